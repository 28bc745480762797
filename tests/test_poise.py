"""POISE online-probe baseline (arXiv 2605.07579, METHODS.md §5): cross-rollout construction, G = 2, AUC."""

from __future__ import annotations

import math

import pytest
import torch

from mmrlvr.algos.poise import (PoiseProbe, auc, cross_rollout_baseline, entropy_stats, poise_advantages,
                                poise_features)


def test_cross_rollout_baseline_never_uses_the_rollouts_own_prediction():
    # G = 2: each takes the other's prediction; G = 3: the mean of the two others; a lone row gets 0
    pred = torch.tensor([0.2, 0.8, 0.1, 0.4, 0.7, 0.9])
    groups = torch.tensor([0, 0, 1, 1, 1, 2])
    b, lonely = cross_rollout_baseline(pred, groups)
    torch.testing.assert_close(b, torch.tensor([0.8, 0.2, (0.4 + 0.7) / 2, (0.1 + 0.7) / 2, (0.1 + 0.4) / 2, 0.0]))
    assert lonely == 1
    # unbiasedness in the sense that matters: b_i does not move when rollout i's own features move
    pred2 = pred.clone()
    pred2[0] = 5.0
    assert float(cross_rollout_baseline(pred2, groups)[0][0]) == pytest.approx(0.8)


def test_auc_and_entropy_stats_hand_worked():
    assert auc(torch.tensor([0.9, 0.8, 0.1, 0.8]), torch.tensor([True, True, False, False])) == pytest.approx(
        (1 + 0.5 + 1 + 1) / 4)
    assert auc(torch.tensor([0.1, 0.2]), torch.tensor([True, True])) is None
    ent = torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(entropy_stats(ent, mask), torch.tensor([[2.0, 1.0, 3.0], [2.0, 0.0, 2.0]]))
    f = poise_features(torch.ones(2, 4), torch.zeros(2, 4), ent, mask)
    assert f.shape == (2, 11)


def test_probe_learns_online_and_its_auc_is_logged_with_group_size_two():
    # prompts carry a difficulty d in their features; reward 1 with probability 1 - d. The probe should learn
    # to predict the reward from the features, so the held-out AUC rises well above 0.5 within a few steps.
    g = torch.Generator().manual_seed(0)
    probe = PoiseProbe(3, seed=0, buffer_steps=8, train_iters=30, lr=1e-2)
    aucs, first = [], None
    for step in range(12):
        d = torch.rand(16, generator=g).repeat_interleave(2)  # 16 prompts x G = 2
        x = torch.stack([d, torch.rand(32, generator=g), torch.zeros(32)], -1)
        r = (torch.rand(32, generator=g) > d).float()
        groups = torch.arange(16).repeat_interleave(2)
        adv, stats = poise_advantages(r, groups, x, probe)
        assert adv.shape == (32,) and "poise/probe_mse" in stats and "poise/train_mse" in stats
        if step == 0:
            first = stats
            torch.testing.assert_close(adv, r)  # untrained probe predicts 0: A = r - 0
        if "poise/probe_auc" in stats:
            aucs.append(stats["poise/probe_auc"])
    assert first["poise/lone_rows"] == 0
    assert sum(aucs[-4:]) / 4 > 0.7, aucs  # held-out: computed before the probe trains on that step
    # A = r - b with b from the *other* rollout's prediction
    pred = probe.predict(x)
    b, _ = cross_rollout_baseline(pred, groups)
    adv, _ = poise_advantages(r, groups, x, probe, train=False)
    torch.testing.assert_close(adv, r - b)
    state = probe.state_dict()
    other = PoiseProbe(3)
    other.load_state_dict(state)
    torch.testing.assert_close(other.predict(x), probe.predict(x))
    assert math.isfinite(sum(aucs))
