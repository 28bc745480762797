"""Advantage estimators: hand-worked values, loop-vs-vectorised, zero-variance groups, bad input."""

import math

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.algos import (
    ADVANTAGES,
    dr_grpo_advantages,
    group_stats,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    split_advantages,
    zero_std_group_fraction,
)
from mmrlvr.registry import RegistryError

# Three groups of unequal size: [1, 0, 0, 1], [1, 1, 1, 1] (no spread), [0.5, 0, 1].
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2])


class TestHandWorked:
    def test_grpo_unbiased_std(self):
        # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> A = +-0.5 / 0.57735 = +-0.86603
        # group 1: all equal -> 0; group 2: mean 0.5, deviations (0, -0.5, 0.5), var 0.5 / 2 -> std 0.5
        a = 0.5 / math.sqrt(1 / 3)
        expected = torch.tensor([a, -a, -a, a, 0, 0, 0, 0, 0.0, -1.0, 1.0])
        assert_close(grpo_advantages(REWARDS, GROUPS), expected, atol=1e-5, rtol=0)

    def test_grpo_population_std(self):
        # group 0 population std 0.5 -> +-1; group 2 population std sqrt(0.5 / 3) = 0.40825 -> +-1.22474
        b = 0.5 / math.sqrt(0.5 / 3)
        expected = torch.tensor([1.0, -1, -1, 1, 0, 0, 0, 0, 0, -b, b])
        assert_close(grpo_advantages(REWARDS, GROUPS, unbiased=False), expected, atol=1e-5, rtol=0)

    def test_dr_grpo_is_centred_reward(self):
        # no std division: R - group mean
        expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.0, -0.5, 0.5])
        assert_close(dr_grpo_advantages(REWARDS, GROUPS), expected)

    def test_rloo_leave_one_out(self):
        # group 0, row 0: R = 1, others (0, 0, 1) mean 1/3 -> 2/3; row 1: 0 - (1 + 0 + 1)/3 = -2/3
        # group 2, row 9: 0 - (0.5 + 1)/2 = -0.75; row 10: 1 - 0.25 = 0.75; row 8: 0.5 - 0.5 = 0
        expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0, 0.0, -0.75, 0.75])
        assert_close(rloo_advantages(REWARDS, GROUPS), expected)

    def test_reinforce_pp_baseline_sequence_whitening(self):
        # c = R - group mean = (.5,-.5,-.5,.5, 0,0,0,0, 0,-.5,.5); batch mean 0,
        # population std sqrt(6 * 0.25 / 11) = 0.36927 -> +-0.5 / 0.36927 = +-1.35401
        s = 0.5 / math.sqrt(1.5 / 11)
        expected = torch.tensor([s, -s, -s, s, 0, 0, 0, 0, 0, -s, s])
        assert_close(reinforce_pp_advantages(REWARDS, GROUPS, whiten_scope="sequence"), expected,
                     atol=1e-5, rtol=0)

    def test_reinforce_pp_default_whitens_over_tokens_as_verl(self):
        # equal lengths: verl's masked_whiten = (c - mu) / sqrt(unbiased var + 1e-8) over the 11 values
        s = 0.5 / math.sqrt(1.5 / 10 + 1e-8)
        expected = torch.tensor([s, -s, -s, s, 0, 0, 0, 0, 0, -s, s])
        assert_close(reinforce_pp_advantages(REWARDS, GROUPS), expected, atol=1e-5, rtol=0)

    def test_reinforce_pp_without_baseline_whitens_raw_rewards(self):
        # rewards (1, 0, 0, 1) and (2, 2): batch mean 1, population std sqrt((0+1+1+0+1+1)/6) = 0.8165;
        # the (2, 2) group has no spread -> 0 despite its positive whitened reward
        r, g = torch.tensor([1.0, 0, 0, 1, 2, 2]), torch.tensor([0, 0, 0, 0, 1, 1])
        s = math.sqrt(4 / 6)
        expected = torch.tensor([0, -1 / s, -1 / s, 0, 0, 0])
        assert_close(reinforce_pp_advantages(r, g, baseline=False, whiten_scope="sequence"), expected,
                     atol=1e-5, rtol=0)

    def test_split_advantages_normalises_each_reward_in_its_group(self):
        # task (1,0,1,0): mean .5, unbiased std .57735 -> +-.86603
        # cons (1,1,1,0): mean .75, dev (.25,.25,.25,-.75), var .75/3 = .25, std .5 -> (.5,.5,.5,-1.5)
        # alpha 1, beta 0.5 -> task + 0.5 * cons
        task, cons = torch.tensor([1.0, 0, 1, 0]), torch.tensor([1.0, 1, 1, 0])
        a = 0.5 / math.sqrt(1 / 3)
        expected = torch.tensor([a + 0.25, -a + 0.25, a + 0.25, -a - 0.75])
        got = split_advantages(task, cons, torch.zeros(4, dtype=torch.long), alpha=1.0, beta=0.5)
        assert_close(got, expected, atol=1e-5, rtol=0)

    def test_split_advantages_keeps_consistency_signal_when_task_has_none(self):
        # all answers right (task has no spread) but one rollout inconsistent: only A_cons remains
        task, cons = torch.ones(4), torch.tensor([1.0, 1, 1, 0])
        got = split_advantages(task, cons, torch.zeros(4, dtype=torch.long), alpha=1.0, beta=1.0)
        assert_close(got, torch.tensor([0.5, 0.5, 0.5, -1.5]), atol=1e-5, rtol=0)


