"""``mmrlvr data synth`` (write a synthetic visual task) and ``mmrlvr data inspect`` (check a dataset).

    mmrlvr data synth --task count --split train --n 2000 --out data/count-train [--seed 0] [--image-size 112]
    mmrlvr data synth --task video_count --split train --n 200 --out data/video-train
    mmrlvr data synth --task rubric_count --split train --n 200 --out data/rubric-train
    mmrlvr data inspect data/train.parquet [--format auto] [--rows 3] [--max-prompt-length 1024]

The tasks are every name ``data.train: synth:TASK`` accepts, read from the live registries
(``synth_tasks``): the image tasks of ``mmrlvr.data.synth``, the video tasks of ``mmrlvr.data.synth_video``
and the rubric tasks of ``mmrlvr.train.data`` (rows with an instance rubric, ``mmrlvr.rubric.synth``).
``inspect`` is described in ``mmrlvr.data.inspect``.

The folder is readable with ``datasets.load_from_disk`` and with ``mmrlvr.data.load_samples``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from mmrlvr.data.synth import SPLITS, TASKS
from mmrlvr.data.synth_video import FRAME_SIZE, VIDEO_TASKS
from mmrlvr.errors import UserError


class _Parser(argparse.ArgumentParser):
    """argparse that raises UserError (one paragraph, exit 2 from mmrlvr.cli) instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message}\n\n{self.format_usage().strip()}")


def synth_tasks() -> dict[str, str]:
    """Every synthetic task, in listing order, -> its kind ("image", "video" or "rubric").

    Read from the registries training uses (``mmrlvr.data.synth.TASKS``,
    ``mmrlvr.data.synth_video.VIDEO_TASKS``, ``mmrlvr.train.data.RUBRIC_SYNTH_TASKS``), so a task added
    there is listed and accepted here. None of them imports torch."""
    from mmrlvr.train.data import RUBRIC_SYNTH_TASKS

    return {**{t: "image" for t in TASKS}, **{t: "video" for t in VIDEO_TASKS},
            **{t: "rubric" for t in RUBRIC_SYNTH_TASKS}}


def _synth_rows(task: str, kind: str, split: str, n: int, seed: int, size: int,
                progress: Callable[[int], None]) -> list[dict[str, Any]]:
    """The rows of one synthetic task, made as ``data.train: synth:TASK`` makes them (which uses seed 0)."""
    if kind == "video":
        from mmrlvr.data.synth_video import make_video_row

        rows = []
        for i in range(n):
            rows.append(make_video_row(task, split, i, seed, frame_size=size))
            progress(1)
        return rows
    if kind == "rubric":
        from mmrlvr.rubric.synth import rubric_rows

        if task != "rubric_count":  # the only rubric task so far; mmrlvr.train.data builds it the same way
            raise UserError(f"no writer for the rubric task {task!r} yet")
        return rubric_rows(n, split, seed=seed, image_size=size, progress=progress)
    from mmrlvr.data.synth import make_rows

    return make_rows(task, split, n, seed=seed, image_size=size, progress=progress)


def _parser() -> argparse.ArgumentParser:
    tasks = synth_tasks()
    parser = _Parser(prog="mmrlvr data", description="Synthetic visual tasks with verifiable answers; dataset checks.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    synth = sub.add_parser("synth", help="write a synthetic task as a datasets folder (save_to_disk)",
                           description="Write a synthetic task as a datasets folder (save_to_disk).")
    synth.add_argument("--task", required=True,
                       help="one of: " + "; ".join(f"{kind}: {', '.join(t for t, k in tasks.items() if k == kind)}"
                                                   for kind in dict.fromkeys(tasks.values())))
    synth.add_argument("--split", required=True, help=f"one of: {', '.join(SPLITS)} (never share a scene)")
    synth.add_argument("--n", type=int, required=True, help="number of rows")
    synth.add_argument("--out", required=True, help="output folder (created; an existing dataset is replaced)")
    synth.add_argument("--seed", type=int, default=0, help="seed of the row streams (default 0)")
    synth.add_argument("--image-size", type=int, default=None,
                       help=f"image side in pixels (default 112; video tasks: frame side, default {FRAME_SIZE})")
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
    tasks = synth_tasks()
    if args.task not in tasks:
        raise UserError(f"unknown task {args.task!r}; tasks: {', '.join(tasks)}")
    kind = tasks[args.task]
    size = args.image_size if args.image_size is not None else (FRAME_SIZE if kind == "video" else 112)
    if size < 56:
        raise UserError(f"--image-size must be at least 56 pixels, got {size}")
    if args.split not in SPLITS:
        raise UserError(f"unknown split {args.split!r}; splits: {', '.join(SPLITS)}")
    if args.n <= 0:
        raise UserError(f"--n must be a positive number of rows, got {args.n}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")

    import datasets
    from tqdm.auto import tqdm

    from mmrlvr.data.synth import save_rows

    datasets.disable_progress_bars()  # one bar (ours) rather than datasets' "Saving the dataset" bar too
    t0 = time.perf_counter()
    with tqdm(total=args.n, desc=f"{args.task}/{args.split}", unit="row") as bar:
        rows = _synth_rows(args.task, kind, args.split, args.n, args.seed, size, bar.update)
        path = save_rows(rows, out)
    elapsed = time.perf_counter() - t0
    answers = Counter(datasets.load_from_disk(str(path))["answer"])
    spread = (f"{len(answers)} distinct answers" if len(answers) > 8
              else "answers " + " ".join(f"{a}:{n}" for a, n in sorted(answers.items())))
    print(f"wrote {args.n} {args.task}/{args.split} rows (seed {args.seed}, {size}px, {spread}) "
          f"to {path} in {elapsed:.1f}s")
    return 0
