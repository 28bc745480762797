"""POPO positive-only loss (arXiv 2605.06650, METHODS.md §5): weights, NLL, similarity term, EMA target."""

from __future__ import annotations

import math

import pytest
import torch

from mmrlvr.algos.aggregation import agg_loss
from mmrlvr.algos.losses import POLICY_LOSSES, call_policy_loss
from mmrlvr.algos.popo import PopoSimilarity, masked_mean_features, popo_entropy_term, popo_weights


def test_weights_softmax_over_positives_per_group_hand_worked():
    # group 0: rewards 1, 1, 0, 0 with length-averaged log-probs -1, -2 for the positives (T = 1):
    # w = softmax(-1, -2) = (e^-1, e^-2) / (e^-1 + e^-2) = (0.7311, 0.2689); a = 2 w
    # group 1: no positive -> nothing, counted. group 2: one positive -> a = 1
    rewards = torch.tensor([1.0, 1.2, 0.0, 0.2, 0.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    ell = torch.tensor([-1.0, -2.0, -0.5, -0.1, -1.0, -1.0, -3.0, -1.0])
    a, pos, stats = popo_weights(rewards, groups, ell)
    e1, e2 = math.exp(-1), math.exp(-2)
    torch.testing.assert_close(a, torch.tensor([2 * e1 / (e1 + e2), 2 * e2 / (e1 + e2), 0, 0, 0, 0, 1.0, 0]))
    assert pos.tolist() == [True, True, False, False, False, False, True, False]
    assert stats["popo/groups_without_positive"] == 1 and stats["popo/groups"] == 3
    # temperature 2: softmax(-0.5, -1)
    a2, _, _ = popo_weights(rewards, groups, ell, temperature=2.0)
    h1, h2 = math.exp(-0.5), math.exp(-1.0)
    assert float(a2[0]) == pytest.approx(2 * h1 / (h1 + h2), rel=1e-6)


def test_loss_is_a_weighted_nll_over_positive_tokens():
    logp = torch.tensor([[-0.5, -1.0, 0.0], [-2.0, -0.1, -0.3]], requires_grad=True)
    a = torch.tensor([1.5, 0.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # the stage zeroes the non-positive row
    loss, stats = call_policy_loss("popo", logp, logp.detach(), a, mask)
    torch.testing.assert_close(loss.detach(), torch.tensor([[0.75, 1.5, 0.0], [0.0, 0.0, 0.0]]))
    # token-mean divides by the positive token count (2): (0.75 + 1.5) / 2
    assert float(agg_loss(loss, mask, "token-mean")) == pytest.approx(1.125)
    assert float(stats.clip_fraction) == 0.0 and "popo" in POLICY_LOSSES
    neg, _ = call_policy_loss("popo", logp, logp.detach(), torch.tensor([-1.0, 0.0]), mask)
    assert torch.equal(neg.detach(), torch.zeros(2, 3))  # positive only


def test_entropy_term_and_features():
    ent = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    torch.testing.assert_close(popo_entropy_term(ent, mask), torch.tensor([[-0.01, 0.0], [-0.03, -0.04]]))
    h = torch.arange(12.0).reshape(2, 2, 3)
    torch.testing.assert_close(masked_mean_features(h, mask), torch.tensor([[0.0, 1.0, 2.0], [7.5, 8.5, 9.5]]))


def test_similarity_term_hand_worked_and_ema_target():
    sim = PopoSimilarity(2, predictor_hidden=4, noise_std=0.0)
    with torch.no_grad():  # make h_phi the identity on R^2 (GELU(x) for x>0 plus a -x path)
        sim.predictor[0].weight.copy_(torch.tensor([[1.0, 0], [0, 1.0], [-1.0, 0], [0, -1.0]]) * 10)
        sim.predictor[0].bias.zero_()
        sim.predictor[2].weight.copy_(torch.tensor([[1.0, 0, -1.0, 0], [0, 1.0, 0, -1.0]]) / 10)
        sim.predictor[2].bias.zero_()
    f_on = torch.tensor([[1.0, 0.0], [1.0, 1.0]], requires_grad=True)
    f_tg = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    w = torch.tensor([3.0, 1.0])
    # cos = 1 and 1/sqrt(2): L = -(3*1 + 1*0.7071) / 4
    assert float(sim.loss(f_on, f_tg, w)) == pytest.approx(-(3 + 1 / math.sqrt(2)) / 4, abs=1e-3)
    sim.loss(f_on, f_tg, w).backward()
    assert f_on.grad is not None and sim.predictor[0].weight.grad is not None
    assert float(sim.loss(f_on, f_tg, torch.zeros(2))) == 0.0  # no positive: nothing
    # EMA: xi <- 0.995 xi + 0.005 theta
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema = PopoSimilarity(1, predictor_hidden=2)
    ema.update_target(model)
    with torch.no_grad():
        model.weight.fill_(3.0)
    ema.update_target(model)
    with ema.target(model):
        assert float(model.weight) == pytest.approx(0.995 * 1 + 0.005 * 3)
    assert float(model.weight) == 3.0  # restored
