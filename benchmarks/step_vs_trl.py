"""Our GRPO step vs TRL's GRPOTrainer on the same VLM, data, group size and lengths.

Each arm runs in its own subprocess (so peak RSS is that arm's alone), the arms alternate, and the script
prints per-arm medians of the step and of its phases (generate, reference pass, policy forward+backward,
optimiser), then the ratios ours/TRL. Settings matched on both sides (docs/performance.md): float32, the
vision tower frozen on both arms, B prompts x G generations, fixed-length responses, T = 1.0, k3 KL to the
reference with beta 0.05, AdamW lr 1e-4 constant, grad clip 1.0, one optimisation pass per generation
batch (one micro-batch), no eval, no checkpoints; ``--lora``: r 16, alpha 32 on q/k/v/o of the
language model on both arms (the reference is the adapter disabled). Ours also writes its rollout store
(a background thread) unless --no-rollout-log.

Shapes (``mmrlvr.models.standin``): ``toy`` is the 0.64 M-parameter tiny Qwen2.5-VL (16 prompts x 8, 16
image tokens, 32 new tokens by default); ``qwen2_5_vl_3b`` / ``qwen2_5_vl_7b`` are shape-true stand-ins
(real widths, 151,936 vocabulary, real vision-tower widths, ``--layers`` decoder layers, random weights,
built offline; 2 prompts x 4 by default). Their end-of-sequence logits are pinned at 0 among random
others, so responses run to --new-tokens (the mean response length is printed per arm to show it).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/step_vs_trl.py [--steps 5] [--rounds 2]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/step_vs_trl.py --shape qwen2_5_vl_3b --image-tokens 256 \
        --new-tokens 128 --steps 2 --rounds 1 [--lora]

Device and precision: ``--device`` auto (a CUDA GPU when torch sees one, else the CPU) | cpu | cuda, and
``--dtype`` float32 (default) | bfloat16: both arms load the weights in that dtype (TRL with ``bf16=True``). On a
GPU the memory figure is each arm's peak of ``torch.cuda.max_memory_allocated`` (peak RSS is printed too) and
step times are taken after ``torch.cuda.synchronize``; generation is the HF engine on both arms (vLLM runs are
``benchmarks/gpu_check.py``'s).

    python benchmarks/step_vs_trl.py --shape qwen2_5_vl_3b --device cuda --dtype bfloat16 --new-tokens 512

Ends with, per run (one shape):
    step time ratio (ours/TRL): X
    peak memory ratio (ours/TRL): Y

``--credit SCHEME`` (vepo, vppo, entropy_topk, ...) runs our arm with that token-credit scheme beside our plain
GRPO instead of TRL (which has no vision credit) and ends with ``step time ratio (SCHEME/none)`` and
``peak memory ratio (SCHEME/none)``:

    OMP_WAIT_POLICY=PASSIVE python benchmarks/step_vs_trl.py --credit vepo [--shape qwen2_5_vl_3b ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mmrlvr.models.standin import BENCH_POINTS as DEFAULTS  # per shape: B, G, image tokens, new tokens

BETA, LR = 0.05, 1e-4
LORA = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
PHASES = ("generate", "reference", "policy_fwd_bwd", "optimizer")


def _samples(n: int, side: int):
    from mmrlvr.data import rows_to_samples
    from mmrlvr.data.synth import make_rows

    return rows_to_samples(make_rows("count", "train", n, seed=0, image_size=side))


class PhaseTimer:
    """Wraps methods so that each call's wall time adds to a phase of the current step."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self.lengths: list[float] = []

    def new_step(self) -> None:
        self.steps.append({k: 0.0 for k in PHASES})

    def add(self, phase: str, seconds: float) -> None:
        if self.steps:
            self.steps[-1][phase] += seconds

    def wrap(self, obj, name: str, phase) -> None:
        """``phase``: a phase name, or a function of the call's (args, kwargs) returning one (or None)."""
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                which = phase(args, kwargs) if callable(phase) else phase
                if which:
                    self.add(which, time.perf_counter() - t0)
        setattr(obj, name, timed)


def _wire_optimizer(trainer, cfg) -> str:
    """Which optimiser our arm runs: the runtime builds it with ``mmrlvr.train.optim.build_optimizer`` (fused
    AdamW where the device has it) and the update stage clips with the one-pass norm + non-finite check."""
    fused = bool(getattr(trainer.rt.optimizer, "defaults", {}).get("fused"))
    return f"the run's own optimiser ({'fused' if fused else 'foreach/for-loop'} AdamW)"


