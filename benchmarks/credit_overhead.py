"""What vision-sensitive token credit costs per training step: `vepo` and `vppo` against `none`.

    python benchmarks/credit_overhead.py [--steps 6] [--settings tiny,large_vocab,shape_true]

A step here is the trainer's real step (``Trainer.run_step``): generation, rewards, advantages, the credit
scheme's passes, the reference pass (k3 KL), the policy update and the optimizer step, with the rollout
records written — what a user waits for. The three arms differ only in ``credit.scheme``:

  none   plain GRPO
  vepo   + one no-grad forward on the perturbed image (backbone, then lm_head chunk by chunk) and the
         full-vocabulary JSD / entropy shift against the clean distribution, which VEPO reads from the
         update's own first forward (``credit.in_update``, mmrlvr.train.deferred_credit)
  vppo   + one no-grad forward on the perturbed image, reading only the sampled token's log-prob

Each arm is its own ``Trainer`` (own model copy) in one process, and the arms run interleaved step by
step (none, vepo, vppo, none, ...) after one warm-up step each. The learning rate is 0, so all three
generate exactly the same rollouts at every step (same seeds, same weights): the only difference in work
is the credit. Figures are the median CPU time of the process per step (``time.process_time``; with one
compute thread it measures the work done, whatever else runs on a shared machine) — for the whole step
and for the step without generation ("train part": rewards, passes, update) — and the median wall time
beside it.

Memory, first the figure that holds still: the **step increment**, the peak of live tensor bytes during a
step above those alive when it started (``mmrlvr.train.tensor_memory.TensorPeak``: the CUDA allocator's peak
on a GPU, which is what a GPU out-of-memory error depends on; on CPU the running sum of PyTorch's allocation
events, every tensor buffer the step allocates, intermediates inside operators included). The same code asks
for the same buffers in the same order, so it is the same from step to step and run to run; its median over
the timed steps is printed with its spread ((max - min) / median). Beside it, as a user's ``top`` shows it:
the peak resident memory of the process (``VmHWM``, reset before each step through ``echo 5 >
/proc/self/clear_refs``, Linux) and its rise above the resident memory at the step's start. On CPU the
kernel's out-of-memory killer reads the resident figure, but that moves with glibc's heap (whether freed
buffers return to the OS or stay as holes, ``mmrlvr.train.host_memory``) by hundreds of MiB between runs of
the same code, so ratios are taken on the tensor figure. One fresh subprocess per (setting, arm) measures
memory (a warm-up step, then the timed steps); the profiler's bookkeeping costs a few per cent of a step there.

Settings:
  tiny         configs/credit-vepo-tiny.yaml as a user runs it: the warm-started tiny Qwen2.5-VL
               (real Qwen2_5_VLForConditionalGeneration), 16 prompts x G 8, responses up to 32 tokens
  large_vocab  the same body with a 32,000-token vocabulary (untrained, so every response runs to the
               limit), 1 prompt x G 4, 512-token responses
  shape_true   Qwen2.5-VL-3B's widths (hidden 2,048, MLP 11,008, 16 heads) and 151,936-token vocabulary, one
               decoder layer (``mmrlvr.models.standin``, random weights: every response runs to 512 tokens),
               256 image tokens, 1 prompt x G 4, 3 timed steps; the step increment is the memory a step takes
               above the model and optimizer state
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("none", "vepo", "vppo")
QUIET = ["eval.at_start=false", "eval.at_end=false", "eval.every=0", "save_every=0", "progress=false",
         "tensorboard=false", "optim.lr=0"]
SETTINGS: dict[str, dict[str, Any]] = {
    "tiny": {"model": "tiny:qwen2_5_vl:warm", "overrides": []},
    "large_vocab": {"model": None, "vocab": 32000,
                    "overrides": ["rollout.prompts_per_step=1", "rollout.group_size=4",
                                  "rollout.max_new_tokens=512"]},
    # Qwen2.5-VL-3B's widths and 151,936-token vocabulary (mmrlvr.models.standin, one decoder layer, random
    # weights: every response runs to the limit), 256 image tokens (448-px images), 512 new tokens, 1 prompt x G 4
    # (each arm in its own process: three full-fine-tuning copies with their AdamW state and reference would need
    # ~21 GB; timed and measured over the same 3 steps after a warm-up step)
    "shape_true": {"model": None, "standin": "qwen2_5_vl_3b", "image_tokens": 256, "steps": 3, "separate": True,
                   "overrides": ["rollout.prompts_per_step=1", "rollout.group_size=4", "rollout.max_new_tokens=512",
                                 "data.image_size=448", "algo.micro_batch_size=4"]},
}


def large_vocab_model(out: Path, vocab: int) -> str:
    """The tiny Qwen2.5-VL body with a ``vocab``-row embedding and lm_head, saved as a local checkpoint."""
    import torch
    from transformers import AutoConfig, GenerationConfig, Qwen2_5_VLForConditionalGeneration

    from mmrlvr.models.tiny import build_tiny

    if not (out / "config.json").is_file() or AutoConfig.from_pretrained(out).text_config.vocab_size != vocab:
        build_tiny("qwen2_5_vl", out)
        config = AutoConfig.from_pretrained(out)
        config.text_config.vocab_size = vocab
        torch.manual_seed(0)
        model = Qwen2_5_VLForConditionalGeneration(config)
        model.generation_config = GenerationConfig.from_pretrained(out)
        model.save_pretrained(out)
    return str(out)


def make_trainer(setting: str, arm: str, work: Path):
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    spec = SETTINGS[setting]
    if spec.get("standin"):
        from mmrlvr.models.standin import build_standin

        folder = work / f"model-{setting}"
        if not (folder / "config.json").is_file():
            build_standin(spec["standin"], folder, image_tokens=spec["image_tokens"])
        model = str(folder)
    else:
        model = spec["model"] or large_vocab_model(work / f"model-{setting}", spec["vocab"])
    cfg = load_config(ROOT / "configs" / "credit-vepo-tiny.yaml",
                      [f"output_dir={work / f'{setting}-{arm}'}", f"model.path={model}", f"credit.scheme={arm}",
                       *QUIET, *spec["overrides"]])
    trainer = Trainer(cfg)
    trainer.gen_cpu = 0.0
    generate = trainer.engine.generate

    def timed_generate(*args, **kwargs):  # CPU time of generation, to report the train part on its own
        c0 = time.process_time()
        try:
            return generate(*args, **kwargs)
        finally:
            trainer.gen_cpu += time.process_time() - c0

    trainer.engine.generate = timed_generate
    return trainer


def timed_step(trainer, step: int) -> dict[str, float]:
    trainer.gen_cpu = 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    metrics = trainer.run_step(step)
    cpu = time.process_time() - c0
    return {"cpu": cpu, "train_cpu": cpu - trainer.gen_cpu, "wall": time.perf_counter() - t0,
            "tokens": metrics.get("response_length/mean", 0.0)}


def time_worker(setting: str, steps: int, work: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    trainers = {a: make_trainer(setting, a, work) for a in ARMS}
    for a in ARMS:
        timed_step(trainers[a], 0)  # warm-up: allocator pools, lazy inits
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in ARMS}
    for step in range(1, steps + 1):
        for a in ARMS:
            runs[a].append(timed_step(trainers[a], step))
    return {a: {k: statistics.median(r[k] for r in runs[a]) for k in ("cpu", "train_cpu", "wall", "tokens")}
            for a in ARMS}


def _kib(field: str) -> int:
    return int(re.search(field + r":\s+(\d+)", open("/proc/self/status").read()).group(1))


def measured_step(trainer, step: int) -> dict[str, Any]:
    """One step with its memory measured: the tensor peak above the step's start (``TensorPeak`` on the policy's
    device) and the resident high-water mark, reset at the step's start, with its rise above the resident set
    there (MiB); plus ``timed_step``'s figures."""
    from mmrlvr.train.tensor_memory import TensorPeak

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _kib("VmRSS")
    with TensorPeak(next(trainer.policy.parameters()).device, detail=True) as peak:
        out = timed_step(trainer, step)
    hwm = _kib("VmHWM")
    stage = [name for name in peak.top if name.startswith("stage ")][-1:]
    where = stage + [name for name in peak.top[-2:] if name not in stage]
    return {**out, "tensor_mib": peak.increment / 2**20, "peak_mib": hwm / 1024, "increment_mib": (hwm - before) / 1024,
            "where": " > ".join(where)}


