"""``mmrlvr data synth`` lists and writes every synthetic task that training accepts (``data.train: synth:TASK``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmrlvr.cli import main
from mmrlvr.data.synth import TASKS
from mmrlvr.data.synth_video import VIDEO_TASKS
from mmrlvr.train.data import RUBRIC_SYNTH_TASKS

ROOT = Path(__file__).resolve().parents[1]
ALL_TASKS = TASKS + VIDEO_TASKS + RUBRIC_SYNTH_TASKS


def _run(*code_or_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code_or_args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_help_lists_every_registered_task_without_torch():
    res = _run("-m", "mmrlvr.cli", "data", "synth", "--help")
    assert res.returncode == 0, res.stderr
    words = {w.strip(",;:.()") for w in res.stdout.split()}
    missing = [t for t in ALL_TASKS if t not in words]
    assert not missing, f"not listed by `mmrlvr data synth --help`: {missing}\n{res.stdout}"
    assert {"video_count", "rubric_count"} <= set(ALL_TASKS)
    probe = _run("-c", "import sys\nfrom mmrlvr.cli import main\ntry:\n    main(['data', 'synth', '--help'])\n"
                       "except SystemExit:\n    pass\nprint('TORCH', 'torch' in sys.modules)")
    assert probe.returncode == 0, probe.stderr
    assert "TORCH False" in probe.stdout


def _load(path: Path):
    from mmrlvr.data import load_samples

    samples, _report = load_samples(str(path))
    return samples


def test_video_count_writes_the_training_rows(tmp_path, capsys):
    out = tmp_path / "video"
    assert main(["data", "synth", "--task", "video_count", "--split", "train", "--n", "2", "--out", str(out)]) == 0
    assert "wrote 2 video_count/train rows (seed 0, 56px" in capsys.readouterr().out
    from mmrlvr.data import rows_to_samples
    from mmrlvr.data.synth_video import make_video_rows

    got, want = _load(out), rows_to_samples(make_video_rows("video_count", "train", 2))
    assert len(got) == 2
    for a, b in zip(got, want):
        assert a.answer == b.answer and a.messages == b.messages
        fa, fb = a.meta["videos"][0]["frames"], b.meta["videos"][0]["frames"]
        assert len(fa) == len(fb) == 4
        assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(fa, fb))


def test_rubric_count_writes_rows_with_their_rubric(tmp_path, capsys):
    out = tmp_path / "rubric"
    assert main(["data", "synth", "--task", "rubric_count", "--split", "test", "--n", "2", "--out", str(out)]) == 0
    assert "wrote 2 rubric_count/test rows (seed 0, 112px" in capsys.readouterr().out
    from mmrlvr.rubric.synth import rubric_samples

    got, want = _load(out), rubric_samples(2, "test", seed=0)
    assert len(got) == 2
    for a, b in zip(got, want):
        assert a.rubric and a.rubric == b.rubric
        assert a.answer == b.answer and a.messages == b.messages


@pytest.mark.parametrize("task", ALL_TASKS)
def test_every_listed_task_writes(tmp_path, task):
    assert main(["data", "synth", "--task", task, "--split", "train", "--n", "2", "--out", str(tmp_path / task)]) == 0
    assert len(_load(tmp_path / task)) == 2
