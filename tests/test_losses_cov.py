"""Clip-Cov and KL-Cov (Cui et al. 2025, arXiv:2505.22617): covariance, selection, gradients, hand-worked.

Cov_i = (log pi_i - mean log pi) * (A_i - mean A) over the valid tokens of the batch the loss sees. KL-Cov adds
coef * |log pi - log pi_old| to the unclipped surrogate of the max(1, floor(k * N)) tokens of largest Cov; Clip-Cov
detaches max(1, floor(r * N)) tokens drawn among those with omega_low < Cov < omega_high that PPO did not clip.
Every expected number below is worked out by hand in the comments, not read from the implementation. The last
tests run both losses through the trainer on the tiny offline model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.algos.losses import POLICY_LOSSES, _centred_cov, call_policy_loss, ppo_clip_loss

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------ KL-Cov
# 2 rows x 3 tokens, the last token of row 1 is padding (-inf, mask 0): 5 valid tokens.
#   log pi = [[-0.5, -1.0, -2.0], [-0.5, -3.0, pad]], A = [+1, -1] per row
#   mean log pi = (-0.5 - 1 - 2 - 0.5 - 3) / 5 = -1.4;  mean A = (1 + 1 + 1 - 1 - 1) / 5 = 0.2
#   Cov = (log pi + 1.4) * (A - 0.2):
#     (0,0) 0.9 * 0.8 = 0.72   (0,1) 0.4 * 0.8 = 0.32   (0,2) -0.6 * 0.8 = -0.48
#     (1,0) 0.9 * -1.2 = -1.08 (1,1) -1.6 * -1.2 = 1.92
#   ranked: (1,1) 1.92 > (0,0) 0.72 > (0,1) 0.32 > (0,2) -0.48 > (1,0) -1.08
KL_LOGP = torch.tensor([[-0.5, -1.0, -2.0], [-0.5, -3.0, float("-inf")]])
KL_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
KL_ADV = torch.tensor([1.0, -1.0])
KL_COV = torch.tensor([[0.72, 0.32, -0.48], [-1.08, 1.92, 0.0]])


def _leaf(values: torch.Tensor) -> torch.Tensor:
    return values.clone().requires_grad_(True)


def _grad(name: str, logp_values: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
          **params) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(loss [N, L], d sum(loss) / d log pi [N, L], stats) of loss ``name``."""
    logp = _leaf(logp_values)
    loss, stats = call_policy_loss(name, logp, old, adv, mask, **params)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return loss.detach(), grad, stats


def test_covariance_is_centred_over_valid_tokens_hand_worked():
    valid = KL_MASK > 0
    logp = torch.where(valid, KL_LOGP, 0.0)
    adv = KL_ADV.unsqueeze(-1).expand(2, 3)
    assert_close(_centred_cov(logp, adv, valid), KL_COV)


def test_kl_cov_penalises_exactly_the_top_k_tokens():
    # off-policy by hand-picked log-ratios, all inside PPO's [0.8, 1.2] so ppo_clip clips nothing here
    log_r = torch.tensor([[0.05, 0.05, -0.05], [0.05, -0.1, 0.0]])
    old = torch.where(KL_MASK > 0, KL_LOGP - log_r, KL_LOGP)
    r = log_r.exp()
    _, ppo_grad, _ = _grad("ppo_clip", KL_LOGP, old, KL_ADV, KL_MASK)
    # ppo_clip (unclipped everywhere): d(-A r)/d log pi = -A r
    assert_close(ppo_grad, torch.where(KL_MASK > 0, -KL_ADV.unsqueeze(-1) * r, 0.0))

    # default k = 2e-3: n = max(1, floor(0.002 * 5)) = 1 -> only (1,1), Cov 1.92
    loss, grad, stats = _grad("kl_cov", KL_LOGP, old, KL_ADV, KL_MASK)
    # (1,1): A = -1, log r = -0.1: loss = r + |log r| = e^-0.1 + 0.1; grad = r + sign(-0.1) = e^-0.1 - 1
    assert loss[1, 1].item() == pytest.approx(math.exp(-0.1) + 0.1, rel=1e-6)
    assert grad[1, 1].item() == pytest.approx(math.exp(-0.1) - 1, rel=1e-5)
    changed = ~torch.isclose(grad, ppo_grad)
    assert changed.nonzero().tolist() == [[1, 1]]
    assert float(stats.clip_fraction) == 0.0  # no token loses its gradient

    # k = 0.4: n = floor(0.4 * 5) = 2 -> (1,1) and (0,0), the two largest Cov
    loss, grad, _ = _grad("kl_cov", KL_LOGP, old, KL_ADV, KL_MASK, fraction=0.4)
    assert (~torch.isclose(grad, ppo_grad)).nonzero().tolist() == [[0, 0], [1, 1]]
    # (0,0): A = +1, log r = 0.05: grad = -e^0.05 + 1
    assert grad[0, 0].item() == pytest.approx(1 - math.exp(0.05), rel=1e-5)
    assert loss[0, 0].item() == pytest.approx(-math.exp(0.05) + 0.05, rel=1e-6)
    # coef scales only the penalty: beta = 0.5 on (1,1): e^-0.1 - 0.5
    _, grad_half, _ = _grad("kl_cov", KL_LOGP, old, KL_ADV, KL_MASK, fraction=0.4, coef=0.5)
    assert grad_half[1, 1].item() == pytest.approx(math.exp(-0.1) - 0.5, rel=1e-5)


