"""The one place where consistency code calls the answer verifiers of ``mmrlvr.rewards``.

Consistency must be judged with *the same* normalisation as accuracy ("0.5" vs "1/2", "(C)" vs "C",
units, tolerances from ``meta["tolerance"]``, box IoU), otherwise a rollout could be "correct" but
"inconsistent" for reasons of spelling alone. Every comparison goes through here, so a change of the
rewards API is a change of this file only.
"""

from __future__ import annotations

from functools import lru_cache

from mmrlvr.rewards.auto import same_answer as _rewards_same_answer
from mmrlvr.rewards.combine import answer_judge, make_answer_judge
from mmrlvr.rewards.parsing import split_think_answer
from mmrlvr.rewards.auto import AutoAccuracyReward
from mmrlvr.rewards.parsing import ParsedResponse
from mmrlvr.types import Completion, Sample

__all__ = ["parse_response", "same_answer", "matches_ground_truth", "answer_correct", "has_ground_truth"]

#: boxes agree / are correct at IoU >= this (as ``answer_judge``)
IOU_THRESHOLD = 0.5


def parse_response(text: str, think_prefilled: bool = False) -> ParsedResponse:
    """Thinking, answer and their spans (``mmrlvr.rewards.parsing.split_think_answer``)."""
    return split_think_answer(text, think_prefilled=think_prefilled)


def same_answer(answer: str, conclusion: str, sample: Sample) -> bool:
    """Does the response's ``answer`` state the thinking's ``conclusion``?

    The conclusion plays the ground truth: it is the clean value the extractor found ("3", "C",
    "[1, 2, 3, 4]"), while the answer block is free text the verifier already knows how to read
    ("(C) 5 cm", "\\boxed{3}"). An answer the verifier cannot read as stating the conclusion is "no".
    """
    return bool(_rewards_same_answer(answer, conclusion, sample, IOU_THRESHOLD))


@lru_cache(maxsize=None)
def _auto() -> AutoAccuracyReward:
    return AutoAccuracyReward(box={"threshold": IOU_THRESHOLD})


def matches_ground_truth(value: str, sample: Sample) -> bool:
    """Is ``value`` (e.g. the thinking's conclusion) correct for ``sample``, by the accuracy verifier?"""
    return _auto().check(value, sample).score >= 1.0 - 1e-9


def has_ground_truth(sample: Sample) -> bool:
    return sample.answer is not None and bool(str(sample.answer).strip())


@lru_cache(maxsize=None)
def _judge(think_prefilled: bool):
    return make_answer_judge(think_prefilled=think_prefilled) if think_prefilled else answer_judge


def answer_correct(completion: Completion, sample: Sample, think_prefilled: bool = False) -> bool:
    """The accuracy verdict of the evaluation judge (R1 template): a missing answer is not correct."""
    return bool(_judge(think_prefilled)(completion, sample)[0])
