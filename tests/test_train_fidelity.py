"""The step does what DAPO, PPO and the rollout-correction references do (issue 14), on the real tiny Qwen2.5-VL.

- dynamic sampling: dropped groups leave every normaliser (seq-mean-token-sum's row count too), a step whose
  groups are all dropped leaves parameters and AdamW state bit-identical, refill rounds fill the batch with
  groups that carry signal and are reported;
- pi_old recomputed by the training model makes the first epoch's ratio exactly 1 (HF engine);
- TIS / MIS weights from an engine whose log-probs are off on purpose, checked against the formula.
"""

from __future__ import annotations

import copy
import zlib

import pytest
import torch

from mmrlvr.config import load_config
from mmrlvr.rewards.base import REWARDS
from mmrlvr.types import RewardResult
from tests.test_train_loop import small_config, tiny_dir  # noqa: F401  (fixture)


class HalfConstant:
    """Constant 0 for about half the prompts (by a hash of the prompt id), the share of distinct response tokens
    for the others: some groups carry no signal, the rest always do."""

    def __init__(self, **_):
        pass

    def __call__(self, completion, sample):
        if zlib.crc32(sample.id.encode()) % 2 == 0:
            return RewardResult(0.0, {"half_constant": 0.0})
        ids = completion.token_ids
        score = len(set(ids)) / len(ids) if ids else 0.0
        return RewardResult(score, {"half_constant": score})


if "half_constant" not in REWARDS:
    REWARDS.add("half_constant", HalfConstant)

HALF = [{"name": "half_constant", "weight": 1.0}]
def dynamic(max_rounds: int) -> dict:
    """Dynamic sampling on the total reward with ``max_rounds`` generation rounds per step."""
    return {"algo__dynamic_sampling": True,
            "algo__dynamic_sampling_params": {"metric": "reward", "max_rounds": max_rounds}}


def _trainer(tiny_dir, out, **extra):
    from mmrlvr.train.trainer import Trainer

    return Trainer(load_config(data=small_config(tiny_dir, out, log_rollouts=False, **extra)))


def _state(trainer):
    params = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    opt = copy.deepcopy(trainer.optimizer.state_dict())
    return params, opt, trainer.scheduler.get_last_lr()[0]


def _assert_same_state(a, b):
    pa, oa, la = a
    pb, ob, lb = b
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert la == lb
    assert oa["state"].keys() == ob["state"].keys()
    for k in oa["state"]:
        for name, v in oa["state"][k].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(ob["state"][k][name])), (k, name)


@pytest.mark.parametrize("credit", ["none", "vepo"])
def test_all_dropped_step_leaves_parameters_and_adamw_state_bit_identical(tiny_dir, tmp_path, credit):
    from mmrlvr.train.reward_setup import build_run_reward as build_reward

    t = _trainer(tiny_dir, tmp_path / "run", credit__scheme=credit, **dynamic(1))
    t.run_step(0)  # a step with signal first: AdamW's moments are non-zero, so a zero-signal step would move them
    assert t.optimizer.state_dict()["state"]
    constant = [{"name": "format", "weight": 1.0}]
    t.rt.reward = build_reward(load_config(data=small_config(tiny_dir, tmp_path / "x", rewards=constant)))
    before = _state(t)
    logged = t.run_step(1)  # the untrained policy never formats: every group's reward is 0, all dropped
    assert logged["zero_std_group_fraction"] == 1.0
    assert logged["update/zero_signal"] == 1.0 and logged["dynamic_sampling/kept_groups"] == 0.0
    _assert_same_state(before, _state(t))


def test_refill_rounds_fill_the_batch_with_groups_that_carry_signal(tiny_dir, tmp_path):
    t = _trainer(tiny_dir, tmp_path / "run", rewards=HALF, **dynamic(4))
    b = t.pipeline.run(0)
    G, target = 4, 4
    assert b.rollouts.num_rows == target * G and len(b.results) == target * G
    rounds, kept = b.logged["dynamic_sampling/rounds"], b.logged["dynamic_sampling/kept_groups"]
    assert rounds >= 2  # with ~half the prompts constant, 4 groups with signal need more than one round here
    assert kept + b.logged["dynamic_sampling/fill_groups"] == target
    groups = b.rewards.view(target, G)
    live = b.row_mask.view(target, G)[:, 0]
    assert int(live.sum()) == kept
    assert bool((groups[live].std(dim=1) > 0).all())  # every kept group carries signal
    assert bool((b.token_weights[~b.row_mask] == 0).all())
    # every row still has its own prompt's images and text: the rewards were computed on these completions
    for i, (c, s) in enumerate(zip(b.rollouts.completions, b.rollouts.samples)):
        assert b.results[i].score == HalfConstant()(c, s).score
    assert torch.isfinite(torch.tensor(b.logged["loss"]))


