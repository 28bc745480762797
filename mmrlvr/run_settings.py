"""Settings a run derives from its config: defaults that depend on other keys.

Read by the stages that act on them, by the methods' config checks and by the plan, so they live here, below
all of those (this module imports nothing of mmrlvr and no torch).
"""

from __future__ import annotations

from typing import Any

#: ``rollout.tool_params`` and their defaults: a tool call's time budget, the largest image a tool may return (pixels),
#: whether the prompt lists the tools' schemas. The rollout's ``ToolUse``, ``run_call`` and the config checks read them
TOOL_DEFAULTS: dict[str, Any] = {"time_budget_s": 10.0, "max_image_pixels": 1024 * 1024, "describe": True}

#: ``rollout.strategy_params`` of the tree strategy (TreeRPO) and their defaults (segment_length 0: max_new_tokens
#: split evenly over the depth)
TREE_DEFAULTS = {"depth": 2, "branching": 2, "segment_length": 0}


def tree_params(cfg: Any) -> dict[str, int]:
    """``rollout.strategy_params`` with the defaults filled in (segment length resolved)."""
    p = {**TREE_DEFAULTS, **(cfg.rollout.strategy_params or {})}
    if not p["segment_length"]:
        p["segment_length"] = max(1, cfg.rollout.max_new_tokens // max(int(p["depth"]), 1))
    return {k: int(v) for k, v in p.items()}


def recompute_enabled(cfg: Any) -> bool:
    """``algo.recompute_old_logprobs`` with its default resolved: on for several epochs, the vLLM engine or OPD."""
    flag = cfg.algo.recompute_old_logprobs
    if flag is None:  # OPD: the reverse KL's student side from the teacher's kind of pass (exactly 0 for equal weights)
        return cfg.algo.epochs > 1 or cfg.rollout.engine == "vllm" or cfg.algo.advantage == "opd"
    return bool(flag)
