"""Policy losses, KL estimators and aggregation against their papers' formulas, and loss-owned defaults.

Expected values are computed here with scalar Python (math) from the formulas, never from mmrlvr's code.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from mmrlvr.algos.aggregation import agg_denominator, agg_loss
from mmrlvr.algos.kl import KL_ESTIMATORS
from mmrlvr.algos.losses import POLICY_LOSSES, call_policy_loss
from mmrlvr.algos.presets import PRESETS, explicit_algo_keys, loss_defaults, loss_kwargs, resolve_loss_params
from mmrlvr.methods import method_spec
from mmrlvr.config import AlgoConfig

# two responses of 3 tokens, the second with 2 valid tokens
LOGR = [[0.5, 0.0, -0.4], [0.1, -0.05, 0.0]]  # log pi - log pi_old
OLD = [[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]]
ADV = [1.0, -2.0]
MASK = [[1, 1, 1], [1, 1, 0]]


def _tensors():
    old = torch.tensor(OLD)
    logp = (old + torch.tensor(LOGR)).requires_grad_(True)
    return logp, old, torch.tensor(ADV), torch.tensor(MASK, dtype=torch.float32)


def _grad(loss_tok, logp, mask):
    (g,) = torch.autograd.grad((loss_tok * mask).sum(), logp)
    return g


def test_ppo_clip_per_token_formula():
    # -min(r A, clip(r, 1-e, 1+e) A), e = 0.2; gradient -r A where the min takes the unclipped branch
    logp, old, adv, mask = _tensors()
    loss, _ = call_policy_loss("ppo_clip", logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    g = _grad(loss, logp, mask)
    for i in range(2):
        for t in range(3):
            if not MASK[i][t]:
                assert loss[i, t] == 0 and g[i, t] == 0
                continue
            r, a = math.exp(LOGR[i][t]), ADV[i]
            unclipped, clipped = r * a, min(max(r, 0.8), 1.2) * a
            assert float(loss.detach()[i, t]) == pytest.approx(-min(unclipped, clipped), abs=1e-6)
            want = -r * a if unclipped <= clipped else 0.0
            assert float(g[i, t]) == pytest.approx(want, abs=1e-6)


def test_gspo_sequence_ratio_and_gradient_of_the_sequence_objective():
    # GSPO eq. (5)-(7): s_i = exp(mean_t log r_t); J = mean_i min(s_i A_i, clip(s_i, 1-a, 1+b) A_i)
    logp, old, adv, mask = _tensors()
    a, b = 3e-4, 4e-4
    loss, stats = call_policy_loss("gspo", logp, old, adv, mask, eps_low=a, eps_high=b)
    agg = agg_loss(loss, mask, "seq-mean-token-mean")
    (g,) = torch.autograd.grad(agg, logp)
    # reference: the sequence objective written directly, differentiated by autograd on fresh leaves
    ref_logp = torch.tensor(OLD) + torch.tensor(LOGR)
    ref_logp.requires_grad_(True)
    terms = []
    for i in range(2):
        n = sum(MASK[i])
        s = torch.exp(sum(ref_logp[i, t] - OLD[i][t] for t in range(n)) / n)
        terms.append(-torch.minimum(s * ADV[i], s.clamp(1 - a, 1 + b) * ADV[i]))
    ref = torch.stack(terms).mean()
    (g_ref,) = torch.autograd.grad(ref, ref_logp)
    assert float(agg.detach()) == pytest.approx(float(ref.detach()), abs=1e-6)
    assert torch.allclose(g * mask, g_ref * mask, atol=1e-7)
    s0 = math.exp(sum(LOGR[0]) / 3)
    assert float(stats.ratio_max) == pytest.approx(max(s0, math.exp(sum(LOGR[1][:2]) / 2)), abs=1e-6)


def test_cispo_truncated_detached_weight():
    # MiniMax-M1 eq. (4): -sg(clip(r, 1-eL, 1+eH)) A log pi; eL = 1 (no lower bound), eH = 4 (cap 5)
    logp, old, adv, mask = _tensors()
    logp2 = (old + torch.tensor([[2.0, 0.0, -3.0], [0.1, 0.0, 0.0]])).requires_grad_(True)  # r = e^2 > 5
    for lp, logr in ((logp, LOGR), (logp2, [[2.0, 0.0, -3.0], [0.1, 0.0, 0.0]])):
        loss, _ = call_policy_loss("cispo", lp, old, adv, mask)  # the loss's own defaults
        g = _grad(loss, lp, mask)
        for i in range(2):
            for t in range(3):
                if not MASK[i][t]:
                    continue
                w = min(max(math.exp(logr[i][t]), 0.0), 5.0)
                assert float(loss.detach()[i, t]) == pytest.approx(-w * ADV[i] * (OLD[i][t] + logr[i][t]), abs=1e-5)
                assert float(g[i, t]) == pytest.approx(-w * ADV[i], abs=1e-5)  # every token keeps a gradient


def test_kl_estimators_formulas():
    logp, ref = torch.tensor([[-1.0, -0.2]]), torch.tensor([[-1.5, -0.1]])
    for name, f in {"k1": lambda d: d, "k2": lambda d: 0.5 * d * d, "k3": lambda d: math.exp(-d) + d - 1}.items():
        got = KL_ESTIMATORS.get(name)(logp, ref, mask=torch.ones(1, 2))
        for t in range(2):
            d = float(logp[0, t] - ref[0, t])
            assert float(got[0, t]) == pytest.approx(f(d), abs=1e-6), name


def test_aggregation_modes_formulas_and_a_separate_normaliser():
    l = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
    w = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # numerator weights (e.g. selected tokens)
    d = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # all response tokens
    assert float(agg_loss(l, w, "token-mean")) == pytest.approx((1 + 3 + 4 + 5) / 4)
    assert float(agg_loss(l, w, "seq-mean-token-mean")) == pytest.approx(((1 + 3) / 2 + (4 + 5) / 2) / 2)
    assert float(agg_loss(l, w, "seq-mean-token-sum")) == pytest.approx((4 + 9) / 2)
    assert float(agg_loss(l, w, "seq-mean-token-sum-norm", norm_constant=8)) == pytest.approx(13 / (2 * 8))
    # VPPO's official normaliser: selected tokens in the sum, all response tokens below the line
    assert float(agg_loss(l, w, "token-mean", norm_mask=d)) == pytest.approx(13 / 5)
    assert float(agg_loss(l, w, "seq-mean-token-mean", norm_mask=d)) == pytest.approx((4 / 3 + 9 / 2) / 2)
    assert agg_denominator(d, "token-mean") == 5 and agg_denominator(w, "seq-mean-token-mean") == 2


# ---------------------------------------------------------------------------------------------------
# Each loss owns its defaults


def test_every_registered_loss_owns_the_defaults_of_its_signature():
    """The clip range a loss owns is its own keyword defaults (said once, in its signature), and its aggregation
    and the note's reason are on its declaration beside it; the reference values are pinned here."""
    want = {"ppo_clip": {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None, "agg": None},
            "gspo": {"eps_low": 3e-4, "eps_high": 4e-4, "agg": "seq-mean-token-mean"},
            "cispo": {"eps_low": 1.0, "eps_high": 4.0, "agg": "token-mean"},
            "nsr": {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": None, "agg": None},
            "popo": {"agg": "token-mean"},
            "clip_cov": {"eps_low": 1.0, "eps_high": 1.0, "dual_clip": None, "agg": None},
            "kl_cov": {"agg": None}}
    assert {name: loss_defaults(name) for name in POLICY_LOSSES.names()} == want
    for name, defaults in want.items():
        sig = inspect.signature(POLICY_LOSSES.get(name)).parameters
        for key, value in loss_kwargs(name, {k: v for k, v in defaults.items()}).items():
            if key in sig:  # POPO's temperature, coefficients ... are read by its stages, not by the loss function
                assert sig[key].default == value, (name, key)
        assert method_spec("loss", name).why, name


def test_gspo_without_a_preset_gets_gspo_values_and_says_so():
    generic = vars(AlgoConfig())  # PPO's 0.2 / 0.2 and token-mean
    params, notes = resolve_loss_params("gspo", {**generic, "loss": "gspo"}, {"loss"})
    assert params == {"eps_low": 3e-4, "eps_high": 4e-4, "agg": "seq-mean-token-mean"}
    assert len(notes) == 1 and "gspo" in notes[0] and "eps_high=0.0004" in notes[0]
    # the paper values, from GSPO §5.1: a sequence ratio moves ~1e-3, PPO's 0.2 would never clip
    assert params["eps_low"] < 1e-3 and params["eps_high"] < 1e-3


def test_cispo_defaults_follow_the_reference_implementations():
    params, notes = resolve_loss_params("cispo", vars(AlgoConfig()), set())
    assert params == {"eps_low": 1.0, "eps_high": 4.0, "agg": "token-mean"}  # clip(r, 0, 5)
    assert notes and PRESETS["cispo"]["loss_params"] == {"eps_low": 1.0, "eps_high": 4.0}


def test_user_and_preset_values_win_over_loss_defaults():
    values = {**vars(AlgoConfig()), "eps_high": 0.01, "agg": "token-mean"}
    params, notes = resolve_loss_params("gspo", values, {"eps_high", "agg"})
    assert params == {"eps_low": 3e-4, "eps_high": 0.01, "agg": "token-mean"}
    # DAPO's preset fills eps_high 0.28 for ppo_clip: that is a choice, not a generic value
    dapo = {**vars(AlgoConfig()), "eps_high": 0.28}
    params, notes = resolve_loss_params("ppo_clip", dapo, {"eps_low", "eps_high", "dual_clip"})
    assert params["eps_high"] == 0.28 and notes == []


def test_nothing_to_say_when_the_generic_values_are_the_losses_own():
    assert resolve_loss_params("ppo_clip", vars(AlgoConfig()), set())[1] == []
    assert resolve_loss_params("my_plugin_loss", vars(AlgoConfig()), set()) == ({}, [])
    nsr, notes = resolve_loss_params("nsr", vars(AlgoConfig()), set())
    assert nsr["eps_high"] == 0.28 and loss_kwargs("nsr", {**vars(AlgoConfig()), **nsr})["noise"] == 0.2


def test_a_preset_for_another_loss_does_not_lend_its_clip_range():
    # preset grpo (ppo_clip 0.2/0.2, seq-mean-token-mean) + algo.loss: cispo -> CISPO's own values
    values = {**vars(AlgoConfig()), "loss": "cispo", "agg": "seq-mean-token-mean"}
    keys = explicit_algo_keys({"preset", "loss"}, "grpo", "cispo")
    params, notes = resolve_loss_params("cispo", values, keys)
    assert params == {"eps_low": 1.0, "eps_high": 4.0, "agg": "token-mean"} and notes
    # the preset's own loss keeps the preset's values
    keys = explicit_algo_keys({"preset"}, "dapo", "ppo_clip")
    assert resolve_loss_params("ppo_clip", {**vars(AlgoConfig()), "eps_high": 0.28}, keys)[0]["eps_high"] == 0.28
