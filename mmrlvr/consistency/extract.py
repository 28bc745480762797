"""Find the conclusion a response's thinking states, with its character span.

The consistency judges compare *what the thinking concluded* with *what the answer says*. This module
does the first half: given the text inside ``<think>…</think>`` it finds every place that states an
answer (a candidate), decides which of them are asserted (not a question, not negated, not hedged)
and returns the last asserted one, per answer type:

- ``number``  "the answer is 3", "= 3", "so there are 3", "I count three", ``\\boxed{3}``
- ``choice``  "the answer is (C)", "so option C", "(C) is correct"; bare "(C)" only as a fallback
- ``math``    ``\\boxed{…}``, "the answer is …", the right-hand side of the last equation
- ``box``     the last ``[x1, y1, x2, y2]`` in the thinking
- ``text``    "the answer is red", "so it is red"

Candidates come in two tiers: tier 1 are phrases that announce a conclusion ("answer is", "so", "=",
"there are"), tier 0 are weaker mentions ("is 40", a bare "(C)"). The last asserted tier-1 candidate
wins; tier 0 is used only when the thinking has no tier-1 candidate. Every candidate is recorded so the
inspector can show all of them, and spans index the ``thinking`` string passed in.

Per-task phrasing goes through ``CONCLUSION_HOOKS`` and ``conclusion_from_thinking(thinking, sample)``:
the counting tasks ("How many red shapes are there?") list counts per colour ("I see 2 red, 1 blue."),
so the conclusion is the count of the *asked* colour, and a colour missing from a complete listing
means 0. Hooks return ``None`` to fall back to the generic extraction.

What this module deliberately does not do: decide equality (that is the accuracy verifier's job, see
``mmrlvr.consistency.verify``) or read the ``<answer>`` part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mmrlvr.registry import Registry
from mmrlvr.rewards.parsing import NUMBER_WORD_PATTERN, parse_number_words
from mmrlvr.types import Sample

__all__ = [
    "Candidate",
    "Conclusion",
    "extract_conclusion",
    "conclusion_from_thinking",
    "count_conclusion",
    "CONCLUSION_HOOKS",
    "KINDS",
]

#: Sample.answer_type -> extractor kind. Unknown types use the free-text extractor.
KINDS = {"number": "number", "numeric": "number", "count": "number", "choice": "choice",
         "option": "choice", "math": "math", "expression": "math", "box": "box", "grounding": "box",
         "text": "text"}


@dataclass(frozen=True)
class Candidate:
    """One place in the thinking that states an answer.

    value: the stated answer, lightly cleaned (number words -> digits, trailing punctuation removed).
    span: (start, end) character offsets of the value in the thinking.
    cue: which phrase announced it ("answer_is", "equals", "so", "boxed", "count", "bare_option", ...).
    tier: 1 = announced as a conclusion, 0 = weak mention used only when there is no tier-1 candidate.
    asserted: False when it sits in a question, is negated ("is not 3", "3 is wrong") or hedged
        ("maybe", "if", "let me check whether").
    """

    value: str
    span: tuple[int, int]
    cue: str
    tier: int
    asserted: bool


@dataclass(frozen=True)
class Conclusion:
    """The thinking's conclusion. ``value``/``span`` are None when no asserted candidate was found."""

    value: str | None
    span: tuple[int, int] | None
    kind: str
    candidates: list[Candidate] = field(default_factory=list)
    cue: str | None = None


# ----------------------------------------------------------------------------------------------
# Building blocks

_WORD = r"\b" + NUMBER_WORD_PATTERN + r"\b"  # "seven", "twenty-one" (below one hundred)
_FRAC = r"\\[dt]?frac\s*\{[^{}]+\}\s*\{[^{}]+\}"
_NUMERAL = r"[-+−]?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?%?"
NUM = rf"(?:{_FRAC}|{_NUMERAL}|{_WORD})"

# Where a clause ends: sentence punctuation followed by space/end, a newline, a comma that starts a
# new clause, or the end of the thinking.
_CLAUSE_END = (r"(?=\s*(?:[.;!?](?:\s|$)|\n|,\s+(?:so|which|and|but|because|since|then|therefore|"
               r"thus|hence|as|wait|let)\b|$))")
