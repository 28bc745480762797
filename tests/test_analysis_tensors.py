"""mmrlvr analyze tensors (MAST): planted off-/in-principal updates give the energies and ranks worked out by hand;
the forget score is the first-order change of the forget loss; the CLI writes its files on a tiny run; different
models and a LoRA checkpoint against a full one are one line, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis_helpers import one_line_exit_2 as _one_line_exit_2, train_tiny_run
from mmrlvr.analysis.tensors import (default_k, is_language_projection, off_principal_energy, rank_sum, ranks_desc,
                                     score_projections, top_left_singular)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def planted_weight(d_out: int = 16, d_in: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """W = U diag(12, 11, ..., 1) Vᵀ with random orthonormal U [16, 12], V [12, 12]; returns (W, U)."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(d_out, d_in, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(d_in, d_in, generator=g, dtype=torch.float64))
    s = torch.arange(d_in, 0, -1, dtype=torch.float64)
    return u @ torch.diag(s) @ v.T, u


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm()


def test_off_principal_energy_of_planted_updates():
    w, u = planted_weight()
    u2 = top_left_singular(w.float(), 2)
    r = torch.randn(3, 12, dtype=torch.float64)
    # ΔW in the span of u_3..u_5 (orthogonal to the top-2 directions): energy 1; in the span of u_1, u_2: 0
    assert off_principal_energy(u2, u[:, 2:5] @ r) == pytest.approx(1.0, abs=1e-9)
    assert off_principal_energy(u2, u[:, :2] @ r[:2]) == pytest.approx(0.0, abs=1e-9)
    # 1·u_1 xᵀ + 2·u_3 yᵀ with unit x, y: ‖ΔW‖² = 1 + 4 (u_1 ⊥ u_3), off-principal part 2·u_3 yᵀ -> 4 / 5
    x, y = unit(torch.randn(12, dtype=torch.float64)), unit(torch.randn(12, dtype=torch.float64))
    assert off_principal_energy(u2, torch.outer(u[:, 0], x) + 2 * torch.outer(u[:, 2], y)) == pytest.approx(0.8)
    assert off_principal_energy(u2, torch.zeros(16, 12)) == 0.0


def test_gram_path_gives_the_same_subspace_as_the_svd():
    for shape in [(16, 12), (12, 16)]:
        w = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        exact, gram = top_left_singular(w, 3), top_left_singular(w, 3, exact_max=0)
        torch.testing.assert_close(exact @ exact.T, gram @ gram.T, atol=1e-8, rtol=0)  # same projector


def test_k_ranks_and_names():
    assert default_k((128, 128)) == 1 and default_k((3584, 3584)) == 35 and default_k((512, 3584)) == 5
    assert default_k((64, 64), 0.1) == 6
    assert ranks_desc([3.0, 1.0, 3.0]) == [1.5, 3.0, 1.5]
    assert is_language_projection("model.language_model.layers.3.self_attn.k_proj.weight")
    assert is_language_projection("model.layers.0.mlp.down_proj.weight")
    assert not is_language_projection("model.visual.blocks.0.mlp.up_proj.weight")
    assert not is_language_projection("model.language_model.layers.3.self_attn.k_proj.bias")


def test_planted_off_principal_projection_ranks_first():
    names = [f"model.language_model.layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    wa, wb = {}, {}
    for i, name in enumerate(names):
        w, u = planted_weight(seed=i)
        r = torch.randn(3, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + i))
        # v_proj: ΔW outside W_A's top-2 left singular directions, ‖ΔW‖ = 2; the others inside, ‖ΔW‖ = 1
        dw = 2 * unit(u[:, 2:5] @ r) if "v_proj" in name else unit(u[:, :2] @ r[:2])
        wa[name], wb[name] = w.float(), (w + dw).float()
    rows = score_projections(wa, wb, k=2)["attention"]
    # v_proj: energy ≈ 1 (the others ≈ 0) and the largest norm (2 vs 1): rank 1 by both scores, rank sum 2; the
    # others share ranks 2..4 of each score (their energies and norms are equal up to float rounding): sums 2 · 9 = 18
    top = rows[0]
    assert top["module"] == "v_proj" and top["rank"] == 1 and top["rank_sum"] == 2
    assert top["off_principal_energy"] == pytest.approx(1.0, abs=1e-5)
    assert top["delta_norm"] == pytest.approx(2.0, abs=1e-5) and top["random_energy"] == pytest.approx(1 - 2 / 16)
    assert sum(r["rank_sum"] for r in rows[1:]) == 18 and all(r["rank"] > 1 for r in rows[1:])
    for r in rows[1:]:
        assert r["off_principal_energy"] == pytest.approx(0.0, abs=1e-5) and r["forget_alignment"] is None
        assert r["delta_norm"] == pytest.approx(1.0, abs=1e-5)


