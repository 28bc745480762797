"""``mmrlvr demo``: the main job, end to end on a CPU in minutes.

Builds (or reuses from the cache) the warm-started tiny Qwen2.5-VL and the synthetic counting data,
trains with the embedded config (``mmrlvr/train/demo.yaml``), evaluates before and after, prints a
before -> after table and the run directory, saves the run's curves as PNG, and with ``--inspect`` opens
the inspector on the run.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml


def demo_config_dict() -> dict[str, Any]:
    return yaml.safe_load(resources.files("mmrlvr.train").joinpath("demo.yaml").read_text())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmrlvr demo", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/demo", help="run directory")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the embedded config's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-size", type=int, default=None,
                   help="held-out prompts evaluated before and after (default: the embedded config's 200 for a full "
                        "run; scaled down with a shorter --steps, at least 16)")
    p.add_argument("--inspect", action="store_true", help="open the inspector on the run afterwards")
    p.add_argument("--save-every", type=int, default=None, metavar="N",
                   help="checkpoint every N steps (default: the embedded config's, 100)")
    p.add_argument("--keep-all", action="store_true",
                   help="keep every checkpoint (keep_checkpoints: 0), e.g. for mmrlvr analyze trajectory")
    p.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    return p


MIN_EVAL_SIZE = 16


def demo_eval_size(config: dict[str, Any], steps: int | None, eval_size: int | None,
                   overrides: list[str]) -> int | None:
    """The eval size override for a demo run (None: keep the config's).

    ``--eval-size`` wins, then a ``data.eval_size=`` override; otherwise a shorter ``--steps`` scales the
    evaluation down in proportion (``--steps 3`` must not spend minutes on 2 x 200 x 8 eval samples), to at
    least ``MIN_EVAL_SIZE`` prompts.

    >>> cfg = {"max_steps": 200, "data": {"eval_size": 200}}
    >>> demo_eval_size(cfg, 3, None, []), demo_eval_size(cfg, 50, None, []), demo_eval_size(cfg, None, None, [])
    (16, 50, None)
    >>> demo_eval_size(cfg, 3, 40, []), demo_eval_size(cfg, 3, None, ["data.eval_size=8"])
    (40, None)
    """
    if eval_size is not None:
        if eval_size < 1:
            from mmrlvr.errors import UserError

            raise UserError(f"--eval-size must be >= 1, got {eval_size}")
        return eval_size
    if any(o.split("=", 1)[0].strip() == "data.eval_size" for o in overrides):
        return None
    full_steps, full_size = int(config.get("max_steps", 0)), int(config.get("data", {}).get("eval_size", 0))
    if steps is None or not full_steps or not full_size or steps >= full_steps:
        return None
    return min(full_size, max(MIN_EVAL_SIZE, round(full_size * steps / full_steps)))


def format_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A short before -> after table of the eval metrics that both sides have."""
    k = before.get("k", after.get("k", 8))
    rows = [("greedy accuracy", "greedy_accuracy"), (f"avg@{k} accuracy (T=1)", f"avg@{k}"), (f"pass@{k}", f"pass@{k}"),
            ("format rate", "format_rate"), ("inconsistency rate", "inconsistency_rate"),
            ("rubric score", "rubric")]
    lines = [f"{'metric':<24}{'before':>10}{'after':>10}{'change':>10}"]
    for label, key in rows:
        if key in before and key in after and before[key] is not None and after[key] is not None:
            b, a = float(before[key]), float(after[key])
            lines.append(f"{label:<24}{b:>10.3f}{a:>10.3f}{a - b:>+10.3f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from mmrlvr.config import load
    from mmrlvr.train.trainer import Trainer

    overrides = [f"output_dir={args.out}", f"seed={args.seed}", *args.overrides]
    if args.save_every is not None:
        overrides.append(f"save_every={args.save_every}")
    if args.keep_all:
        overrides.append("keep_checkpoints=0")
    if args.steps is not None:
        overrides.append(f"max_steps={args.steps}")
    eval_size = demo_eval_size(demo_config_dict(), args.steps, args.eval_size, args.overrides)
    if eval_size is not None:
        overrides.append(f"data.eval_size={eval_size}")
    loaded = load(data=demo_config_dict(), overrides=overrides)  # its notes are printed when the run starts
    cfg = loaded.config
    print(f"mmrlvr demo: training {cfg.model.path} on {cfg.data.train} for {cfg.max_steps} steps -> {cfg.output_dir}")
    if eval_size is not None and args.eval_size is None:
        print(f"mmrlvr demo: evaluating on {eval_size} held-out prompts (scaled with --steps; --eval-size N to change)")
    trainer = Trainer(loaded)
    summary = trainer.train()
    before, after = summary.get("before", {}), summary.get("after", {})
    print()
    print(format_table(before, after))
    from mmrlvr.train.plots import plot_run

    png = plot_run(Path(cfg.output_dir))
    print(f"\nrun directory: {cfg.output_dir}")
    if png:
        print(f"curves: {png}")
    print(f"inspect it:    mmrlvr inspect {cfg.output_dir}")
    (Path(cfg.output_dir) / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    if args.inspect:
        from mmrlvr.inspector.cli import main as inspect_main

        return inspect_main([cfg.output_dir])
    return 0
