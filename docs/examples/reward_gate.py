"""A reward transform on the shape stage in one file: the total reward of a wrong answer keeps only a fraction.

With a format bonus beside the accuracy reward, a well-formatted wrong answer still earns something, and a
policy can settle for formatting. This shape stage gates the total reward on the accuracy component:

    r_i <- r_i              if accuracy_i > 0
    r_i <- GAMMA * r_i      otherwise                   (GAMMA = 0.5 here)

accuracy_i is the (unweighted) score of the run's accuracy reward for rollout i, read from
``batch.results[i].components`` under the first of ``COMPONENTS`` the run's rewards name (demo-tiny's is
``auto_accuracy``). The stage runs after the built-in shape stages (priority 5: after ``dynamic_sampling``), so
the groups it sees are the step's final ones, and before the advantages are computed from ``batch.rewards``.
It counts the rows it gated in ``gate/gated_rows``.

It runs only when named (an explicit ``stages.shape`` list adds to the automatic shape stages):

    mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/reward_gate.py]" "stages.shape=[gate_on_accuracy]"

Stages take no parameters from the config: to change GAMMA, edit the constant in your copy of this file, or
subclass ``GateOnAccuracy`` with another ``gamma`` and register it under a name of your own. Illustrative: a
shape stage that reads the reward components and writes ``batch.rewards``; not a published method.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrlvr.metric import Metric
from mmrlvr.train.stages import Stage, register_stage

#: the fraction of its total reward a rollout with accuracy 0 keeps
GAMMA = 0.5
#: reward components read as accuracy, in order of preference
COMPONENTS = ("accuracy", "auto_accuracy")


@register_stage("shape", "gate_on_accuracy", priority=5)
class GateOnAccuracy(Stage):
    """Rows whose accuracy component is 0 keep GAMMA times their total reward."""

    selected_by = ("stages.shape",)  # the plan's "why": only an explicit stages.shape list picks it
    reads = ("rewards",)  # the reward components it gates on
    when_text = "stages.shape names gate_on_accuracy"
    gamma: float = GAMMA

    @classmethod
    def when(cls, cfg) -> bool:
        return False  # never picked automatically

    @classmethod
    def validate(cls, cfg) -> list[str]:
        if not any(spec.name in COMPONENTS for spec in cfg.rewards):
            return [f"stages.shape: gate_on_accuracy needs one of the rewards {', '.join(COMPONENTS)} in `rewards`"]
        return []

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        return {}  # no config keys of its own (``rewards`` is the score stage's to show)

    def __init__(self, rt) -> None:
        super().__init__(rt)
        names = {spec.name for spec in self.cfg.rewards}
        self.component = next(c for c in COMPONENTS if c in names)

    def __call__(self, b) -> None:
        acc = torch.tensor([r.components.get(self.component, 0.0) for r in b.results], dtype=b.rewards.dtype)
        wrong = acc <= 0
        b.rewards = torch.where(wrong, self.gamma * b.rewards, b.rewards)
        b.diagnostics["gate/gated_rows"] = Metric.sum(float(wrong.sum()))  # a count: summed over processes
