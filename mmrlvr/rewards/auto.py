"""``auto_accuracy``: one reward for mixed tasks, dispatching on ``sample.answer_type``.

number → ``numeric`` (falling back to ``accuracy`` when the answer is not a plain number, e.g. ``\\sqrt{4}``),
choice → ``choice``, math → ``accuracy``, box → ``grounding``, text → ``text``. One config key then works
on a dataset mixing counting, multiple-choice, grounding and math rows. Per-type options go in the
sub-dictionaries (``number: {abs_tol: 0.5}``, ``box: {coord_format: norm1000}``); ``template`` and
``think_prefilled`` apply to all.

``same_answer`` exposes the same verifiers for comparing two answers (the consistency judges use it to
compare the thinking's conclusion with the final answer).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mmrlvr.errors import DataError
from mmrlvr.rewards.accuracy import AccuracyReward
from mmrlvr.rewards.base import REWARDS
from mmrlvr.rewards.choice import ChoiceReward
from mmrlvr.rewards.common import AnswerReward
from mmrlvr.rewards.grounding import GroundingReward, location_boxes
from mmrlvr.rewards.numeric import NumericReward
from mmrlvr.rewards.text import TextReward
from mmrlvr.types import Completion, RewardResult, Sample

ANSWER_TYPES = ("number", "choice", "math", "box", "text")


@REWARDS.register("auto_accuracy")
class AutoAccuracyReward:
    """Task accuracy for any ``answer_type``; ``parsed["verifier"]`` says which verifier decided.

    >>> from mmrlvr.types import Sample
    >>> auto = AutoAccuracyReward()
    >>> count = Sample(id="c", messages=[], images=[], answer="3", answer_type="number")
    >>> pick = Sample(id="p", messages=[], images=[], answer="B", answer_type="choice")
    >>> auto("<think>3 shapes</think><answer>3</answer>", count).score
    1.0
    >>> auto("<think>b</think><answer>(B)</answer>", pick).score
    1.0
    """

    def __init__(self, template: str = "r1", think_prefilled: bool = False, number: dict[str, Any] | None = None,
                 choice: dict[str, Any] | None = None, math: dict[str, Any] | None = None,
                 box: dict[str, Any] | None = None, text: dict[str, Any] | None = None) -> None:
        common = {"template": template, "think_prefilled": think_prefilled}
        self.verifiers: dict[str, AnswerReward] = {
            "number": NumericReward(**{**common, **(number or {})}),
            "choice": ChoiceReward(**{**common, **(choice or {})}),
            "math": AccuracyReward(**{**common, **(math or {})}),
            "box": GroundingReward(**{**common, **(box or {})}),
            "text": TextReward(**{**common, **(text or {})}),
        }

    def metrics(self) -> dict[str, float]:
        """The verifiers' own counts (``reward/accuracy/gold_unparsed``, ``reward/grounding/box_unparsed``, ...)."""
        out: dict[str, float] = {}
        for verifier in self.verifiers.values():
            m = getattr(verifier, "metrics", None)
            if callable(m):
                out.update(m())
        return out

    def verifier_for(self, sample: Sample) -> str:
        t = sample.answer_type
        if t not in self.verifiers:
            raise DataError(f"sample {sample.id!r}: unknown answer_type {t!r}; known: {', '.join(ANSWER_TYPES)}",
                            field="answer_type")
        return t

    def _number_fallback(self, result: RewardResult, sample: Sample) -> RewardResult:
        """A "number" answer written as an expression (``\\frac{6}{2}``, ``\\sqrt{9}``) goes to math-verify."""
        answer = result.parsed.get("answer")
        if answer and "not_a_number" in result.parsed.get("problems", []):
            fallback = self.verifiers["math"].check(answer, sample)
            fallback.parsed["verifier"] = "math"
            return fallback
        return result

    def __call__(self, completion: Completion | str, sample: Sample) -> RewardResult:
        t = self.verifier_for(sample)
        result = self.verifiers[t](completion, sample)
        if t == "number":
            result = self._number_fallback(result, sample)
        result.parsed.setdefault("verifier", t)
        return result

    def check(self, answer: str, sample: Sample) -> RewardResult:
        """Score an already-extracted answer string with the verifier for ``sample.answer_type``."""
        t = self.verifier_for(sample)
        result = self.verifiers[t].check(answer, sample)
        if t == "number":
            result = self._number_fallback(result, sample)
        result.parsed.setdefault("verifier", t)
        return result


_DEFAULT_AUTO: AutoAccuracyReward | None = None


def same_answer(a: str, b: str, sample: Sample, iou_threshold: float = 0.5) -> bool:
    """Do answers ``a`` and ``b`` agree, judged by the verifier for ``sample.answer_type``?

    ``b`` plays the ground truth; boxes agree when every box matches with IoU ≥ ``iou_threshold``. A ``b``
    the verifier cannot read as a ground truth (not a number, no box) means "no", never an exception.

    >>> s = Sample(id="c", messages=[], images=[], answer="3", answer_type="number")
    >>> same_answer("3.0", "3", s), same_answer("2", "3", s)
    (True, False)
    """
    global _DEFAULT_AUTO
    if _DEFAULT_AUTO is None:
        _DEFAULT_AUTO = AutoAccuracyReward()
    auto = _DEFAULT_AUTO
    probe = dataclasses.replace(sample, answer=b)
    try:
        if sample.answer_type == "box":
            # both boxes come from the response, so they share a frame: no resizing, no clipping -- unless one is
            # in location tokens (their own 0-1 grid): then the image's size puts both in one frame
            if not (location_boxes(a) or location_boxes(b)):
                probe = dataclasses.replace(sample, answer=b, meta={}, images=[])
            result = GroundingReward(threshold=iou_threshold, max_area_fraction=None).check(a, probe)
        else:
            result = auto.check(a, probe)
    except DataError:
        return False
    return result.score >= 1.0 - 1e-9
