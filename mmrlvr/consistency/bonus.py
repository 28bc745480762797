"""Group-level consistency shaping: the GRPO-CARE bonus, CORA's split advantages and their β schedule.

Pure tensor functions (formulas and papers: docs/consistency.md), no model and no config inside. Rows are rollouts; rollouts of
the same prompt share a ``group_index`` value (any integers, need not be contiguous or sorted).

- ``care_bonus``: GRPO-CARE [code]. Among the *accurate* rollouts of a group (acc > 0.1 and at least
  the group's mean accuracy), those whose consistency probability p is at least the accurate rollouts'
  mean p minus a margin earn ``scale * acc``. Inaccurate rollouts never earn it, so the bonus cannot
  pay for "consistent but wrong" — the failure docs/consistency.md ("The study") measured for a plain consistency reward.
- ``cora_split_advantages``: CORA's HRAS [paper]. The task reward and the consistency reward are
  normalised separately within each group and then combined, A = α·A_task + β·A_cons, so a reward with
  a small spread is not drowned by the other one.
- ``beta_schedule``: warm-up then decay of β [ours: CORA states a schedule, not its constants].
"""

from __future__ import annotations

import math

import torch

from mmrlvr.algos.advantages import split_advantages

__all__ = ["care_bonus", "cora_split_advantages", "beta_schedule"]


def _group_ids(group_index: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense 0..K-1 group ids for arbitrary group labels: ([N] long, K)."""
    uniq, inverse = torch.unique(group_index, return_inverse=True)
    return inverse, int(uniq.numel())


def _group_mean(x: torch.Tensor, gid: torch.Tensor, k: int, weight: torch.Tensor) -> torch.Tensor:
    """Weighted per-group mean broadcast back to rows: [N]. Groups with zero weight get NaN."""
    total = torch.zeros(k, dtype=x.dtype).index_add_(0, gid, x * weight)
    count = torch.zeros(k, dtype=x.dtype).index_add_(0, gid, weight)
    return (total / count)[gid]


def care_bonus(acc: torch.Tensor, p: torch.Tensor, group_index: torch.Tensor, *, acc_threshold: float = 0.1,
               margin: float = 0.01, scale: float = 0.5) -> torch.Tensor:
    """GRPO-CARE consistency bonus per rollout.

    acc:          [N] float, accuracy reward of each rollout (0..1)
    p:            [N] float, P(consistent) of each rollout; NaN = could not be judged (never earns a bonus
                  and is left out of the group's mean p)
    group_index:  [N] long, rollouts with equal values belong to the same prompt
    returns       [N] float, ``scale * acc_i`` for accurate rollouts with p_i >= mean_accurate(p) - margin,
                  else 0. Accurate: acc_i > acc_threshold and acc_i >= mean acc of its group.
    """
    acc, p = acc.double(), p.double()
    gid, k = _group_ids(group_index)
    mean_acc = _group_mean(acc, gid, k, torch.ones_like(acc))  # [N]
    accurate = (acc > acc_threshold) & (acc >= mean_acc)  # [N] bool
    judged = accurate & ~torch.isnan(p)
    mean_p = _group_mean(torch.nan_to_num(p), gid, k, judged.double())  # [N], NaN where nobody judged
    earns = judged & (p >= mean_p - margin)
    return torch.where(earns, scale * acc, torch.zeros_like(acc)).float()


def cora_split_advantages(task_r: torch.Tensor, cons_r: torch.Tensor, group_index: torch.Tensor,
                          alpha: float = 1.0, beta: float = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """A = α·norm_g(task_r) + β·norm_g(cons_r): CORA's separately normalised advantages.

    task_r:      [N] float, task reward (accuracy + format + …) per rollout
    cons_r:      [N] float, consistency reward per rollout
    group_index: [N] long
    returns      [N] float, the sequence-level advantage (broadcast over tokens by the trainer)

    Normalisation is ``mmrlvr.algos.advantages.split_advantages`` (unbiased std; a group whose values are
    all equal gives 0), so the trainer's GRPO advantages and these never drift apart.
    """
    return split_advantages(task_r, cons_r, group_index, alpha, beta, eps=eps)


def beta_schedule(step: int, warmup_steps: int, decay_steps: int, beta_max: float, beta_min: float) -> float:
    """β for CORA's consistency advantage at ``step`` [ours].

    Linear warm-up 0 -> beta_max over ``warmup_steps`` (the consistency signal is noise while answers
    are mostly wrong), then a cosine decay beta_max -> beta_min over ``decay_steps``, then beta_min.

    >>> beta_schedule(5, 10, 20, 1.0, 0.2)
    0.5
    >>> round(beta_schedule(20, 10, 20, 1.0, 0.2), 6)  # halfway through the decay: 0.2 + 0.8 * 0.5
    0.6
    """
    if step < 0 or warmup_steps < 0 or decay_steps < 0:
        raise ValueError("step, warmup_steps and decay_steps must be >= 0")
    if step < warmup_steps:
        return beta_max * step / warmup_steps
    t = step - warmup_steps
    if decay_steps == 0 or t >= decay_steps:
        return beta_max if decay_steps == 0 else beta_min
    return beta_min + (beta_max - beta_min) * 0.5 * (1.0 + math.cos(math.pi * t / decay_steps))
