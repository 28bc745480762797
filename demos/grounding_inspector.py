"""Grounding with boxes, seen in the inspector.

What to look at: the tiny VLM is asked for the pixel box of a described shape ("Give the box of the red
circle.") and rewarded by IoU with the true box. After a short run the inspector opens on it: pick a step
and a prompt group, and the image panel draws each response's predicted box (magenta, with its IoU)
beside the ground truth (cyan). Sort the group by reward to see what separates a 0.8-IoU answer from a
0.1 one; switch the token heatmap to "advantage" or "ratio" to see which tokens the update pushed on;
use the Filter tab (component `grounding` failed, finish reason `length`) to find reward bugs such as a
full-image box. The grounding reward refuses boxes covering > 80% of the image unless the target does.

    python demos/grounding_inspector.py [--steps 30] [--out runs/demo-grounding] [--no-inspect]
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="runs/demo-grounding")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--no-inspect", action="store_true", help="train only; print the inspect command")
    args = p.parse_args(argv)
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(ROOT / "configs" / "grounding-tiny.yaml", [
        f"output_dir={args.out}", f"max_steps={args.steps}", "save_every=0", "eval.every=0", "data.eval_size=32",
    ])
    summary = Trainer(cfg).train()
    b, a = summary.get("before", {}), summary.get("after", {})
    if b and a:
        print(f"held-out greedy box accuracy (IoU >= 0.5): {b['greedy_accuracy']:.3f} -> {a['greedy_accuracy']:.3f}")
    print(f"run directory: {args.out}\ninspect it:    mmrlvr inspect {args.out}")
    if args.no_inspect:
        return 0
    from mmrlvr.inspector.cli import main as inspect_main

    return inspect_main([args.out, "--port", str(args.port)])


if __name__ == "__main__":
    raise SystemExit(main())
