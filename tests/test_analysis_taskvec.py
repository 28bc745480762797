"""``mmrlvr analyze taskvec`` (DoTS): SFT vs RL task vectors, planted on tensors and on tiny model folders.

Expected numbers come from the construction: τ_RL = −τ_SFT conflicts everywhere (rate 1, ratio 1, cosine −1);
τ_RL = τ_SFT never (rate 0); hand-worked vectors give 2 conflicts among 3 shared elements; planted energies per
module family give their shares; a perturbation of one family's tensors puts all of a vector's energy there.
The merge's pieces (τ against BASE or SFT, the official code's top-k rule with ties, the global / per-tensor /
no rescale) are checked on three tiny dict checkpoints whose expected values are worked out by hand below.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from analysis_helpers import cli as _cli, one_line_exit_2 as _one_line_exit_2
from mmrlvr.analysis import taskvec as tv
from mmrlvr.errors import UserError

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
    t_sft, t_rl = tv.task_vectors(w0, sft, w0, "sft")  # RL back to the base, against SFT: τ_RL = −τ_SFT
    assert all(not t.any() for t in tv.task_vectors(w0, sft, w0)[1].values())  # default (against BASE): τ_RL = 0
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


def test_keep_top_keeps_the_largest_fraction_and_rescale_restores_the_norm():
    tau = _rand(40, 25, seed=5)  # 1000 elements, no ties
    s = tv.keep_top(tau, 0.2)
    kept = s != 0
    assert int(kept.sum()) == 200
    assert float(tau[kept].abs().min()) >= float(tau[~kept].abs().max())
    assert torch.equal(s[kept], tau[kept])
    r, factor = tv.sparsify_vector({"t": tau}, 0.2, "tensor")
    assert factor is None
    assert float(r["t"].norm()) == pytest.approx(float(tau.norm()), rel=1e-6)
    assert torch.equal(r["t"] != 0, kept)
    # int(2.5) = 2 (the official code rounds down; we kept ceil(2.5) = 3 before), int(0.9) = 0: all zeros
    assert int((tv.keep_top(_rand(10, seed=6), 0.25) != 0).sum()) == 2
    assert not tv.keep_top(_rand(3, seed=7), 0.3).any()
    assert torch.equal(tv.keep_top(tau, 1.0), tau)
    assert torch.equal(tv.rescale_to_norm(torch.zeros(3), torch.ones(3)), torch.zeros(3))
    for bad in (0.0, 1.5):
        with pytest.raises(UserError, match="--keep"):
            tv.keep_top(tau, bad)
    with pytest.raises(UserError, match="--rescale"):
        tv.sparsify_vector({"t": tau}, 0.3, "layer")
    with pytest.raises(UserError, match="--rl-vector"):
        tv.task_vectors({"t": tau}, {"t": tau}, {"t": tau}, "rl")


# ------------------------------------------------------------- hand-worked merge on tiny dict checkpoints
# Three parameter tensors; BASE integers and τ multiples of 1/16, so W − W_0 is exact in float32 and the ties
# below stay ties. τ_SFT = W_SFT − W_0 and τ_RL = W_RL − W_0 (against BASE) are these literals:
A, B, C = "layers.0.self_attn.q_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.input_layernorm.weight"
HW0 = {A: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], B: [1, -1, 2, -2], C: [1, 1, 1]}
HT_SFT = {A: [0.5, -4, 1, 3, -0.25, 0, 2, -2, 0.125, -1.5], B: [1, -0.5, 0.25, 2], C: [0.5, -0.5, 0.25]}
HT_RL = {A: [-0.125, 0.25, 0.5, -0.375, 0.0625, 0.5, -0.25, 0.125, -0.75, 0.375], B: [-2, 1, 0.5, -0.25],
         C: [0.25, 0, -0.125]}
# kept elements (1 = kept), by hand from the rule k = int(keep·numel), keep |τ| ≥ the k-th largest |τ|:
KEEP = {  # (vector, keep) -> {tensor: mask}
    # keep 0.3: A k=3; τ_SFT's |τ| sorted 4, 3, 2, 2, ...: the 3rd largest is 2, tied: 4 elements survive.
    # B k=int(1.2)=1; C k=int(0.9)=0 -> all zeros
    ("sft", 0.3): {A: [0, 1, 0, 1, 0, 0, 1, 1, 0, 0], B: [0, 0, 0, 1], C: [0, 0, 0]},
    # τ_RL: A's 0.75, 0.5, 0.5 (the tie fills k = 3 exactly); B's −2
    ("rl", 0.3): {A: [0, 0, 1, 0, 0, 1, 0, 0, 1, 0], B: [1, 0, 0, 0], C: [0, 0, 0]},
    # keep 0.5: A k=5 (4, 3, 2, 2, 1.5); B k=2 (2, 1); C k=1, the largest |τ| 0.5 is tied: 2 survive
    ("sft", 0.5): {A: [0, 1, 0, 1, 0, 0, 1, 1, 0, 1], B: [1, 0, 0, 1], C: [1, 1, 0]},
}
# --rl-vector sft: τ_RL = W_RL − W_SFT = HT_RL − HT_SFT, by hand:
HT_RL_SFT = {A: [-0.625, 4.25, -0.5, -3.375, 0.3125, 0.5, -2.25, 2.125, -0.875, 1.875], B: [-3, 1.5, 0.25, -2.25],
             C: [-0.25, 0.5, -0.375]}
KEEP_RL_SFT = {A: [0, 1, 0, 1, 0, 0, 1, 0, 0, 0], B: [1, 0, 0, 0], C: [0, 0, 0]}  # 4.25, 3.375, 2.25; −3; none


def _hand_ckpts() -> tuple[dict, dict, dict]:
    t = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    w0 = {n: t(v) for n, v in HW0.items()}
    sft = {n: t([a + b for a, b in zip(HW0[n], HT_SFT[n])]) for n in HW0}
    rl = {n: t([a + b for a, b in zip(HW0[n], HT_RL[n])]) for n in HW0}
    return w0, sft, rl


def _masked(vec: dict, mask: dict) -> dict:
    return {n: [x * m for x, m in zip(vec[n], mask[n])] for n in vec}


def _sq(vec: dict) -> float:
    return sum(x * x for xs in vec.values() for x in xs)


def _expected_merge(s_sft: dict, s_rl: dict, lam_sft: float, lam_rl: float) -> dict:
    return {n: [w + lam_sft * a + lam_rl * b for w, a, b in zip(HW0[n], s_sft[n], s_rl[n])] for n in HW0}


def _assert_close(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for n in want:
        assert got[n].tolist() == pytest.approx(want[n], rel=1e-6, abs=1e-7), n


def test_hand_worked_vectors_against_base_and_against_sft():
    w0, sft, rl = _hand_ckpts()
    t_sft, t_rl = tv.task_vectors(w0, sft, rl)  # the default: both against BASE
    assert {n: v.tolist() for n, v in t_sft.items()} == HT_SFT
    assert {n: v.tolist() for n, v in t_rl.items()} == HT_RL
    _, t_rl_sft = tv.task_vectors(w0, sft, rl, "sft")
    assert {n: v.tolist() for n, v in t_rl_sft.items()} == HT_RL_SFT
    # the report's numbers are of the chosen pair: ‖τ_RL‖/‖τ_SFT‖ with τ_RL against BASE, then against SFT
    assert tv.compare(t_sft, t_rl)["overall"]["magnitude_ratio"] == pytest.approx(math.sqrt(_sq(HT_RL) / _sq(HT_SFT)))
    assert tv.compare(t_sft, t_rl_sft)["overall"]["magnitude_ratio"] == pytest.approx(
        math.sqrt(_sq(HT_RL_SFT) / _sq(HT_SFT)))
    assert tv.vector_names("base")["tau_rl"] == "W_RL − W_BASE" and tv.vector_names("sft")["tau_rl"] == "W_RL − W_SFT"


@pytest.mark.parametrize("vector,keep", sorted(KEEP))
def test_hand_worked_top_k_masks_ties_kept(vector, keep):
    tau = HT_SFT if vector == "sft" else HT_RL
    for n, xs in tau.items():
        got = tv.keep_top(torch.tensor(xs), keep)
        assert got.tolist() == [x * m for x, m in zip(xs, KEEP[vector, keep][n])], n


def test_hand_worked_merge_defaults_global_rescale():
    """Defaults: τ both against BASE, keep 0.3, one factor per vector ‖τ‖₂ / ‖s(τ)‖₂ over all tensors."""
    w0, sft, rl = _hand_ckpts()
    t_sft, t_rl = tv.task_vectors(w0, sft, rl)
    k_sft, k_rl = _masked(HT_SFT, KEEP["sft", 0.3]), _masked(HT_RL, KEEP["rl", 0.3])
    # ‖τ_SFT‖² = 36.578125 + 5.3125 + 0.5625 = 42.453125; kept: 16 + 9 + 4 + 4 (A) + 4 (B) = 37
    assert _sq(HT_SFT) == 42.453125 and _sq(k_sft) == 37
    f_sft, f_rl = math.sqrt(_sq(HT_SFT) / _sq(k_sft)), math.sqrt(_sq(HT_RL) / _sq(k_rl))
    s_sft, g_sft = tv.sparsify_vector(t_sft, tv.DEFAULT_KEEP)
    s_rl, g_rl = tv.sparsify_vector(t_rl, tv.DEFAULT_KEEP)
    assert g_sft == pytest.approx(f_sft) and g_rl == pytest.approx(f_rl)
    e_sft = {n: [f_sft * x for x in xs] for n, xs in k_sft.items()}
    e_rl = {n: [f_rl * x for x in xs] for n, xs in k_rl.items()}
    _assert_close(s_sft, e_sft)
    _assert_close(s_rl, e_rl)
    assert tv.vector_norm(s_sft) == pytest.approx(math.sqrt(_sq(HT_SFT)))  # norm-preserving, as a whole
    _assert_close(tv.merged_weights(w0, s_sft, s_rl, 1.5, 0.5), _expected_merge(e_sft, e_rl, 1.5, 0.5))


def test_hand_worked_merge_rescale_tensor_none_keep_and_rl_vector_sft():
    w0, sft, rl = _hand_ckpts()
    t_sft, t_rl = tv.task_vectors(w0, sft, rl)
    k_sft, k_rl = _masked(HT_SFT, KEEP["sft", 0.3]), _masked(HT_RL, KEEP["rl", 0.3])

    def per_tensor(kept: dict, full: dict) -> dict:  # each tensor to its own norm; an all-zero one stays 0
        return {n: [x * math.sqrt(sum(v * v for v in full[n]) / sum(v * v for v in xs)) for x in xs]
                if any(xs) else xs for n, xs in kept.items()}

    s_sft, f = tv.sparsify_vector(t_sft, 0.3, "tensor")
    s_rl, _ = tv.sparsify_vector(t_rl, 0.3, "tensor")
    assert f is None
    _assert_close(tv.merged_weights(w0, s_sft, s_rl, 1.0, 2.0),
                  _expected_merge(per_tensor(k_sft, HT_SFT), per_tensor(k_rl, HT_RL), 1.0, 2.0))
    s_sft, f = tv.sparsify_vector(t_sft, 0.3, "none")
    s_rl, _ = tv.sparsify_vector(t_rl, 0.3, "none")
    assert f is None
    _assert_close(tv.merged_weights(w0, s_sft, s_rl, 0.5, 1.0), _expected_merge(k_sft, k_rl, 0.5, 1.0))
    # --keep 0.5 (τ_SFT's masks by hand above), global rescale
    k5 = _masked(HT_SFT, KEEP["sft", 0.5])
    s5, f5 = tv.sparsify_vector(t_sft, 0.5)
    assert f5 == pytest.approx(math.sqrt(_sq(HT_SFT) / _sq(k5)))
    _assert_close(s5, {n: [f5 * x for x in xs] for n, xs in k5.items()})
    # --keep 1: nothing dropped, factor 1: the merge at (1, 1) is W_SFT + τ_RL, i.e. RL + τ_SFT
    s1, f1 = tv.sparsify_vector(t_sft, 1.0)
    r1, _ = tv.sparsify_vector(t_rl, 1.0)
    assert f1 == 1.0
    _assert_close(tv.merged_weights(w0, s1, r1, 1.0, 1.0), _expected_merge(HT_SFT, HT_RL, 1.0, 1.0))
    # --rl-vector sft: τ_RL = W_RL − W_SFT, its own mask and factor
    _, t_rl_sft = tv.task_vectors(w0, sft, rl, "sft")
    k_rs = _masked(HT_RL_SFT, KEEP_RL_SFT)
    f_rs = math.sqrt(_sq(HT_RL_SFT) / _sq(k_rs))
    s_rs, g_rs = tv.sparsify_vector(t_rl_sft, 0.3)
    assert g_rs == pytest.approx(f_rs)
    s_sft, f_sft = tv.sparsify_vector(t_sft, 0.3)
    e_sft = {n: [f_sft * x for x in xs] for n, xs in k_sft.items()}
    _assert_close(tv.merged_weights(w0, s_sft, s_rs, 1.0, 1.0),
                  _expected_merge(e_sft, {n: [f_rs * x for x in xs] for n, xs in k_rs.items()}, 1.0, 1.0))


def test_continued_from_sft_is_noticed_for_one_run_or_a_run_started_from_the_sft_folder(tmp_path):
    run = tmp_path / "run"
    for step in (10, 20):
        (run / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        (run / "checkpoints" / f"step-{step:08d}" / "state.json").write_text(json.dumps({"step": step}))
    (run / "config.yaml").write_text("model:\n  path: somewhere/base\n")
    early, late = run / "checkpoints" / "step-00000010", run / "checkpoints" / "step-00000020"
    assert "one run" in tv.continued_from_sft(str(early), early, late)
    assert tv.continued_from_sft(str(late), late, early) is None  # "RL" earlier than "SFT": cannot tell
    sft_model = tmp_path / "sft-export"
    sft_model.mkdir()
    (run / "config.yaml").write_text(f"model:\n  path: {sft_model}\n")
    assert "model.path" in tv.continued_from_sft(str(sft_model), sft_model, late)
    other = tmp_path / "other-model"
    other.mkdir()
    assert tv.continued_from_sft(str(other), other, late) is None


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
    mlp.up_proj (RL continued from SFT); RL_BASE = BASE + the same noise on mlp.up_proj (RL trained from BASE,
    the paper's setting). τ_SFT lives in attn.q only; τ_RL in mlp only for RL_BASE against BASE and for RL
    against SFT."""
    from mmrlvr.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("taskvec")
    base = build_tiny("qwen2_5_vl", root / "base")
    _perturbed(base, root / "sft", [Q0], 0.05, 1)
    _perturbed(root / "sft", root / "rl", [UP1], 0.02, 2)
    _perturbed(base, root / "rl_base", [UP1], 0.02, 2)
    return {"base": base, "sft": root / "sft", "rl": root / "rl", "rl_base": root / "rl_base", "root": root}


