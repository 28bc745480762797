"""``mmrlvr analyze trajectory`` (RELEX): rank-1 structure of the weight updates, planted and on a tiny run.

The expected numbers come from the construction: a planted ΔW_t = (a + b·t)·u is one direction with a linear
coefficient (explained variance 1, R² 1, c(t) = (a + b·t)·‖u‖, Ŵ(S) = W_0 + (a + b·S)·u); T orthonormal
deltas spread the energy evenly (explained variance 1/T); a rank-1 trajectory with c = (t − 3)² over t = 1..5
is symmetric, so its least-squares line is flat (slope 0, intercept mean(c) = 2, R² 0).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from analysis_helpers import cli as _cli, one_line_exit_2 as _one_line_exit_2, train_tiny_run
from mmrlvr.analysis import trajectory as tj

ROOT = Path(__file__).resolve().parents[1]


def _planted(a: float, b: float, steps: list[int], shape=(6, 7), seed=0, noise=0.0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(*shape, generator=g)
    deltas = [(a + b * t) * u + noise * torch.randn(*shape, generator=g) for t in steps]
    return u, deltas


# ------------------------------------------------------------------------------------------ planted math
def test_planted_rank1_linear_trajectory_is_recovered_exactly():
    steps = [10, 20, 30, 40, 50]
    a, b = 0.3, 0.02
    u, deltas = _planted(a, b, steps)
    traj = tj.tensor_trajectory(deltas, steps)
    assert traj.explained == pytest.approx(1.0, abs=1e-9)
    assert traj.r2 == pytest.approx(1.0, abs=1e-9)
    assert traj.sigma2[1] == pytest.approx(0.0, abs=1e-9 * traj.sigma2[0])
    norm_u = float(u.norm())
    assert traj.coefficients == pytest.approx([(a + b * t) * norm_u for t in steps], rel=1e-5)
    assert traj.slope == pytest.approx(b * norm_u, rel=1e-5)
    assert traj.intercept == pytest.approx(a * norm_u, rel=1e-4)
    assert float(traj.direction.norm()) == pytest.approx(1.0, rel=1e-6)
    w0 = torch.randn(6, 7, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(tj.extrapolate(w0, traj, 90), w0 + (a + b * 90) * u, atol=1e-5)


def test_direction_sign_does_not_change_the_extrapolation():
    steps = [2, 4, 6, 8]
    a, b = -1.0, -0.1  # the planted coefficient is negative: v_1 = -u/‖u‖ and c(t) > 0
    u, deltas = _planted(a, b, steps, shape=(5,), seed=3)
    traj = tj.tensor_trajectory(deltas, steps)
    assert traj.coefficients[-1] > 0
    assert torch.allclose(traj.direction, -u / u.norm(), atol=1e-6)
    w0 = torch.zeros(5)
    assert torch.allclose(tj.extrapolate(w0, traj, 20), (a + b * 20) * u, atol=1e-5)


def test_tiny_noise_keeps_both_numbers_near_one():
    steps = [20, 40, 60, 80, 100]
    _, deltas = _planted(0.0, 0.01, steps, shape=(40, 30), noise=1e-4)
    traj = tj.tensor_trajectory(deltas, steps)
    assert traj.explained > 0.999
    assert traj.r2 > 0.999


def test_orthonormal_deltas_spread_the_energy_evenly():
    steps = [1, 2, 3, 4]
    eye = torch.eye(8)
    traj = tj.tensor_trajectory([eye[i] for i in range(4)], steps)  # ΔW_t = e_t: G = I
    assert traj.explained == pytest.approx(0.25, abs=1e-9)
    u1, u2 = eye[0], eye[1]  # two directions taking turns: G = blocks of 2 equal eigenvalues
    traj2 = tj.tensor_trajectory([u1, u2, u1, u2], steps)
    assert traj2.explained == pytest.approx(0.5, abs=1e-9)


def test_non_linear_rank1_trajectory_has_low_r2():
    steps = [1, 2, 3, 4, 5]
    u = torch.randn(10, generator=torch.Generator().manual_seed(2))
    traj = tj.tensor_trajectory([(t - 3) ** 2 * u for t in steps], steps)
    # c = (4, 1, 0, 1, 4)·‖u‖: one direction (EV 1), but the line through it is flat
    assert traj.explained == pytest.approx(1.0, abs=1e-9)
    assert traj.slope == pytest.approx(0.0, abs=1e-9)
    assert traj.intercept == pytest.approx(2.0 * float(u.norm()), rel=1e-6)
    assert traj.r2 == pytest.approx(0.0, abs=1e-9)


def test_linear_fit_edge_cases():
    a, b, r2 = tj.linear_fit([2.0, 4.0], [1.0, 3.0])
    assert (a, b, r2) == (pytest.approx(-1.0), pytest.approx(1.0), None)  # any line fits 2 points
    assert tj.linear_fit([1.0, 2.0, 3.0], [5.0, 5.0, 5.0])[2] == 1.0  # constant: the flat line fits exactly
    # hand-worked: c = (0, 2, 1) over t = (0, 1, 2): b = 0.5, a = 0.5, SS_res = 1.5, SS_tot = 2 -> R² = 0.25
    a, b, r2 = tj.linear_fit([0.0, 1.0, 2.0], [0.0, 2.0, 1.0])
    assert (a, b, r2) == (pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.25))


def test_gram_in_column_blocks_matches_the_dense_product(monkeypatch):
    monkeypatch.setattr(tj, "_CHUNK", 7)
    rows = [torch.randn(5, 9, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    m = torch.stack([r.reshape(-1) for r in rows]).double()
    assert torch.allclose(tj.gram(rows), m @ m.T, atol=1e-10)


# ------------------------------------------------------------------------------------ CLI on a tiny run
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A full fine-tuning tiny run with checkpoints at steps 2, 4, 6 (all kept)."""
    return train_tiny_run(tmp_path_factory.mktemp("traj") / "run", "max_steps=6", "save_every=2")