# A clause-long value (expression or free text), at most 80 characters.
_CLAUSE_VALUE = r"(?P<v>[^\n]{1,80}?)" + _CLAUSE_END
_LINK = r"(?:is|are|was|were|equals|=|gives|get|got|have|has|be|becomes|comes\s+to)"
_SO = r"\b(?:so|therefore|thus|hence|overall|altogether|in\s+total)\b"
_ANSWER_IS = (r"\b(?:answer|(?:correct|right|best)\s+(?:choice|option))\b[^.?!\n\d]{0,24}?"
              r"(?:\bis\b|=|:|\bwould\s+be\b|\bshould\s+be\b|\bmust\s+be\b|\bwill\s+be\b)\s*")
_OPS_AFTER = r"(?!\s*[a-z]*\s*[-+*/×÷^·=]\s*[\w(\\])"  # "= 3 + 1" is not a conclusion, "= 3." is

# "is it 3", "could the answer be 3": asking, recorded as a candidate but never asserted
_QUESTION = r"\b(?:is|are|could|would|might|can)\s+(?:it|the\s+answer|that|this|there)\s+(?:be\s+)?"
_HEDGE = re.compile(r"\b(?:maybe|perhaps|possibly|might|could|if|suppose|assume|assuming|whether|guess|"
                    r"not\s+sure|unsure|check|wonder)\b", re.I)
_NEGATION = re.compile(r"\bnot\b|n't\b|\bnever\b", re.I)
_REJECTED_AFTER = re.compile(r"^\)?\s*(?:is|was|would\s+be|seems|looks)?\s*(?:wrong|incorrect|impossible|"
                             r"not\s+(?:right|correct|it|the))\b", re.I)
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
_CLAUSE_START = re.compile(r"[,;:]|\bthen\b|\bso\b|\bthus\b|\btherefore\b|\bhence\b", re.I)


@dataclass(frozen=True)
class _Pattern:
    cue: str
    tier: int
    regex: re.Pattern[str]


def _p(cue: str, tier: int, pattern: str, flags: int = re.I) -> _Pattern:
    return _Pattern(cue, tier, re.compile(pattern, flags))


_NUMBER_PATTERNS = [
    _p("answer_is", 1, _ANSWER_IS + r"\$?\(?(?P<v>" + NUM + ")"),
    _p("equals", 1, r"(?:(?<![<>!=])=(?!=)|≈|\bequals\b|\bis\s+equal\s+to\b)\s*\$?(?P<v>" + NUM + ")" + _OPS_AFTER),
    _p("so", 1, _SO + r"[,:]?\s*(?:[^.?!\n]{0,60}?\b" + _LINK + r"\s+)?(?:about\s+|exactly\s+)?(?P<v>" + NUM + ")"
       + _OPS_AFTER),
    _p("count", 1, r"\b(?:there\s+(?:is|are|were)|I\s+(?:see|count|get|find|have)|we\s+(?:have|get)|"
                   r"count\s+(?:is|of)|total\s+(?:is|of))\s+(?:only\s+|exactly\s+)?(?P<v>" + NUM + ")"),
    _p("is", 0, r"\b(?:is|are|was|be)\s+(?:about\s+|approximately\s+|exactly\s+)?\$?(?P<v>" + NUM + ")"
       + _OPS_AFTER),
    _p("about", 0, r"\b(?:about|approximately|around|roughly)\s+(?P<v>" + NUM + ")" + _OPS_AFTER),
    _p("question", 0, _QUESTION + r"(?P<v>" + NUM + ")"),
]

_LETTER = r"(?P<v>[A-J])"
_LETTER_END = r"(?![A-Za-z0-9])"
_CHOICE_PATTERNS = [
    _p("answer_is", 1, _ANSWER_IS + r"(?:option\s+|choice\s+)?\(?" + _LETTER + r"\)?" + _LETTER_END
       + r"(?!\s+[a-z])"),
    _p("so", 1, r"\b(?:so|therefore|thus|hence|choose|pick|select|go\s+with)\b[,:]?\s*(?:(?:it\s+is|it's|"
                r"the\s+answer\s+is)\s+)?(?:(?:option|choice)\s+)?\(?" + _LETTER + r"\)?" + _LETTER_END
       + r"(?=\s*(?:[.,;:!?)]|$|\n|is\b))"),
    _p("is_correct", 1, r"(?:\b(?:option|choice)\s+)?\(?\b" + _LETTER + r"\)?\s+(?:is|seems|looks)\s+"
                        r"(?:the\s+)?(?:correct|right|answer|best)"),
    _p("boxed", 1, r"\\boxed\{\s*\(?" + _LETTER + r"\)?\s*\}"),
    _p("bare_option", 0, r"(?:\b(?:option|choice)\s+\(?" + _LETTER + r"\)?" + _LETTER_END + r"|\(" + _LETTER
       .replace("?P<v>", "?P<v2>") + r"\))"),
]
# The option letter itself must be upper case ("a" is an article); the rest is case-insensitive.
_CHOICE_PATTERNS = [_Pattern(p.cue, p.tier, re.compile(
    p.regex.pattern.replace("[A-J]", "(?-i:[A-J])"), re.I)) for p in _CHOICE_PATTERNS]

