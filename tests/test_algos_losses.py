"""Policy losses: hand-worked values and gradients, masking, loop-vs-vectorised, NSR's recovery rule."""

import math

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.algos import (
    POLICY_LOSSES,
    agg_loss,
    call_policy_loss,
    cispo_loss,
    gspo_loss,
    nsr_loss,
    ppo_clip_loss,
)
from mmrlvr.registry import RegistryError

E = math.e
OLD = torch.tensor([[-2.0, -1.0, -0.5], [-2.0, -1.0, -0.5]])
LOG_RATIO = torch.tensor([[1.0, 0.0, -1.0], [1.0, 0.0, -1.0]])
ADV = torch.tensor([1.0, -1.0])
FULL = torch.ones(2, 3)


def _logp(values: torch.Tensor) -> torch.Tensor:
    return values.clone().requires_grad_(True)


class TestPPOClip:
    def test_hand_worked_values_and_gradients(self):
        # ratios r = e^(1, 0, -1) = (2.718, 1, 0.368) in both rows; eps 0.2 -> clip range [0.8, 1.2]
        # row 0, A = +1: max(-r, -clip(r)) = (max(-2.718, -1.2), -1, max(-0.368, -0.8)) = (-1.2, -1, -0.368)
        #   d/dlogp: clipped token 0 -> 0; token 1: -r = -1; token 2 (unclipped side wins): -r = -0.368
        # row 1, A = -1: max(r, clip(r)) = (2.718, 1, max(0.368, 0.8) = 0.8); grads (e, 1, 0)
        logp = _logp(OLD + LOG_RATIO)
        loss, stats = ppo_clip_loss(logp, OLD, ADV, FULL)
        assert_close(loss, torch.tensor([[-1.2, -1.0, -1 / E], [E, 1.0, 0.8]]))
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        assert_close(grad, torch.tensor([[0.0, -1.0, -1 / E], [E, 1.0, 0.0]]))
        # 2 of 6 tokens clipped; ratio mean (2e + 2 + 2/e) / 6 = 1.36205
        assert_close(stats.clip_fraction, torch.tensor(2 / 6))
        assert_close(stats.ratio_mean, torch.tensor((2 * E + 2 + 2 / E) / 6))
        assert_close(stats.ratio_max, torch.tensor(E))
        assert_close(stats.ratio_min, torch.tensor(1 / E))
        # k3 of KL(old || new): r - 1 - log r = (e - 2, 0, 1/e) per row -> mean (2(e-2) + 2/e) / 6
        assert_close(stats.approx_kl, torch.tensor((2 * (E - 2) + 2 / E) / 6))
        assert stats.recovered_fraction == 0

    def test_clip_higher(self):
        # DAPO eps_high 0.28: the A = +1, r = e token is clipped at 1.28 instead of 1.2
        loss, _ = ppo_clip_loss(OLD + LOG_RATIO, OLD, ADV, FULL, eps_low=0.2, eps_high=0.28)
        assert_close(loss[0, 0], torch.tensor(-1.28))
        assert_close(loss[1, 2], torch.tensor(0.8))  # lower bound still 1 - 0.2

    def test_dual_clip_caps_negative_advantage_tokens(self):
        # A = -1, log ratios (2, 1): r = (7.389, 2.718). PPO loss = max(r, 1.2) = (7.389, 2.718);
        # dual clip c = 3: min(., 3) = (3, 2.718); the capped token has zero gradient
        old = torch.tensor([[-3.0, -3.0]])
        logp = _logp(old + torch.tensor([[2.0, 1.0]]))
        loss, stats = ppo_clip_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), dual_clip=3.0)
        assert_close(loss, torch.tensor([[3.0, E]]))
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        assert_close(grad, torch.tensor([[0.0, E]]))
        assert_close(stats.clip_fraction, torch.tensor(0.5))

    def test_dual_clip_must_exceed_one(self):
        with pytest.raises(ValueError, match="dual_clip must be > 1"):
            ppo_clip_loss(OLD, OLD, ADV, FULL, dual_clip=0.5)

    def test_matches_scalar_loop(self):
        gen = torch.Generator().manual_seed(1)
        old = -torch.rand(4, 6, generator=gen) * 3
        logp = old + torch.randn(4, 6, generator=gen) * 0.4
        adv = torch.randn(4, generator=gen)
        loss, _ = ppo_clip_loss(logp, old, adv, torch.ones(4, 6), eps_low=0.2, eps_high=0.28, dual_clip=3.0)
        expected = torch.zeros(4, 6)
        for i in range(4):
            a = float(adv[i])
            for t in range(6):
                r = math.exp(float(logp[i, t] - old[i, t]))
                val = max(-a * r, -a * min(max(r, 0.8), 1.28))
                expected[i, t] = min(val, -a * 3.0) if a < 0 else val
        assert_close(loss, expected)

    def test_token_level_advantages_equal_broadcast(self):
        loss_seq, _ = ppo_clip_loss(OLD + LOG_RATIO, OLD, ADV, FULL)
        loss_tok, _ = ppo_clip_loss(OLD + LOG_RATIO, OLD, ADV[:, None].expand(2, 3), FULL)
        assert_close(loss_seq, loss_tok)