def run_ours(model_dir: str, a, out: str, rollout_log: bool) -> dict:
    from mmrlvr.config import load_config
    from mmrlvr.models.standin import image_side
    from mmrlvr.train.trainer import Trainer

    side = 112 if a.shape == "toy" else image_side(a.image_tokens)
    model = {"path": model_dir, "freeze_vision": True, "dtype": a.dtype}
    if a.lora:
        model["lora"] = {"enabled": True, **LORA}
    if a.gradient_checkpointing:
        model["gradient_checkpointing"] = True
    if a.prefix_sharing is not None:  # None: the config's default (on)
        model["prefix_sharing"] = a.prefix_sharing
    if a.heap_mmap_threshold_mib is not None:  # None: the config's default (4 MiB)
        model["heap_mmap_threshold_mib"] = a.heap_mmap_threshold_mib
    credit = {"credit": {"scheme": a.credit}} if getattr(a, "credit", None) else {}
    cfg = load_config(data={**credit,
        "output_dir": out, "max_steps": a.steps, "save_every": 0, "log_rollouts": rollout_log,
        "tensorboard": False, "progress": False, "model": model,
        "data": {"train": "synth:count", "train_size": a.prompts * a.steps, "image_size": side,
                 "max_pixels": max(side * side, 448 * 448)},
        "rollout": {"group_size": a.group, "prompts_per_step": a.prompts, "max_new_tokens": a.new_tokens},
        "algo": {"kl_coef": BETA, "kl_estimator": "k3", "micro_batch_size": a.prompts * a.group},
        "optim": {"lr": LR, "grad_clip": 1.0},
        "rewards": [{"name": "format", "weight": 0.2}, {"name": "auto_accuracy", "weight": 1.0}],
        "eval": {"at_start": False, "at_end": False},
    })
    trainer = Trainer(cfg)
    optim_note = _wire_optimizer(trainer, cfg)
    timer = PhaseTimer()
    timer.wrap(trainer.pipeline.stage("update"), "optimizer_step", "optimizer")
    times = []
    for step in range(a.steps):
        timer.new_step()
        t0 = time.perf_counter()
        batch = trainer.pipeline.run(step)  # what Trainer.run_step does, keeping the batch for its timings
        _sync()
        times.append(time.perf_counter() - t0)
        ph = timer.steps[-1]
        ph["generate"] = batch.timings.get("generate", 0.0)
        ph["reference"] = batch.timings.get("reference", 0.0)
        ph["policy_fwd_bwd"] = batch.timings.get("update", 0.0) - ph["optimizer"]
        mask = getattr(getattr(batch, "rollouts", None), "response_mask", None)
        if mask is not None:
            timer.lengths.append(float(mask.sum(1).float().mean()))
    if trainer.writer is not None:
        trainer.writer.close()
    return {"step_s": times, "phases": timer.steps, "response_len": timer.lengths, "note": optim_note}


def run_trl(model_dir: str, a, out: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mmrlvr.models import load_policy
    from mmrlvr.rewards.base import build_reward
    from mmrlvr.types import Completion

    from mmrlvr.models.standin import image_side

    steps = a.steps
    samples = _samples(a.prompts * steps, 112 if a.shape == "toy" else image_side(a.image_tokens))
    fmt, acc = build_reward("format"), build_reward("auto_accuracy")

    def reward(completions, idx, **_):
        out = []
        for c, i in zip(completions, idx):
            text = c[0]["content"] if isinstance(c, list) else c
            comp, s = Completion(text=text), samples[i]
            out.append(0.2 * fmt(comp, s).score + acc(comp, s).score)
        return out

    ds = Dataset.from_list([{"prompt": s.messages, "image": s.images[0], "idx": i} for i, s in enumerate(samples)])
    model, processor = load_policy(model_dir, dtype=a.dtype)
    from mmrlvr.models.lora import freeze_vision

    freeze_vision(model)  # same work as ours (model.freeze_vision)
    peft_config = None
    if a.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], target_modules=LORA["target_modules"],
                                 lora_dropout=0.0, bias="none")
    group = a.prompts * a.group
    args = GRPOConfig(
        output_dir=out, max_steps=steps, per_device_train_batch_size=group, num_generations=a.group,
        max_completion_length=a.new_tokens, temperature=1.0, beta=BETA, learning_rate=LR, max_grad_norm=1.0,
        lr_scheduler_type="constant", bf16=a.dtype == "bfloat16", gradient_checkpointing=a.gradient_checkpointing,
        use_cpu=a.device == "cpu",
        logging_steps=1, report_to=[], save_strategy="no", num_iterations=1, steps_per_generation=1,
        shuffle_dataset=False, seed=0, disable_dropout=True,
    )
    times: list[float] = []
    timer = PhaseTimer()

    class Timer(TrainerCallback):
        def on_step_begin(self, *_a, **_k):
            self.t0 = time.perf_counter()
            timer.new_step()

        def on_pre_optimizer_step(self, *_a, **_k):
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, *_a, **_k):
            timer.add("optimizer", time.perf_counter() - self.t_opt)

        def on_step_end(self, *_a, **_k):
            _sync()
            times.append(time.perf_counter() - self.t0)

        def on_log(self, _args, _state, _control, logs=None, **_k):
            if logs and "completions/mean_length" in logs:
                timer.lengths.append(float(logs["completions/mean_length"]))

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                          processing_class=processor, callbacks=[Timer()], peft_config=peft_config)
    timer.wrap(trainer, "_generate", "generate")
    # no-grad calls are the reference (and old-policy) passes; with grad, the policy forward
    timer.wrap(trainer, "_get_per_token_logps_and_entropies",
               lambda _a, _k: "policy_fwd_bwd" if torch.is_grad_enabled() else "reference")
    timer.wrap(trainer.accelerator, "backward", "policy_fwd_bwd")
    torch.manual_seed(0)
    trainer.train()
    return {"step_s": times, "phases": timer.steps, "response_len": timer.lengths}