def test_merge_end_to_end_on_tiny_folders(folders, tmp_path):
    from mmrlvr.analysis.checkpoints import base_weights

    """Defaults (τ against BASE, global rescale) on an RL model trained from BASE, --keep 0.25."""
    out = tmp_path / "out"
    res = _cli("analyze", "taskvec", str(folders["base"]), str(folders["sft"]), str(folders["rl_base"]), "--out",
               str(out), "--merge", "--keep", "0.25", "--lambda-sft", "1", "--lambda-rl", "0.5,1", "--eval-data",
               "synth:count", "--eval-limit", "2", "--eval-k", "0", "--eval-max-new-tokens", "4")
    assert res.returncode == 0, res.stderr[-2000:]
    res_dir = out / "analysis" / "taskvec"
    for name in ("results.json", "results.md", "module_shares.png", "tensors.png", "merge_grid.png"):
        assert (res_dir / name).is_file(), name
    numbers = json.loads((res_dir / "results.json").read_text())
    assert numbers["vectors"] == {"rl_vector": "base", "tau_sft": "W_SFT − W_BASE", "tau_rl": "W_RL − W_BASE"}
    assert "note" not in numbers
    fam = numbers["families"]
    assert fam["attn.q"]["share_sft"] == pytest.approx(1.0) and fam["mlp"]["share_rl"] == pytest.approx(1.0)
    assert sum(d["share_sft"] for d in fam.values()) == pytest.approx(1.0)
    assert sum(d["share_rl"] for d in fam.values()) == pytest.approx(1.0)
    assert numbers["overall"]["overlap"] == 0.0 and numbers["overall"]["sign_conflict"] is None  # disjoint
    m = numbers["merge"]
    assert (m["keep"], m["rescale"]) == (0.25, "global")
    assert m["sparse"] == {"sign_conflict": None, "overlap": 0.0}
    # RL = W_0 + τ_RL: (λ_SFT, λ_RL) = (0, 1) against BASE (it was (1, 1) with τ_RL against SFT)
    assert [(r["model"], r["lambda_sft"], r["lambda_rl"]) for r in m["grid"]] == [
        ("SFT", 1.0, 0.0), ("RL", 0.0, 1.0), ("merge", 1.0, 0.5), ("merge", 1.0, 1.0)]
    # the best merge: W_0 + λ·ŝ(τ): on q_proj int(0.25·numel) moved elements (random floats: no ties); τ_SFT lives
    # in q_proj only, so the global factor is q_proj's own: norm λ_SFT·‖τ_SFT‖
    w0, sft, rl = (base_weights(folders[k]) for k in ("base", "sft", "rl_base"))
    merged = base_weights(Path(m["folder"]))
    d = merged[Q0] - w0[Q0]
    assert int((d != 0).sum()) == int(0.25 * d.numel())
    full = float((sft[Q0] - w0[Q0]).norm())
    assert float(d.norm()) == pytest.approx(m["best"]["lambda_sft"] * full, rel=1e-4)
    assert m["rescale_factor"]["sft"] == pytest.approx(full / float(tv.keep_top(sft[Q0] - w0[Q0], 0.25).norm()),
                                                       rel=1e-5)
    d_rl = merged[UP1] - w0[UP1]
    assert float(d_rl.norm()) == pytest.approx(m["best"]["lambda_rl"] * float((rl[UP1] - w0[UP1]).norm()), rel=1e-4)
    untouched = "model.language_model.layers.1.self_attn.k_proj.weight"
    assert torch.equal(merged[untouched], w0[untouched])
    exp = _cli("export", m["folder"], "--out", str(tmp_path / "export"))  # export takes the merged folder
    assert exp.returncode == 0, exp.stderr[-2000:]