_MATH_PATTERNS = [
    _p("answer_is", 1, _ANSWER_IS + _CLAUSE_VALUE),
    _p("equals", 1, r"(?<![<>!=])=(?!=)\s*(?P<v>[^=\n]{1,80}?)" + _CLAUSE_END),
    _p("so", 1, _SO + r"[,:]?\s*[^.?!\n=]{0,60}?\b(?:is|are|equals|becomes|gives)\s+" + _CLAUSE_VALUE),
    _p("is", 0, r"\b(?:is|are|equals)\s+(?P<v>[^\n]{0,40}?[\d\\][^\n]{0,40}?)" + _CLAUSE_END),
]

_BOX_NUM = r"-?\d+(?:\.\d+)?"
_BOX_PATTERNS = [
    _p("box", 1, r"(?P<v>[\[(]\s*" + r"\s*,\s*".join([_BOX_NUM] * 4) + r"\s*[\])])"),
]

_TEXT_PATTERNS = [
    _p("answer_is", 1, _ANSWER_IS + _CLAUSE_VALUE),
    _p("so", 1, _SO + r"[,:]?\s*(?:it\s+is|it's|they\s+are|this\s+is|that\s+is|the\s+\w+\s+is|the\s+\w+\s+are)\s+"
       + _CLAUSE_VALUE),
    _p("it_is", 0, r"\b(?:it\s+is|it's|this\s+is)\s+" + _CLAUSE_VALUE),
    _p("question", 0, _QUESTION + _CLAUSE_VALUE),
]

_PATTERNS = {"number": _NUMBER_PATTERNS, "choice": _CHOICE_PATTERNS, "math": _MATH_PATTERNS,
             "box": _BOX_PATTERNS, "text": _TEXT_PATTERNS}


# ----------------------------------------------------------------------------------------------
# Assertedness

def _sentence_bounds(text: str, start: int, end: int) -> tuple[int, int, str]:
    """(sentence start, sentence end, terminator) of the sentence holding text[start:end]."""
    s = 0
    for m in _SENTENCE_END.finditer(text, 0, start):
        s = m.end()
    m = _SENTENCE_END.search(text, end)
    if m is None:
        return s, len(text), ""
    return s, m.end(), m.group(0)


def _is_asserted(text: str, cue_start: int, v_start: int, v_end: int) -> bool:
    """A candidate is asserted unless it is asked, negated or hedged (see module docstring)."""
    s_start, _, terminator = _sentence_bounds(text, v_start, v_end)
    if terminator == "?":
        return False
    if _NEGATION.search(text, cue_start, v_start):
        return False
    if _REJECTED_AFTER.match(text[v_end:v_end + 40]):
        return False
    clause_start = s_start
    for m in _CLAUSE_START.finditer(text, s_start, cue_start):
        clause_start = m.start()
    return _HEDGE.search(text, clause_start, v_start) is None


# ----------------------------------------------------------------------------------------------
# Value clean-up per kind

def _digits(word: str) -> str:
    """A number in words as digits ("Twenty-one" -> "21"); anything else unchanged."""
    value = parse_number_words(word)
    return str(value) if value is not None else word


