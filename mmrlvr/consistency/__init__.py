"""Thinking–answer consistency (docs/consistency.md): measure it, judge it, reward it safely.

- ``extract``: the conclusion the thinking states (per answer type, per-task hooks), with spans;
- ``verify``: the one adapter onto the accuracy verifiers of ``mmrlvr.rewards``;
- ``analysis``: one rollout's facts (conclusion, agrees, thinking_correct, answer_correct);
- ``judges``: P(consistent) by rule, NLI model or EMA-reference likelihood (``CONSISTENCY_JUDGES``);
- ``likelihood``: GRPO-CARE's EMA reference and answer likelihoods;
- ``bonus``: GRPO-CARE bonus, CORA split advantages, β schedule (pure tensor functions);
- ``reward``: the ``consistency`` reward (variants ``accurate_only`` [default], ``plain``,
  ``follow_correct_thinking``, ``care``), registered in ``mmrlvr.rewards.base.REWARDS`` on import;
- ``metrics``: inconsistency rate and the thinking/answer four-way breakdown (``score_completions`` for
  completions no reward scored);
- ``evaluate``: held-out accuracy plus greedy/sampled consistency metrics (``evaluate_consistency``).

Importing this package registers the reward and does not import torch; the torch-based names
(``EMAReference``, ``care_bonus``, ...) load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from mmrlvr.consistency.analysis import RolloutAnalysis, analyse
from mmrlvr.consistency.extract import (
    CONCLUSION_HOOKS,
    Candidate,
    Conclusion,
    conclusion_from_thinking,
    count_conclusion,
    extract_conclusion,
)
from mmrlvr.consistency.judges import (
    CONSISTENCY_JUDGES,
    ConsistencyJudge,
    LikelihoodJudge,
    NLIJudge,
    RuleJudge,
    build_judge,
)
from mmrlvr.consistency.metrics import consistency_metrics, score_completions
from mmrlvr.consistency.reward import DEFAULT_VARIANT, VARIANTS, ConsistencyReward, group_indices

_LAZY = {
    "care_bonus": "mmrlvr.consistency.bonus",
    "cora_split_advantages": "mmrlvr.consistency.bonus",
    "beta_schedule": "mmrlvr.consistency.bonus",
    "EMAReference": "mmrlvr.consistency.likelihood",
    "answer_probs": "mmrlvr.consistency.likelihood",
    "answer_likelihoods": "mmrlvr.consistency.likelihood",
    "build_answer_inputs": "mmrlvr.consistency.likelihood",
    "evaluate_consistency": "mmrlvr.consistency.heldout",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mmrlvr.consistency' has no attribute {name!r}")


__all__ = [
    "Candidate", "Conclusion", "extract_conclusion", "conclusion_from_thinking", "count_conclusion",
    "CONCLUSION_HOOKS", "RolloutAnalysis", "analyse",
    "ConsistencyJudge", "CONSISTENCY_JUDGES", "RuleJudge", "NLIJudge", "LikelihoodJudge", "build_judge",
    "ConsistencyReward", "VARIANTS", "DEFAULT_VARIANT", "group_indices", "consistency_metrics",
    "score_completions",
    *_LAZY,
]
