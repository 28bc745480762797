"""Where our step's memory goes: peak RSS of each stage of the step, at a model shape.

Runs our trainer (the same settings as ``benchmarks/step_vs_trl.py``'s ours arm: float32, vision frozen,
B prompts x G, k3 KL to a reference, one micro-batch, AdamW + clip) and prints, per step and stage, the
resident set after the stage, the peak during it and its seconds (Linux: ``VmHWM`` from
``/proc/self/status``, reset before each stage by writing 5 to ``/proc/self/clear_refs``). The optimiser step inside the update stage
is shown on its own line. The peak of the whole run is the largest "peak" printed.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/stage_memory.py --shape qwen2_5_vl_3b --image-tokens 256 \
        --new-tokens 128 [--steps 2] [--model DIR] [--heap-mmap-threshold-mib 0]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from mmrlvr.models.standin import BENCH_POINTS as DEFAULTS


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                out[line.split(":")[0]] = int(line.split()[1]) // 1024
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


_LAST = [time.perf_counter()]  # when the last stage ended: each line also gives the stage's seconds


def _report(label: str) -> None:
    s = _status()
    now = time.perf_counter()
    print(f"{label:<34} now {s['VmRSS']:>7,} MiB   peak {s['VmHWM']:>7,} MiB   {now - _LAST[0]:6.1f} s", flush=True)
    _LAST[0] = now
    _reset_peak()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="toy", choices=list(DEFAULTS))
    p.add_argument("--image-tokens", type=int, default=None)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--model", default=None, help="model folder (default: build the --shape model)")
    p.add_argument("--prefix-sharing", action=argparse.BooleanOptionalAction, default=True,
                   help="model.prefix_sharing (default on, as the config's)")
    p.add_argument("--heap-mmap-threshold-mib", type=int, default=None,
                   help="model.heap_mmap_threshold_mib (0 = glibc's default; default: the config's, 4)")
    a = p.parse_args()
    prompts, group, image_tokens, new_tokens = DEFAULTS[a.shape]
    image_tokens, new_tokens = a.image_tokens or image_tokens, a.new_tokens or new_tokens

    from mmrlvr.models.standin import build_standin, image_side

    tmp = tempfile.TemporaryDirectory()
    model_dir = a.model or str(build_standin(a.shape, Path(tmp.name) / "m", image_tokens=image_tokens,
                                             layers=a.layers))
    _report("start")
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    _report("imports")
    side = 112 if a.shape == "toy" else image_side(image_tokens)
    cfg = load_config(data={
        "output_dir": str(Path(tmp.name) / "run"), "max_steps": a.steps, "save_every": 0, "log_rollouts": True,
        "tensorboard": False, "progress": False, "model": {
            "path": model_dir, "freeze_vision": True, "prefix_sharing": a.prefix_sharing,
            **({} if a.heap_mmap_threshold_mib is None else {"heap_mmap_threshold_mib": a.heap_mmap_threshold_mib})},
        "data": {"train": "synth:count", "train_size": prompts * a.steps, "image_size": side,
                 "max_pixels": max(side * side, 448 * 448)},
        "rollout": {"group_size": group, "prompts_per_step": prompts, "max_new_tokens": new_tokens},
        "algo": {"kl_coef": 0.05, "kl_estimator": "k3", "micro_batch_size": prompts * group},
        "optim": {"lr": 1e-4, "grad_clip": 1.0},
        "rewards": [{"name": "format", "weight": 0.2}, {"name": "auto_accuracy", "weight": 1.0}],
        "eval": {"at_start": False, "at_end": False},
    })
    trainer = Trainer(cfg)
    _report("trainer built (model, reference)")
    for kind, stages in trainer.pipeline.stages:
        for stage in stages:
            call = stage.__call__
            stage.__class__ = type(type(stage).__name__, (type(stage),),
                                   {"__call__": lambda self, b, _call=call, _k=kind: (_call(b), _report(f"  {_k}"))[0]})
    update = trainer.pipeline.stage("update")
    step_fn = update.optimizer_step

    def optimizer_step(*args, **kwargs):
        _report("  update: forward + backward")
        out = step_fn(*args, **kwargs)
        _report("  update: optimiser step")
        return out

    update.optimizer_step = optimizer_step
    for step in range(a.steps):
        t0 = time.perf_counter()
        print(f"step {step}", flush=True)
        trainer.pipeline.run(step)
        print(f"step {step}: {time.perf_counter() - t0:.1f} s", flush=True)
    if trainer.writer is not None:
        trainer.writer.close()
    tmp.cleanup()


if __name__ == "__main__":
    main()