def _sync() -> None:
    """Wait for queued GPU work, so that a step's time is its work's (a no-op on the CPU)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def child(arm: str, model_dir: str, a, rollout_log: bool) -> None:
    import torch

    with tempfile.TemporaryDirectory() as out:
        res = run_ours(model_dir, a, out, rollout_log) if arm == "ours" else run_trl(model_dir, a, out)
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if a.device == "cuda":
        res["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
        res["gpu"] = torch.cuda.get_device_name()
        res["on_gpu"] = torch.cuda.is_initialized() and res["peak_gpu_mib"] > 0
    print("RESULT " + json.dumps(res))


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def bench_shape(shape: str, args, env: dict[str, str]) -> None:
    """Alternate the arms ``args.rounds`` times on ``shape``; print phases and the two ratio lines."""
    prompts, group, image_tokens, new_tokens = DEFAULTS[shape]
    a = argparse.Namespace(**{**vars(args), "shape": shape, "prompts": args.prompts or prompts,
                              "group": args.group or group, "image_tokens": args.image_tokens or image_tokens,
                              "new_tokens": args.new_tokens or new_tokens})
    model_dir, built = args.model, None
    if model_dir is None:
        from mmrlvr.models.standin import build_standin

        built = tempfile.mkdtemp()  # removed at the end: a stand-in is gigabytes
        t0 = time.perf_counter()
        model_dir = str(build_standin(shape, Path(built) / shape, image_tokens=a.image_tokens, layers=args.layers))
        print(f"== {shape}: built in {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"== {shape}: {a.prompts} prompts x G {a.group}, {a.image_tokens} image tokens, {a.new_tokens} new "
          f"tokens, {'LoRA' if a.lora else 'full fine-tuning'}"
          f"{', gradient checkpointing' if a.gradient_checkpointing else ''}"
          f"{', ours without prefix sharing' if args.prefix_sharing is False else ', ours with prefix sharing'}"
          f"{'' if args.heap_mmap_threshold_mib is None else f', heap mmap threshold {args.heap_mmap_threshold_mib} MiB'}; "
          f"{a.dtype} on {a.device}; "
          f"{a.steps} steps x {a.rounds} rounds",
          flush=True)
    try:
        _alternate(a, args, env, model_dir)
    finally:
        if built is not None:
            shutil.rmtree(built, ignore_errors=True)


def _alternate(a, args, env: dict[str, str], model_dir: str) -> None:
    shape = a.shape
    # --credit: our arm with that token-credit scheme beside our plain GRPO (TRL has no vision credit)
    arms = {"ours": ("ours", None), "trl": ("trl", None)}
    if args.credit:
        arms = {"ours": ("ours", None), f"ours+{args.credit}": ("ours", args.credit)}
    results: dict[str, list[dict]] = {k: [] for k in arms}
    for r in range(args.rounds):
        for arm, (kind, credit) in arms.items():
            cmd = [sys.executable, __file__, "--child", kind, "--model", model_dir, "--shape", shape,
                   "--steps", str(a.steps), "--prompts", str(a.prompts), "--group", str(a.group),
                   "--image-tokens", str(a.image_tokens), "--new-tokens", str(a.new_tokens),
                   "--device", a.device, "--dtype", a.dtype]
            cmd += ["--no-rollout-log"] if args.no_rollout_log else []
            cmd += ["--credit", credit] if credit else []
            if args.prefix_sharing is not None:
                cmd += ["--prefix-sharing" if args.prefix_sharing else "--no-prefix-sharing"]
            if args.heap_mmap_threshold_mib is not None:
                cmd += ["--heap-mmap-threshold-mib", str(args.heap_mmap_threshold_mib)]
            cmd += ["--lora"] if a.lora else []
            cmd += ["--gradient-checkpointing"] if a.gradient_checkpointing else []
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
                raise SystemExit(f"{arm} arm failed (exit {proc.returncode})")
            res = json.loads(line[len("RESULT "):])
            if a.device == "cuda" and not res.get("on_gpu"):
                raise SystemExit(f"{arm} arm was asked for the GPU but allocated nothing there")
            results[arm].append(res)
            timed = res["step_s"][1:] or res["step_s"]
            if res.get("note") and r == 0:
                print(f"     {arm}: {res['note']}")
            gpu = f"peak GPU memory {res['peak_gpu_mib']:.0f} MiB ({res['gpu']}), " if "peak_gpu_mib" in res else ""
            print(f"round {r + 1} {arm:>4}: median step {statistics.median(timed):.3f} s, {gpu}"
                  f"peak RSS {res['peak_rss_mib']:.0f} MiB, mean response {_median(res['response_len']):.1f} tokens",
                  flush=True)
    med = {k: _median([t for res in rs for t in (res["step_s"][1:] or res["step_s"])]) for k, rs in results.items()}
    key = "peak_gpu_mib" if a.device == "cuda" else "peak_rss_mib"  # what the run is bounded by
    mem = {k: max(res[key] for res in rs) for k, rs in results.items()}
    for arm, rs in results.items():
        phases = {ph: _median([st[ph] for res in rs for st in (res["phases"][1:] or res["phases"])]) for ph in PHASES}
        print(f"{arm:>4} phases (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    what = "GPU memory" if a.device == "cuda" else "RSS"
    if args.credit:
        other = f"ours+{args.credit}"
        print(f"ours: {med['ours']:.3f} s/step, {mem['ours']:.0f} MiB;  {other}: {med[other]:.3f} s/step, "
              f"{mem[other]:.0f} MiB (peak {what})")
        print(f"step time ratio ({args.credit}/none): {med[other] / med['ours']:.2f}")
        print(f"peak memory ratio ({args.credit}/none): {mem[other] / mem['ours']:.2f}", flush=True)
        return
    print(f"ours: {med['ours']:.3f} s/step, {mem['ours']:.0f} MiB;  TRL: {med['trl']:.3f} s/step, {mem['trl']:.0f} MiB "
          f"(peak {what})")
    print(f"step time ratio (ours/TRL): {med['ours'] / med['trl']:.2f}")
    print(f"peak memory ratio (ours/TRL): {mem['ours'] / mem['trl']:.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs="+", default=["toy"], choices=list(DEFAULTS),
                   help="model shape(s), benchmarked one after the other")
    p.add_argument("--image-tokens", type=int, default=None, help="image tokens per prompt (a square: 256, 1024)")
    p.add_argument("--new-tokens", type=int, default=None, help="response length (fixed)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (B)")
    p.add_argument("--group", type=int, default=None, help="generations per prompt (G)")
    p.add_argument("--layers", type=int, default=1, help="stand-ins: decoder layers")
    p.add_argument("--lora", action="store_true", help="LoRA r 16 on q/k/v/o (both arms)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="both arms")
    p.add_argument("--steps", type=int, default=5, help="steps per arm; the first is warm-up and not timed")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of (ours, TRL)")
    p.add_argument("--model", default=None, help="model folder (default: build the --shape model)")
    p.add_argument("--no-rollout-log", action="store_true", help="ours: do not write the rollout store")
    p.add_argument("--prefix-sharing", action=argparse.BooleanOptionalAction, default=None,
                   help="ours: model.prefix_sharing (each group's prompt run once in the reference and policy passes; "
                        "default: the config's, on)")
    p.add_argument("--heap-mmap-threshold-mib", type=int, default=None,
                   help="ours: model.heap_mmap_threshold_mib (0 = glibc's default allocator behaviour; default: "
                        "the config's, 4)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: a CUDA GPU when torch sees one, else the CPU (both arms)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="weights dtype (both arms)")
    p.add_argument("--credit", default=None,
                   help="a token-credit scheme (vepo, vppo, entropy_topk, ...): our arm with it beside our plain GRPO, "
                        "no TRL arm (TRL has no vision credit); prints the scheme/none ratios")
    p.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        args.shape = args.shape[0]
        child(args.child, args.model, args, not args.no_rollout_log)
        return
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # both arms on the CPU even where a GPU is present
    elif args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device")
    if args.model is not None and len(args.shape) > 1:
        raise SystemExit("--model goes with one --shape")
    for shape in args.shape:
        bench_shape(shape, args, env)


if __name__ == "__main__":
    main()
