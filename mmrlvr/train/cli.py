"""``mmrlvr train CONFIG.yaml [key=value ...] [--resume | --overwrite] [--dry-run]``: one run from a config.

Flags and ``key=value`` overrides mix in any order. Everything that can be checked before the model loads
is checked first (``mmrlvr.validation.check_run``) and reported at once; then the run folder is prepared
(``mmrlvr.train.run_dir.prepare_run_dir``: never clobbered, locked for this run) and training starts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmrlvr.config import describe


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mmrlvr train", allow_abbrev=False,  # `--resum` must not silently mean --resume
        description="Train a VLM with GRPO-family RL from a YAML config. Overrides: dotted key=value, "
                    "e.g. algo.loss=gspo rollout.group_size=8 optim.lr=1e-5.",
    )
    p.add_argument("config", nargs="?", help="YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    p.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint in output_dir")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing run in output_dir (removed atomically before the new run starts)")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept a config that differs from the run's in keys that break exactness")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and help")
    p.add_argument("--dry-run", action="store_true",
                   help="check the config, data, rewards, stages, run folder and judge endpoints; print the config and the "
                        "plan (what runs, why, with which settings) and exit")
    p.add_argument("--config-only", action="store_true",
                   help="with --dry-run: check only what the config decides (names, types, ranges, rewards), not "
                        "the model, data, packages or run folder of this machine (a config for another machine)")
    return p


def _reward_and_credit_lines() -> list[str]:
    """The rewards and credit schemes with their parameters (their registries took ``params`` mappings first)."""
    import mmrlvr.consistency.reward  # noqa: F401  (registers "consistency")
    import mmrlvr.rewards  # noqa: F401
    import mmrlvr.rubric.reward  # noqa: F401  (registers "rubric")
    from mmrlvr.credit.schemes import CREDIT_SCHEMES
    from mmrlvr.methods import parameter_lines
    from mmrlvr.rewards.base import REWARDS

    return (parameter_lines("rewards[i].name (rewards; parameters under rewards[i].params):",
                            [(n, REWARDS.get(n)) for n in REWARDS.names()])
            + parameter_lines("credit.scheme (credit schemes; parameters under credit.scheme_params):",
                              [(n, CREDIT_SCHEMES.get(n)) for n in CREDIT_SCHEMES.names()]))


def main(argv: list[str]) -> int:
    args = build_parser().parse_intermixed_args(argv)  # flags before, between or after overrides
    if args.help_config:
        from mmrlvr.methods import help_lines

        if args.config and Path(args.config).is_file():  # plug-ins the config names list their methods too
            from mmrlvr.config import collect_config
            from mmrlvr.plugins import load_run_plugins

            cfg = collect_config(args.config).config
            load_run_plugins(cfg.output_dir, cfg.plugins, quiet=True)  # a run's config.yaml: its copies too
        print("\n".join(describe()))
        print("\nmethods and their parameters (set them under the params key beside the name):")
        print("\n".join(help_lines()))
        print("\n".join(_reward_and_credit_lines()))
        return 0
    if args.config and "=" in args.config and not Path(args.config).is_file():
        # overrides written before the config file: the first word without "=" is the config
        words = [args.config, *args.overrides]
        first = next((w for w in words if "=" not in w), None)
        if first is not None:
            words.remove(first)
        args.config, args.overrides = first, words
    if not args.config:
        build_parser().error("a CONFIG.yaml is required (or --help-config)")
    from mmrlvr.validation import check_run

    if args.config_only and not args.dry_run:
        build_parser().error("--config-only goes with --dry-run (a run needs its model, data and folder checked)")
    loaded = check_run(args.config, args.overrides, dry_run=args.dry_run, resume=args.resume,
                       overwrite=args.overwrite, allow_config_change=args.allow_config_change,
                       environment=not args.config_only)
    cfg = loaded.config
    if args.dry_run:
        print(cfg.to_yaml())  # secrets redacted
        # the plan as YAML comments: stdout stays the resolved config, readable by yaml.safe_load
        plan = loaded.plan
        lines = [f"note: {n}" for n in loaded.notes] + (
            plan.lines() if plan is not None else ["plan: not built (the plug-ins are files of another machine)"])
        print("\n".join(f"# {ln}" for ln in lines))
        return 0
    from mmrlvr.train.run_dir import prepare_run_dir

    lock = prepare_run_dir(cfg, resume=args.resume, overwrite=args.overwrite,
                           allow_config_change=args.allow_config_change, where=str(args.config))
    from mmrlvr.train.distributed import stop_all_ranks_on_failure

    try:
        from mmrlvr.train.trainer import Trainer

        with stop_all_ranks_on_failure():  # several processes: a failing rank stops them all, never a hang
            trainer = Trainer(loaded, resume=args.resume)
            summary = trainer.train()
    finally:
        lock.release()
    if trainer.is_main:
        print(json.dumps({k: v for k, v in summary.items() if k != "last"}, indent=2, default=float))
        print(f"run directory: {cfg.output_dir}")
    return 0
