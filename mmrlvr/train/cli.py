"""``mmrlvr train CONFIG.yaml [key=value ...] [--resume]``: one training run from a config file."""

from __future__ import annotations

import argparse
import json

from mmrlvr.config import describe, load_config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mmrlvr train",
        description="Train a VLM with GRPO-family RL from a YAML config. Overrides: dotted key=value, "
                    "e.g. algo.loss=gspo rollout.group_size=8 optim.lr=1e-5.",
    )
    p.add_argument("config", nargs="?", help="YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    p.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint in output_dir")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and help")
    p.add_argument("--dry-run", action="store_true", help="validate the config, print it and exit")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.help_config:
        print("\n".join(describe()))
        return 0
    if not args.config:
        build_parser().error("a CONFIG.yaml is required (or --help-config)")
    cfg = load_config(args.config, args.overrides)
    if args.dry_run:
        print(cfg.to_yaml())
        return 0
    from mmrlvr.train.trainer import Trainer

    trainer = Trainer(cfg, resume=args.resume)
    summary = trainer.train()
    if trainer.is_main:
        print(json.dumps({k: v for k, v in summary.items() if k != "last"}, indent=2, default=float))
        print(f"run directory: {cfg.output_dir}")
    return 0
