"""Extractors and verifiers for programmatic criteria (the one adapter onto ``mmrlvr.rewards``).

Minimal exposure is structural here: ``extract(check, response)`` receives the check and the response text
and nothing else - no sample, no ground truth - so what it pulls out of the response cannot depend on the
answer. ``verify(check, extracted, expected)`` then compares; ``expected_value(check, sample)`` is the only
place that reads the sample's ground truth (for ``expected: "{answer}"``).

Answer parsing (``<think>``/``<answer>`` splitting, ``\\boxed{}``, numbers, math equivalence) comes from
``mmrlvr.rewards.parsing`` and ``mmrlvr.rewards.mathverify``; this module adapts them to rubric checks and
adds only what rubrics need on top (targets, ``pick``, regex, JSON fields, option letters, box IoU).

The response is written by the policy being trained, so every extractor is bounded before it parses
(``CheckLimits``): responses longer than ``max_chars`` are refused before any parsing, JSON is found by
an iterative scanner with a nesting limit and a work budget linear in the text length (the standard
library's recursive decoder raised ``RecursionError`` on ~1,000 nested ``[``), and author regexes run
under a time budget (the ``regex`` module's ``timeout``: catastrophic backtracking cannot hang a run).
A limit that is hit raises ``CheckLimitError``; ``routing.run_program`` turns it - and any other
exception an extractor or verifier raises on a response - into a scored failure with the reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import regex as _regex

from mmrlvr.rewards import parsing
from mmrlvr.rewards.auto import same_answer
from mmrlvr.rewards.choice import extract_choice
from mmrlvr.boxes import iou
from mmrlvr.rewards.grounding import parse_boxes
from mmrlvr.rubric.jsonscan import OPEN_RE, json_span
from mmrlvr.rubric.schema import ANSWER_REF, Check
from mmrlvr.types import Sample



@dataclass(frozen=True)
class CheckLimits:
    """Bounds on the work one program check may do on one response (all deterministic but the regex one).

    max_chars: longest response a program check parses (longer: a scored failure, nothing parsed).
    json_max_depth: deepest JSON nesting accepted (deeper: no JSON value; json's decoder recurses).
    json_work_factor: the JSON search reads at most this many characters per character of text, summed
        over every candidate start (bounds the cost of many unclosed brackets).
    regex_timeout_s: wall-clock budget of one regex check (the ``regex`` module raises TimeoutError).
    """

    max_chars: int = 50_000
    json_max_depth: int = 64
    json_work_factor: int = 8
    regex_timeout_s: float = 1.0


DEFAULT_LIMITS = CheckLimits()


class CheckLimitError(Exception):
    """A program check hit one of its ``CheckLimits``; the message is the reason shown to users."""


@dataclass(frozen=True)
class Extracted:
    """What an extractor found in the response: ``value`` (None = nothing usable) and a note why."""

    value: Any
    note: str = ""


# ------------------------------------------------------------------------------------------- sections
def split_think_answer(response: str) -> tuple[str, str]:
    """(thinking, answer) of a response, through ``mmrlvr.rewards.parsing``.

    thinking: the closed ``<think>`` block ("" without one). answer: the single ``<answer>`` block; when the
    response uses ``<answer>`` tags but has no single usable block (two answers, unclosed, only inside the
    thinking) the answer is "" - a hedged or broken answer is no answer. Without any ``<answer>`` tag: the
    single final ``\\boxed{}``, else the text after ``</think>`` (or the whole response).
    """
    parsed = parsing.split_think_answer(response)
    thinking = parsed.thinking or ""
    if parsed.answer is not None:
        return thinking, parsed.answer
    if parsing.ANSWER_OPEN in response:
        return thinking, ""
    boxed = parsing.extract_final_answer(response, template="boxed")
    if boxed is not None:
        return thinking, boxed
    return thinking, response.rsplit(parsing.THINK_CLOSE, 1)[-1].strip()


def section(response: str, target: str) -> str:
    """The part of the response a check looks at: "response" (all of it), "thinking" or "answer"."""
    if target == "response":
        return response
    thinking, answer = split_think_answer(response)
    return thinking if target == "thinking" else answer


# ----------------------------------------------------------------------------------------- extraction
def extract(check: Check, response: str, limits: CheckLimits = DEFAULT_LIMITS) -> Extracted:
    """Pull the value a program check needs out of the response alone (never sees the ground truth).

    Raises ``CheckLimitError`` when the response is over ``limits.max_chars`` (checked before any
    parsing) or a regex runs past its time budget.
    """
    if len(response) > limits.max_chars:
        raise CheckLimitError(f"the response is {len(response):,} characters, over the {limits.max_chars:,}-"
                              "character limit of program checks (nothing was parsed)")
    text = section(response, check.param("target"))
    kind = check.kind
    if kind == "regex":
        flags = _regex.I if check.param("ignore_case") else 0
        try:
            found = _regex.findall(check.param("pattern"), text, flags, timeout=limits.regex_timeout_s)
        except TimeoutError:
            raise CheckLimitError(f"the pattern ran past its {limits.regex_timeout_s:g} s budget on this "
                                  "response") from None
        return Extracted(len(found))
    if not text.strip():
        return Extracted(None, f"empty {check.param('target')}")
    if kind == "number":
        return _pick_number(text, check.param("pick"))
    if kind == "choice":
        letter, problem = extract_choice(text)
        return Extracted(letter, problem or "")
    if kind == "math":
        boxed = parsing.extract_boxed(text)
        return Extracted(boxed[-1] if boxed else text.strip())
    if kind == "iou":
        boxes = list(dict.fromkeys(parse_boxes(text)))
        if len(boxes) > 1:
            return Extracted(None, f"{len(boxes)} different boxes: ambiguous answer")
        return Extracted(boxes[0] if boxes else None, "" if boxes else "no box found")
    if kind == "json_field":
        obj, note = first_json(text, limits)
        if note:
            return Extracted(None, note)
        found, value = _dig(obj, check.param("field"))
        return Extracted(value if found else None, "" if found else f"no field {check.param('field')!r}")
    raise ValueError(f"not a program check: {kind}")


def numbers_in(text: str) -> list[float]:
    """The numbers a text states: the whole text as one number (+ unit) if it is one, else every number."""
    value, _ = parsing.split_number_unit(text)
    return [value] if value is not None else parsing.find_numbers(text)


def _pick_number(text: str, pick: str) -> Extracted:
    nums = numbers_in(text)
    if not nums:
        return Extracted(None, "no number found")
    if pick == "only":
        distinct = sorted({round(n, 9) for n in nums})
        if len(distinct) > 1:
            return Extracted(None, f"several different numbers {distinct[:5]}: ambiguous answer")
        return Extracted(nums[0])
    return Extracted(nums[-1] if pick == "last" else nums[0])


def first_json(text: str, limits: CheckLimits = DEFAULT_LIMITS) -> tuple[Any, str]:
    """The first JSON object or array in ``text`` (a ```json fence first): (value, "") or (None, why not).

    Raises ``CheckLimitError`` for a value nested deeper than the limit or a search over its budget.

    Linear time at any nesting: each candidate start ("{" or "[") is scanned iteratively for its
    matching close (strings and escapes respected), with at most ``json_max_depth`` open brackets - a
    deeper value ends the search (a degenerate response, not an answer) - and the characters scanned over
    all candidates are capped at ``json_work_factor`` x the text length. Only a span that closes is
    handed to ``json.loads``, whose recursion then stays within the depth limit.
    """
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(text)
    budget = limits.json_work_factor * max(len(text), 1) + 1000
    for cand in candidates:
        for start in OPEN_RE.finditer(cand):
            i = start.start()
            end, why = json_span(cand, i, limits.json_max_depth)
            budget -= end - i
            if why == "depth":
                raise CheckLimitError(f"JSON nested deeper than {limits.json_max_depth} levels")
            if not why:
                try:
                    return json.loads(cand[i:end]), ""
                except (ValueError, RecursionError):
                    pass
            if budget <= 0:
                raise CheckLimitError("no JSON value found within the search budget "
                                      f"({limits.json_work_factor} characters read per character of text)")
    return None, "no JSON value found"


def _dig(obj: Any, dotted: str) -> tuple[bool, Any]:
    for part in dotted.split("."):
        if isinstance(obj, dict) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and part.lstrip("-").isdigit() and -len(obj) <= int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return False, None
    return True, obj


# ---------------------------------------------------------------------------------------- verification
def expected_value(check: Check, sample: Sample | None) -> Any:
    """The check's expected value; ``"{answer}"`` reads the sample's ground truth (the only place that does)."""
    expected = check.params.get("expected")
    if expected != ANSWER_REF:
        return expected
    if sample is None or sample.answer is None:
        raise ValueError('the check uses expected: "{answer}" but the sample has no answer')
    if check.kind == "iou":
        boxes = parse_boxes(str(sample.answer))
        if not boxes:
            raise ValueError(f"the sample's answer {sample.answer!r} is not a box [x1, y1, x2, y2]")
        return boxes[0]
    return sample.answer


def check_expected(check: Check, expected: Any) -> None:
    """Raise ValueError when the expected value cannot be compared with (bad data, not the response's fault)."""
    if check.kind == "number" and not isinstance(expected, (int, float)) and not numbers_in(str(expected)):
        raise ValueError(f"the expected value {str(expected)[:80]!r} of a number check is not a number")


def verify(check: Check, extracted: Extracted, expected: Any) -> tuple[bool, str]:
    """Compare an extracted value with the expected one: (met, rationale)."""
    kind, value = check.kind, extracted.value
    if kind == "regex":
        need = check.param("min_count")
        return value >= need, f"pattern found {value} time(s), need {need}"
    if value is None and not (kind == "json_field" and expected is None and extracted.note == ""):
        return False, extracted.note or "nothing extracted"
    if kind == "number":
        exp = numbers_in(str(expected))[0] if not isinstance(expected, (int, float)) else float(expected)
        tol = check.param("tolerance") + check.param("rel_tolerance") * abs(exp)
        return abs(value - exp) <= tol + 1e-12, f"extracted {value:g}, expected {exp:g} ± {tol:g}"
    if kind == "choice":
        exp = str(expected).strip().strip("()").upper()[:1]
        return value == exp, f"extracted option {value}, expected {exp}"
    if kind == "math":
        ok = math_equal(str(expected), str(value))
        return ok, f"extracted {str(value)[:80]!r} {'is' if ok else 'is not'} equivalent to {str(expected)[:80]!r}"
    if kind == "iou":
        score = iou(tuple(value), tuple(float(v) for v in expected))
        tau = check.param("threshold")
        return score >= tau, f"IoU {score:.3f} vs threshold {tau:g}"
    if kind == "json_field":
        if expected is None:
            return True, f"field {check.param('field')!r} present"
        return _json_equal(value, expected, check.param("tolerance")), f"field = {value!r}, expected {expected!r}"
    raise ValueError(f"not a program check: {kind}")


#: the sample a math check judges against (its answer is replaced by the expected value)
_MATH_SAMPLE = Sample(id="rubric-check", messages=[], images=[], answer=None, answer_type="math")


def math_equal(expected: str, predicted: str) -> bool:
    """Equivalence as the accuracy reward judges a final answer (``mmrlvr.rewards.auto.same_answer`` on a math
    sample: units, currency, percentages, thousands separators and Unicode math read first, hedged answers refused,
    then math-verify; safe on any thread), else normalised text — so a rubric's math check and the run's accuracy
    reward agree."""
    if same_answer(str(predicted), str(expected), _MATH_SAMPLE):
        return True
    return _norm(expected) == _norm(predicted)


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", parsing.normalize_answer(str(s)))


def _json_equal(value: Any, expected: Any, tol: float) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(expected, (int, float)):
        return abs(float(value) - float(expected)) <= tol + 1e-12
    if isinstance(value, str) and isinstance(expected, (str, int, float)):
        return _norm(value) == _norm(str(expected))
    return value == expected