def _clean_value(kind: str, raw: str, span: tuple[int, int]) -> tuple[str, tuple[int, int]] | None:
    """Trim a matched value; return None to drop the candidate. Spans stay aligned with the text."""
    start, end = span
    lead = len(raw) - len(raw.lstrip(" $("))
    trail = len(raw) - len(raw.rstrip(" $.,;:)"))
    if kind == "box":  # the brackets are the value
        lead, trail = 0, 0
    if kind == "math" and raw.rstrip().endswith(")") and raw.count("(") >= raw.count(")"):
        trail = len(raw) - len(raw.rstrip(" $.,;:"))  # keep a closing parenthesis that is balanced
    value = raw[lead:len(raw) - trail] if trail else raw[lead:]
    start, end = start + lead, end - trail
    if not value:
        return None
    if kind == "number":
        value = _digits(value).replace("−", "-")
    if kind == "box":
        nums = re.findall(_BOX_NUM, value)
        value = "[" + ", ".join(nums) + "]"
    if kind == "math" and "$" in value:  # "$x = 12$ square units": the math ends at the closing $
        value = value[:value.index("$")].rstrip()
        end = start + len(value)
    if kind in ("math", "text"):
        boxed = re.fullmatch(r"\\boxed\s*\{(.*)\}", value)
        if boxed:  # "the answer is \boxed{x}": the value is x
            value, start, end = boxed.group(1), start + boxed.start(1), start + boxed.end(1)
        lhs = re.fullmatch(r"([A-Za-z]\w*\s*=\s*)(.+)", value) if kind == "math" else None
        if lhs:  # "the answer is x = 4": the value is 4
            value, start = lhs.group(2), start + len(lhs.group(1))
    if kind == "math" and not re.search(r"[\w\\]", value):
        return None
    return value, (start, end)


def _boxed_candidates(text: str) -> list[tuple[str, tuple[int, int], int]]:
    """Contents of every ``\\boxed{…}`` with balanced braces: (content, span of content, cue start)."""
    out = []
    for m in re.finditer(r"\\boxed\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append((text[m.end():i - 1], (m.end(), i - 1), m.start()))
    return out


# ----------------------------------------------------------------------------------------------
# Public API

def _option_letter(value: str, options: Any) -> str | None:
    """Map a free-text value to an option letter when it equals one option's text."""
    if not options:
        return None
    items = options.items() if isinstance(options, dict) else (
        (chr(ord("A") + i), o) for i, o in enumerate(options))
    norm = _norm_text(value)
    for letter, text in items:
        if _norm_text(str(text)) == norm:
            return str(letter).strip("() ").upper()
    return None


def _norm_text(s: str) -> str:
    s = re.sub(r"^\(?[A-J]\)[\s.:]*", "", s.strip())
    s = re.sub(r"\b(?:the|a|an)\b", " ", s.lower())
    return re.sub(r"[^\w.]+", " ", s).strip(" .")


def candidates(thinking: str, kind: str, options: Any = None) -> list[Candidate]:
    """Every conclusion-like phrase of ``kind`` in the thinking, in text order (spans deduplicated)."""
    found: dict[tuple[int, int], Candidate] = {}

    def add(value: str, span: tuple[int, int], cue: str, tier: int, cue_start: int) -> None:
        cleaned = _clean_value(kind, value, span)
        if cleaned is None:
            return
        v, sp = cleaned
        asserted = cue != "question" and _is_asserted(thinking, cue_start, sp[0], sp[1])
        cand = Candidate(v, sp, cue, tier, asserted)
        old = found.get(sp)
        if old is None or old.tier < tier:
            found[sp] = cand

    if kind in ("number", "math", "text"):
        for content, span, cue_start in _boxed_candidates(thinking):
            if kind == "number" and not re.fullmatch(r"\s*" + NUM + r"\s*", content, re.I):
                continue
            add(content, span, "boxed", 1, cue_start)
    for pat in _PATTERNS[kind]:
        for m in pat.regex.finditer(thinking):
            group = "v" if m.group("v") is not None else "v2"
            add(m.group(group), m.span(group), pat.cue, pat.tier, m.start())
    if kind == "choice" and options:
        # "the answer is red" where option B is "red" states option B
        for pat in _TEXT_PATTERNS[:2]:
            for m in pat.regex.finditer(thinking):
                letter = _option_letter(m.group("v"), options)
                if letter is not None:
                    sp = m.span("v")
                    found.setdefault(sp, Candidate(letter, sp, "option_text", pat.tier,
                                                   _is_asserted(thinking, m.start(), *sp)))
    # A shorter value inside a longer one at the same place is the same statement: keep the longer
    # (e.g. "= 1/2" matched as "1/2" by one pattern and "1" by none — guards future patterns).
    spans = sorted(found, key=lambda sp: (sp[0], -sp[1]))
    kept: list[Candidate] = []
    for sp in spans:
        if kept and kept[-1].span[0] <= sp[0] and sp[1] <= kept[-1].span[1] and found[sp].tier <= kept[-1].tier:
            continue
        kept.append(found[sp])
    return kept


def choose(cands: Sequence[Candidate]) -> Candidate | None:
    """The last asserted candidate of the highest tier that has one."""
    for tier in (1, 0):
        asserted = [c for c in cands if c.tier == tier and c.asserted]
        if asserted:
            return max(asserted, key=lambda c: c.span[0])
    return None


def extract_conclusion(thinking: str | None, answer_type: str, options: Any = None) -> Conclusion:
    """The last asserted answer stated in ``thinking`` for an answer of ``answer_type``.

    >>> extract_conclusion("Is it 3? No: 2 + 2 = 4, so the answer is 4.", "number").value
    '4'
    >>> extract_conclusion("Could it be (B)? The answer is (C).", "choice").value
    'C'

    ``options`` (list of option texts, or dict letter -> text) lets a choice conclusion be stated by
    the option's text. Empty or missing thinking gives ``value=None`` with no candidates.
    """
    kind = KINDS.get(answer_type, "text")
    if not thinking or not thinking.strip():
        return Conclusion(None, None, kind, [])
    cands = candidates(thinking, kind, options)
    best = choose(cands)
    if best is None:
        return Conclusion(None, None, kind, cands)
    return Conclusion(best.value, best.span, kind, cands, best.cue)


# ----------------------------------------------------------------------------------------------
# Per-task hooks

#: task name -> hook(thinking, sample) -> Conclusion | None (None = use the generic extraction)
CONCLUSION_HOOKS: Registry[Callable[[str, Sample], "Conclusion | None"]] = Registry("conclusion hook")

COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "black", "white", "gray", "grey",
           "brown", "pink", "cyan", "magenta")