def test_kl_cov_on_policy_penalty_has_zero_gradient():
    # pi_old == pi (the first pass over a batch): |log r| = 0, d|x|/dx at 0 is 0, so even with every valid token
    # selected (k = 1) the gradient is the plain policy gradient -A (r = 1), which is ppo_clip's at r = 1
    old = KL_LOGP.clone()
    loss, grad, _ = _grad("kl_cov", KL_LOGP, old, KL_ADV, KL_MASK, fraction=1.0)
    want = torch.where(KL_MASK > 0, -KL_ADV.unsqueeze(-1).expand(2, 3), 0.0)
    assert torch.equal(grad, want)
    assert torch.equal(loss, want)  # -A * 1 + 0
    _, ppo_grad, _ = _grad("ppo_clip", KL_LOGP, old, KL_ADV, KL_MASK)
    assert torch.equal(grad, ppo_grad)


def test_kl_cov_has_no_ppo_clip():
    # as both reference codes: a token far outside PPO's range keeps -A r (ppo_clip would zero its gradient)
    log_r = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])  # (0,0): A = +1, r = e^0.5 = 1.6487 > 1.2
    old = torch.where(KL_MASK > 0, KL_LOGP - log_r, KL_LOGP)
    _, ppo_grad, _ = _grad("ppo_clip", KL_LOGP, old, KL_ADV, KL_MASK)
    _, grad, _ = _grad("kl_cov", KL_LOGP, old, KL_ADV, KL_MASK)  # only (1,1) penalised, on-policy there
    assert ppo_grad[0, 0].item() == 0.0
    assert grad[0, 0].item() == pytest.approx(-math.exp(0.5), rel=1e-6)


def test_kl_cov_ties_go_to_the_earlier_token():
    # four equal tokens: Cov 0 everywhere (A constant); k = 0.5 -> n = 2 -> the first two positions
    logp = torch.full((2, 2), -1.0)
    old = logp - 0.1
    _, grad, _ = _grad("kl_cov", logp, old, torch.ones(2), torch.ones(2, 2), fraction=0.5)
    # penalised: -e^0.1 + 1; the others: -e^0.1
    assert_close(grad, torch.tensor([[1 - math.exp(0.1)] * 2, [-math.exp(0.1)] * 2]))


# ---------------------------------------------------------------------------------------------- Clip-Cov
# 2 rows x 6 tokens, all valid (N = 12), A = [+1, -1] per row -> mean A = 0.
#   log pi row 0 = [-0.5, -1.0, -1.5, -2.0, -3.0, -4.0]   (sum -12)
#   log pi row 1 = [-4.5, -8.5, -8.0, -1.0, -0.5, -1.5]   (sum -24)   -> mean log pi = -36 / 12 = -3
#   Cov row 0 = (log pi + 3) * (+1) = [2.5, 2.0, 1.5, 1.0, 0.0, -1.0]
#   Cov row 1 = (log pi + 3) * (-1) = [1.5, 5.5, 5.0, -2.0, -2.5, -1.5]
#   in (1, 5), strict: (0,0) 2.5, (0,1) 2.0, (0,2) 1.5, (1,0) 1.5; (0,3) = 1.0 and (1,2) = 5.0 sit on the bounds
#   (excluded), (1,1) = 5.5 is above. (0,1) is given log r = 0.8: r = e^0.8 = 2.2255 > 1 + eps_high = 2 with
#   A > 0, so PPO (clip range [0, 2] by default) already clipped it and it is no candidate either.
#   Candidates: (0,0), (0,2), (1,0). Every other token has r = 1: PPO's gradient -A (row 0: -1, row 1: +1).
CC_LOGP = torch.tensor([[-0.5, -1.0, -1.5, -2.0, -3.0, -4.0], [-4.5, -8.5, -8.0, -1.0, -0.5, -1.5]])
CC_OLD = CC_LOGP - torch.tensor([[0.0, 0.8, 0.0, 0.0, 0.0, 0.0], [0.0] * 6])
CC_ADV = torch.tensor([1.0, -1.0])
CC_MASK = torch.ones(2, 6)
CANDIDATES = {(0, 0), (0, 2), (1, 0)}


