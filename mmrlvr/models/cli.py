"""``mmrlvr tiny build``: build an offline tiny Qwen-family VLM, optionally warm-started on a synthetic task.

    mmrlvr tiny build --family qwen2_5_vl --out runs/tiny
    mmrlvr tiny build --family qwen2_5_vl --out runs/tiny-ws --warm-start --task count [--answer-noise 0.9]

With ``--warm-start`` the result is cached in the folder (``warmstart.json``): a second call with the same
options prints the stored figures at once; ``--force`` rebuilds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mmrlvr.errors import UserError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrlvr tiny", description="Offline tiny Qwen-family VLMs.")
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="build a tiny random VLM (optionally warm-started) into a folder")
    build.add_argument("--family", required=True, choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"],
                       help="model class: Qwen2-VL, Qwen2.5-VL or Qwen3-VL")
    build.add_argument("--out", required=True, help="output folder (loads with AutoModelForImageTextToText)")
    build.add_argument("--warm-start", action="store_true",
                       help="SFT on a synthetic task to 30-60%% held-out accuracy (cached in the folder)")
    build.add_argument("--task", default="count", help="synthetic task for --warm-start (default: count)")
    build.add_argument("--answer-noise", type=float, default=0.0,
                       help="fraction of SFT targets whose answer is randomised, thinking kept (default 0)")
    build.add_argument("--steps", type=int, default=None,
                       help="most SFT steps for --warm-start (default: the task's recipe, 600; 1200 for video_count)")
    build.add_argument("--seed", type=int, default=0, help="random seed (weights, data, sampling)")
    build.add_argument("--force", action="store_true",
                       help="rebuild even if the folder holds a model / cache (and never copy the shipped build)")
    build.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def _build_plain(args: argparse.Namespace) -> int:
    from mmrlvr.models.loading import load_policy
    from mmrlvr.models.tiny import build_tiny

    out = Path(args.out)
    if (out / "config.json").exists() and not args.force:
        raise UserError(f"{str(out)!r} already holds a model; pass --force to overwrite it")
    t0 = time.perf_counter()
    from mmrlvr.models.warmstart import build_lock

    with build_lock(out):
        build_tiny(args.family, out, seed=args.seed)
    model, processor = load_policy(out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"built {type(model).__name__} ({n_params / 1e6:.2f} M parameters, vocabulary "
          f"{len(processor.tokenizer)}) in {out} [{time.perf_counter() - t0:.1f} s]")
    return 0


def _build_warm(args: argparse.Namespace) -> int:
    from mmrlvr.models.warmstart import UNSET, build_lock, warm_start

    t0 = time.perf_counter()
    with build_lock(args.out):  # another builder of this folder (a run, a second command) finishes first
        result = warm_start(args.out, family=args.family, task=args.task,
                            steps=UNSET if args.steps is None else args.steps,
                            answer_noise=args.answer_noise, seed=args.seed, force=args.force,
                            progress=not args.quiet)
    took = time.perf_counter() - t0
    k = result["k"]
    source = ("shipped with the package" if result.get("shipped") else "cached") if result["cached"] \
        else f"{result['steps_run']} SFT steps"
    chance = result.get("chance")
    print(f"warm-started {args.family} on {args.task} ({source}) in {args.out}")
    print(f"held-out (n={result['n']}): greedy accuracy {result['greedy_accuracy']:.3f}"
          + (f" (chance {chance:.3f})" if chance is not None else "")
          + f", avg@{k} {result[f'avg@{k}']:.3f}, pass@{k} {result[f'pass@{k}']:.3f}, "
          f"format rate {result['format_rate']:.3f}")
    print(f"time: {took:.1f} s" + ("" if result["cached"] else f" (build + SFT + eval; SFT {result['train_s']:.1f} s)"))
    print("metrics: " + json.dumps({key: result[key] for key in ("greedy_accuracy", f"avg@{k}", f"pass@{k}",
                                                                 "format_rate", "steps_run", "cached")}))
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # transformers' own save/load bars: noise next to ours
    if args.action == "build":
        return _build_warm(args) if args.warm_start else _build_plain(args)
    return 2  # pragma: no cover - argparse enforces the sub-command
