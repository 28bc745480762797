"""``mmrlvr data synth`` through the real dispatcher."""

from __future__ import annotations

import datasets
import pytest

from mmrlvr.cli import main


def test_synth_writes_a_loadable_dataset(tmp_path, capsys):
    out = tmp_path / "count-train"
    assert main(["data", "synth", "--task", "count", "--split", "train", "--n", "40", "--out", str(out),
                 "--seed", "1"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("wrote 40 count/train rows (seed 1, 112px, answers 0:") and str(out) in line
    ds = datasets.load_from_disk(str(out))
    assert len(ds) == 40 and ds[0]["images"][0].size == (112, 112)
    assert ds[0]["id"] == "count-train-1-000000"


def test_bad_task_lists_tasks(tmp_path, capsys):
    assert main(["data", "synth", "--task", "counting", "--split", "train", "--n", "5", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'counting'; tasks: count, count_chatter, largest_colour, left_right, grounding, geometry" in err
    assert "Traceback" not in err and not (tmp_path / "x").exists()


def test_bad_arguments_are_one_paragraph(tmp_path, capsys):
    assert main(["data", "synth", "--task", "count"]) == 2
    assert "the following arguments are required: --split, --n, --out" in capsys.readouterr().err
    assert main(["data", "synth", "--task", "count", "--split", "val", "--n", "5", "--out", str(tmp_path)]) == 2
    assert "unknown split 'val'; splits: train, test" in capsys.readouterr().err
    assert main(["data", "synth", "--task", "count", "--split", "test", "--n", "0", "--out", str(tmp_path)]) == 2
    assert main(["data", "synth", "--task", "count", "--split", "test", "--n", "x", "--out", str(tmp_path)]) == 2
    assert "invalid int value: 'x'" in capsys.readouterr().err


def test_help(capsys):
    # argparse prints help and exits 0 itself
    with pytest.raises(SystemExit) as info:
        main(["data", "synth", "--help"])
    assert info.value.code == 0
    assert "--image-size" in capsys.readouterr().out
    assert main(["data"]) == 0 and "synth" in capsys.readouterr().out
