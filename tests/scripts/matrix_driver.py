"""Run matrix cases one after another in this process (1 process, or each rank of a torchrun launch).

    python tests/scripts/matrix_driver.py OUT_DIR STRATEGY CASE [CASE ...]

Each case goes through ``mmrlvr train``'s own entry point (validation, run folder, trainer), so what runs is
what a user's command runs; one process per side keeps the matrix within CI's time (imports and the process
group once, not per case). A case that fails stops the launch (a failing rank stops every rank).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from matrix_cases import cases  # noqa: E402

from mmrlvr.train.cli import main  # noqa: E402


def run(out: Path, strategy: str, names: list[str]) -> None:
    by_name = {c.name: c for c in cases()}
    for name in names:
        t0 = time.perf_counter()
        code = main(by_name[name].argv(out, strategy))
        if code:
            raise SystemExit(f"matrix case {name} ({strategy}) exited {code}")
        print(f"matrix: {name} {strategy} ok in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    run(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
