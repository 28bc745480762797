"""``format``: 1.0 for a response in the expected shape, else 0.0.

The strict R1 shape is exactly ``<think>…</think><answer>…</answer>`` with a non-empty answer and only
whitespace outside the tags (``split_think_answer`` lists every departure). The ``boxed`` shape is a
response whose text after the thinking commits to one non-empty ``\\boxed{}`` answer. ``template="any"``
accepts either. The reward never looks at the ground truth.
"""

from __future__ import annotations

from mmrlvr.rewards.base import REWARDS
from mmrlvr.rewards.common import AnswerReward, completion_text
from mmrlvr.rewards.parsing import locate_answer, split_think_answer
from mmrlvr.types import Completion, RewardResult, Sample

FORMAT_TEMPLATES = ("r1", "boxed", "any")


@REWARDS.register("format")
class FormatReward:
    """Strict format check.

    template: "r1" (default), "boxed", or "any" (R1 or boxed). think_prefilled: the prompt opened
    ``<think>`` already. max_response_chars: longer responses score 0 before parsing (default 200,000). ``parsed["problems"]`` names what is wrong.

    >>> fmt = FormatReward()
    >>> fmt("<think>2 red</think><answer>2</answer>", None).score
    1.0
    >>> r = fmt("<think>2 red</think><answer>2</answer> trust me", None)
    >>> r.score, r.parsed["problems"]
    (0.0, ['text_outside_tags'])
    >>> FormatReward(template="any")("So it is \\\\boxed{2}.", None).score
    1.0
    """

    def __init__(self, template: str = "r1", think_prefilled: bool = False,
                 max_response_chars: int | None = None) -> None:
        if template not in FORMAT_TEMPLATES:
            raise ValueError(f"format: unknown template {template!r}; known: {', '.join(FORMAT_TEMPLATES)}")
        self.template = template
        self.think_prefilled = bool(think_prefilled)
        self.max_response_chars = int(max_response_chars or AnswerReward.default_max_response_chars)

    def __call__(self, completion: Completion | str, sample: Sample | None) -> RewardResult:
        text = completion_text(completion)
        if len(text) > self.max_response_chars:  # before any parsing (see AnswerReward)
            return RewardResult(0.0, {}, {"template": None, "problems": ["response_too_long"]})
        problems: list[str] = []
        if self.template in ("r1", "any"):
            p = split_think_answer(text, think_prefilled=self.think_prefilled)
            if p.well_formed:
                return RewardResult(1.0, {}, {"template": "r1", "problems": []})
            problems += p.problems
        if self.template in ("boxed", "any"):
            answer, boxed_problems = locate_answer(text, "boxed", self.think_prefilled)
            if answer is not None:
                return RewardResult(1.0, {}, {"template": "boxed", "problems": []})
            problems += [p for p in boxed_problems if p not in problems]
        return RewardResult(0.0, {}, {"template": None, "problems": problems})