def test_cli_on_a_tiny_run_writes_numbers_plots_and_a_model_eval_and_export_take(tiny_run, tmp_path):
    from mmrlvr.analysis.checkpoints import base_weights, checkpoint_weights, run_checkpoints
    from mmrlvr.train.checkpoint import list_checkpoints

    res = _cli("analyze", "trajectory", str(tiny_run), "--extrapolate", "10", "--top", "3",
               "--eval-limit", "2", "--eval-k", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    out = tiny_run / "analysis" / "trajectory"
    for name in ("results.json", "results.md", "explained_variance.png", "coefficients.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    numbers = json.loads((out / "results.json").read_text())
    s = numbers["summary"]
    assert s["steps"] == [2, 4, 6]
    assert 0 < s["changed_tensors"] < s["tensors"]  # freeze_vision: the vision tower never moves
    for key in ("explained_variance_energy_weighted", "explained_variance_numel_weighted",
                "explained_variance_median", "r2_energy_weighted"):
        assert 0.0 <= s[key] <= 1.0 and math.isfinite(s[key]), key
    assert 0.0 <= s["whole_model"]["explained_variance"] <= 1.0
    names = {r["name"] for r in numbers["tensors"]}
    assert not any(".visual." in n for n in names)
    for r in numbers["tensors"]:
        assert 0.0 <= r["explained_variance"] <= 1.0 and 0.0 <= r["r2"] <= 1.0
    # the extrapolated folder: W_0 + ĉ(10)·v_1 with ‖v_1‖ = 1, so ‖Ŵ − W_0‖ = |a + b·10| per changed tensor
    folder = out / "extrapolated-step-10"
    base = base_weights(run_checkpoints(tiny_run).base_folder())
    new = checkpoint_weights(folder)
    for r in numbers["tensors"]:
        expected = abs(r["intercept"] + 10 * r["slope"])
        assert float((new[r["name"]] - base[r["name"]]).norm()) == pytest.approx(expected, rel=1e-3, abs=1e-7)
    for name in set(base) - names:
        assert torch.equal(new[name], base[name])
    assert folder not in list_checkpoints(tiny_run) and len(list_checkpoints(tiny_run)) == 3  # never resumed from
    evals = numbers["eval"]["results"]
    assert [e["model"] for e in evals] == ["base", "checkpoint", "checkpoint", "checkpoint", "extrapolated"]
    assert all(0.0 <= e["greedy_accuracy"] <= 1.0 for e in evals)
    assert numbers["eval"]["settings"]["n"] == 2 and numbers["eval"]["settings"]["k"] == 1
    # `mmrlvr eval --model FOLDER --data ...` and `mmrlvr export FOLDER --out ...` take the folder
    ev = _cli("eval", "--model", str(folder), "--data", "synth:count", "--limit", "2", "--k", "0",
              "--max-new-tokens", "4", "--no-progress")
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert json.loads(ev.stdout[ev.stdout.index("{"):])["step"] == 10
    exp = _cli("export", str(folder), "--out", str(tmp_path / "export"))
    assert exp.returncode == 0, exp.stderr[-2000:]
    assert (tmp_path / "export" / "model.safetensors").is_file()


def test_bad_input_no_checkpoints_or_one_checkpoint(tiny_run, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy2(tiny_run / "config.yaml", empty / "config.yaml")
    _one_line_exit_2(_cli("analyze", "trajectory", str(empty)), "no checkpoints/ folder")
    one = tmp_path / "one"
    (one / "checkpoints").mkdir(parents=True)
    shutil.copy2(tiny_run / "config.yaml", one / "config.yaml")
    shutil.copytree(tiny_run / "checkpoints" / "step-00000004", one / "checkpoints" / "step-00000004")
    _one_line_exit_2(_cli("analyze", "trajectory", str(one)), "1 verified checkpoint(s)", "at least 2")
    _one_line_exit_2(_cli("analyze", "trajectory", str(tmp_path / "nope")), "no such run directory")