def _loop_reference(name, rewards, groups):
    """One group at a time, straight from the formulas."""
    out = torch.zeros_like(rewards)
    for g in groups.unique():
        idx = (groups == g).nonzero().flatten()
        r = rewards[idx]
        if len(r) < 2 or bool((r == r[0]).all()):
            continue  # zero-variance group (or a single row): no signal
        if name == "grpo":
            out[idx] = (r - r.mean()) / (r.std() + 1e-6)
        elif name == "dr_grpo":
            out[idx] = r - r.mean()
        elif name == "rloo":
            out[idx] = torch.stack([r[i] - torch.cat([r[:i], r[i + 1:]]).mean() for i in range(len(r))])
    return out


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_vectorised_matches_loop_over_groups(name):
    gen = torch.Generator().manual_seed(0)
    for trial in range(5):
        sizes = torch.randint(1, 7, (6,), generator=gen).tolist()
        labels = torch.randperm(100, generator=gen)[:6]  # arbitrary, unsorted labels
        groups = torch.cat([torch.full((s,), int(lab)) for s, lab in zip(sizes, labels)])
        groups = groups[torch.randperm(len(groups), generator=gen)]  # not even contiguous
        rewards = torch.randint(0, 3, (len(groups),), generator=gen).float() / 2
        assert_close(ADVANTAGES.get(name)(rewards, groups), _loop_reference(name, rewards, groups),
                     atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_zero_variance_group_gives_exactly_zero(name):
    # 0.1 * 3 is not exactly 0.3 in float, so mean(0.1, 0.1, 0.1) != 0.1: the exact max == min test matters
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 0.3])
    groups = torch.tensor([5, 5, 5, 2, 2, 9])  # the lone row 9 has no spread either
    adv = ADVANTAGES.get(name)(rewards, groups)
    assert adv[:3].eq(0).all() and adv[5] == 0
    assert adv[3] > 0 > adv[4]


def test_all_groups_zero_variance():
    rewards, groups = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1])
    for name in ADVANTAGES:
        assert ADVANTAGES.get(name)(rewards, groups).eq(0).all(), name


def test_group_stats_and_zero_std_fraction():
    stats = group_stats(REWARDS, GROUPS)
    assert_close(stats.size, torch.tensor([4.0] * 8 + [3.0] * 3))
    assert stats.has_spread.tolist() == [True] * 4 + [False] * 4 + [True] * 3
    # groups: 0 has spread, 1 none, 2 has spread -> 1 of 3
    assert zero_std_group_fraction(REWARDS, GROUPS) == pytest.approx(1 / 3)


def test_empty_batch():
    empty, idx = torch.zeros(0), torch.zeros(0, dtype=torch.long)
    for name in ADVANTAGES:
        assert ADVANTAGES.get(name)(empty, idx).shape == (0,)
    assert zero_std_group_fraction(empty, idx) == 0.0


class TestBadInput:
    def test_nan_reward_is_named(self):
        with pytest.raises(ValueError, match=r"not finite at rows \[2\]"):
            grpo_advantages(torch.tensor([1.0, 0.0, float("nan")]), torch.zeros(3, dtype=torch.long))

    def test_shape_mismatch(self):
        with pytest.raises(ValueError, match="must be \\[N\\]"):
            grpo_advantages(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))

    def test_float_group_index(self):
        with pytest.raises(ValueError, match="integer"):
            rloo_advantages(torch.zeros(3), torch.zeros(3))

    def test_unknown_estimator_lists_known(self):
        # every registered estimator is named: the built-ins, and any a plug-in loaded earlier in this test process
        # added (docs/examples' median and pass@k estimators; the suite's order decides whether they ran before)
        known = ADVANTAGES.names()
        assert {n for n in known if ADVANTAGES.get(n).__module__.startswith("mmrlvr.")} == {
            "dr_grpo", "grpo", "pass_at_k", "reinforce_pp", "rloo"}
        with pytest.raises(RegistryError) as err:
            ADVANTAGES.get("gae")
        assert str(err.value).startswith(f"unknown advantage estimator 'gae'; known: {', '.join(known)}")
