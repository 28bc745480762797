"""KL estimators, loss aggregation modes and masked reductions: hand-worked values and masking."""

import math

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.algos import (
    AGG_MODES,
    KL_ESTIMATORS,
    agg_loss,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_mean,
    masked_var,
    masked_whiten,
)
from mmrlvr.registry import RegistryError

REF = torch.tensor([[-1.0, -1.0, -1.0]])
D = torch.tensor([[0.5, -0.5, 0.0]])  # d = log pi - log pi_ref


class TestKL:
    def test_hand_worked(self):
        assert_close(kl_k1(REF + D, REF), D)
        # k2 = d^2 / 2 = (0.125, 0.125, 0)
        assert_close(kl_k2(REF + D, REF), torch.tensor([[0.125, 0.125, 0.0]]))
        # k3 = e^-d + d - 1: e^-0.5 - 0.5 = 0.10653; e^0.5 - 1.5 = 0.14872; 0
        assert_close(kl_k3(REF + D, REF), torch.tensor([[math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5, 0.0]]))

    def test_k3_clamps(self):
        # d = -30 -> clamped to -20: e^20 - 21 ~ 4.9e8 -> result clamped to 10
        # d = 30 -> clamped to 20: e^-20 + 19 ~ 19 -> 10;  d = 5: e^-5 + 4 = 4.00674 (untouched)
        got = kl_k3(torch.tensor([[-30.0, 30.0, 5.0]]), torch.zeros(1, 3))
        assert_close(got, torch.tensor([[10.0, 10.0, math.exp(-5) + 4]]))

    def test_k3_gradient(self):
        # d k3 / d logp = 1 - e^-d: d = 0.5 -> 0.39347; d = -0.5 -> -0.64872; d = 0 -> 0
        logp = (REF + D).requires_grad_(True)
        (grad,) = torch.autograd.grad(kl_k3(logp, REF).sum(), logp)
        assert_close(grad, torch.tensor([[1 - math.exp(-0.5), 1 - math.exp(0.5), 0.0]]))

    @pytest.mark.parametrize("name", ["k1", "k2", "k3"])
    def test_mask_makes_minus_inf_padding_safe(self, name):
        inf = float("-inf")
        logp = torch.tensor([[-1.0, inf], [-0.5, inf]], requires_grad=True)
        ref = torch.tensor([[-1.2, inf], [-0.1, inf]])
        mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
        kl = KL_ESTIMATORS.get(name)(logp, ref, mask=mask)
        (grad,) = torch.autograd.grad(agg_loss(kl, mask, "token-mean"), logp)
        assert torch.isfinite(kl).all() and torch.isfinite(grad).all()
        assert kl[:, 1].eq(0).all() and grad[:, 1].eq(0).all()

    def test_estimators_agree_with_exact_kl_by_sampling(self):
        # Monte Carlo over a 4-way categorical: k1 and k3 are unbiased for KL(pi || ref); k2 close
        pi = torch.tensor([0.4, 0.3, 0.2, 0.1])
        ref = torch.tensor([0.3, 0.3, 0.25, 0.15])
        exact = float((pi * (pi / ref).log()).sum())  # 0.4 ln(4/3) + 0 + 0.2 ln 0.8 + 0.1 ln(2/3) = 0.02989
        idx = torch.multinomial(pi, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
        logp, ref_logp = pi.log()[idx][None], ref.log()[idx][None]
        assert kl_k1(logp, ref_logp).mean().item() == pytest.approx(exact, abs=2e-3)
        assert kl_k3(logp, ref_logp).mean().item() == pytest.approx(exact, abs=2e-3)
        assert kl_k2(logp, ref_logp).mean().item() == pytest.approx(exact, abs=5e-3)
        assert (kl_k3(logp, ref_logp) >= 0).all()

    def test_unknown_estimator(self):
        with pytest.raises(RegistryError, match="unknown KL estimator 'k4'; known: k1, k2, k3"):
            KL_ESTIMATORS.get("k4")


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


class TestAggregation:
    @pytest.mark.parametrize("mode, expected", [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-mean", 2.75),  # ((1 + 2) / 2 + 4 / 1) / 2
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 6),  # 7 / (2 rows * L = 3)
    ])
    def test_hand_worked(self, mode, expected):
        assert_close(agg_loss(LOSS, MASK, mode), torch.tensor(expected))

    def test_norm_constant(self):
        # Dr.GRPO with a generation budget of 7 tokens: 7 / (2 * 7) = 0.5
        assert_close(agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_constant=7), torch.tensor(0.5))
        with pytest.raises(ValueError, match="norm_constant"):
            agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_constant=0)

    @pytest.mark.parametrize("mode, expected", [
        ("token-mean", 6 / 3.5),  # (2*1 + 1*2 + 0.5*4) / (2 + 1 + 0.5)
        ("seq-mean-token-mean", (4 / 3 + 4) / 2),  # row 0: (2 + 2) / 3; row 1: 2 / 0.5
        ("seq-mean-token-sum", (4 + 2) / 2),
        ("seq-mean-token-sum-norm", 6 / 6),
    ])
    def test_token_weights(self, mode, expected):
        weights = torch.tensor([[2.0, 1.0, 0.0], [0.5, 0.0, 0.0]])
        assert_close(agg_loss(LOSS, weights, mode), torch.tensor(expected))

    def test_empty_row(self):
        mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
        # seq-mean-token-mean skips the empty row: (1 + 2) / 2; token-sum modes still divide by N = 2
        assert_close(agg_loss(LOSS, mask, "seq-mean-token-mean"), torch.tensor(1.5))
        assert_close(agg_loss(LOSS, mask, "seq-mean-token-sum"), torch.tensor(1.5))

    @pytest.mark.parametrize("mode", sorted(AGG_MODES))
    def test_all_masked_is_zero_with_finite_gradient(self, mode):
        loss = LOSS.clone().requires_grad_(True)
        total = agg_loss(loss, torch.zeros(2, 3), mode)
        (grad,) = torch.autograd.grad(total, loss)
        assert total.item() == 0 and torch.isfinite(grad).all()

    @pytest.mark.parametrize("mode", sorted(AGG_MODES))
    def test_garbage_at_masked_positions_is_ignored(self, mode):
        for fill in (float("-inf"), float("inf"), float("nan")):
            loss = torch.where(MASK > 0, LOSS, torch.tensor(fill)).requires_grad_(True)
            total = agg_loss(loss, MASK, mode)
            (grad,) = torch.autograd.grad(total, loss)
            assert_close(total, agg_loss(LOSS, MASK, mode))
            assert torch.isfinite(grad).all() and grad[MASK == 0].eq(0).all()

    def test_seq_mean_token_mean_matches_loop(self):
        gen = torch.Generator().manual_seed(0)
        loss = torch.randn(5, 7, generator=gen)
        mask = (torch.rand(5, 7, generator=gen) > 0.4).float() * torch.rand(5, 7, generator=gen) * 2
        mask[2] = 0
        rows = [float((loss[i] * mask[i]).sum() / mask[i].sum()) for i in range(5) if mask[i].sum() > 0]
        assert_close(agg_loss(loss, mask, "seq-mean-token-mean"), torch.tensor(sum(rows) / len(rows)))

    def test_unknown_mode_lists_known(self):
        with pytest.raises(RegistryError, match="unknown loss aggregation mode 'mean'; known: seq-mean-token-mean, "
                                                "seq-mean-token-sum, seq-mean-token-sum-norm, token-mean"):
            agg_loss(LOSS, MASK, "mean")

    def test_shape_check(self):
        with pytest.raises(ValueError, match="must both be"):
            agg_loss(LOSS, MASK[:1], "token-mean")


