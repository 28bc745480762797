"""mmrlvr.analysis.checkpoints: a run's checkpoints as plain weights, and one-line errors for what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmrlvr.analysis.checkpoints import check_same_model, run_checkpoints, weights_of
from mmrlvr.errors import UserError


def test_missing_runs_and_checkpoints_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="no such run directory"):
        run_checkpoints(tmp_path / "nope")
    (tmp_path / "run").mkdir()
    with pytest.raises(UserError, match="no checkpoints/ folder") as e:
        run_checkpoints(tmp_path / "run")
    assert "keep_checkpoints: 0" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "run" / "checkpoints").mkdir()
    with pytest.raises(UserError, match="0 verified checkpoint"):
        run_checkpoints(tmp_path / "run")
    with pytest.raises(UserError, match="not a run directory"):
        weights_of(tmp_path / "run" / "checkpoints")


def test_different_models_name_the_first_difference():
    a = {"x.weight": torch.zeros(2, 3), "y": torch.zeros(1)}
    check_same_model(a, {"x.weight": torch.ones(2, 3), "y": torch.ones(1)}, "A", "B")
    with pytest.raises(UserError, match="'y' is only in A"):
        check_same_model(a, {"x.weight": torch.zeros(2, 3)}, "A", "B")
    with pytest.raises(UserError, match=r"'x.weight' is \(2, 3\) in one and \(3, 2\)"):
        check_same_model(a, {"x.weight": torch.zeros(3, 2), "y": torch.zeros(1)}, "A", "B")


def test_a_model_folder_reads_as_plain_float32_weights(tmp_path):
    from mmrlvr.models.tiny import build_tiny

    folder = build_tiny("qwen2_5_vl", tmp_path / "m")
    weights, kind = weights_of(folder)
    assert kind == "model" and weights and all(t.dtype == torch.float32 and t.device.type == "cpu"
                                               for t in weights.values())
    assert any(n.endswith("q_proj.weight") for n in weights)
    assert not any(n.startswith("base_model.") for n in weights)


def test_every_analysis_is_a_subcommand_with_help():
    import subprocess
    import sys

    from mmrlvr.analysis.cli import ANALYSES

    assert set(ANALYSES) == {"trajectory", "taskvec", "tensors", "tokens", "prefix", "saturation", "sensitivity"}
    top = subprocess.run([sys.executable, "-m", "mmrlvr.cli", "analyze", "--help"], capture_output=True, text=True)
    assert top.returncode == 0 and all(name in top.stdout for name in ANALYSES)
    for name in ANALYSES:
        res = subprocess.run([sys.executable, "-m", "mmrlvr.cli", "analyze", name, "--help"], capture_output=True,
                             text=True)
        assert res.returncode == 0 and f"mmrlvr analyze {name}" in res.stdout, (name, res.stderr)
    bad = subprocess.run([sys.executable, "-m", "mmrlvr.cli", "analyze", "trajectori", "x"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "invalid choice: 'trajectori'" in bad.stderr