_META_TARGET_KEYS = ("colour", "color", "target_colour", "target_color", "target")


def _count_target(sample: Sample) -> str | None:
    for key in _META_TARGET_KEYS:
        value = sample.meta.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip().lower()
    m = re.search(r"\bhow\s+many\s+([a-z]+)", sample.question, re.I)
    return m.group(1).lower() if m else None


def count_conclusion(thinking: str, target: str) -> Conclusion | None:
    """The count of ``target`` (a colour or object word) stated in counting-style thinking.

    Recognised: "I see 2 red, 1 blue", "two red shapes", "red: 2", "no red". When the thinking lists
    counts of other colours ("I see 2 red, 1 blue.") and never mentions the target colour, the listing
    says the target count is 0 (cue "count_absent", span = the listing). Returns None when the thinking
    has no counting phrasing at all, so the caller falls back to the generic extraction.
    """
    t = re.escape(target)
    pats = [
        ("count_of", re.compile(r"(?P<v>" + NUM + r")\s+(?:" + t + r")\b", re.I)),
        ("count_of", re.compile(r"\b" + t + r"\b(?:\s+(?:shapes?|objects?|ones?|items?))?\s*(?::|=|-|"
                                r"count\s+is|\bis\b|\bare\b)\s*(?P<v>" + NUM + ")", re.I)),
        ("count_none", re.compile(r"\b(?P<v>no|none\s+of\s+the)\s+" + t + r"\b", re.I)),
    ]
    cands: list[Candidate] = []
    for cue, rx in pats:
        for m in rx.finditer(thinking):
            raw = m.group("v")
            value = "0" if cue == "count_none" else _digits(raw)
            sp = m.span("v")
            cands.append(Candidate(value, sp, cue, 1, _is_asserted(thinking, m.start(), *sp)))
    cands.sort(key=lambda c: c.span)
    best = choose(cands)
    if best is not None:
        return Conclusion(best.value, best.span, "number", cands, best.cue)
    if target in COLOURS:
        listing = re.compile(r"\bI\s+(?:see|count)\s+" + NUM + r"\s+(?:" + "|".join(COLOURS) + r")\b"
                             r"(?:\s*(?:,|and)\s*(?:and\s+)?" + NUM + r"\s+(?:" + "|".join(COLOURS) + r")\b)*",
                             re.I)
        found = [m for m in listing.finditer(thinking) if _is_asserted(thinking, m.start(), m.start(), m.end())]
        if found:
            m = found[-1]
            cand = Candidate("0", m.span(), "count_absent", 1, True)
            return Conclusion("0", m.span(), "number", cands + [cand], "count_absent")
    return None


