"""Token-credit schemes against METHODS §2 and the official code (VEPO, VPPO, PAPO, entropy top-k, RSI).

Expected values are computed here in plain Python from the formulas. VPPO's official loss
(github.com/huaixuheqing/VPPO-RL, ``core_algos.compute_policy_loss`` / ``dp_actor.update_policy``):
pg_loss * topk_mask averaged over response_mask, plus 0.06 * mean(-log pi) over response_mask.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from mmrlvr.algos.aggregation import agg_denominator, agg_loss
from mmrlvr.credit import CREDIT_SCHEMES, TokenSignals, build_scheme
from mmrlvr.credit.perturb import gaussian_noise
from mmrlvr.credit.schemes import VEPO
from mmrlvr.errors import UserError


def _minmax(xs):
    lo, hi = min(xs), max(xs)
    return [0.0 if hi - lo <= 1e-6 else (x - lo) / (hi - lo) for x in xs]


def _topk(scores, frac):
    k = math.ceil(frac * len(scores) - 1e-9)
    order = sorted(range(len(scores)), key=lambda t: (-scores[t], t))
    return sorted(order[:k])


def test_vepo_score_d_and_topk_from_the_formula():
    jsd = [0.01, 0.20, 0.05, 0.00, 0.10, 0.02, 0.30, 0.04, 0.06, 0.08]
    ent = [0.5, 1.5, 0.2, 2.0, 0.9, 1.1, 0.3, 0.7, 1.8, 0.4]
    dH = [0.1, -0.3, 0.0, 0.05, 0.4, -0.1, 0.2, 0.0, -0.6, 0.3]
    a = 0.7
    j, h, g = _minmax(jsd), _minmax(ent), _minmax([abs(x) for x in dH])
    s = [(1 - (1 - j[t]) ** a * (1 - g[t]) ** (1 - a)) * h[t] for t in range(10)]
    want = _topk(s, 0.2)
    sig = TokenSignals(entropy=torch.tensor([ent]), jsd=torch.tensor([jsd]), entropy_shift=torch.tensor([dH]),
                       logp=-torch.ones(1, 10), logq=-torch.ones(1, 10), old_logp=None)
    r = CREDIT_SCHEMES.get("vepo")(sig, torch.ones(1, 10), torch.ones(1))
    assert r.selected[0].nonzero().flatten().tolist() == want
    assert r.adv_scale.tolist() == [1.0] and r.norm_weights is None  # the advantage itself is unchanged


def test_vepo_noise_std_is_the_official_two():
    assert VEPO.perturbation == ("gaussian", {"std": 2.0})
    assert inspect.signature(gaussian_noise).parameters["std"].default == 2.0
    # and the noise really has that std: 2 patches of a Qwen2-VL layout (C=3, Tp=2, P=14)
    from mmrlvr.credit.perturb import PatchLayout

    layout = PatchLayout()
    pv = torch.zeros(4 * 64, layout.row_width)
    grid = torch.tensor([[1, 16, 16]])
    noisy = gaussian_noise(pv, grid, generator=torch.Generator().manual_seed(0), layout=layout)
    assert float(noisy.std()) == pytest.approx(2.0, rel=0.05)


def _vppo_signals(old, logq):
    return TokenSignals(entropy=torch.zeros_like(old), jsd=None, entropy_shift=None, logp=old, logq=logq,
                        old_logp=old)


def test_vppo_dependency_scale_and_selection_from_the_formula():
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.5, -3.0], [-0.2, -0.4, -1.0, -2.0, -0.1], [-1.0] * 5])
    logq = torch.tensor([[-1.5, -0.5, -0.5, -3.0, -2.0], [-0.3, -0.4, -2.5, -2.0, -0.6], [-1.0] * 5])
    S = [[min(max(math.exp(d) - d - 1, 0.0), 10.0) for d in (logq[i] - old[i]).tolist()] for i in range(3)]
    sbar = [sum(r) / 5 for r in S]
    n = _minmax(sbar)
    bmin = 0.9
    bmax = bmin + (1 - bmin) / (sum(n) / 3)
    scale = [bmin + x * (bmax - bmin) for x in n]
    r = CREDIT_SCHEMES.get("vppo")(_vppo_signals(old, logq), torch.ones(3, 5), torch.ones(3))
    assert r.adv_scale.tolist() == pytest.approx(scale, abs=1e-6)
    for i in range(2):  # row 2 is all zeros: ties broken by position
        assert r.selected[i].nonzero().flatten().tolist() == _topk(S[i], 0.4)


@pytest.mark.parametrize("k", [0.2, 0.4, 0.8])
def test_vppo_official_normaliser_does_not_depend_on_the_selection_ratio(k):
    T = 10
    old = -torch.linspace(0.5, 2.0, T).repeat(2, 1)
    logq = old - torch.linspace(0.0, 1.0, T).repeat(2, 1)
    mask = torch.ones(2, T)
    r = build_scheme("vppo", k=k)(_vppo_signals(old, logq), mask, torch.ones(2))
    assert torch.equal(r.norm_weights, mask)  # all response tokens are counted below the line
    logp = old.clone().requires_grad_(True)
    loss = agg_loss(logp, r.token_weights, "token-mean", norm_mask=r.norm_weights)
    loss.backward()
    sel = r.selected
    assert torch.allclose(logp.grad[sel], torch.full_like(logp.grad[sel], 1 / (2 * T)))  # 1 / all tokens
    assert logp.grad[~sel].abs().sum() == 0
    assert agg_denominator(r.norm_weights, "token-mean") == 2 * T
    # the "selected" option divides by the kept tokens instead: x(T / ceil(kT)) larger steps
    s = build_scheme("vppo", k=k, normalizer="selected")(_vppo_signals(old, logq), mask, torch.ones(2))
    assert s.norm_weights is None
    logp2 = old.clone().requires_grad_(True)
    agg_loss(logp2, s.token_weights, "token-mean").backward()
    assert float(logp2.grad[sel][0]) == pytest.approx(1 / (2 * math.ceil(k * T)))


def test_vppo_official_entropy_term():
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    r = CREDIT_SCHEMES.get("vppo")(_vppo_signals(old, old - 0.3), mask, torch.ones(1))
    logp = torch.tensor([[-0.7, -1.4, -float("inf")]], requires_grad=True)
    term = r.extra_loss(logp)  # + 0.06 * (-log pi) on response tokens
    assert term.detach()[0].tolist() == pytest.approx([0.06 * 0.7, 0.06 * 1.4, 0.0])
    term.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.06, -0.06, 0.0])
    # normalised like the official mean over response tokens: agg with the normaliser's weights
    assert float(agg_loss(term.detach(), r.norm_weights, "token-mean")) == pytest.approx(0.06 * (0.7 + 1.4) / 2)
    assert build_scheme("vppo", entropy_coef=0.0)(_vppo_signals(old, old), mask, torch.ones(1)).extra_loss is None
    with pytest.raises(UserError, match="normalizer"):
        build_scheme("vppo", normalizer="kept")


def test_papo_perception_kl_term():
    # -gamma * k3(pi(.|I) || pi(.|I_mask)) on the sampled token, k3 = e^d - d - 1, d = logq - logp
    logp0, logq = [-0.5, -1.0], [-1.5, -0.2]
    sig = TokenSignals(entropy=torch.ones(1, 2), jsd=None, entropy_shift=None, logp=torch.tensor([logp0]),
                       logq=torch.tensor([logq]), old_logp=None)
    r = CREDIT_SCHEMES.get("papo")(sig, torch.ones(1, 2), torch.zeros(1))
    got = r.extra_loss(torch.tensor([logp0])).tolist()[0]
    for t in range(2):
        d = logq[t] - logp0[t]
        assert got[t] == pytest.approx(-0.02 * (math.exp(d) - d - 1), abs=1e-7)


def test_entropy_topk_and_rsi_from_their_definitions():
    ent = [0.3, 1.2, 0.8, 0.1, 2.0, 0.5, 0.9, 1.1]
    logp = [-0.2, -0.5, -3.0, -0.01, -1.9, -0.6, -0.05, -2.5]
    sig = TokenSignals(entropy=torch.tensor([ent]), jsd=None, entropy_shift=None, logp=torch.tensor([logp]),
                       logq=None, old_logp=None)
    r = CREDIT_SCHEMES.get("entropy_topk")(sig, torch.ones(1, 8), torch.zeros(1))
    assert r.selected[0].nonzero().flatten().tolist() == _topk(ent, 0.2)
    h = _minmax(ent)
    keep = [t for t in range(8) if 0.5 * (1 - (1 - h[t])) <= -logp[t] / ent[t] <= 2.0 * (1 + (1 - h[t]))]
    r = CREDIT_SCHEMES.get("rsi")(sig, torch.ones(1, 8), torch.zeros(1))
    assert r.selected[0].nonzero().flatten().tolist() == keep
