"""``mmrlvr data synth`` (write a synthetic visual task) and ``mmrlvr data inspect`` (check a dataset).

    mmrlvr data synth --task count --split train --n 2000 --out data/count-train [--seed 0] [--image-size 112]
    mmrlvr data inspect data/train.parquet [--format auto] [--rows 3] [--max-prompt-length 1024]

``inspect`` is described in ``mmrlvr.data.inspect``.

The folder is readable with ``datasets.load_from_disk`` and with ``mmrlvr.data.load_samples``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from mmrlvr.data.synth import SPLITS, TASKS
from mmrlvr.errors import UserError


class _Parser(argparse.ArgumentParser):
    """argparse that raises UserError (one paragraph, exit 2 from mmrlvr.cli) instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message}\n\n{self.format_usage().strip()}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mmrlvr data", description="Synthetic visual tasks with verifiable answers; dataset checks.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    synth = sub.add_parser("synth", help="write a synthetic task as a datasets folder (save_to_disk)",
                           description="Write a synthetic task as a datasets folder (save_to_disk).")
    synth.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
    synth.add_argument("--split", required=True, help=f"one of: {', '.join(SPLITS)} (never share a scene)")
    synth.add_argument("--n", type=int, required=True, help="number of rows")
    synth.add_argument("--out", required=True, help="output folder (created; an existing dataset is replaced)")
    synth.add_argument("--seed", type=int, default=0, help="seed of the row streams (default 0)")
    synth.add_argument("--image-size", type=int, default=112, help="image side in pixels (default 112)")
    from mmrlvr.data.inspect import add_arguments

    inspect = sub.add_parser("inspect", help="show a dataset as the model will see it, and every problem in it",
                             description="Show the detected layout, the first rows rendered through the chat "
                                         "template (image markers, token counts), and every problem with its "
                                         "row and field. Exit 0: no problem; 1: some rows have problems; "
                                         "2: the file cannot be used.")
    add_arguments(inspect)
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "inspect":
        from mmrlvr.data.inspect import run

        return run(args)
    if args.command != "synth":
        parser.print_help()
        return 0 if args.command is None else 2
    if args.task not in TASKS:
        raise UserError(f"unknown task {args.task!r}; tasks: {', '.join(TASKS)}")
    if args.split not in SPLITS:
        raise UserError(f"unknown split {args.split!r}; splits: {', '.join(SPLITS)}")
    if args.n <= 0:
        raise UserError(f"--n must be a positive number of rows, got {args.n}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")

    import datasets
    from tqdm.auto import tqdm

    from mmrlvr.data.synth import write_dataset

    datasets.disable_progress_bars()  # one bar (ours) rather than datasets' "Saving the dataset" bar too
    t0 = time.perf_counter()
    with tqdm(total=args.n, desc=f"{args.task}/{args.split}", unit="row") as bar:
        path = write_dataset(args.task, args.split, args.n, out, seed=args.seed, image_size=args.image_size,
                             progress=bar.update)
    elapsed = time.perf_counter() - t0
    answers = Counter(datasets.load_from_disk(str(path))["answer"])
    spread = (f"{len(answers)} distinct answers" if len(answers) > 8
              else "answers " + " ".join(f"{a}:{n}" for a, n in sorted(answers.items())))
    print(f"wrote {args.n} {args.task}/{args.split} rows (seed {args.seed}, {args.image_size}px, {spread}) "
          f"to {path} in {elapsed:.1f}s")
    return 0