class TestGSPO:
    def test_sequence_ratio_is_clipped_as_a_whole(self):
        # row 0: log ratios (0.1, 0.3), third token padding -> s = e^0.2 = 1.2214 > 1.2 (eps 0.2), A = +1:
        #   every token's loss is -1.2 and none gets a gradient
        # row 1: log ratios (0.1, -0.1, 0) -> s = e^0 = 1: loss -1 per token, d/dlogp_t = -s = -1
        old = torch.full((2, 3), -1.0)
        logp = _logp(old + torch.tensor([[0.1, 0.3, 0.0], [0.1, -0.1, 0.0]]))
        mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
        loss, stats = gspo_loss(logp, old, torch.tensor([1.0, 1.0]), mask, eps_low=0.2, eps_high=0.2)
        assert_close(loss, torch.tensor([[-1.2, -1.2, 0.0], [-1.0, -1.0, -1.0]]))
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        assert_close(grad, torch.tensor([[0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]]))
        assert_close(stats.clip_fraction, torch.tensor(2 / 5))  # row 0's two tokens
        assert_close(stats.ratio_max, torch.tensor(math.exp(0.2)))

    def test_token_form_gradient_equals_sequence_objective(self):
        # Unclipped (wide eps): grad of seq-mean-token-mean(gspo) == grad of mean_i(-A_i * s_i(theta))
        # with s_i = exp(mean_t (logp - old)) over each row's own tokens
        gen = torch.Generator().manual_seed(2)
        old = -torch.rand(3, 5, generator=gen) * 2
        delta = torch.randn(3, 5, generator=gen) * 0.1
        mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [1.0] * 4 + [0.0]])
        adv = torch.tensor([0.7, -1.3, 0.4])
        logp = _logp(old + delta)
        loss, _ = gspo_loss(logp, old, adv, mask, eps_low=10.0, eps_high=10.0)
        (grad,) = torch.autograd.grad(agg_loss(loss, mask, "seq-mean-token-mean"), logp)
        logp2 = _logp(old + delta)
        s = torch.exp(((logp2 - old) * mask).sum(-1) / mask.sum(-1))
        (grad_ref,) = torch.autograd.grad((-adv * s).mean(), logp2)
        assert_close(grad, grad_ref)
        assert (grad[mask > 0] != 0).all()  # every token of every sequence gets a gradient


class TestCISPO:
    def test_hand_worked_every_token_keeps_gradient(self):
        # row 0 of the shared example, A = +1: r = (e, 1, 1/e); eps_high 0.28, no lower bound:
        # weight sg(clip(r, 0, 1.28)) = (1.28, 1, 0.3679); logp = old + log r = (-1, -1, -1.5)
        # loss = -w * A * logp = (1.28, 1, 0.5518); d/dlogp = -w * A = (-1.28, -1, -0.3679), none zero
        logp = _logp(OLD[:1] + LOG_RATIO[:1])
        loss, stats = cispo_loss(logp, OLD[:1], ADV[:1], FULL[:1], eps_high=0.28)
        assert_close(loss, torch.tensor([[1.28, 1.0, 1.5 / E]]))
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        assert_close(grad, torch.tensor([[-1.28, -1.0, -1 / E]]))
        assert_close(stats.clip_fraction, torch.tensor(1 / 3))  # the truncated weight of token 0

    def test_lower_bound_when_given(self):
        loss, stats = cispo_loss(OLD[:1] + LOG_RATIO[:1], OLD[:1], ADV[:1], FULL[:1], eps_high=0.28, eps_low=0.2)
        # token 2: weight clip(0.368, 0.8, 1.28) = 0.8 -> loss -0.8 * 1 * (-1.5) = 1.2
        assert_close(loss[0, 2], torch.tensor(1.2))
        assert_close(stats.clip_fraction, torch.tensor(2 / 3))


