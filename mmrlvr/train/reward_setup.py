"""The run's reward: the configured components with run-wide settings passed down (shared by training and eval)."""

from __future__ import annotations

from mmrlvr.config import RunConfig


def build_run_reward(cfg: RunConfig):
    """The weighted sum of ``cfg.rewards``. Rewards that read answers get the data's answer convention
    (``mmrlvr.data.prompts.answer_format``: R1 tags or ``\\boxed{}``) unless their params set one. Rubric rewards get the run's judge, its parameters and the judge-outage
    thresholds (``rubric.max_unknown_rate`` / ``warn_unknown_rate``); group-aware rewards get the group size."""
    from mmrlvr.rewards.combine import CombinedReward, RewardSpec

    import inspect

    from mmrlvr.data.prompts import answer_format
    from mmrlvr.rewards.base import REWARDS

    specs = [RewardSpec(s.name, s.weight, dict(s.params)) for s in cfg.rewards]
    convention = answer_format(cfg.data)  # r1 | boxed | raw: the one place the answer convention is set
    for spec in specs:
        builder = REWARDS.get(spec.name) if spec.name in REWARDS else None
        try:
            takes_template = builder is not None and "template" in inspect.signature(builder).parameters
        except (TypeError, ValueError):
            takes_template = False
        # a format reward checks a tagged layout; with raw answers (template: plain) it keeps its own default
        if takes_template and not (convention == "raw" and spec.name == "format"):
            spec.params.setdefault("template", convention)
        if spec.name == "rubric":
            if cfg.rubric.judge != "none":
                spec.params.setdefault("judge", cfg.rubric.judge)
                spec.params.setdefault("judge_params", dict(cfg.rubric.judge_params))
            spec.params.setdefault("max_unknown_rate", cfg.rubric.max_unknown_rate)
            spec.params.setdefault("warn_unknown_rate", cfg.rubric.warn_unknown_rate)
        if spec.name in ("rubric", "consistency"):
            spec.params.setdefault("group_size", cfg.rollout.group_size)
    return CombinedReward(specs)