def test_rank_sum_by_hand():
    rows = [{"name": n, "e": e, "g": g} for n, e, g in [("q", 0.0, 1.0), ("k", 0.0, 0.0), ("v", 1.0, 0.0),
                                                        ("o", 0.0, 0.0)]]
    # e ranks: v 1, q/k/o tie at (2 + 3 + 4) / 3 = 3; g ranks: q 1, k/v/o tie at 3
    # sums: q 3 + 1 = 4, v 1 + 3 = 4, k = o = 6 -> q and v share rank 1, k and o rank 3; "x" (all None) is skipped
    out = {r["name"]: r for r in rank_sum(rows, ("e", "g", "x"))}
    assert [out[n]["rank_sum"] for n in "qkvo"] == [4, 6, 4, 6]
    assert [out[n]["rank"] for n in "qkvo"] == [1, 3, 1, 3]
    assert "rank_x" not in out["q"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    return train_tiny_run(tmp_path_factory.mktemp("tensors") / "run", "max_steps=4", "save_every=2",
                          "log_rollouts=false")


def test_forget_score_is_the_first_order_change_of_the_forget_loss(tiny_run):
    from mmrlvr.analysis.checkpoints import weights_of
    from mmrlvr.analysis.tensors import forget_gradients
    from mmrlvr.analysis.tokens import model_of
    from mmrlvr.config import load_config
    from mmrlvr.train.data import load_split

    a, b = tiny_run / "checkpoints" / "step-00000002", tiny_run / "checkpoints" / "step-00000004"
    name = "model.language_model.layers.0.self_attn.v_proj.weight"
    wa, _ = weights_of(a, lambda n: n == name)
    wb, _ = weights_of(b, lambda n: n == name)
    samples = load_split("synth:count", load_config(tiny_run / "config.yaml").data, "test")[:4]
    loaded = model_of(a)
    grads, _ = forget_gradients(loaded, samples, "r1", {name})
    dw = wb[name] - wa[name]
    param = dict(loaded.model.named_parameters())[name]
    losses = []
    for sign in (1.0, -1.0):  # central difference: (L(A + ΔW) − L(A − ΔW)) / 2 = ⟨∇L, ΔW⟩ + O(‖ΔW‖³)
        with torch.no_grad():
            param.add_(sign * dw)
        losses.append(forget_gradients(loaded, samples, "r1", {name})[1])
        with torch.no_grad():
            param.sub_(sign * dw)
    predicted = float((grads[name].double() * dw.double()).sum())
    assert abs(predicted) > 1e-5
    assert (losses[0] - losses[1]) / 2 == pytest.approx(predicted, rel=0.05)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", "analyze", "tensors", *args], capture_output=True,
                          text=True, env=ENV, timeout=300)


def test_cli_on_two_tiny_checkpoints(tiny_run):
    res = _cli(str(tiny_run / "checkpoints" / "step-00000002"), str(tiny_run), "--forget", "synth:count",
               "--forget-limit", "2")
    assert res.returncode == 0, res.stderr
    out = tiny_run / "analysis" / "tensors"
    numbers = json.loads((out / "results.json").read_text())
    assert len(numbers["attention"]) == 8 and len(numbers["mlp"]) == 6  # 2 layers x q/k/v/o, x gate/up/down
    assert sorted(r["rank"] for r in numbers["attention"])[0] == 1
    assert all(r["k"] == 1 and 0 <= r["off_principal_energy"] <= 1 and r["delta_norm"] > 0
               and r["forget_alignment"] is not None for r in numbers["attention"])
    assert numbers["forget"]["samples"] == 2
    md = (out / "results.md").read_text()
    assert "our reading" in md and "## MLP projections" in md
    assert (out / "tensors.png").stat().st_size > 1000


def test_different_models_and_mixed_kinds_are_one_line_exit_2(tiny_run, tmp_path):
    from mmrlvr.models.tiny import build_tiny

    other = build_tiny("qwen2_5_vl", tmp_path / "narrow", hidden_size=64)
    _one_line_exit_2(_cli(str(tiny_run), str(other), "--out", str(tmp_path)), "different models")
    # a LoRA checkpoint (adapter_config.json beside state.json) against a full one: refused before loading weights
    lora = tmp_path / "lora" / "checkpoints" / "step-00000001"
    lora.mkdir(parents=True)
    (lora / "state.json").write_text(json.dumps({"step": 1}))
    (lora / "adapter_config.json").write_text("{}")
    _one_line_exit_2(_cli(str(lora), str(tiny_run / "checkpoints" / "step-00000002"), "--out", str(tmp_path)),
                     "is a LoRA checkpoint and")
    _one_line_exit_2(_cli(str(tiny_run), str(other)), "pass --out DIR")
    _one_line_exit_2(_cli(str(tmp_path / "missing"), str(tiny_run)), "no such run directory")
    empty = tmp_path / "empty_run"
    (empty / "checkpoints").mkdir(parents=True)
    shutil.copy(tiny_run / "config.yaml", empty / "config.yaml")
    _one_line_exit_2(_cli(str(empty), str(tiny_run)), "0 verified checkpoint")