class TestNSR:
    def test_equals_ppo_clip_when_nothing_is_clipped(self):
        logp = OLD + 0.05 * LOG_RATIO  # ratios within [0.95, 1.05]
        nsr, _ = nsr_loss(logp, OLD, ADV, FULL, generator=torch.Generator().manual_seed(0))
        ppo, _ = ppo_clip_loss(logp, OLD, ADV, FULL, eps_low=0.2, eps_high=0.28)
        assert_close(nsr, ppo)

    def test_rescue_rule_with_the_same_noise(self):
        # A = +1, r = 1.3 > b = 1.28, noise 0.2: r' = 1.3 (1 - 0.2 u) <= 1.28  <=>  u >= 0.076923;
        # a rescued token has loss -r' and gradient -r' (d r / d logp = r); others stay clipped at -1.28
        n = 64
        old = torch.full((1, n), -1.0)
        logp = _logp(old + math.log(1.3))
        loss, stats = nsr_loss(logp, old, torch.ones(1), torch.ones(1, n), generator=torch.Generator().manual_seed(3))
        u = torch.rand((1, n), generator=torch.Generator().manual_seed(3))
        rescued = u >= (1 - 1.28 / 1.3) / 0.2
        r_noisy = 1.3 * (1 - 0.2 * u)
        assert_close(loss, torch.where(rescued, -r_noisy, torch.full_like(u, -1.28)))
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        assert_close(grad, torch.where(rescued, -r_noisy, torch.zeros_like(u)))
        assert_close(stats.recovered_fraction, rescued.float().mean())
        assert_close(stats.clip_fraction, 1 - rescued.float().mean())

    def test_expected_gradient_is_a_soft_clip(self):
        # r = 1.3: P(rescue) = 1 - (1 - 1.28/1.3)/0.2 = 0.92308; E[grad] = -int_{u0}^1 1.3 (1 - 0.2u) du
        #   = -1.3 * [(1 - u0) - 0.1 (1 - u0^2)] = -1.07077
        # r = 1.7 > 1.28 / 0.8 = 1.6: outside the band, never rescued, gradient 0
        # A = -1, r = 0.7 < 0.8: r' = 0.7 (1 + 0.2 u) >= 0.8 <=> u >= 0.71429: P = 0.28571
        n = 20000
        old = torch.full((3, n), -1.0)
        logp = _logp(old + torch.tensor([[math.log(1.3)], [math.log(1.7)], [math.log(0.7)]]))
        loss, _ = nsr_loss(logp, old, torch.tensor([1.0, 1.0, -1.0]), torch.ones(3, n),
                           generator=torch.Generator().manual_seed(4))
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        u0 = (1 - 1.28 / 1.3) / 0.2
        assert (grad[0] != 0).float().mean().item() == pytest.approx(1 - u0, abs=0.01)
        assert grad[0].mean().item() == pytest.approx(-1.3 * ((1 - u0) - 0.1 * (1 - u0 ** 2)), abs=0.01)
        assert grad[1].eq(0).all()
        assert (grad[2] != 0).float().mean().item() == pytest.approx(1 - (0.8 / 0.7 - 1) / 0.2, abs=0.015)

    def test_full_noise_gives_inverse_ratio_rescue_rate(self):
        # noise = 1: r' = r u <= b  <=>  u <= b / r; at r = 2b, P = 0.5
        n = 20000
        old = torch.full((1, n), -1.0)
        logp = old + math.log(2 * 1.28)
        _, stats = nsr_loss(logp, old, torch.ones(1), torch.ones(1, n), noise=1.0,
                            generator=torch.Generator().manual_seed(5))
        assert stats.recovered_fraction.item() == pytest.approx(0.5, abs=0.015)

    def test_same_generator_seed_same_loss(self):
        logp = OLD + 0.35 * LOG_RATIO
        a, _ = nsr_loss(logp, OLD, ADV, FULL, generator=torch.Generator().manual_seed(7))
        b, _ = nsr_loss(logp, OLD, ADV, FULL, generator=torch.Generator().manual_seed(7))
        assert torch.equal(a, b)

    def test_bad_noise(self):
        with pytest.raises(ValueError, match="noise"):
            nsr_loss(OLD, OLD, ADV, FULL, noise=0.0)


ALL_LOSSES = sorted(POLICY_LOSSES)


