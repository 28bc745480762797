"""``choice``: multiple-choice answers — an option letter or the option's text.

Understood: "C", "(C)", "C.", "c", "'C'", "“C”", "option C", "The answer is C", "\\boxed{C}", "C. red", and the
option's text itself ("red") when ``sample.meta["options"]`` lists the options. Options are a list
(``["red", "blue", …]`` → A, B, …; a leading "A." / "(A)" in a text is ignored) or a mapping
``{"A": "red", …}``. The ground truth (``sample.answer``) is a letter or an option's text.

An answer naming two different letters ("A, B", "A or B", "C. red" when red is option A) scores 0. Questions
with several correct letters (multi-select) are not handled here.
"""

from __future__ import annotations

import re
import string
from typing import Any

from mmrlvr.errors import DataError
from mmrlvr.rewards.base import REWARDS
from mmrlvr.rewards.common import AnswerReward, require_answer
from mmrlvr.rewards.parsing import extract_boxed, fold_unicode, normalize_answer, strip_lead_in
from mmrlvr.types import RewardResult, Sample

_LETTER_ONLY_RE = re.compile(r"^[(\[]?\s*([A-Za-z])\s*[)\]]?\s*[.:)]?$")
_LETTER_THEN_TEXT_RE = re.compile(r"^[(\[]?([A-Z])(?:[)\]]\s*[.:]?|[.:])\s*(.+)$", re.DOTALL)
_LETTER_MENTION_RE = re.compile(r"(?<![A-Za-z0-9'’_\\])([A-Z])(?![A-Za-z0-9'’_])")
_OPTION_PREFIX_RE = re.compile(r"^\s*[(\[]?([A-Z])[)\].:]\s+")
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|mathrm)\s*\{([^{}]*)\}")
#: quotes a whole answer may stand in ("'B'", "“B”", "「B」"): not part of the letter
_QUOTES = {"'": "'", '"': '"', "`": "`", "“": "”", "‘": "’", "«": "»", "「": "」", "『": "』"}


def options_from_meta(meta: dict[str, Any] | None) -> dict[str, str]:
    """``meta["options"]`` as ``{letter: text}`` (empty when absent).

    >>> options_from_meta({"options": ["A. red", "blue"]})
    {'A': 'red', 'B': 'blue'}
    """
    raw = (meta or {}).get("options")
    if not raw:
        return {}
    if isinstance(raw, dict):
        items = [(str(k).strip().strip("()").upper(), str(v)) for k, v in raw.items()]
    elif isinstance(raw, (list, tuple)):
        if len(raw) > 26:
            raise DataError(f"{len(raw)} options; at most 26 (A–Z) are supported", field="meta.options")
        items = [(string.ascii_uppercase[i], str(v)) for i, v in enumerate(raw)]
    else:
        raise DataError(f"options must be a list or a mapping, got {type(raw).__name__}", field="meta.options")
    return {k: _OPTION_PREFIX_RE.sub("", v).strip() for k, v in items}


# Words that follow an option letter ("A or B", "C is correct") rather than an article ("A red circle").
_AFTER_LETTER = {"or", "and", "nor", "vs", "versus", "is", "was", "seems", "appears", "because", "since", "then",
                 "matches", "fits", "looks"}


def _is_article_or_pronoun(text: str, m: re.Match[str]) -> bool:
    """'A red circle' / 'I think': a capital A or I followed by a lower-case word is English, not a letter."""
    if m.group(1) not in "AI":
        return False
    nxt = re.match(r"\s+([a-z]+)", text[m.end() :])
    return nxt is not None and nxt.group(1) not in _AFTER_LETTER


def extract_choice(answer: str, options: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """(letter, problem): the one option letter an answer commits to, or (None, why not).

    >>> extract_choice("The answer is (C).")
    ('C', None)
    >>> extract_choice("A, B")
    (None, 'several_letters')
    >>> extract_choice("blue", {"A": "red", "B": "blue"})
    ('B', None)
    >>> extract_choice("A. blue", {"A": "red", "B": "blue"})
    (None, 'letter_text_conflict')
    """
    options = options or {}
    valid = set(options) if options else set(string.ascii_uppercase)
    a = fold_unicode(answer).strip()  # "（Ｂ）" is (B)
    boxed = extract_boxed(a)
    if boxed:
        if len({b.strip() for b in boxed}) > 1:
            return None, "several_letters"
        a = boxed[-1]
    a = _TEXT_CMD_RE.sub(r"\1", a).strip().strip("$").strip()
    a = strip_lead_in(a).replace("**", "").strip()
    while len(a) >= 2 and _QUOTES.get(a[0]) == a[-1]:
        a = a[1:-1].strip()
    if not a:
        return None, "empty_answer"
    text_to_letter = {normalize_answer(v): k for k, v in options.items() if v.strip()}

    m = _LETTER_ONLY_RE.match(a)
    if m:
        letter = m.group(1).upper()
        return (letter, None) if letter in valid else (None, "invalid_letter")
    m = _LETTER_THEN_TEXT_RE.match(a)
    if m and m.group(1) in valid:
        letter, rest = m.group(1), normalize_answer(m.group(2))
        named = text_to_letter.get(rest)
        if named is not None and named != letter:
            return None, "letter_text_conflict"
        if extract_choice(m.group(2), options)[0] not in (None, letter):
            return None, "several_letters"
        return letter, None
    if normalize_answer(a) in text_to_letter:
        return text_to_letter[normalize_answer(a)], None
    letters = {m.group(1) for m in _LETTER_MENTION_RE.finditer(a) if not _is_article_or_pronoun(a, m)} & valid
    if len(letters) == 1:
        return letters.pop(), None
    if len(letters) > 1:
        return None, "several_letters"
    return None, "no_letter"


def gold_letter(sample: Sample, options: dict[str, str]) -> str:
    """The correct letter of ``sample`` (its answer may be the letter or the option's text)."""
    gold = require_answer(sample, "choice").strip()
    m = _LETTER_ONLY_RE.match(gold)
    if m:
        return m.group(1).upper()
    for k, v in options.items():
        if normalize_answer(v) == normalize_answer(gold):
            return k
    raise DataError(
        f"sample {sample.id!r}: choice answer {gold!r} is neither an option letter nor one of meta['options']",
        field="answer",
    )


@REWARDS.register("choice")
class ChoiceReward(AnswerReward):
    """1.0 when the answer commits to the correct option letter (or its text), else 0.0.

    Parameters: ``template``, ``think_prefilled``, ``max_answer_chars``.
    ``parsed``: answer, letter (what the response chose), gold (correct letter), problems.

    >>> from mmrlvr.types import Sample
    >>> s = Sample(id="q", messages=[], images=[], answer="B", answer_type="choice", meta={"options": ["red", "blue"]})
    >>> ChoiceReward()("<think>it is blue</think><answer>The answer is (B)</answer>", s).score
    1.0
    >>> ChoiceReward()("<think>hmm</think><answer>blue</answer>", s).score
    1.0
    >>> ChoiceReward()("<think>hmm</think><answer>A or B</answer>", s).score
    0.0
    """

    name = "choice"

    def check(self, answer: str, sample: Sample) -> RewardResult:
        options = options_from_meta(sample.meta)
        gold = gold_letter(sample, options)
        letter, problem = extract_choice(answer, options)
        parsed = {"answer": answer, "letter": letter, "gold": gold, "problems": [problem] if problem else []}
        return RewardResult(float(letter is not None and letter == gold), {}, parsed)
