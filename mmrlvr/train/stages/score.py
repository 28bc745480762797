"""Score: every rollout through the configured rewards -> RewardResult (score, components, parsed) and [N] rewards.

Each row's correctness by the run's answer judge (``RewardResult.judged``: correct, formatted) is written here,
once: the accuracy metrics, dynamic sampling and the samplers read it.

Rewards that keep per-call statistics (``fn.metrics()``: judge unknown rate, parse failures) report them here,
for the record stage.
"""

from __future__ import annotations

from typing import Any

from mmrlvr.lazy_import import lazy_module
from mmrlvr.rewards.base import score_batch
from mmrlvr.rewards.combine import judge_rows
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.stages.base import Stage, register_stage

torch = lazy_module("torch")  # selection (config checks) runs without torch; the stages' work imports it


@register_stage("score", "rewards")
class Rewards(Stage):
    fallback = True
    reads = ("rewards",)

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        return {f"rewards[{i}]": {"name": s.name, "weight": s.weight, **({"params": s.params} if s.params else {})}
                for i, s in enumerate(cfg.rewards)}

    @classmethod
    def validate(cls, cfg) -> list[str]:
        return [] if cfg.rewards else ["rewards: at least one reward component is needed"]

    def __call__(self, b: StepBatch) -> None:
        rt = self.rt
        b.results = score_batch(rt.reward, b.rollouts.completions, b.rollouts.samples,
                                group_index=b.rollouts.group_index.tolist())
        judge_rows(b.results, b.rollouts.completions, b.rollouts.samples)
        fns = rt.reward_fns()
        for fn in ([rt.reward] if rt.reward not in fns else []) + fns:  # the guard's counters, then each reward's
            if hasattr(fn, "metrics"):
                b.reward_metrics.update(fn.metrics())
        b.rewards = torch.tensor([r.score for r in b.results], dtype=torch.float32)
        for report in rt.data_reports:  # rows the loader dropped (e.g. prompts too long), once per step
            if hasattr(report, "metrics"):
                b.diagnostics.update(report.metrics())