def _detached(grad: torch.Tensor, ppo_grad: torch.Tensor) -> set[tuple[int, int]]:
    """Tokens whose gradient clip_cov removed where ppo_clip (same range) kept one."""
    return {tuple(ix) for ix in ((grad == 0) & (ppo_grad != 0)).nonzero().tolist()}


def test_clip_cov_hand_worked_covariance_and_ppo_gradient():
    adv = CC_ADV.unsqueeze(-1).expand(2, 6)
    want = torch.tensor([[2.5, 2.0, 1.5, 1.0, 0.0, -1.0], [1.5, 5.5, 5.0, -2.0, -2.5, -1.5]])
    assert_close(_centred_cov(CC_LOGP, adv, CC_MASK > 0), want)
    _, ppo_grad, _ = _grad("ppo_clip", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, eps_low=1.0, eps_high=1.0)
    assert_close(ppo_grad, torch.tensor([[-1.0, 0.0, -1.0, -1.0, -1.0, -1.0], [1.0] * 6]))


@pytest.mark.parametrize("fraction,count", [(2e-4, 1), (0.17, 2), (0.5, 3), (1.0, 3)])
def test_clip_cov_detaches_max_1_floor_r_n_candidates(fraction, count):
    # n = max(1, floor(r * 12)): 2e-4 -> 1, 0.17 -> floor(2.04) = 2; 0.5 -> 6 and 1.0 -> 12, but only 3 candidates
    _, ppo_grad, _ = _grad("ppo_clip", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, eps_low=1.0, eps_high=1.0)
    for seed in range(5):
        gen = torch.Generator().manual_seed(seed)
        loss, grad, stats = _grad("clip_cov", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, fraction=fraction, generator=gen)
        gone = _detached(grad, ppo_grad)
        assert len(gone) == count and gone <= CANDIDATES, (seed, gone)
        # every other token's gradient is ppo_clip's, exactly
        keep = torch.ones(2, 6, dtype=torch.bool)
        for i, j in gone:
            keep[i, j] = False
        assert torch.equal(grad[keep], ppo_grad[keep])
        # a detached token keeps its loss value: -A r with r = 1 -> -A
        for i, j in gone:
            assert loss[i, j].item() == -CC_ADV[i].item()
        # clip_fraction: the PPO-clipped (0,1) plus the detached ones, over 12 tokens
        assert float(stats.clip_fraction) == pytest.approx((1 + count) / 12)


def test_clip_cov_draw_is_reproducible_and_uniform_over_candidates():
    _, ppo_grad, _ = _grad("ppo_clip", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, eps_low=1.0, eps_high=1.0)

    def pick(seed: int) -> set:
        gen = torch.Generator().manual_seed(seed)
        return _detached(_grad("clip_cov", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, generator=gen)[1], ppo_grad)

    assert all(pick(s) == pick(s) for s in range(10))  # the same seed detaches the same token
    seen = [next(iter(pick(s))) for s in range(60)]
    assert set(seen) == CANDIDATES  # each candidate is drawn by some seed, nothing else ever is
    assert min(seen.count(c) for c in CANDIDATES) >= 10  # roughly uniform (20 expected each)


def test_clip_cov_bounds_and_eps_are_parameters():
    # wider Cov window [0.5, 6): (0,3) 1.0, (1,1) 5.5 and (1,2) 5.0 join; r = 1 takes all 6 candidates
    _, ppo_grad, _ = _grad("ppo_clip", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, eps_low=1.0, eps_high=1.0)
    _, grad, _ = _grad("clip_cov", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, fraction=1.0, cov_low=0.5, cov_high=6.0,
                       generator=torch.Generator().manual_seed(0))
    assert _detached(grad, ppo_grad) == CANDIDATES | {(0, 3), (1, 1), (1, 2)}
    # eps 3 (range [-2, 4] -> [0, 4]): (0,1) with r = 2.23 is no longer PPO-clipped and becomes a candidate
    _, ppo_wide, _ = _grad("ppo_clip", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, eps_low=1.0, eps_high=3.0)
    _, grad, _ = _grad("clip_cov", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, fraction=1.0, eps_high=3.0,
                       generator=torch.Generator().manual_seed(0))
    assert _detached(grad, ppo_wide) == CANDIDATES | {(0, 1)}
    with pytest.raises(ValueError, match="cov_low"):
        call_policy_loss("clip_cov", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, cov_low=5.0, cov_high=1.0)
    with pytest.raises(ValueError, match="fraction"):
        call_policy_loss("kl_cov", CC_LOGP, CC_OLD, CC_ADV, CC_MASK, fraction=0.0)


