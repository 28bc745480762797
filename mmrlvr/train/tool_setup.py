"""A run's multi-turn settings from its config: the tools it offers, turn and token limits, ReSum.

Read by the ``multi_turn`` generate stage (``mmrlvr.train.stages.generate``), held-out evaluation and ``mmrlvr eval``
of a run, so all three sample trajectories alike.
"""

from __future__ import annotations

from mmrlvr.run_settings import TOOL_DEFAULTS


def multi_turn(cfg) -> bool:
    """Whether the run's rollouts are multi-turn: it offers tools, or summarises (ReSum)."""
    return bool(cfg.rollout.tools) or bool(cfg.rollout.summarize)


def summarize_of(cfg):
    """The run's ReSum settings (``rollout.summarize``), or None."""
    if not cfg.rollout.summarize:
        return None
    from mmrlvr.rollout.multiturn import Summarize

    return Summarize(**cfg.rollout.summarize)


def tool_use(cfg):
    """The run's ``ToolUse`` (tools, turn and token limits) from ``rollout.*``, or None when its rollouts are one
    turn: what the generate stage, held-out evaluation and ``mmrlvr eval`` of the run sample with."""
    if not multi_turn(cfg):
        return None
    from mmrlvr.rollout.multiturn import ToolUse
    from mmrlvr.tools import TOOLS

    r = cfg.rollout
    p = {**TOOL_DEFAULTS, **(r.tool_params or {})}
    return ToolUse(tools={name: TOOLS.get(name) for name in r.tools}, max_turns=r.max_turns,
                   max_tokens=r.max_trajectory_tokens, time_budget_s=float(p["time_budget_s"]),
                   max_image_pixels=int(p["max_image_pixels"]), describe=bool(p["describe"]))


def with_tools(engine, cfg):
    """``engine`` itself, or a ``ToolEngine`` over it when the run offers tools (``tool_use``)."""
    use = tool_use(cfg)
    if use is None:
        return engine
    from mmrlvr.rollout.multiturn import ToolEngine

    return ToolEngine(engine, use, summarize_of(cfg))
