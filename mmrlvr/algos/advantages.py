"""Group-relative advantage estimators: rewards of G rollouts per prompt in, one advantage per rollout out.

Every estimator has the signature ``fn(rewards [N] float, group_index [N] int, **params) -> [N]`` and
is registered in ``ADVANTAGES`` by name (config key ``algo.advantage``). The trainer broadcasts the
per-sequence advantage over the response tokens. Groups need not have equal sizes.

One rule holds for every estimator: a group whose rewards are all equal carries no learning signal and
gets advantage exactly 0 (its rows still count in the loss normaliser unless DAPO dynamic sampling
removes them; see ``mmrlvr.algos.sampling``).

Not here: reward computation, KL-in-reward shaping, per-token (GAE) returns. Formulas: METHODS.md §1, §3.
"""

from __future__ import annotations

from typing import Callable

import torch

from mmrlvr.algos.groups import group_stats
from mmrlvr.registry import Registry

#: name -> fn(rewards [N], group_index [N], **params) -> advantages [N]
ADVANTAGES: Registry[Callable[..., torch.Tensor]] = Registry("advantage estimator")


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, eps: float = 1e-6,
                    unbiased: bool = True) -> torch.Tensor:
    """GRPO: A_i = (R_i - mean_g R) / (std_g R + eps) (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    rewards: [N] float; group_index: [N] int. Returns [N].
    ``unbiased=True`` (default) uses the n-1 sample std, as verl's and TRL's GRPO do (``torch.std``);
    ``False`` uses the population std. The choice rescales a group of G by sqrt(G/(G-1)), nothing else.
    """
    stats = group_stats(rewards, group_index, unbiased=unbiased)
    adv = (rewards - stats.mean) / (stats.std + eps)
    return torch.where(stats.has_spread, adv, torch.zeros_like(adv))


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO: A_i = R_i - mean_g R, no division by the group std, which favours groups that are
    nearly all right or all wrong (Liu et al. 2025, "Understanding R1-Zero-Like Training",
    arXiv:2503.20783). Pair with the ``seq-mean-token-sum-norm`` aggregation.

    rewards: [N] float; group_index: [N] int. Returns [N].
    """
    stats = group_stats(rewards, group_index)
    adv = rewards - stats.mean
    return torch.where(stats.has_spread, adv, torch.zeros_like(adv))


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """RLOO: A_i = R_i - mean_{j != i} R_j, the leave-one-out baseline, unbiased for any group size
    (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740; Kool et al. 2019).

    rewards: [N] float; group_index: [N] int. Returns [N]. Since mean_{j!=i} = (n*mean - R_i)/(n-1),
    A_i = n/(n-1) * (R_i - mean_g); a group of one has no baseline and gets 0.
    """
    stats = group_stats(rewards, group_index)
    adv = (rewards - stats.mean) * stats.size / (stats.size - 1).clamp_min(1)
    return torch.where(stats.has_spread, adv, torch.zeros_like(adv))


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, baseline: bool = True,
                            eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262): normalise with *batch* statistics, not group ones.

    rewards: [N] float; group_index: [N] int. Returns [N].
    ``baseline=True`` (default, "REINFORCE++-baseline", the variant the paper recommends for
    reasoning with several samples per prompt): subtract the group mean, then whiten over the whole
    batch, A = (c - mean_batch c) / (std_batch c + eps) with c = R - mean_g R. ``baseline=False``:
    whiten the raw rewards over the batch. Batch statistics are over sequences (population std), since
    advantages here are per sequence; zero-variance groups are then set to 0 like every estimator here.
    """
    stats = group_stats(rewards, group_index)
    centred = rewards - stats.mean if baseline else rewards
    if centred.numel() == 0:
        return centred
    adv = (centred - centred.mean()) / (centred.std(correction=0) + eps)
    return torch.where(stats.has_spread, adv, torch.zeros_like(adv))


def split_advantages(task_rewards: torch.Tensor, cons_rewards: torch.Tensor, group_index: torch.Tensor,
                     alpha: float = 1.0, beta: float = 1.0, *, eps: float = 1e-6,
                     unbiased: bool = True) -> torch.Tensor:
    """CORA-style advantage splitting (METHODS §3): A = alpha * A_task + beta * A_cons.

    task_rewards, cons_rewards: [N] float; group_index: [N] int. Returns [N].
    Each reward is GRPO-normalised within its group separately, so a consistency reward with a small
    spread is not drowned by the task reward's scale (and a group where only one of the two varies
    still gets that one's signal). The warm-up/decay schedule of beta lives with the consistency code;
    this is the pure combination.
    """
    if task_rewards.shape != cons_rewards.shape:
        raise ValueError(f"task_rewards {tuple(task_rewards.shape)} and cons_rewards "
                         f"{tuple(cons_rewards.shape)} differ in shape")
    a_task = grpo_advantages(task_rewards, group_index, eps=eps, unbiased=unbiased)
    a_cons = grpo_advantages(cons_rewards, group_index, eps=eps, unbiased=unbiased)
    return alpha * a_task + beta * a_cons


def token_split_advantages(task_rewards: torch.Tensor, cons_rewards: torch.Tensor, group_index: torch.Tensor,
                           cons_token_mask: torch.Tensor, alpha: float = 1.0, beta: float = 1.0, *,
                           eps: float = 1e-6, unbiased: bool = True) -> torch.Tensor:
    """Split advantages whose consistency term reaches only some tokens: [N, L].

    A_{i,t} = alpha * A_task_i + beta * A_cons_i * m_{i,t}, with A_task, A_cons group-normalised
    separately (as ``split_advantages``) and m = ``cons_token_mask`` [N, L] (e.g. the answer span). Why:
    a consistency advantage on the thinking tokens can be earned by rewriting correct thinking to match a
    wrong answer; confined to the answer it can only be earned by the answer following the thinking."""
    a_task = grpo_advantages(task_rewards, group_index, eps=eps, unbiased=unbiased)
    a_cons = grpo_advantages(cons_rewards, group_index, eps=eps, unbiased=unbiased)
    return alpha * a_task[:, None] + beta * a_cons[:, None] * cons_token_mask.to(a_task.dtype)
