"""ACPO variance-adaptive clipping (arXiv 2606.22570, METHODS.md §5) and the off-policy diagnostics.

Hand-worked from eps_b = clamp(eps0 + alpha * sigma_b, eps_min, eps_max), eps0 0.2, alpha 3, eps_max 3,
5 equal-width bins of the current probability, sigma_b the population std of the bin's ratios.
"""

from __future__ import annotations

import math

import pytest
import torch

from mmrlvr.algos.clipping import CLIP_RULE_REGISTRY, OffPolicyDiagnostics, acpo_bounds, loss_bounds
from mmrlvr.algos.losses import call_policy_loss, nsr_loss, ppo_clip_loss
from mmrlvr.algos.presets import clip_kwargs, loss_kwargs
from mmrlvr.errors import UserError


def _batch(probs, ratios):
    logp = torch.tensor([probs], dtype=torch.float64).log().requires_grad_(True)
    old = (logp.detach() - torch.tensor([ratios], dtype=torch.float64).log())
    return logp, old, torch.ones_like(old)


def test_acpo_bounds_per_bin_hand_worked():
    # bin 4 (p = 0.9): ratios 1.0, 1.5 -> sigma 0.25 -> eps 0.2 + 0.75 = 0.95
    # bin 0 (p = 0.1): one token -> sigma 0 -> eps 0.2
    # bin 2 (p = 0.5): ratios 1, 3 -> sigma 1 -> 3.2, clamped to eps_max 3.0
    probs = torch.tensor([[0.9, 0.9, 0.1, 0.5, 0.5]])
    ratio = torch.tensor([[1.0, 1.5, 1.5, 1.0, 3.0]])
    eps, same = acpo_bounds(probs, ratio, torch.ones_like(ratio, dtype=torch.bool), 0.2, 0.2)
    torch.testing.assert_close(eps, torch.tensor([[0.95, 0.95, 0.2, 3.0, 3.0]]))
    assert same is eps or torch.equal(same, eps)  # symmetric
    # masked tokens do not enter sigma: drop the 1.5 of bin 4 and its sigma is 0
    valid = torch.tensor([[True, False, True, True, True]])
    eps, _ = acpo_bounds(probs, ratio, valid, 0.2, 0.2)
    assert float(eps[0, 0]) == pytest.approx(0.2)
    eps, _ = acpo_bounds(probs, ratio, valid, 0.2, 0.2, eps0=0.1, alpha=1.0, eps_max=0.5)
    assert float(eps[0, 3]) == pytest.approx(0.5) and float(eps[0, 0]) == pytest.approx(0.1)
    assert set(CLIP_RULE_REGISTRY.names()) == {"fixed", "acpo"}


def test_acpo_loss_same_ratio_clipped_in_one_bin_not_in_the_other():
    logp, old, mask = _batch([0.9, 0.9, 0.1], [1.0, 1.5, 1.5])
    loss, stats = ppo_clip_loss(logp, old, torch.ones(1), mask, clip="acpo")
    # bin 4: eps 0.95, r = 1.5 inside -> -1.5 with gradient; bin 0: eps 0.2, r = 1.5 clipped -> -1.2, no grad
    torch.testing.assert_close(loss.detach(), torch.tensor([[-1.0, -1.5, -1.2]], dtype=torch.float64))
    loss.sum().backward()
    assert logp.grad[0, 1] != 0 and logp.grad[0, 2] == 0
    assert float(stats.clip_fraction) == pytest.approx(1 / 3)
    low, high = loss_bounds({"clip": "acpo"}, logp, (logp - old).exp(), mask > 0)
    torch.testing.assert_close(high, torch.tensor([[0.95, 0.95, 0.2]], dtype=torch.float64))
    fixed, _ = ppo_clip_loss(logp, old, torch.ones(1), mask)
    assert float(fixed[0, 1].detach()) == pytest.approx(-1.2)  # PPO's 0.2 would clip both


def test_acpo_uses_dual_clip_three_for_negative_advantages():
    # bin 4, ratios 1 and 5: sigma 2 -> eps 3 (clamped); A = -1: max(5, clamp(5, -2, 4) = 4) = 5, dual clip -> 3
    logp, old, mask = _batch([0.9, 0.9], [1.0, 5.0])
    loss, _ = ppo_clip_loss(logp, old, -torch.ones(1), mask, clip="acpo")
    assert float(loss[0, 1]) == pytest.approx(3.0)
    loss, _ = ppo_clip_loss(logp, old, -torch.ones(1), mask, clip="acpo", dual_clip=4.5)
    assert float(loss[0, 1]) == pytest.approx(4.5)
    loss, _ = nsr_loss(logp, old, -torch.ones(1), mask, clip="acpo")  # NSR takes the rule too
    assert float(loss[0, 1]) == pytest.approx(3.0)