@CONCLUSION_HOOKS.register("count")
def _count_hook(thinking: str, sample: Sample) -> Conclusion | None:
    target = _count_target(sample)
    return count_conclusion(thinking, target) if target else None


def _first_asserted(rx: re.Pattern[str], thinking: str, value_of: Callable[[re.Match[str]], str],
                    cue: str) -> Conclusion | None:
    """The last asserted match of ``rx`` (group "v" holds the value) as a text Conclusion."""
    cands = [Candidate(value_of(m), m.span("v"), cue, 1, _is_asserted(thinking, m.start(), *m.span("v")))
             for m in rx.finditer(thinking)]
    best = choose(cands)
    return None if best is None else Conclusion(best.value, best.span, "text", cands, cue)


_COLOUR_ALT = "|".join(COLOURS)


@CONCLUSION_HOOKS.register("largest_colour")
def _largest_colour_hook(thinking: str, sample: Sample) -> Conclusion | None:
    """"The largest shape is the red circle." states the colour red (an explicit "answer is …" wins)."""
    stated = extract_conclusion(thinking, "text")
    if stated.value is not None:
        return None
    rx = re.compile(r"\b(?:largest|biggest)\b[^.?!\n]{0,30}?\b(?:is|are)\s+(?:the\s+|a\s+)?(?P<v>"
                    + _COLOUR_ALT + r")\b", re.I)
    return _first_asserted(rx, thinking, lambda m: m.group("v").lower(), "largest_is")


@CONCLUSION_HOOKS.register("left_right")
def _left_right_hook(thinking: str, sample: Sample) -> Conclusion | None:
    """Positions stated in the thinking imply the answer: "The red circle is at x 30, the blue square is at
    x 70." -> "left" (subject x < reference x). An explicit "so it is left" wins; equal x says nothing."""
    stated = extract_conclusion(thinking, "text")
    if stated.value is not None or not sample.meta.get("subject") or not sample.meta.get("reference"):
        return None

    def x_of(obj: Any) -> re.Match[str] | None:
        words = r"\s+".join(re.escape(str(w)) for w in obj)
        found = [m for m in re.finditer(r"\b" + words + r"\b\s+is\s+at\s+x\s*=?\s*(?P<x>-?\d+(?:\.\d+)?)",
                                        thinking, re.I) if _is_asserted(thinking, m.start(), *m.span("x"))]
        return found[-1] if found else None

    a, b = x_of(sample.meta["subject"]), x_of(sample.meta["reference"])
    if a is None or b is None or float(a.group("x")) == float(b.group("x")):
        return None
    value = "left" if float(a.group("x")) < float(b.group("x")) else "right"
    span = (min(a.start(), b.start()), max(a.end(), b.end()))
    cand = Candidate(value, span, "positions", 1, True)
    return Conclusion(value, span, "text", [cand], "positions")


def conclusion_from_thinking(thinking: str | None, sample: Sample) -> Conclusion:
    """The thinking's conclusion for this sample, using its task's hook when there is one.

    The hook is chosen by ``sample.meta["conclusion_hook"]``, else ``sample.meta["task"]`` when it names
    a registered hook (or contains "count"), else the counting hook for "How many …?" questions. A hook
    that finds nothing falls back to ``extract_conclusion`` with the sample's answer type and options.
    """
    kind = KINDS.get(sample.answer_type, "text")
    if not thinking or not thinking.strip():
        return Conclusion(None, None, kind, [])
    hook_name = sample.meta.get("conclusion_hook")
    task = str(sample.meta.get("task") or "")
    if hook_name is None:
        if task in CONCLUSION_HOOKS:
            hook_name = task
        elif "count" in task.lower() or (kind == "number" and re.search(r"\bhow\s+many\b", sample.question, re.I)):
            hook_name = "count"
    if hook_name is not None:
        found = CONCLUSION_HOOKS.get(hook_name)(thinking, sample)
        if found is not None:
            return found
    return extract_conclusion(thinking, sample.answer_type, sample.meta.get("options"))