def test_clip_cov_without_candidates_is_ppo_clip():
    # A constant: Cov = 0 everywhere, no candidate, nothing drawn: exactly ppo_clip with the same range
    adv = torch.ones(2)
    loss, grad, _ = _grad("clip_cov", CC_LOGP, CC_OLD, adv, CC_MASK, generator=torch.Generator().manual_seed(0))
    want, want_grad, _ = _grad("ppo_clip", CC_LOGP, CC_OLD, adv, CC_MASK, eps_low=1.0, eps_high=1.0)
    assert torch.equal(loss, want) and torch.equal(grad, want_grad)


def test_both_are_registered_with_the_reference_defaults():
    import inspect

    from mmrlvr.algos.presets import loss_defaults

    assert {"clip_cov", "kl_cov"} <= set(POLICY_LOSSES.names())
    clip = inspect.signature(POLICY_LOSSES.get("clip_cov")).parameters
    kl = inspect.signature(POLICY_LOSSES.get("kl_cov")).parameters
    # the authors' recipes: r 2e-4, omega 1 / 5, clip ratio 1 / 1; KL-Cov k 2e-3 (their 7B), beta 1
    assert (clip["fraction"].default, clip["cov_low"].default, clip["cov_high"].default) == (2e-4, 1.0, 5.0)
    assert (clip["eps_low"].default, clip["eps_high"].default, clip["dual_clip"].default) == (1.0, 1.0, None)
    assert (kl["fraction"].default, kl["coef"].default) == (2e-3, 1.0)
    assert "eps_low" not in kl and loss_defaults("kl_cov") == {"agg": None}
    # ppo_clip itself is untouched by the new losses' range
    assert ppo_clip_loss.__kwdefaults__["eps_high"] == 0.2


# ---------------------------------------------------------------------------------------- through the trainer
FAST = ["eval.every=0", "eval.at_start=false", "eval.at_end=false", "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=16", "data.train_size=8", "progress=false", "tensorboard=false",
        "log_rollouts=false", "keep_checkpoints=0", "save_every=1"]


def test_kl_cov_at_one_epoch_puts_a_note_in_the_plan():
    from mmrlvr.config import load_config
    from mmrlvr.train.plan import build_plan

    def notes(*overrides: str) -> list[str]:
        cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", list(overrides))
        return [n for n in build_plan(cfg).notes if "kl_cov" in n]

    one = notes("algo.loss=kl_cov")
    assert len(one) == 1 and "algo.epochs: 1" in one[0] and "algo.epochs >= 2" in one[0]
    assert "numerical mismatch" in one[0]  # HF engine, one epoch: pi_old is the sampler's
    exact = notes("algo.loss=kl_cov", "algo.recompute_old_logprobs=true")
    assert len(exact) == 1 and "exactly 0" in exact[0]
    assert notes("algo.loss=kl_cov", "algo.epochs=2") == [] and notes("algo.loss=clip_cov") == []
    from mmrlvr.train.plan import Plan

    assert any(ln.startswith("note: algo.loss: kl_cov") for ln in Plan([], one).lines())


def _train(out: Path, overrides: list[str], steps: int, resume: bool = False):
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", [f"output_dir={out}", *FAST, *overrides,
                                                             f"max_steps={steps}"])
    trainer = Trainer(cfg, resume=resume)
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}
    trainer.train()
    moved = any(not torch.equal(p.detach(), before[n]) for n, p in trainer.policy.named_parameters()
                if p.requires_grad)
    return trainer, moved


def _steps(run: Path) -> dict[int, dict]:
    from mmrlvr.train.metrics import read_metrics

    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("time/")}
            for r in read_metrics(run / "metrics.jsonl") if "loss" in r}


@pytest.mark.parametrize("loss,extra", [("clip_cov", []), ("kl_cov", ["algo.epochs=2"])])
def test_trains_through_the_trainer_and_resumes_exactly(loss, extra, tmp_path):
    """2 steps on the tiny offline VLM (4 prompts x 8 rollouts, 16 tokens): finite losses, the weights move; a run
    stopped after step 1 and resumed logs exactly the uninterrupted step 2 (Clip-Cov's draw is seeded per step)."""
    overrides = [f"algo.loss={loss}", *extra]
    _, moved = _train(tmp_path / "a", overrides, 2)
    assert moved
    a = _steps(tmp_path / "a")
    assert sorted(a) == [1, 2] and all(math.isfinite(a[s]["loss"]) for s in a)
    if loss == "clip_cov":
        # one token of each 32-row micro-batch is Cov-detached at most (r = 2e-4 of ~450 tokens -> max(1, 0))
        assert all(0 < a[s]["clip_fraction"] < 0.05 for s in a), a
    _train(tmp_path / "b", overrides, 1)
    _train(tmp_path / "b", overrides, 2, resume=True)
    assert _steps(tmp_path / "b")[2] == a[2]
