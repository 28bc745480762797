"""``mmrlvr analyze SUBCOMMAND ...``: one analysis of a run's checkpoints or rollouts per sub-command.

Each sub-command lives in its own module of ``mmrlvr.analysis`` with ``add_arguments(parser)`` and
``run(args) -> Path`` (the folder it wrote); this module only routes (imports are lazy, so ``--help`` is fast).
"""

from __future__ import annotations

import argparse
import importlib

#: sub-command -> (module, one-line help)
ANALYSES: dict[str, tuple[str, str]] = {
    "trajectory": ("mmrlvr.analysis.trajectory",
                   "rank-1 structure of the weight updates over saved steps (RELEX); --extrapolate STEP"),
    "taskvec": ("mmrlvr.analysis.taskvec", "SFT vs RL task vectors: magnitudes, sign conflicts, per module (DoTS)"),
    "tensors": ("mmrlvr.analysis.tensors", "which attention projections carry the RL update: off-principal energy (MAST)"),
    "saturation": ("mmrlvr.analysis.saturation", "training reward vs held-out accuracy: the pre-saturation phase"),
    "tokens": ("mmrlvr.analysis.tokens", "per-token Δlog-prob between two checkpoints over stored rollouts"),
    "prefix": ("mmrlvr.analysis.prefix", "shortest thinking prefix still answered correctly: redundancy (ThoughtFold)"),
    "sensitivity": ("mmrlvr.analysis.sensitivity", "answer flip rate under image perturbations per checkpoint"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmrlvr analyze", description="What RL did to the model, from a run's "
                                "checkpoints and rollouts; each writes RUN_DIR/analysis/<name>/ (docs/analysis.md).")
    sub = p.add_subparsers(dest="analysis", metavar="SUBCOMMAND", required=True)
    for name, (_, help_) in ANALYSES.items():
        sub.add_parser(name, help=help_, description=help_)  # its own arguments: the module adds them (main)
    return p


def main(argv: list[str]) -> int:
    parser = build_parser()
    if argv and argv[0] in ANALYSES:  # the chosen module adds its arguments (only that one is imported)
        module = importlib.import_module(ANALYSES[argv[0]][0])
        sub = argparse.ArgumentParser(prog=f"mmrlvr analyze {argv[0]}", description=ANALYSES[argv[0]][1])
        module.add_arguments(sub)
        args = sub.parse_args(argv[1:])
        out = module.run(args)
        print(f"wrote {out}")
        return 0
    parser.parse_args(argv)  # --help, or an unknown sub-command: argparse says so (exit 2)
    return 2
