"""Advantages: from [N] rewards and the group layout to [N] (or [N, L]) advantages.

- ``group`` (default): the estimator ``algo.advantage`` from ``mmrlvr.algos.ADVANTAGES`` (GRPO, Dr.GRPO, RLOO,
  REINFORCE++, plug-ins).
- ``consistency_split`` (``consistency.split_advantage``): CORA-style split (arXiv:2507.11662; docs/consistency.md):
  A = alpha * A_task + beta(t) * A_cons, each normalised within its group; with
  ``consistency.scope: answer`` the consistency term reaches only the final answer's tokens ([N, L]).
"""

from __future__ import annotations

import torch

from mmrlvr.algos import ADVANTAGES, split_advantages, token_split_advantages
from mmrlvr.algos.advantages import call_advantage
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.stages.base import Stage, register_stage


def global_rows(rt, b: StepBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, slice]:
    """(rewards, group index, response lengths, kept rows) of the step's *global* batch, and this process's rows.

    Several processes: an estimator with batch statistics (REINFORCE++ whitens over every row of the step)
    must not normalise over one rank's share, so every rank computes the advantages of the whole batch and
    keeps its rows. Group indices become global (each rank's offset by the groups of the ranks before it).
    One process: the batch's own tensors, unchanged."""
    gi = b.rollouts.group_index
    counts = (b.rollouts.response_mask > 0).sum(dim=-1)  # [N] response lengths
    keep = b.row_mask if b.row_mask is not None else torch.ones_like(b.rewards, dtype=torch.bool)
    if rt.accel.num_processes == 1:
        return b.rewards, gi, counts, keep, slice(0, len(b.rewards))
    rank = torch.full_like(gi, rt.accel.process_index)
    n_groups = torch.full_like(gi, int(gi.max()) + 1 if len(gi) else 0)
    (rewards, groups, counts, keep, ranks, ngs), rows = rt.gather_rows(b.rewards, gi, counts, keep, rank, n_groups)
    per_rank = dict(zip(ranks.tolist(), ngs.tolist()))
    offset, acc = {}, 0
    for r in sorted(per_rank):
        offset[r], acc = acc, acc + per_rank[r]
    groups = groups + torch.tensor([offset[r] for r in ranks.tolist()], dtype=groups.dtype)
    return rewards, groups, counts, keep, rows


@register_stage("advantages", "group")
class GroupAdvantage(Stage):
    @classmethod
    def validate(cls, cfg) -> list[str]:
        if cfg.algo.advantage not in ADVANTAGES:
            return [f"algo.advantage: unknown advantage estimator {cfg.algo.advantage!r}; "
                    f"known: {', '.join(ADVANTAGES.names())}"]
        return []

    def __init__(self, rt) -> None:
        super().__init__(rt)
        name = self.cfg.algo.advantage
        ADVANTAGES.get(name)  # an unknown name fails here, listing the known ones
        # token_counts reach only the estimators that take them (REINFORCE++'s token-level whitening)
        self.estimator = lambda rewards, group_index, token_counts=None: call_advantage(
            name, rewards, group_index, token_counts=token_counts)

    def __call__(self, b: StepBatch) -> None:
        rewards, groups, counts, keep, rows = global_rows(self.rt, b)
        if bool(keep.all()):
            b.advantages = self.estimator(rewards, groups, counts)[rows]
            return
        # rows outside the batch (unscored, dropped groups) take no part in their group's baseline
        adv = torch.zeros_like(rewards)
        if bool(keep.any()):
            adv[keep] = self.estimator(rewards[keep], groups[keep], counts[keep])
        b.advantages = adv[rows]


@register_stage("advantages", "consistency_split", priority=10)
class ConsistencySplit(Stage):
    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.consistency.split_advantage

    @classmethod
    def validate(cls, cfg) -> list[str]:
        cc = cfg.consistency
        if not any(s.name == cc.component for s in cfg.rewards):
            return [f"consistency.component: split_advantage needs a reward named {cc.component!r} in `rewards`"]
        return []

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.consistency.bonus import beta_schedule

        cfg, cc = self.cfg, self.cfg.consistency
        cons_w = next(s.weight for s in cfg.rewards if s.name == cc.component)
        cons = torch.tensor([r.components.get(cc.component, 0.0) for r in b.results], dtype=torch.float32)
        task = b.rewards - cons_w * cons
        beta = beta_schedule(b.step, cc.beta_warmup_steps, cc.beta_decay_steps, cc.beta, cc.beta_min)
        rollouts = b.rollouts
        if cc.scope == "answer":  # [N, L]: the consistency term reaches the answer's tokens only
            from mmrlvr.consistency.spans import answer_token_mask

            m = answer_token_mask([c.text for c in rollouts.completions], rollouts.response_ids,
                                  rollouts.response_mask, getattr(self.rt.processor, "tokenizer", self.rt.processor))
            b.advantages = token_split_advantages(task, cons, rollouts.group_index, m, cc.alpha, beta)
        else:
            b.advantages = split_advantages(task, cons, rollouts.group_index, cc.alpha, beta)
