"""One rollout's thinking–answer analysis: split, extract the conclusion, verify both sides.

``analyse(completion, sample)`` is the rule-based core every consistency judge, reward variant and
metric shares. It never decides a reward; it records facts:

- ``agrees``: the thinking's conclusion equals the answer under the accuracy verifier of the sample's
  answer type (None when either side is missing);
- ``thinking_correct``: the conclusion equals the ground truth (None without a conclusion or without
  ground truth);
- ``answer_correct``: the answer equals the ground truth (None without ground truth; a missing or
  malformed answer is False, exactly as the accuracy reward scores it).

Spans are offsets into ``completion.text`` so the inspector can highlight them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmrlvr.consistency.extract import Conclusion, conclusion_from_thinking
from mmrlvr.consistency.verify import (answer_correct, has_ground_truth, matches_ground_truth, parse_response,
                                       same_answer)
from mmrlvr.types import Completion, Sample

__all__ = ["RolloutAnalysis", "analyse"]


@dataclass
class RolloutAnalysis:
    thinking: str | None
    answer: str | None
    think_span: tuple[int, int] | None
    answer_span: tuple[int, int] | None
    conclusion: Conclusion
    conclusion_span: tuple[int, int] | None  # into completion.text
    agrees: bool | None
    thinking_correct: bool | None
    answer_correct: bool | None
    problems: list[str]

    @property
    def rule_verdict(self) -> str:
        """"consistent" / "inconsistent" from the rule comparison, "unknown" when it cannot compare."""
        if self.agrees is None:
            return "unknown"
        return "consistent" if self.agrees else "inconsistent"


def analyse(completion: Completion, sample: Sample, think_prefilled: bool = False) -> RolloutAnalysis:
    """Split the response, find the thinking's conclusion and verify it against answer and ground truth."""
    parsed = parse_response(completion.text, think_prefilled)
    conclusion = conclusion_from_thinking(parsed.thinking, sample)
    span = None
    if conclusion.span is not None and parsed.think_span is not None:
        offset = parsed.think_span[0]
        span = (offset + conclusion.span[0], offset + conclusion.span[1])
    agrees = thinking_correct = None
    if conclusion.value is not None and parsed.answer is not None:
        agrees = same_answer(parsed.answer, conclusion.value, sample)
    gt = has_ground_truth(sample)
    if conclusion.value is not None and gt:
        thinking_correct = matches_ground_truth(conclusion.value, sample)
    correct = answer_correct(completion, sample, think_prefilled) if gt else None
    return RolloutAnalysis(parsed.thinking, parsed.answer, parsed.think_span, parsed.answer_span, conclusion,
                           span, agrees, thinking_correct, correct, list(parsed.problems))