def test_clip_rule_reaches_the_loss_from_config_values_and_is_refused_where_it_cannot_apply():
    values = {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None, "clip": "acpo",
              "clip_params": {"eps0": 0.1, "alpha": 2.0, "eps_max": 1.0}}
    kw = loss_kwargs("ppo_clip", values)
    assert kw["clip"] == "acpo" and kw["clip_params"] == {"eps0": 0.1, "alpha": 2.0, "eps_min": 0.0, "eps_max": 1.0}
    logp, old, mask = _batch([0.9, 0.9], [1.0, 1.5])
    # bin 4, ratios 1 and 1.5: sigma 0.25 -> eps 0.1 + 2 * 0.25 = 0.6: r = 1.5 is inside [0.4, 1.6]
    loss, _ = call_policy_loss("ppo_clip", logp, old, torch.ones(1), mask, **kw)
    assert float(loss[0, 1].detach()) == pytest.approx(-1.5)
    _, high = loss_bounds(kw, logp, (logp - old).exp(), mask > 0)
    assert float(high[0, 0]) == pytest.approx(0.1 + 2.0 * 0.25)
    assert clip_kwargs("gspo", {"clip": "fixed"}) == {}
    with pytest.raises(UserError, match="algo.clip=acpo"):
        clip_kwargs("gspo", values)


def test_offpolicy_diagnostics_per_old_probability_bin_hand_worked():
    d = OffPolicyDiagnostics()
    old = torch.tensor([[0.9, 0.9, 0.9, 0.1]]).log()
    ratio = torch.tensor([[1.0, 1.3, 0.7, 1.0]])
    d.add(ratio, old, torch.ones_like(ratio, dtype=torch.bool), 0.2, 0.2)
    d.add(torch.tensor([[2.0]]), torch.tensor([[0.1]]).log(), torch.ones(1, 1, dtype=torch.bool), 0.2, 0.2)
    m = d.metrics()
    assert m["offpolicy/bin4/tokens"] == 3 and m["offpolicy/bin4/ratio_mean"] == pytest.approx(1.0)
    assert m["offpolicy/bin4/ratio_std"] == pytest.approx(math.sqrt(0.18 / 3))
    assert m["offpolicy/bin4/clip_low"] == pytest.approx(1 / 3) and m["offpolicy/bin4/clip_high"] == pytest.approx(1 / 3)
    assert m["offpolicy/bin0/ratio_mean"] == pytest.approx(1.5) and m["offpolicy/bin0/ratio_std"] == pytest.approx(0.5)
    assert m["offpolicy/bin0/clip_high"] == pytest.approx(0.5) and "offpolicy/bin2/tokens" not in m
    # per-token bounds (ACPO): a wider range clips nothing
    d = OffPolicyDiagnostics()
    d.add(ratio, old, torch.ones_like(ratio, dtype=torch.bool), torch.full((1, 4), 0.5), torch.full((1, 4), 0.5))
    assert d.metrics()["offpolicy/bin4/clip_low"] == 0.0


def test_config_ranges_of_the_seed_method_keys_are_checked():
    from mmrlvr.config import load_config
    from mmrlvr.errors import UserError as UE

    base = {"model": {"path": "x"}, "data": {"train": "synth:count"}, "rewards": [{"name": "format"}]}
    with pytest.raises(UE) as e:
        load_config(data={**base, "algo": {"clip": "acpo", "clip_params": {"eps_min": 0.5, "eps_max": 0.1},
                                           "loss": "popo", "loss_params": {"ema_tau": 1.0},
                                           "advantage": "poise", "advantage_params": {"buffer_steps": 0}}})
    text = str(e.value)
    for key in ("algo.clip_params: clip rule 'acpo': eps_max (0.1) must be >= eps_min (0.5)",
                "algo.loss_params.ema_tau: policy loss 'popo': must be in [0, 1), got 1.0",
                "algo.advantage_params.buffer_steps: advantage estimator 'poise': must be >= 1, got 0"):
        assert key in text
    # the old keys are checked too, and named as written
    with pytest.raises(UE, match="algo.popo_ema_tau: must be in"):
        load_config(data={**base, "algo": {"popo_ema_tau": 1.0}})
    from mmrlvr.validation import name_problems

    problems = name_problems(load_config(data={**base, "algo": {"clip": "acp"}}), "config")
    assert any("algo.clip" in p and "acpo" in p for p in problems), problems