def test_rl_vector_base_and_sft_on_an_rl_model_that_continued_from_sft(folders, tmp_path):
    """RL = SFT + noise on mlp: against BASE τ_RL holds τ_SFT's q_proj part too (same values there: no conflict,
    ratio 1 on q_proj); --rl-vector sft isolates the RL stage (mlp only). --top-p is --keep's old name."""
    rows = {}
    for vec in ("base", "sft"):
        out = tmp_path / vec
        res = _cli("analyze", "taskvec", str(folders["base"]), str(folders["sft"]), str(folders["rl"]), "--out",
                   str(out), "--rl-vector", vec, "--top-p", "0.3")
        assert res.returncode == 0, res.stderr[-2000:]
        rows[vec] = json.loads((out / "analysis" / "taskvec" / "results.json").read_text())
        assert rows[vec]["vectors"]["rl_vector"] == vec
        assert f"τ_RL = {rows[vec]['vectors']['tau_rl']} (`--rl-vector {vec}`" in (
            out / "analysis" / "taskvec" / "results.md").read_text()
    base, sft = rows["base"], rows["sft"]
    assert base["vectors"]["tau_rl"] == "W_RL − W_BASE" and sft["vectors"]["tau_rl"] == "W_RL − W_SFT"
    q = {r["name"]: r for r in base["tensors"]}[Q0]
    assert q["magnitude_ratio"] == pytest.approx(1.0) and q["sign_conflict"] == 0.0 and q["cosine"] == pytest.approx(1)
    assert 0 < base["families"]["attn.q"]["share_rl"] < 1 and base["families"]["mlp"]["share_rl"] > 0
    assert base["overall"]["sign_conflict"] == 0.0
    assert sft["families"]["mlp"]["share_rl"] == pytest.approx(1.0) and sft["overall"]["overlap"] == 0.0
    # ‖W_RL − W_0‖² = ‖τ_SFT‖² + ‖W_RL − W_SFT‖² here (disjoint tensors)
    assert base["overall"]["norm_rl"] ** 2 == pytest.approx(
        sft["overall"]["norm_sft"] ** 2 + sft["overall"]["norm_rl"] ** 2, rel=1e-4)


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
    _one_line_exit_2(_cli("analyze", "taskvec", str(folders["base"]), str(folders["sft"]), str(folders["rl"]),
                          "--out", str(tmp_path / "o"), "--merge", "--keep", "0"), "--keep 0.0", "(0, 1]")