def test_dropped_groups_leave_the_seq_mean_token_sum_normaliser(tiny_dir, tmp_path):
    """The gradient of a batch with dropped groups equals the gradient of the kept groups alone."""
    from mmrlvr.rollout.merge import select_rows
    from mmrlvr.train.batch import StepBatch

    t = _trainer(tiny_dir, tmp_path / "run", rewards=HALF,
                 algo__agg="seq-mean-token-sum", rollout__prompts_per_step=8, algo__micro_batch_size=12, **dynamic(1))
    b = t.pipeline.run(0, upto="credit")
    assert 0 < int(b.row_mask.sum()) < b.rollouts.num_rows  # some groups dropped, some kept
    upd = t.pipeline.stage("update")
    grads = []

    def keep_grads():
        grads.append({n: p.grad.detach().clone() for n, p in t.policy.named_parameters() if p.grad is not None})
        t.optimizer.zero_grad(set_to_none=True)
        return 0.0

    upd.optimizer_step = keep_grads
    rows = torch.nonzero(b.row_mask).flatten().tolist()
    kept = StepBatch(step=0, rollouts=select_rows(b.rollouts, rows, t.rt.vision_start_id),
                     images_per_row=[b.images_per_row[r] for r in rows], token_weights=b.token_weights[rows].clone(),
                     advantages=b.advantages[rows].clone(), ref_logprobs=b.ref_logprobs[rows].clone(),
                     results=[b.results[r] for r in rows], rewards=b.rewards[rows])
    upd.update(b)
    upd.update(kept)
    full, only = grads
    assert full.keys() == only.keys()
    for n in full:
        torch.testing.assert_close(full[n], only[n], atol=1e-6, rtol=1e-5)


def test_recompute_old_logprobs_makes_the_first_epoch_ratio_exactly_one(tiny_dir, tmp_path):
    t = _trainer(tiny_dir, tmp_path / "a", algo__epochs=2)  # epochs > 1: recomputed by default
    assert t.pipeline.names["reference"] == ["old_policy", "frozen"]
    b = t.pipeline.run(0)
    valid = b.rollouts.response_mask > 0
    assert bool((b.token_ratio[valid] == 1.0).all())
    assert "rollout/logprob_abs_diff" in b.logged and b.logged["rollout/logprob_abs_diff"] >= 0.0
    # the sampler's own log-probs are kept beside the recomputed ones
    assert b.rollout_logprobs is not None and b.rollout_logprobs.shape == b.rollouts.old_logprobs.shape
    off = _trainer(tiny_dir, tmp_path / "b", algo__epochs=2, algo__recompute_old_logprobs=False)
    assert off.pipeline.names["reference"] == ["frozen"]
    b2 = off.pipeline.run(0)
    # without the recompute the first ratio is the training model's over the sampler's, token by token
    expected = torch.where(valid, (b.rollouts.old_logprobs - b2.rollouts.old_logprobs).exp(), 0.0)
    torch.testing.assert_close(b2.token_ratio, expected, atol=1e-5, rtol=1e-5)


class PerturbedEngine:
    """The HF engine whose reported log-probs are off on purpose (as a vLLM sampler's may be): +0.7 on even
    response positions, -1.5 on odd ones."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, *args, **kwargs):
        batch = self.engine.generate(*args, **kwargs)
        shift = torch.zeros_like(batch.old_logprobs)
        shift[:, 0::2] = 0.7
        shift[:, 1::2] = -1.5
        batch.old_logprobs = torch.where(batch.response_mask > 0, batch.old_logprobs + shift, 0.0)
        return batch

    def sync_weights(self, model):
        self.engine.sync_weights(model)


@pytest.mark.parametrize("mode,level", [("tis", "token"), ("mis", "token"), ("tis", "sequence")])
def test_rollout_correction_weights_follow_the_formula(tiny_dir, tmp_path, mode, level):
    t = _trainer(tiny_dir, tmp_path / "run", algo__recompute_old_logprobs=True, algo__rollout_correction=mode,
                 algo__rollout_correction_params={"level": level, "cap": 3.0})
    t.rt.engine = PerturbedEngine(t.rt.engine)
    b = t.pipeline.run(0)
    mask = b.rollouts.response_mask
    valid = mask > 0
    log_ratio = torch.where(valid, b.rollouts.old_logprobs - b.rollout_logprobs, 0.0)  # log pi_train - log pi_rollout
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
    r = log_ratio.clamp(-20, 20).exp()
    expected = r.clamp(max=3.0) if mode == "tis" else torch.where(r > 3.0, 0.0, r)
    torch.testing.assert_close(b.is_weights, expected * mask)
    if level == "token":  # the sampler said +0.7 on even positions (ratio ~e^-0.7) and -1.5 on odd ones (~e^1.5 > 3)
        odd = valid.clone()
        odd[:, 0::2] = False
        assert bool((b.is_weights[odd] == (3.0 if mode == "tis" else 0.0)).all())
    diff = b.logged["rollout/logprob_abs_diff"]
    assert 0.9 < diff < 1.3  # the mean |shift| over the valid tokens (~1.1), the engine's own mismatch tiny
    assert b.logged["rollout/corrected_fraction"] > 0.2
