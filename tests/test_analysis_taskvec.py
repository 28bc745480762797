"""``mmrlvr analyze taskvec`` (DoTS): SFT vs RL task vectors, planted on tensors and on tiny model folders.

Expected numbers come from the construction: τ_RL = −τ_SFT conflicts everywhere (rate 1, ratio 1, cosine −1);
τ_RL = τ_SFT never (rate 0); hand-worked vectors give 2 conflicts among 3 shared elements; planted energies per
module family give their shares; a perturbation of one family's tensors puts all of a vector's energy there.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from analysis_helpers import cli as _cli, one_line_exit_2 as _one_line_exit_2
from mmrlvr.analysis import taskvec as tv

ROOT = Path(__file__).resolve().parents[1]
Q0 = "model.language_model.layers.0.self_attn.q_proj.weight"
UP1 = "model.language_model.layers.1.mlp.up_proj.weight"


# ------------------------------------------------------------------------------------------ tensor math
def _rand(*shape, seed=0):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return torch.where(t == 0, torch.ones_like(t), t)  # every element non-zero


def test_opposite_task_vectors_conflict_everywhere_identical_never():
    w0 = {"a.q_proj.weight": _rand(4, 5), "b.mlp.up_proj.weight": _rand(3, seed=1)}
    tau = {"a.q_proj.weight": _rand(4, 5, seed=2), "b.mlp.up_proj.weight": _rand(3, seed=3)}
    sft = {n: w0[n] + tau[n] for n in w0}
    t_sft, t_rl = tv.task_vectors(w0, sft, w0)  # RL back to the base: τ_RL = −τ_SFT
    assert all(torch.allclose(t_rl[n], -t_sft[n]) for n in w0)
    opp = tv.compare(t_sft, t_rl)
    assert opp["overall"]["sign_conflict"] == 1.0
    assert opp["overall"]["magnitude_ratio"] == pytest.approx(1.0)
    assert opp["overall"]["cosine"] == pytest.approx(-1.0)
    assert opp["overall"]["overlap"] == 1.0
    assert all(r["sign_conflict"] == 1.0 and r["magnitude_ratio"] == pytest.approx(1.0) for r in opp["tensors"])
    same = tv.compare(tau, {n: t.clone() for n, t in tau.items()})
    assert same["overall"]["sign_conflict"] == 0.0
    assert same["overall"]["magnitude_ratio"] == pytest.approx(1.0)
    assert same["overall"]["cosine"] == pytest.approx(1.0)


def test_hand_worked_conflicts_overlap_and_ratio():
    a = torch.tensor([1.0, -2.0, 0.0, 3.0])
    b = torch.tensor([2.0, 2.0, 5.0, -1.0])
    assert tv.sign_conflicts(a, b) == (2, 3)  # both move at 0, 1, 3; signs differ at 1 and 3
    r = tv.compare({"x.weight": a}, {"x.weight": b})["tensors"][0]
    assert r["sign_conflict"] == pytest.approx(2 / 3)
    assert r["overlap"] == pytest.approx(3 / 4)
    assert r["magnitude_ratio"] == pytest.approx(math.sqrt(34 / 14))
    zero = tv.compare({"x.weight": torch.zeros(3)}, {"x.weight": torch.ones(3)})["overall"]
    assert zero["magnitude_ratio"] is None and zero["sign_conflict"] is None  # τ_SFT = 0: undefined


def test_module_families_and_planted_shares():
    names = {
        "model.language_model.layers.0.self_attn.q_proj.weight": "attn.q",
        "model.language_model.layers.0.self_attn.q_proj.bias": "attn.q",
        "model.language_model.layers.1.self_attn.k_proj.weight": "attn.k",
        "model.language_model.layers.1.self_attn.v_proj.weight": "attn.v",
        "model.language_model.layers.1.self_attn.o_proj.weight": "attn.o",
        "model.language_model.layers.0.mlp.down_proj.weight": "mlp",
        "model.language_model.embed_tokens.weight": "embeddings",
        "lm_head.weight": "embeddings",
        "model.visual.blocks.0.attn.qkv.weight": "vision",
        "model.visual.blocks.1.mlp.up_proj.weight": "vision",
        "model.visual.merger.mlp.0.weight": "vision",
        "model.language_model.norm.weight": "other",
        "model.language_model.layers.0.input_layernorm.weight": "other",
    }
    assert {n: tv.module_family(n) for n in names} == names
    energy = {"model.language_model.layers.0.self_attn.q_proj.weight": 1.0,
              "model.language_model.layers.0.mlp.down_proj.weight": 3.0,
              "model.language_model.embed_tokens.weight": 2.5, "lm_head.weight": 1.5,
              "model.visual.blocks.0.attn.qkv.weight": 2.0}
    shares = tv.module_shares(energy)
    assert shares == pytest.approx({"attn.q": 0.1, "mlp": 0.3, "embeddings": 0.4, "vision": 0.2})
    assert sum(shares.values()) == pytest.approx(1.0)
    # through compare(): tensors whose ‖τ‖² is the planted energy
    tau = {n: torch.full((4,), math.sqrt(e / 4)) for n, e in energy.items()}
    fam = tv.compare(tau, {n: 2 * t for n, t in tau.items()})["families"]
    assert {f: d["share_sft"] for f, d in fam.items()} == pytest.approx(shares)
    assert {f: d["share_rl"] for f, d in fam.items()} == pytest.approx(shares)
    assert all(d["magnitude_ratio"] == pytest.approx(2.0) for d in fam.values())


def test_top_p_sparsification_keeps_exactly_the_largest_fraction_and_rescale_restores_the_norm():
    tau = _rand(40, 25, seed=5)  # 1000 elements
    s = tv.top_p_sparsify(tau, 0.2)
    kept = s != 0
    assert int(kept.sum()) == 200
    assert float(tau[kept].abs().min()) >= float(tau[~kept].abs().max())
    assert torch.equal(s[kept], tau[kept])
    r = tv.sparsify_rescale(tau, 0.2)
    assert float(r.norm()) == pytest.approx(float(tau.norm()), rel=1e-6)
    assert torch.equal(r != 0, kept)
    assert int((tv.top_p_sparsify(_rand(10, seed=6), 0.25) != 0).sum()) == 3  # ceil(2.5)
    assert torch.equal(tv.top_p_sparsify(tau, 1.0), tau)
    assert torch.equal(tv.rescale_to_norm(torch.zeros(3), torch.ones(3)), torch.zeros(3))


def test_merged_weights_add_the_scaled_vectors():
    w0 = {"w": torch.tensor([1.0, 1.0]), "frozen": torch.tensor([5.0])}
    m = tv.merged_weights(w0, {"w": torch.tensor([2.0, 0.0])}, {"w": torch.tensor([0.0, -4.0])}, 0.5, 0.25)
    assert torch.equal(m["w"], torch.tensor([2.0, 0.0])) and torch.equal(m["frozen"], torch.tensor([5.0]))


# ------------------------------------------------------------------------------------ CLI on tiny folders
def _perturbed(src: Path, dst: Path, names: list[str], scale: float, seed: int) -> None:
    """``src`` with a random perturbation added to ``names`` only, saved as a model folder."""
    from mmrlvr.models import load_policy

    model, processor = load_policy(src)
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n in names:
            params[n].add_(scale * torch.randn(params[n].shape, generator=g))
    model.save_pretrained(dst)
    processor.save_pretrained(dst)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """BASE (tiny random VLM); SFT = BASE + noise on layer 0's q_proj; RL = SFT + noise on layer 1's
    mlp.up_proj: τ_SFT lives in attn.q only, τ_RL in mlp only."""
    from mmrlvr.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("taskvec")
    base = build_tiny("qwen2_5_vl", root / "base")
    _perturbed(base, root / "sft", [Q0], 0.05, 1)
    _perturbed(root / "sft", root / "rl", [UP1], 0.02, 2)
    return {"base": base, "sft": root / "sft", "rl": root / "rl", "root": root}


def test_merge_end_to_end_on_tiny_folders(folders, tmp_path):
    from mmrlvr.analysis.checkpoints import base_weights

    out = tmp_path / "out"
    res = _cli("analyze", "taskvec", str(folders["base"]), str(folders["sft"]), str(folders["rl"]), "--out", str(out),
               "--merge", "--top-p", "0.25", "--lambda-sft", "1", "--lambda-rl", "0.5,1", "--eval-data", "synth:count",
               "--eval-limit", "2", "--eval-k", "0", "--eval-max-new-tokens", "4")
    assert res.returncode == 0, res.stderr[-2000:]
    res_dir = out / "analysis" / "taskvec"
    for name in ("results.json", "results.md", "module_shares.png", "tensors.png", "merge_grid.png"):
        assert (res_dir / name).is_file(), name
    numbers = json.loads((res_dir / "results.json").read_text())
    fam = numbers["families"]
    assert fam["attn.q"]["share_sft"] == pytest.approx(1.0) and fam["mlp"]["share_rl"] == pytest.approx(1.0)
    assert sum(d["share_sft"] for d in fam.values()) == pytest.approx(1.0)
    assert sum(d["share_rl"] for d in fam.values()) == pytest.approx(1.0)
    assert numbers["overall"]["overlap"] == 0.0 and numbers["overall"]["sign_conflict"] is None  # disjoint
    m = numbers["merge"]
    assert [(r["model"], r["lambda_sft"], r["lambda_rl"]) for r in m["grid"]] == [
        ("SFT", 1.0, 0.0), ("RL", 1.0, 1.0), ("merge", 1.0, 0.5), ("merge", 1.0, 1.0)]
    # the best merge: W_0 + λ·ŝ(τ): on q_proj exactly ceil(0.25·numel) moved elements, norm λ_SFT·‖τ_SFT‖
    w0, sft = base_weights(folders["base"]), base_weights(folders["sft"])
    merged = base_weights(Path(m["folder"]))
    d = merged[Q0] - w0[Q0]
    assert int((d != 0).sum()) == math.ceil(0.25 * d.numel())
    assert float(d.norm()) == pytest.approx(m["best"]["lambda_sft"] * float((sft[Q0] - w0[Q0]).norm()), rel=1e-4)
    untouched = "model.language_model.layers.1.self_attn.k_proj.weight"
    assert torch.equal(merged[untouched], w0[untouched])
    exp = _cli("export", m["folder"], "--out", str(tmp_path / "export"))  # export takes the merged folder
    assert exp.returncode == 0, exp.stderr[-2000:]


def test_bad_input_different_models_lora_vs_full_and_no_output(folders, tmp_path):
    from mmrlvr.models.tiny import build_tiny

    other = build_tiny("qwen2_5_vl", tmp_path / "other", num_hidden_layers=1)
    _one_line_exit_2(_cli("analyze", "taskvec", str(folders["base"]), str(folders["sft"]), str(other),
                          "--out", str(tmp_path / "o")), "different models", "layers.1")
    # a LoRA run's checkpoint against a full fine-tuning one: refused from state.json / adapter_config.json,
    # before any weights load
    lora, full = tmp_path / "lora-ckpt", tmp_path / "full-ckpt"
    for d in (lora, full):
        d.mkdir()
        (d / "state.json").write_text(json.dumps({"step": 1}))
    (lora / "adapter_config.json").write_text("{}")
    _one_line_exit_2(_cli("analyze", "taskvec", str(folders["base"]), str(full), str(lora), "--out",
                          str(tmp_path / "o")), "RL", "LoRA", "SFT", "full fine-tuning")
    _one_line_exit_2(_cli("analyze", "taskvec", str(folders["base"]), str(folders["sft"]), str(folders["rl"])),
                     "--out")
    _one_line_exit_2(_cli("analyze", "taskvec", str(folders["base"]), str(folders["sft"]), str(tmp_path / "nope"),
                          "--out", str(tmp_path / "o")), "RL", "no such")
