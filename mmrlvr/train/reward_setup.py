"""The run's reward: the configured components with run-wide settings passed down (shared by training and eval)."""

from __future__ import annotations

from mmrlvr.config import RunConfig


def build_run_reward(cfg: RunConfig):
    """The weighted sum of ``cfg.rewards``. Rubric rewards get the run's judge, its parameters and the judge-outage
    thresholds (``rubric.max_unknown_rate`` / ``warn_unknown_rate``); group-aware rewards get the group size."""
    from mmrlvr.rewards.combine import CombinedReward, RewardSpec

    specs = [RewardSpec(s.name, s.weight, dict(s.params)) for s in cfg.rewards]
    for spec in specs:
        if spec.name == "rubric":
            if cfg.rubric.judge != "none":
                spec.params.setdefault("judge", cfg.rubric.judge)
                spec.params.setdefault("judge_params", dict(cfg.rubric.judge_params))
            spec.params.setdefault("max_unknown_rate", cfg.rubric.max_unknown_rate)
            spec.params.setdefault("warn_unknown_rate", cfg.rubric.warn_unknown_rate)
        if spec.name in ("rubric", "consistency"):
            spec.params.setdefault("group_size", cfg.rollout.group_size)
    return CombinedReward(specs)
