"""Longest test files first: how the parallel suite ends with its workers together.

xdist (``--dist loadfile``) hands a worker one whole file at a time, in collection order
(``--no-loadscope-reorder``), and the next one when the worker has at most two tests left. In alphabetical order a
few long files (the stage goldens, the two-process runs, the learning checks) came late, and one worker ran the
last of them while the other idled: replaying a recorded run's test times through that hand-out rule, the suite
on 2 workers ended ~1 minute after the point where both could have. Sorted longest first (the longest-processing-
time rule of scheduling), the replay ends within a few seconds of it.

The times come from a full run: ``python -m pytest --record-file-times`` writes ``RECORD`` (per file, the
seconds its tests' set-up, call and tear-down took, as the workers reported them). A stale record only costs
balance, never a result: a file it lacks is estimated from its number of tests (a file with a ``slow`` test goes
first, as before there was a record).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable

RECORD = Path(__file__).with_name("data") / "file_times.json"


def file_of(nodeid: str) -> str:
    """The file a test id belongs to (``tests/test_x.py::test_y[a]`` -> ``tests/test_x.py``): xdist's unit."""
    return nodeid.split("::", 1)[0]


def load_record(path: Path = RECORD) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def estimated_seconds(tests_per_file: dict[str, int], slow_files: set[str],
                      record: dict[str, float]) -> dict[str, float]:
    """Each file's expected seconds: the record's, else ``tests x`` the record's mean seconds a test; a file with
    a slow test that the record lacks counts as longer than every recorded one."""
    recorded_tests = sum(n for f, n in tests_per_file.items() if f in record)
    per_test = sum(record[f] for f in tests_per_file if f in record) / recorded_tests if recorded_tests else 0.0
    longest = max(record.values(), default=0.0)
    out = {}
    for f, n in tests_per_file.items():
        if f in record:
            out[f] = record[f]
        elif f in slow_files:
            out[f] = longest + 1.0
        else:
            out[f] = n * per_test
    return out


def order_longest_first(items: list, record: dict[str, float]) -> None:
    """Sort collected ``items`` in place: files by expected seconds, longest first; a file's tests stay together
    and in their order, and ties keep the collection order (so every worker computes the same order)."""
    tests_per_file: dict[str, int] = defaultdict(int)
    slow_files = set()
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        f = file_of(item.nodeid)
        tests_per_file[f] += 1
        first_seen.setdefault(f, i)
        if "slow" in item.keywords:
            slow_files.add(f)
    seconds = estimated_seconds(dict(tests_per_file), slow_files, record)
    items.sort(key=lambda item: (-seconds[file_of(item.nodeid)], first_seen[file_of(item.nodeid)]))


class Recorder:
    """Sums the reported durations per file (set-up, call and tear-down reports alike)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, duration: float) -> None:
        self.seconds[file_of(nodeid)] += duration

    def write(self, path: Path = RECORD, *, existing: Iterable[str] = ()) -> dict[str, float]:
        """Merge this run's files into the record at ``path`` (files it did not run keep their times, as long as
        they are among ``existing``, the files that still exist); returns what was written."""
        keep = set(existing)
        merged = {f: s for f, s in load_record(path).items() if f in keep}
        merged.update({f: round(s, 1) for f, s in self.seconds.items()})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
        return merged