def median_spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every figure over the steps, and the tensor increment's spread ((max - min) / median)."""
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "where"}
    out["where"] = runs[-1]["where"]  # where the last step's peak was (the steps agree)
    tensor = [r["tensor_mib"] for r in runs]
    out["tensor_spread"] = (max(tensor) - min(tensor)) / max(out["tensor_mib"], 1e-9)
    return out


def memory_worker(setting: str, arm: str, steps: int, work: Path) -> dict[str, Any]:
    """One arm alone in a fresh process: a warm-up step, then ``steps`` measured steps (figures: median)."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    trainer = make_trainer(setting, arm, work)
    timed_step(trainer, 0)  # warm-up: allocator pools, lazy inits
    return median_spread([measured_step(trainer, step) for step in range(1, steps + 1)])


def _run_child(args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="timed steps per arm (median reported)")
    ap.add_argument("--settings", default="tiny,large_vocab,shape_true", help="comma list of: " + ", ".join(SETTINGS))
    ap.add_argument("--work", default=None, help="folder for run directories and the large-vocab model")
    ap.add_argument("--worker", choices=["time", "memory"], help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="credit-overhead-"))
    if a.worker == "time":
        print(json.dumps(time_worker(a.setting, a.steps, work)))
        return 0
    if a.worker == "memory":
        print(json.dumps(memory_worker(a.setting, a.arm, a.steps, work)))
        return 0

    import torch

    settings = [s for s in a.settings.split(",") if s]
    print(f"credit overhead: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}, OMP_WAIT_POLICY=PASSIVE, "
          f"torch {torch.__version__}, {a.steps} timed steps per arm, work dir {work}")
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    for s in settings:
        steps = min(a.steps, SETTINGS[s].get("steps", a.steps))  # the shape-true setting: 3 timed steps
        m = {arm: _run_child(["--worker", "memory", "--setting", s, "--arm", arm, "--steps", str(min(steps, 3)),
                              "--work", str(work)]) for arm in ARMS}
        if SETTINGS[s].get("separate"):  # one process per arm: timed in the measured steps
            t = m
        else:
            t = _run_child(["--worker", "time", "--setting", s, "--steps", str(steps), "--work", str(work)])
        spec = SETTINGS[s]
        label = (f"{spec['standin']} stand-in (1 layer), {spec['image_tokens']} image tokens" if spec.get("standin")
                 else spec["model"] or f"tiny body, vocab {spec['vocab']}")
        print(f"\n[{s}] {label} "
              f"{' '.join(SETTINGS[s]['overrides'])}; mean response length {t['none']['tokens']:.1f} tokens")
        print(f"  {'arm':6s} {'step CPU s':>10s} {'train part CPU s':>17s} {'step wall s':>12s} "
              f"{'step increment MiB':>19s} {'spread':>7s} {'peak RSS MiB':>13s} {'RSS rise MiB':>13s}")
        for arm in ARMS:
            print(f"  {arm:6s} {t[arm]['cpu']:10.3f} {t[arm]['train_cpu']:17.3f} {t[arm]['wall']:12.3f} "
                  f"{m[arm]['tensor_mib']:19.1f} {m[arm]['tensor_spread']:7.1%} {m[arm]['peak_mib']:13.1f} "
                  f"{m[arm]['increment_mib']:13.1f}")
        for arm in ARMS[1:]:
            ratios.setdefault(arm, {})[s] = {
                "time": t[arm]["cpu"] / t["none"]["cpu"], "train": t[arm]["train_cpu"] / t["none"]["train_cpu"],
                "wall": t[arm]["wall"] / t["none"]["wall"],
                "increment": m[arm]["tensor_mib"] / max(m["none"]["tensor_mib"], 1e-6),
                "memory": m[arm]["peak_mib"] / m["none"]["peak_mib"],
                "rss_rise": m[arm]["increment_mib"] / max(m["none"]["increment_mib"], 1e-6)}
        for arm in ARMS:
            print(f"  {arm}: step increment reached in {m[arm]['where']}")
    print("\n(targets: step-time ratio <= 1.3, step-increment ratio <= 1.15; time = median CPU time per step, "
          "step increment = median peak of live tensor bytes above the step's start)")
    for arm, per in ratios.items():
        for s, r in per.items():
            print(f"{arm}/none [{s}]: time ratio {r['time']:.2f}, step increment {r['increment']:.2f} "
                  f"(train part without generation {r['train']:.2f}, wall {r['wall']:.2f}; "
                  f"resident: peak RSS {r['memory']:.2f}, RSS rise {r['rss_rise']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
