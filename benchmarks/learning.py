"""Does it learn? The demo config from the warm-started tiny VLM, several seeds, plus a learning-rate-0 control.

For each arm it prints held-out greedy accuracy, avg@8 (T = 1.0), pass@8 and format rate before and after,
the wall time, and at the end one line per arm with the changes. The acceptance bar (issue 3): avg@8 up by
>= 10 points within 10 minutes on 2 CPU cores in each seed, greedy down by <= 3 points, format >= 0.95,
and the lr-0 control flat.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/learning.py [--seeds 0 1] [--steps 300] [--config configs/demo-tiny.yaml]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

KEYS = ("greedy_accuracy", "avg@8", "pass@8", "format_rate")


def run_arm(config: str, out: Path, seed: int, steps: int, lr: float | None, extra: list[str]) -> dict:
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    overrides = [f"output_dir={out}", f"seed={seed}", f"max_steps={steps}", "save_every=0", *extra]
    if lr is not None:
        overrides.append(f"optim.lr={lr}")
    cfg = load_config(config, overrides)
    t0, c0 = time.perf_counter(), time.process_time()
    summary = Trainer(cfg).train()
    summary["wall_s"] = time.perf_counter() - t0
    # CPU seconds of this process: on a shared, oversubscribed machine the wall time overstates the cost
    summary["cpu_s"] = time.process_time() - c0
    return summary


def fmt(before: dict, after: dict) -> str:
    parts = []
    for k in KEYS:
        if k in before and k in after:
            parts.append(f"{k} {before[k]:.3f} -> {after[k]:.3f} ({100 * (after[k] - before[k]):+.1f} pts)")
    return "; ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "demo-tiny.yaml"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=None, help="default: the config's max_steps")
    p.add_argument("--out", default="runs/learning")
    p.add_argument("--no-control", action="store_true", help="skip the learning-rate-0 control")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every arm")
    args = p.parse_args()
    from mmrlvr.config import load_config

    steps = args.steps or load_config(args.config).max_steps
    arms = [(f"seed{s}", s, None) for s in args.seeds]
    if not args.no_control:
        arms.append(("lr0-control", args.seeds[0], 0.0))
    results = {}
    for name, seed, lr in arms:
        res = run_arm(args.config, Path(args.out) / name, seed, steps, lr, args.overrides)
        results[name] = res
        print(f"[{name}] {res['wall_s']:.0f} s wall, {res['cpu_s']:.0f} s CPU: {fmt(res['before'], res['after'])}",
              flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=2, default=float))
    print("\nsummary (held-out, before -> after):")
    for name, res in results.items():
        b, a = res["before"], res["after"]
        print(f"{name:>12}: avg@8 {100 * (a['avg@8'] - b['avg@8']):+.1f} pts, greedy "
              f"{100 * (a['greedy_accuracy'] - b['greedy_accuracy']):+.1f} pts, format {a['format_rate']:.3f}, "
              f"{res['wall_s'] / 60:.1f} min wall, {res['cpu_s'] / 60:.1f} min CPU")


if __name__ == "__main__":
    main()
