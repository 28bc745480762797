"""ACPO's off-policy diagnostic: how the importance-ratio spread grows with ``algo.epochs`` (arXiv 2606.22570).

Runs ``configs/demo-tiny.yaml`` (GRPO on the warm-started tiny Qwen2.5-VL, counting task) for ``--steps``
steps at each ``algo.epochs`` in ``--epochs`` (default 1, 2, 8) and each clip rule in ``--clips`` (default
fixed), and reads the ``offpolicy/...`` metrics every run logs: per bin of pi_old (5 equal-width bins), the
ratio mean/std and the low/high clip shares over every pass of a step. At epochs = 1 every ratio is 1 (the
single pass is on-policy); each further pass moves pi away from pi_old, and the spread is what ACPO's
adaptive range reads. Writes ``<out>/results.md``, ``results.json`` and ``acpo_offpolicy.png``.

    python benchmarks/acpo_offpolicy.py --steps 8 --out runs/acpo_offpolicy
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BINS = 5


def run_arm(epochs: int, clip: str, steps: int, out: Path, seed: int, overrides: list[str]) -> dict[str, Any]:
    from mmrlvr.config import load_config
    from mmrlvr.train.metrics import read_metrics
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", overrides=[
        f"output_dir={out}", f"max_steps={steps}", f"seed={seed}", "save_every=0", "log_rollouts=false",
        "progress=false", "tensorboard=false", "eval.at_start=false", "eval.at_end=false", "eval.every=0",
        f"algo.epochs={epochs}", f"algo.clip={clip}", *overrides])
    t0 = time.perf_counter()
    Trainer(cfg).train()
    wall = time.perf_counter() - t0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "offpolicy/ratio_std" in r]
    res: dict[str, Any] = {"epochs": epochs, "clip": clip, "wall_s": wall, "steps": len(rows),
                           "ratio_std": _mean([r["offpolicy/ratio_std"] for r in rows]), "bins": {}}
    for b in range(BINS):
        key = f"offpolicy/bin{b}"
        got = [r for r in rows if f"{key}/tokens" in r]
        if got:
            res["bins"][b] = {m: _mean([r[f"{key}/{m}"] for r in got])
                              for m in ("ratio_mean", "ratio_std", "clip_low", "clip_high", "tokens")}
    return res


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| clip | epochs | all-token ratio std | " + " | ".join(f"bin {b} std / low / high" for b in range(BINS))
             + " | wall s |", "|---|---|---|" + "---|" * BINS + "---|"]
    for r in results:
        cells = []
        for b in range(BINS):
            d = r["bins"].get(b) or r["bins"].get(str(b))
            cells.append(f"{d['ratio_std']:.4f} / {d['clip_low']:.3f} / {d['clip_high']:.3f}" if d else "–")
        lines.append(f"| {r['clip']} | {r['epochs']} | {r['ratio_std']:.4f} | " + " | ".join(cells)
                     + f" | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for clip in sorted({r["clip"] for r in results}):
        for r in (r for r in results if r["clip"] == clip):
            xs = [b for b in range(BINS) if (r["bins"].get(b) or r["bins"].get(str(b)))]
            ys = [(r["bins"].get(b) or r["bins"].get(str(b)))["ratio_std"] for b in xs]
            ax.plot([(b + 0.5) / BINS for b in xs], ys, "o-", label=f"{clip}, epochs {r['epochs']}")
    ax.set_xlabel("pi_old probability bin (centre)")
    ax.set_ylabel("std of pi/pi_old over all passes")
    ax.set_title("off-policy degree: ratio spread per probability bin")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--epochs", type=int, nargs="+", default=[1, 2, 8])
    p.add_argument("--clips", nargs="+", default=["fixed"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/acpo_offpolicy")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every arm")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for clip in args.clips:
        for e in args.epochs:
            res = run_arm(e, clip, args.steps, out / f"{clip}-epochs{e}", args.seed, args.overrides)
            results.append(res)
            print(f"[{clip}, epochs {e}] ratio std {res['ratio_std']:.4f} ({res['wall_s']:.0f} s)", flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    md = table(results)
    (out / "results.md").write_text(md + "\n")
    plot(results, out / "acpo_offpolicy.png")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
