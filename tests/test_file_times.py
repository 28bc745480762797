"""The parallel suite hands out its longest files first (tests/file_times.py) and records the times it orders by."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.file_times import RECORD, Recorder, estimated_seconds, load_record, order_longest_first

ROOT = Path(__file__).resolve().parents[1]


def _items(spec):
    """Fake collected items: (file, test name, slow?) in collection order."""
    return [SimpleNamespace(nodeid=f"tests/{f}::{t}", keywords={"slow": True} if slow else {}) for f, t, slow in spec]


def test_files_go_longest_first_keeping_each_files_tests_together_and_in_order():
    items = _items([("a.py", "t1", False), ("a.py", "t2", False), ("b.py", "t1", False), ("c.py", "t1", False),
                    ("c.py", "t2", False), ("d.py", "t1", False)])
    order_longest_first(items, {"tests/a.py": 3.0, "tests/b.py": 50.0, "tests/c.py": 10.0, "tests/d.py": 10.0})
    # b (50 s), then c and d (10 s each: a tie keeps collection order), then a (3 s); inside a file, the same order
    assert [i.nodeid for i in items] == ["tests/b.py::t1", "tests/c.py::t1", "tests/c.py::t2", "tests/d.py::t1",
                                         "tests/a.py::t1", "tests/a.py::t2"]


def test_a_file_missing_from_the_record_is_estimated_and_a_slow_one_goes_first():
    seconds = estimated_seconds({"tests/a.py": 4, "tests/new.py": 3, "tests/new_slow.py": 1, "tests/b.py": 1},
                                {"tests/new_slow.py"}, {"tests/a.py": 6.0, "tests/b.py": 4.0})
    # the record's mean is (6 + 4) / (4 + 1) = 2 s a test: the new file's 3 tests count 6 s; the unrecorded file
    # with a slow test counts as longer than the longest recorded one
    assert seconds == {"tests/a.py": 6.0, "tests/new.py": 6.0, "tests/new_slow.py": 7.0, "tests/b.py": 4.0}
    items = _items([("a.py", "t", False), ("new_slow.py", "t", True), ("b.py", "t", False)])
    order_longest_first(items, {})  # no record at all: slow files first, the others as collected
    assert [i.nodeid for i in items] == ["tests/new_slow.py::t", "tests/a.py::t", "tests/b.py::t"]


def test_the_recorder_sums_each_files_reports_and_keeps_other_existing_files(tmp_path):
    path = tmp_path / "times.json"
    path.write_text(json.dumps({"tests/kept.py": 9.0, "tests/gone.py": 5.0, "tests/a.py": 100.0}))
    rec = Recorder()
    for nodeid, seconds in [("tests/a.py::t1", 0.5), ("tests/a.py::t1", 2.0), ("tests/a.py::t2[x]", 1.25),
                            ("tests/b.py::t", 0.04)]:
        rec.add(nodeid, seconds)  # set-up, call and tear-down reports of one test add up
    written = rec.write(path, existing=["tests/kept.py", "tests/a.py", "tests/b.py"])
    assert written == {"tests/a.py": 3.8, "tests/b.py": 0.0, "tests/kept.py": 9.0}  # gone.py no longer exists
    assert load_record(path) == written
    assert load_record(tmp_path / "missing.json") == {}


def test_the_shipped_record_names_only_files_that_exist():
    record = load_record()
    assert len(record) > 100
    missing = [f for f in record if not (ROOT / f).is_file()]
    assert not missing, f"{RECORD} names files that are gone: {missing}; rerun `python -m pytest --record-file-times`"


def test_a_parallel_collection_is_ordered_by_the_record():
    """The premise: conftest applies the order when xdist workers collect (they see PYTEST_XDIST_WORKER_COUNT)."""
    picked = ["tests/test_config.py", "tests/test_learning.py", "tests/test_stage_goldens.py"]
    record = load_record()
    expected = sorted(picked, key=lambda f: -record[f])
    assert expected != picked  # the order must change for the check to mean anything
    env = {**os.environ, "PYTEST_XDIST_WORKER_COUNT": "2"}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-m", "", *picked],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    files = []
    for line in out.splitlines():
        if "::" in line and line.split("::")[0] not in files:
            files.append(line.split("::")[0])
    assert files == expected


def test_the_pytest_option_records_the_files_it_ran(tmp_path):
    """``python -m pytest --record-file-times[=PATH]`` end to end (to a scratch file: the shipped record stays)."""
    out = tmp_path / "times.json"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          f"--record-file-times={out}", "tests/test_file_times.py", "-k", "longest_first or estimated"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout[-2000:]
    record = json.loads(out.read_text())
    assert list(record) == ["tests/test_file_times.py"] and record["tests/test_file_times.py"] >= 0
    assert f"file times of 1 files written to {out}" in res.stdout