@pytest.mark.parametrize("name", ALL_LOSSES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_masked_positions_change_nothing(name, mode):
    # Random values, -inf and NaN at masked positions must leave the loss and gradients unchanged.
    gen = torch.Generator().manual_seed(11)
    old = -torch.rand(3, 6, generator=gen) * 3
    delta = torch.randn(3, 6, generator=gen) * 0.4
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [0.5, 2.0, 1.0, 0.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -0.5, 2.0])
    results = []
    for fill in (0.0, float("-inf"), float("nan"), 123.0):
        # the garbage sits in the leaf itself, so a NaN gradient at a masked position would show
        logp = _logp(torch.where(mask > 0, old + delta, torch.full_like(old, fill)))
        old_in = torch.where(mask > 0, old, torch.full_like(old, fill if fill == fill else -7.0))
        loss, stats = call_policy_loss(name, logp, old_in, adv, mask, generator=torch.Generator().manual_seed(0))
        total = agg_loss(loss, mask, mode)
        (grad,) = torch.autograd.grad(total, logp)
        assert torch.isfinite(total) and torch.isfinite(grad).all(), (name, fill)
        assert loss[mask == 0].eq(0).all() and grad[mask == 0].eq(0).all()
        results.append((total.detach(), grad, stats))
    for total, grad, stats in results[1:]:
        assert_close(total, results[0][0])
        assert_close(grad, results[0][1])
        for got, want in zip(stats, results[0][2]):
            assert_close(got, want)


@pytest.mark.parametrize("name", ALL_LOSSES)
def test_blocked_tokens_with_minus_inf_in_both_policies(name):
    # STACK.md: pad after end-of-sequence has log-prob -inf under pi and pi_old alike
    inf = float("-inf")
    logp = _logp(torch.tensor([[-1.0, -0.5, inf], [-0.2, inf, inf]]))
    old = logp.detach() - 0.1
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, stats = call_policy_loss(name, logp, old, torch.tensor([1.0, -1.0]), mask)
    (grad,) = torch.autograd.grad(agg_loss(loss, mask, "token-mean"), logp)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    assert all(torch.isfinite(getattr(stats, f)) for f in stats._fields if f != "diagnostics")


def test_empty_mask_gives_zero_loss_and_finite_stats():
    for name in ALL_LOSSES:
        loss, stats = call_policy_loss(name, OLD, OLD, ADV, torch.zeros(2, 3))
        assert loss.eq(0).all() and all(torch.isfinite(getattr(stats, f)) for f in stats._fields if f != "diagnostics")


class TestLookup:
    def test_unknown_loss_lists_known(self):
        # every registered loss is named: the built-ins, and any a plug-in loaded earlier in this test process added
        # (tests/test_examples_plugins.py loads one; the suite's order decides whether it ran before this test)
        known = POLICY_LOSSES.names()
        assert {n for n in known if POLICY_LOSSES.get(n).__module__.startswith("mmrlvr.")} == {
            "cispo", "clip_cov", "gspo", "kl_cov", "nsr", "popo", "ppo_clip"}
        with pytest.raises(RegistryError) as err:
            POLICY_LOSSES.get("ppo")
        assert str(err.value).startswith(f"unknown policy loss 'ppo'; known: {', '.join(known)}")

    def test_unknown_parameter_is_named(self):
        with pytest.raises(TypeError, match=r"'gspo' got unknown parameter\(s\) \['dual_clip'\]"):
            call_policy_loss("gspo", OLD, OLD, ADV, FULL, dual_clip=3.0)

    def test_generator_reaches_only_losses_that_take_it(self):
        gen = torch.Generator().manual_seed(0)
        call_policy_loss("ppo_clip", OLD, OLD, ADV, FULL, generator=gen)  # ignored, no error
        a, _ = call_policy_loss("nsr", OLD + 0.35 * LOG_RATIO, OLD, ADV, FULL, generator=torch.Generator().manual_seed(9))
        b, _ = nsr_loss(OLD + 0.35 * LOG_RATIO, OLD, ADV, FULL, generator=torch.Generator().manual_seed(9))
        assert torch.equal(a, b)

    def test_bad_shapes(self):
        with pytest.raises(ValueError, match="advantages"):
            ppo_clip_loss(OLD, OLD, torch.ones(3), FULL)
        with pytest.raises(ValueError, match="must all be"):
            ppo_clip_loss(OLD, OLD[:1], ADV, FULL)
