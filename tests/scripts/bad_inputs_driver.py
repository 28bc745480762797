"""Run many ``mmrlvr`` command lines in one process and report, per case, what a user would see.

Usage: ``python bad_inputs_driver.py CASES.json RESULTS.json``. CASES is a list of ``{"id", "argv"}``;
RESULTS gets ``{"id", "rc", "stderr", "stdout", "seconds", "heavy", "created"}`` per case (``created``: the
case's ``run_dir`` exists right after it ran, and did not before), where ``heavy`` lists the
model-side packages (torch, transformers, ...) the case imported: a case that loads a model imports them,
so an empty list proves the case failed before any model load. One process keeps the battery fast
(Python and mmrlvr start once); ``tests/test_bad_inputs.py`` also runs a few cases as real processes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback

HEAVY = ("torch", "transformers", "accelerate", "peft", "vllm")


def run_case(argv: list[str]) -> tuple[object, str, str]:
    from mmrlvr.cli import main as cli

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc: object = cli(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException:  # what the real process would show as a traceback
            rc = "raised"
            err.write(traceback.format_exc())
    return rc, err.getvalue(), out.getvalue()


def main() -> None:
    cases = json.loads(open(sys.argv[1]).read())
    results = []
    for case in cases:
        before = {m for m in HEAVY if m in sys.modules}
        run_dir = case.get("run_dir")
        existed = bool(run_dir) and os.path.exists(run_dir)
        t0 = time.perf_counter()
        rc, err, out = run_case(case["argv"])
        seconds = time.perf_counter() - t0
        after = {m for m in HEAVY if m in sys.modules}
        results.append({"id": case["id"], "rc": rc, "stderr": err, "stdout": out, "seconds": seconds,
                        "heavy": sorted(after - before),
                        "created": bool(run_dir) and not existed and os.path.exists(run_dir)})
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
