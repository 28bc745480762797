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


def vote_entries(cfg: RunConfig) -> list[tuple[int, str, object]]:
    """``(index, name, votes)`` of every top-level ``rewards`` entry that is a majority vote (``majority_vote``,
    ``cocov``, a plug-in subclass of ``MajorityVote``) and sets ``params.votes`` (the value as given, unchecked)."""
    import mmrlvr.rewards.majority  # noqa: F401  (registers majority_vote and cocov)
    from mmrlvr.rewards.base import REWARDS
    from mmrlvr.rewards.majority import MajorityVote

    out = []
    for i, spec in enumerate(cfg.rewards or []):
        params = spec.params or {}
        factory = REWARDS.get(spec.name) if spec.name and spec.name in REWARDS else None
        if "votes" in params and isinstance(factory, type) and issubclass(factory, MajorityVote):
            out.append((i, spec.name, params["votes"]))
    return out


def samples_per_prompt(cfg: RunConfig) -> int:
    """How many responses the generate stage samples per prompt: ``rollout.group_size``, or the ``votes`` of a
    majority-vote reward (TTRL's vote/train split: the pseudo-label is voted over all of them, and the ``vote_split``
    shape stage keeps ``rollout.group_size`` per prompt for training)."""
    votes = [v for _, _, v in vote_entries(cfg) if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return max(votes) if votes else cfg.rollout.group_size
