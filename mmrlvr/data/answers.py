"""Ground-truth checks at load time: every per-row value a reward will later read is parsed here first.

Why: a ``number`` row whose answer is ``a few`` used to load fine and stop the run at the step that first
drew it (the numeric reward raised ``DataError`` mid-training, after minutes of work, and ``on_error=skip``
never saw it). The rule now is that the loader parses each gold value *with the reward's own parser*
(``mmrlvr.rewards.numeric.read_number``, ``mmrlvr.rewards.grounding.parse_boxes``, ...), so what passes
here is what the reward accepts, and a bad row is a load-time ``DataError`` naming the row and field (or a
counted skip with ``on_error=skip``).

Also here: reading answers out of the wrappers other frameworks store them in (``<answer>…</answer>``,
a whole-answer ``\\boxed{}``), and guessing the answer type for layouts that do not record one (LLaVA,
VLM-R1, Visual-RFT: a list of boxes is ``box``, plain words are ``text``, anything else ``math``).
"""

from __future__ import annotations

import re
from typing import Any

from mmrlvr.errors import DataError

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_WORDS = re.compile(r"[^\W\d_]+(?:[\s'\-][^\W\d_]+)*", re.UNICODE)  # letters and spaces, no digits


def strip_answer_tags(text: str) -> str:
    """The content of the last ``<answer>…</answer>`` block (VLM-R1 / Visual-RFT / open-r1 solutions),
    else the text unchanged.

    >>> strip_answer_tags("<think>two red</think><answer> 2 </answer>")
    '2'
    """
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else text


def looks_like_boxes(value: Any) -> bool:
    """A box or a list of boxes (numbers, JSON / Python literals, ``bbox_2d`` / ``Position`` dicts, or location
    tokens: PaliGemma's ``<loc0256>…`` suffixes, Florence-2's ``<loc_256>…``, Kosmos-2's ``<patch_index_0044>…``,
    MiniGPT-v2's ``{<10><20><50><60>}``)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and _boxes(value) != []
    if not isinstance(value, str):
        return False
    if location_boxes(value):
        return True
    text = value.strip().strip("`").strip()
    if text.startswith("json"):
        text = text[4:].strip()
    return text[:1] in "[{(" and bool(_boxes(text))


def location_boxes(text: str) -> list[tuple[float, ...]]:
    """Boxes in location tokens, as 0-1 fractions of the image (``mmrlvr.rewards.grounding.location_boxes``)."""
    from mmrlvr.rewards.grounding import location_boxes as read

    return read(text)


def _boxes(value: Any) -> list[tuple[float, ...]]:
    from mmrlvr.rewards.grounding import parse_boxes

    text = value if isinstance(value, str) else repr(list(value))
    try:
        return parse_boxes(text)
    except Exception:  # noqa: BLE001 - a parser failure means "no boxes" here
        return []


def guess_answer_type(answer: Any) -> str:
    """``box`` for boxes, ``text`` for words without digits or LaTeX, else ``math``.

    >>> guess_answer_type("[10, 20, 30, 40]"), guess_answer_type("golden retriever"), guess_answer_type("3/4")
    ('box', 'text', 'math')
    """
    if looks_like_boxes(answer):
        return "box"
    if isinstance(answer, str) and _WORDS.fullmatch(answer.strip()) and len(answer.strip()) > 1:
        return "text"
    return "math"


def parse_gold_boxes(value: Any) -> list[list[float]]:
    """Every ground-truth box as [x1, y1, x2, y2] floats; an error for none or a degenerate box."""
    boxes = _boxes(value) if not isinstance(value, (int, float)) else []
    if not boxes:
        raise DataError(f"box answer must hold one or more [x1, y1, x2, y2] boxes, got {str(value)[:80]!r}")
    out = []
    for b in boxes:
        if len(b) != 4:
            raise DataError(f"box answer must have 4 numbers per box, got {list(b)}")
        x1, y1, x2, y2 = (float(v) for v in b)
        if not (x2 > x1 and y2 > y1):
            raise DataError(f"box answer must have x2 > x1 and y2 > y1, got {[x1, y1, x2, y2]}")
        out.append([x1, y1, x2, y2])
    return out


def validate_gold(answer: str | None, answer_type: str, meta: dict[str, Any] | None = None) -> None:
    """Raise ``DataError`` (with ``field``) when a reward for ``answer_type`` could not read this row.

    Uses the rewards' own parsers, so the two never disagree (see the module docstring). Example: a
    ``number`` row with answer ``a few`` fails here, naming field ``answer`` (``three`` loads: numbers in words are
    numbers to every reward).
    """
    meta = meta or {}
    if answer is not None:
        if not answer.strip():
            raise DataError("answer is empty", field="answer")
        if answer_type == "number":
            from mmrlvr.rewards.numeric import read_number

            if read_number(answer)[0] is None:
                raise DataError(f"answer {answer[:60]!r} is not a number (answer_type number); write it in "
                                "digits (or as an English number in words) or set answer_type to text/math for this "
                                "row", field="answer")
        elif answer_type == "box":
            parse_gold_boxes(answer)
        elif answer_type == "text":
            from mmrlvr.rewards.parsing import normalize_answer

            if not normalize_answer(answer):
                raise DataError(f"text answer {answer[:60]!r} is empty after normalisation", field="answer")
        elif answer_type == "choice":
            letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
            options = meta.get("options")
            if options is not None and (len(answer) != 1 or answer not in letters[:len(options)]):
                raise DataError(f"choice answer {answer!r} is not one of the option letters "
                                f"A-{letters[len(options) - 1]}", field="answer")
    if "tolerance" in meta:
        from mmrlvr.rewards.numeric import _tolerance_from_meta

        try:
            _tolerance_from_meta(meta, "row")
        except DataError as exc:
            raise DataError(str(exc).split(": ", 1)[-1], field="meta.tolerance") from None
