"""GRPO-CARE bonus, CORA split advantages and the β schedule: hand-worked groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.consistency.bonus import beta_schedule, care_bonus, cora_split_advantages


def test_care_bonus_hand_worked_groups():
    acc = torch.tensor([1.0, 1.0, 0.0, 1.0,   # group 0
                        0.0, 0.0, 0.0, 0.0,   # group 1
                        0.05, 0.6, 0.4, 0.6])  # group 2
    p = torch.tensor([0.9, 0.5, 0.9, 0.8,
                      0.9, 0.9, 0.9, 0.9,
                      0.9, 0.69, 0.99, 0.75])
    g = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    # group 0: mean acc 0.75 -> accurate rows 0, 1, 3 (row 2 is wrong, its high p earns nothing);
    #          mean p over accurate = (0.9 + 0.5 + 0.8) / 3 = 0.7333, bar 0.7233: rows 0 and 3 pass -> 0.5 * 1
    # group 1: nobody above acc 0.1 -> no bonus, however consistent
    # group 2: mean acc 1.65 / 4 = 0.4125 -> accurate rows 1, 3 (0.05 <= 0.1, 0.4 < mean);
    #          mean p = (0.69 + 0.75) / 2 = 0.72, bar 0.71: only row 3 -> 0.5 * 0.6 = 0.3
    want = torch.tensor([0.5, 0.0, 0.0, 0.5, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.3])
    assert_close(care_bonus(acc, p, g), want)


def test_care_bonus_margin_lets_near_mean_through():
    acc = torch.tensor([1.0, 1.0])
    p = torch.tensor([0.80, 0.795])
    g = torch.tensor([0, 0])
    # mean p 0.7975; with margin 0.01 the bar is 0.7875 (both pass), with margin 0 it is 0.7975 (row 1 fails)
    assert_close(care_bonus(acc, p, g), torch.tensor([0.5, 0.5]))
    assert_close(care_bonus(acc, p, g, margin=0.0), torch.tensor([0.5, 0.0]))
    assert_close(care_bonus(acc, p, g, scale=1.0), torch.tensor([1.0, 1.0]))


def test_care_bonus_unjudged_rollouts_never_earn_and_do_not_count_in_the_mean():
    acc = torch.tensor([1.0, 1.0, 1.0])
    p = torch.tensor([float("nan"), 0.5, 0.7])
    # mean p over judged accurate rows = 0.6, bar 0.59: row 2 only; the NaN row gets nothing
    assert_close(care_bonus(acc, p, torch.tensor([0, 0, 0])), torch.tensor([0.0, 0.0, 0.5]))


def test_care_bonus_group_labels_need_not_be_contiguous():
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0])
    p = torch.tensor([0.9, 0.9, 0.2, 0.3])
    interleaved = care_bonus(acc, p, torch.tensor([7, 3, 3, 7]))
    # group 7 = rows 0, 3: mean acc 1, mean p 0.6, bar 0.59 -> row 0 only; group 3 = rows 1, 2: mean acc 0.5,
    # accurate row 2 alone, p 0.2 >= 0.2 - 0.01 -> bonus
    assert_close(interleaved, torch.tensor([0.5, 0.0, 0.5, 0.0]))


def test_cora_split_advantages_hand_worked():
    task = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    cons = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    # group 0 task: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> A_task = +-0.8660
    #         cons: mean 0.75, deviations (.25, .25, -.75, .25), var = 0.75 / 3 = 0.25, std 0.5
    #               -> A_cons = (0.5, 0.5, -1.5, 0.5)
    #   A = 1.0 * A_task + 0.5 * A_cons = (1.1160, -0.6160, -1.6160, 1.1160)
    # group 1: both rewards constant -> 0 (no signal rather than noise)
    # group 2: task constant, cons varies: mean .5, std sqrt(.5) = .7071 -> A_cons = +-0.7071, times 0.5
    s3 = math.sqrt(3) / 2
    want = torch.tensor([s3 + 0.25, -s3 + 0.25, -s3 - 0.75, s3 + 0.25, 0, 0, 0, 0,
                         0.5 * 0.70711, -0.5 * 0.70711])
    assert_close(cora_split_advantages(task, cons, g, alpha=1.0, beta=0.5), want, atol=1e-4, rtol=0)


def test_cora_with_beta_zero_is_plain_grpo_on_the_task_reward():
    task = torch.tensor([3.0, 1.0, 2.0, 0.0])
    cons = torch.tensor([0.0, 1.0, 1.0, 0.0])
    g = torch.tensor([0, 0, 0, 0])
    a = cora_split_advantages(task, cons, g, alpha=1.0, beta=0.0)
    assert_close(a, (task - task.mean()) / (task.std() + 1e-6))


@pytest.mark.parametrize("step,want", [
    (0, 0.0), (5, 0.5),   # linear warm-up over 10 steps to beta_max 1.0
    (10, 1.0),            # start of the cosine decay: 0.2 + 0.8 * (1 + cos 0) / 2
    (20, 0.6),            # halfway: 0.2 + 0.8 * (1 + cos(pi/2)) / 2 = 0.6
    (30, 0.2), (500, 0.2),
])
def test_beta_schedule(step, want):
    assert beta_schedule(step, 10, 20, 1.0, 0.2) == pytest.approx(want)


def test_beta_schedule_edges():
    assert beta_schedule(0, 0, 10, 0.7, 0.1) == pytest.approx(0.7)  # no warm-up
    assert beta_schedule(50, 5, 0, 0.7, 0.1) == pytest.approx(0.7)  # decay_steps 0: no decay
    with pytest.raises(ValueError):
        beta_schedule(-1, 5, 5, 1.0, 0.0)