class TestMasked:
    def test_masked_mean_weights(self):
        # (1*2 + 2*1 + 4*0.5) / 3.5 = 1.71429; per row: (4/3, 4)
        w = torch.tensor([[2.0, 1.0, 0.0], [0.5, 0.0, 0.0]])
        assert_close(masked_mean(LOSS, w), torch.tensor(6 / 3.5))
        assert_close(masked_mean(LOSS, w, dim=-1), torch.tensor([4 / 3, 4.0]))

    def test_masked_var(self):
        # values 1, 2, 4: mean 7/3, squared deviations 16/9, 1/9, 25/9 -> population 14/9, unbiased 7/3
        assert_close(masked_var(LOSS, MASK), torch.tensor(14 / 9))
        assert_close(masked_var(LOSS, MASK, unbiased=True), torch.tensor(7 / 3))

    def test_masked_whiten(self):
        values = torch.where(MASK > 0, LOSS, torch.tensor(float("nan")))
        out = masked_whiten(values, MASK)
        # (v - 7/3) / sqrt(14/9): (-0.8552, -0.2673, 1.3363); masked -> 0
        s = math.sqrt(14 / 9)
        assert_close(out, torch.tensor([[(1 - 7 / 3) / s, (2 - 7 / 3) / s, 0], [(4 - 7 / 3) / s, 0, 0]]))
        assert_close(masked_mean(out, MASK), torch.tensor(0.0), atol=1e-6, rtol=0)
        kept = masked_whiten(values, MASK, shift_mean=False)
        assert (kept[MASK > 0] > 0).all()  # rescaled only, signs kept
