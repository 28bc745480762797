"""A shape stage with per-prompt state that holds on several processes: a bonus for a prompt's first solve.

A correct rollout of a prompt that no earlier step solved gets ``BONUS`` added to its reward; once a prompt has
been solved (by any rollout, on any process), later correct rollouts of it get nothing extra. The state is the
set of solved prompt ids, kept in checkpoints.

Why it needs the whole batch: each process sees only its shard of a step's prompts, and a prompt drawn again in
a later epoch may land on another process. A rank that remembered only its own solves would pay the bonus twice.
So every rank gathers the ids of the step's solved prompts from every process (``Runtime.gather_values``) and
updates the same set; the ranks' states stay identical, and two processes train what one trains.

Logged: ``first_solve/bonus_rows`` (rows paid the bonus: a count, summed over processes) and
``first_solve/solved_prompts`` (the size of the set, the same on every process).

Run it (``stages.shape`` names it; the demo's accuracy component is ``auto_accuracy``):

    mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/first_solve_bonus.py]" "stages.shape=[first_solve_bonus]"

Illustrative: an exploration bonus to show the contract of a stateful stage, not a published method.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrlvr.metric import Metric
from mmrlvr.train.stages import Stage, register_stage

BONUS = 0.5
COMPONENT = "auto_accuracy"  # the reward component that says a rollout is correct (1.0)


@register_stage("shape", "first_solve_bonus", priority=5)
class FirstSolveBonus(Stage):
    selected_by = ("stages.shape",)
    reads = ("rewards",)

    @classmethod
    def when(cls, cfg) -> bool:
        return False  # only when named in stages.shape

    def __init__(self, rt) -> None:
        super().__init__(rt)
        self.solved: set[str] = set()

    def __call__(self, batch) -> None:
        ids = [str(s.id) for s in batch.rollouts.samples]
        correct = [r.components.get(COMPONENT, 0.0) >= 1.0 for r in batch.results]
        if batch.row_mask is not None:  # rows another stage dropped neither earn nor count
            correct = [c and bool(k) for c, k in zip(correct, batch.row_mask.tolist())]
        paid = [c and i not in self.solved for i, c in zip(ids, correct)]
        batch.rewards = batch.rewards + BONUS * torch.tensor(paid, dtype=batch.rewards.dtype)
        solved_here = sorted({i for i, c in zip(ids, correct) if c})
        everywhere, _ = self.rt.gather_values(solved_here)  # every process's, in rank order: the same everywhere
        self.solved.update(everywhere)
        batch.diagnostics["first_solve/bonus_rows"] = Metric.sum(float(sum(paid)))
        batch.diagnostics["first_solve/solved_prompts"] = Metric.same(float(len(self.solved)))

    def state_dict(self) -> dict[str, Any]:
        return {"solved": sorted(self.solved)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.solved = set(state["solved"])
