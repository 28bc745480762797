"""``numeric``: a number within tolerance of the ground truth (counts, lengths, angles, readings).

The answer must be one number, optionally with a unit ("12 cm", "40°", "3/4", "\\frac{3}{4}", "1,000",
"50%" — the unit is dropped, so "50%" matches a ground truth of 50, not 0.5), in digits or in words
("three", "twenty-one apples"; ``mmrlvr.rewards.parsing.parse_number_words``). "2 or 3", "2, 3", "3 4" and
"three four" are not one number and score 0.

Tolerance: correct when ``|pred − gold| <= abs_tol`` or ``|pred − gold| <= rel_tol·|gold|``. A sample's own
``meta["tolerance"]`` (a number = absolute, or ``{"abs": …, "rel": …}``) takes precedence over the reward's
``abs_tol`` / ``rel_tol``; with neither, the check is exact up to float noise (1e-9).
"""

from __future__ import annotations

import math
from typing import Any

from mmrlvr.errors import DataError
from mmrlvr.rewards.base import REWARDS
from mmrlvr.rewards.common import AnswerReward, require_answer
from mmrlvr.rewards.parsing import extract_boxed, split_number_unit, strip_lead_in
from mmrlvr.types import RewardResult, Sample

_FLOAT_NOISE = 1e-9


def read_number(answer: str) -> tuple[float | None, str]:
    """(value, unit) of an answer that states one number, else (None, "").

    >>> read_number("The answer is 12 cm."), read_number("\\\\boxed{3/4}"), read_number("2 or 3")
    ((12.0, 'cm'), (0.75, ''), (None, ''))
    """
    a = answer.strip()
    boxed = extract_boxed(a)
    if boxed:
        if len(set(boxed)) > 1:
            return None, ""
        a = boxed[-1]
    a = strip_lead_in(a).rstrip(" .").strip()
    return split_number_unit(a)


def within_tolerance(pred: float, gold: float, abs_tol: float | None, rel_tol: float | None) -> bool:
    """|pred − gold| ≤ abs_tol, or ≤ rel_tol·|gold| (either may be None); exact (±1e-9) when both are None.

    >>> within_tolerance(3.05, 3.0, 0.1, None), within_tolerance(103.0, 100.0, None, 0.02)
    (True, False)
    """
    if not (math.isfinite(pred) and math.isfinite(gold)):
        return False
    err = abs(pred - gold)
    if abs_tol is None and rel_tol is None:
        return err <= _FLOAT_NOISE * max(1.0, abs(gold))
    return (abs_tol is not None and err <= abs_tol) or (rel_tol is not None and err <= rel_tol * abs(gold))


def _tolerance_from_meta(meta: dict[str, Any], sample_id: str) -> tuple[float | None, float | None] | None:
    tol = (meta or {}).get("tolerance")
    if tol is None:
        return None
    try:
        if isinstance(tol, dict):
            unknown = set(tol) - {"abs", "rel"}
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)}")
            a, r = tol.get("abs"), tol.get("rel")
            return (None if a is None else float(a), None if r is None else float(r))
        return float(tol), None
    except (TypeError, ValueError) as e:
        raise DataError(
            f"sample {sample_id!r}: meta['tolerance'] must be a number or {{abs: …, rel: …}} ({e})",
            field="meta.tolerance",
        ) from None


@REWARDS.register("numeric")
class NumericReward(AnswerReward):
    """1.0 when the stated number is within tolerance of the ground truth, else 0.0.

    Parameters: ``abs_tol``, ``rel_tol`` (defaults: exact), ``use_sample_tolerance`` (read
    ``meta["tolerance"]``, default True), ``template``, ``think_prefilled``, ``max_answer_chars``.
    ``parsed``: answer, value, unit, gold, abs_error, problems.

    >>> from mmrlvr.types import Sample
    >>> s = Sample(id="q", messages=[], images=[], answer="2", answer_type="number")
    >>> NumericReward()("<think>2 red</think><answer>2</answer>", s).score
    1.0
    >>> NumericReward(abs_tol=0.5)("<think>..</think><answer>2.4 cm</answer>", s).score
    1.0
    >>> NumericReward()("<think>..</think><answer>2 or 3</answer>", s).score
    0.0
    """

    name = "numeric"

    def __init__(self, abs_tol: float | None = None, rel_tol: float | None = None, use_sample_tolerance: bool = True,
                 template: str = "r1", think_prefilled: bool = False, max_answer_chars: int | None = None) -> None:
        super().__init__(template, think_prefilled, max_answer_chars)
        for label, v in (("abs_tol", abs_tol), ("rel_tol", rel_tol)):
            if v is not None and not (float(v) >= 0):
                raise ValueError(f"numeric: {label} must be >= 0, got {v!r}")
        self.abs_tol = None if abs_tol is None else float(abs_tol)
        self.rel_tol = None if rel_tol is None else float(rel_tol)
        self.use_sample_tolerance = bool(use_sample_tolerance)

    def check(self, answer: str, sample: Sample) -> RewardResult:
        gold_text = require_answer(sample, self.name)
        gold, _ = read_number(gold_text)
        if gold is None:
            raise DataError(f"sample {sample.id!r}: answer {gold_text!r} is not a number", field="answer")
        value, unit = read_number(answer)
        parsed: dict[str, Any] = {"answer": answer, "value": value, "unit": unit, "gold": gold, "abs_error": None,
                                  "problems": []}
        if value is None:
            parsed["problems"].append("not_a_number")
            return RewardResult(0.0, {}, parsed)
        abs_tol, rel_tol = self.abs_tol, self.rel_tol
        if self.use_sample_tolerance:
            from_meta = _tolerance_from_meta(sample.meta, sample.id)
            if from_meta is not None:
                abs_tol, rel_tol = from_meta
        parsed["abs_error"] = abs(value - gold)
        return RewardResult(float(within_tolerance(value, gold, abs_tol, rel_tol)), {}, parsed)
