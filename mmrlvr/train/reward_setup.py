"""The run's reward: the configured components with run-wide settings passed down (shared by training and eval)."""

from __future__ import annotations

from mmrlvr.config import RunConfig


def build_run_reward(cfg: RunConfig):
    """The weighted sum of ``cfg.rewards``. Every reward whose factory takes ``template`` gets the data's answer
    convention (``mmrlvr.data.prompts.answer_format``: R1 tags or ``\\boxed{}``), and one that takes ``group_size``
    the run's group size, unless its params set them — nested rewards too (``run_settings``). Rubric rewards get
    the run's judge, its parameters and the judge-outage thresholds (``rubric.max_unknown_rate`` /
    ``warn_unknown_rate``)."""
    from mmrlvr.rewards.combine import CombinedReward, RewardSpec

    import inspect

    from mmrlvr.data.prompts import answer_format
    from mmrlvr.rewards.base import REWARDS, run_settings, takes_param

    specs = [RewardSpec(s.name, s.weight, dict(s.params)) for s in cfg.rewards]
    convention = answer_format(cfg.data)  # r1 | boxed | raw: the one place the answer convention is set
    for spec in specs:
        builder = REWARDS.get(spec.name) if spec.name in REWARDS else None
        # a format reward checks a tagged layout; with raw answers (template: plain) it keeps its own default
        if builder is not None and convention == "raw" and spec.name == "format" and takes_param(builder, "template"):
            spec.params.setdefault("template", inspect.signature(builder).parameters["template"].default)
        if spec.name == "rubric":  # the rubric section of the config belongs to the rubric reward
            if cfg.rubric.judge != "none":
                spec.params.setdefault("judge", cfg.rubric.judge)
                spec.params.setdefault("judge_params", dict(cfg.rubric.judge_params))
            spec.params.setdefault("max_unknown_rate", cfg.rubric.max_unknown_rate)
            spec.params.setdefault("warn_unknown_rate", cfg.rubric.warn_unknown_rate)
    # run-wide settings reach every reward that takes them, nested ones too (a combinator's own rewards)
    with run_settings(**run_reward_settings(cfg)):
        return CombinedReward(specs)


def run_reward_settings(cfg: RunConfig) -> dict:
    """The run-wide settings rewards receive when they take the parameter (``mmrlvr.rewards.base.run_settings``):
    the data's answer convention and the group size."""
    from mmrlvr.data.prompts import answer_format

    return {"template": answer_format(cfg.data), "group_size": cfg.rollout.group_size}
