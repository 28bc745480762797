"""The ``mmrlvr`` command line: a thin dispatcher.

Each sub-command lives next to the code it drives and exposes ``main(argv: list[str]) -> int``; this
module only routes to it (imports are lazy so ``mmrlvr --help`` is fast) and turns ``UserError`` into a
one-paragraph message with exit status 2 instead of a traceback. A file the user named that cannot be
read or written (``OSError`` with a file name) is reported the same way; ``MMRLVR_DEBUG=1`` shows the
traceback instead. Output piped into a reader that stops early (``mmrlvr train --help-config | head``)
ends quietly, as Unix tools do.
"""

from __future__ import annotations

import importlib
import os
import sys

from mmrlvr.errors import UserError

# sub-command -> (module with main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("mmrlvr.train.demo", "build the tiny VLM + data, train with every feature on, print before/after"),
    "train": ("mmrlvr.train.cli", "train from a YAML config: mmrlvr train CONFIG.yaml [key=value ...] [--resume]"),
    "eval": ("mmrlvr.train.heldout", "evaluate a run, export or model folder: avg@k, pass@k, greedy accuracy"),
    "export": ("mmrlvr.train.export", "a run as a transformers/vLLM folder: mmrlvr export RUN_DIR --out DIR [--merge]"),
    "tiny": ("mmrlvr.models.cli", "build an offline tiny Qwen-family VLM: mmrlvr tiny build --family ... --out DIR"),
    "data": ("mmrlvr.data.cli", "make synthetic visual tasks: mmrlvr data synth --task TASK --split ... --n N --out DIR"),
    "rubric": ("mmrlvr.rubric.cli", "rubric authoring: validate | preview | score | agreement"),
    "inspect": ("mmrlvr.inspector.cli", "open the Gradio rollout inspector on a run directory"),
    "analyze": ("mmrlvr.analysis.cli", "what RL did to the model: mmrlvr analyze SUBCOMMAND RUN_DIR ... (docs/analysis.md)"),
}


def _usage() -> str:
    lines = ["usage: mmrlvr COMMAND [options]", "", "commands:"]
    width = max(len(c) for c in COMMANDS)
    for name, (_, help_) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {help_}")
    lines.append("")
    lines.append("Run `mmrlvr COMMAND --help` for the options of one command.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run one command; a closed stdout pipe (``| head``) ends quietly wherever it shows."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:
        return _broken_pipe()


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from mmrlvr import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"mmrlvr: unknown command {name!r}.\n\n{_usage()}", file=sys.stderr)
        return 2
    debug = os.environ.get("MMRLVR_DEBUG", "") not in ("", "0")
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except UserError as exc:
        if debug:
            raise
        print(f"mmrlvr {name}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # main() handles it
    except KeyboardInterrupt:
        print(f"mmrlvr {name}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if debug or exc.filename is None:
            raise
        print(f"mmrlvr {name}: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2


def _broken_pipe() -> int:
    """The reader of our stdout went away (``| head``): stop quietly, as Unix tools do (status 141)."""
    try:  # later flushes (at interpreter exit) must not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
