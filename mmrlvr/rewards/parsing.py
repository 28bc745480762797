"""Pure text helpers shared by every reward, the consistency judges and the rubric extractors.

They answer one question each: where is the thinking, where is the final answer, what is inside a
``\\boxed{}``, what number does a string state. They never see the ground truth and never score anything;
the rewards (``format``, ``accuracy``, ``choice``, ...) decide what a parse means.

The R1 response format is ``<think>…</think><answer>…</answer>``: exactly one thinking block, then exactly
one answer block, nothing but whitespace outside. ``split_think_answer`` reports every way a response
departs from it as a named problem, so a hostile or broken response (two answers, unclosed tags, the answer
only inside the thinking) can be told apart from a plainly wrong one in the inspector.

Deliberately not here: option letters (``choice``), boxes (``grounding``) and math equivalence
(``accuracy``, through math-verify) live with the reward that owns them.
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from dataclasses import dataclass, field, replace
from fractions import Fraction

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_TAG_RE = re.compile(r"<(/?)(think|answer)>")

#: Templates understood by ``locate_answer`` / ``extract_final_answer``: the ``<answer>`` block, the final
#: ``\\boxed{}``, or the raw text after the thinking (responses trained without answer tags).
TEMPLATES = ("r1", "boxed", "raw")

#: Texts up to this many characters are memoised by the parsers below (larger ones are parsed each time, so a
#: hostile response cannot fill the caches: at most ``_MEMO_SIZE`` x 8,192 characters are kept per parser).
_MEMO_CHARS = 8192
_MEMO_SIZE = 4096


def _memoised(fn):
    """``fn(text, *args)`` through an LRU cache when ``text`` is a string of at most ``_MEMO_CHARS`` characters.

    Why: one step's rewards parse the same response many times (the format reward, each answer reward, the
    consistency check and every rubric criterion split it into thinking and answer; the numeric readers parse
    the same answers again): in the demo the parsers took about a fifth of the step. The parsers are pure
    functions of their arguments, so the cache changes no result; callers get values they may not mutate
    (numbers, strings, tuples), or a copy (``split_think_answer``)."""
    cached = functools.lru_cache(maxsize=_MEMO_SIZE)(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        text = args[0] if args else None
        if not kwargs and isinstance(text, str) and len(text) <= _MEMO_CHARS:
            return cached(*args)
        return fn(*args, **kwargs)  # keyword calls, long texts and None are not kept

    call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    call.cache_info = cached.cache_info  # type: ignore[attr-defined]
    return call

Span = tuple[int, int]  # [start, end) character offsets into the response text


#: Unicode's vulgar fractions (``½``, ``⅔``, ``⅛``, ...) with their value as ``a/b``
_VULGAR = {ch: unicodedata.normalize("NFKC", ch).replace("\u2044", "/")
           for ch in "\u00bc\u00bd\u00be" + "".join(chr(c) for c in range(0x2150, 0x215f))}
_VULGAR_RE = re.compile("[" + "".join(_VULGAR) + "]")
#: fullwidth ASCII (U+FF01-FF5E, what CJK text uses for letters, digits and punctuation: "（Ｂ）", "１２", "，") and
#: the ideographic space
_WIDTH_TABLE = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)} | {0x3000: 0x20}


def fold_unicode(s: str) -> str:
    """Answer text with fullwidth forms as ASCII and vulgar fractions as ``a/b``, so readers see one spelling.

    Models answering in Chinese or Japanese write fullwidth letters, digits and punctuation ("（Ｂ）",
    "［１０，２０，３０，４０］"); ``½`` is 1/2, and ``1½`` the mixed number 1 1/2. Other compatibility
    characters are left alone (``²`` is an exponent of a unit).

    >>> fold_unicode("（Ｂ）"), fold_unicode("1½"), fold_unicode("⅔")
    ('(B)', '1 1/2', '2/3')
    """
    s = s.translate(_WIDTH_TABLE).replace("\u2044", "/")
    if _VULGAR_RE.search(s):
        s = _VULGAR_RE.sub(lambda m: (" " if m.start() and m.string[m.start() - 1].isdigit() else "")
                           + _VULGAR[m.group()], s)
    return s


def is_blank(s: str) -> bool:
    """No visible character: only whitespace, control characters (NUL), format marks or lone surrogates.

    >>> is_blank(" \\x00\\u200b "), is_blank(" 2 ")
    (True, False)
    """
    return all(ch.isspace() or unicodedata.category(ch)[0] == "C" for ch in s)


@dataclass
class ParsedResponse:
    """The R1 structure of one response.

    thinking: text of the (first closed) thinking block, stripped; None if there is none.
    answer: text of the single answer block, stripped; None when there is no usable answer (missing, empty,
        unclosed, several, or only inside the thinking).
    think_span / answer_span: ``[start, end)`` offsets of those block contents in the original text.
    well_formed: True only for exactly ``<think>…</think><answer>…</answer>`` with a non-empty answer and
        only whitespace outside the tags.
    problems: names of every departure from the format, e.g. ``"several_answers"``, ``"unclosed_answer"``,
        ``"answer_inside_think"``, ``"text_outside_tags"``, ``"no_think"``, ``"empty_answer"``.
    """

    thinking: str | None
    answer: str | None
    think_span: Span | None
    answer_span: Span | None
    well_formed: bool
    problems: list[str] = field(default_factory=list)


@dataclass
class _Block:
    open_start: int
    open_end: int
    close_start: int | None  # None: never closed (runs to the end of the text)
    close_end: int | None


class _Regions:
    """Sorted, non-overlapping spans with O(log n) membership (hostile responses repeat tags thousands of times)."""

    def __init__(self, spans: list[Span]) -> None:
        self.starts = [s for s, _ in spans]
        self.ends = [e for _, e in spans]

    def __contains__(self, pos: int) -> bool:
        i = bisect.bisect_right(self.starts, pos) - 1
        return i >= 0 and pos < self.ends[i]


def _pair_blocks(text: str, kind: str, problems: list[str], skip: _Regions | None = None) -> list[_Block]:
    """Pair ``<kind>`` with the next ``</kind>``; record nesting, stray closes and unclosed opens.

    Tags starting inside a ``skip`` region (the thinking) are ignored here: the thinking may talk about
    tags without breaking the structure that follows it.
    """
    blocks: list[_Block] = []
    current: _Block | None = None
    for m in _TAG_RE.finditer(text):
        if m.group(2) != kind or (skip is not None and m.start() in skip):
            continue
        closing = m.group(1) == "/"
        if not closing:
            if current is not None:
                if f"nested_{kind}" not in problems:  # once: 100,000 repeated tags must not make 100,000 entries
                    problems.append(f"nested_{kind}")
                continue
            current = _Block(m.start(), m.end(), None, None)
        else:
            if current is None:
                if f"stray_close_{kind}" not in problems:
                    problems.append(f"stray_close_{kind}")
                continue
            current.close_start, current.close_end = m.start(), m.end()
            blocks.append(current)
            current = None
    if current is not None:
        problems.append(f"unclosed_{kind}")
        blocks.append(current)
    return blocks


def split_think_answer(text: str, think_prefilled: bool = False) -> ParsedResponse:
    """Split an R1-format response into thinking and answer, naming every format problem.

    ``think_prefilled``: the prompt already ended with ``<think>`` (Qwen3-style chat templates), so the
    response starts inside the thinking and only closes it.

    >>> p = split_think_answer("<think>2 red, 1 blue</think><answer>2</answer>")
    >>> p.thinking, p.answer, p.well_formed
    ('2 red, 1 blue', '2', True)
    >>> split_think_answer("<think>x</think><answer>2</answer><answer>3</answer>").problems
    ['several_answers']
    >>> p = split_think_answer("<think>so <answer>3</answer></think>")
    >>> p.answer, p.problems
    (None, ['answer_inside_think', 'no_answer'])
    >>> split_think_answer("I think</think><answer>4</answer>", think_prefilled=True).well_formed
    True
    """
    parsed = _split_think_answer(text, bool(think_prefilled))
    return replace(parsed, problems=list(parsed.problems))  # a copy: the memoised one is shared


@_memoised
def _split_think_answer(text: str, think_prefilled: bool) -> ParsedResponse:
    offset = 0
    if think_prefilled and not text.lstrip().startswith(THINK_OPEN):
        text = THINK_OPEN + text
        offset = len(THINK_OPEN)
    problems: list[str] = []
    n = len(text)

    def inner(b: _Block) -> Span:
        return (b.open_end, b.close_start if b.close_start is not None else n)

    def outer(b: _Block) -> Span:
        return (b.open_start, b.close_end if b.close_end is not None else n)

    thinks = _pair_blocks(text, "think", problems)
    think_regions = _Regions([outer(b) for b in thinks])  # an unclosed think swallows the rest of the text
    if any(m.group(2) == "answer" and m.start() in think_regions for m in _TAG_RE.finditer(text)):
        problems.append("answer_inside_think")
    candidates = _pair_blocks(text, "answer", problems, skip=think_regions)  # answer blocks after the thinking
    if not thinks:
        problems.insert(0, "no_think")
    elif len(thinks) > 1:
        problems.insert(0, "several_think")
    closed_thinks = [b for b in thinks if b.close_end is not None]
    if candidates and closed_thinks and candidates[0].open_start < closed_thinks[0].open_start:
        problems.append("answer_before_think")

    answer: str | None = None
    answer_span: Span | None = None
    answer_tag_broken = any(p in problems for p in ("nested_answer", "stray_close_answer", "unclosed_answer"))
    if not candidates:
        problems.append("no_answer")
    elif len(candidates) > 1:
        problems.append("several_answers")
    elif not answer_tag_broken:
        s, e = inner(candidates[0])
        raw = text[s:e]
        if not is_blank(raw):
            lead = len(raw) - len(raw.lstrip())
            answer = raw.strip()
            answer_span = (s + lead - offset, s + lead + len(answer) - offset)
        else:
            problems.append("empty_answer")

    thinking: str | None = None
    think_span: Span | None = None
    if closed_thinks:
        s, e = inner(closed_thinks[0])
        thinking = text[s:e].strip()
        lead = len(text[s:e]) - len(text[s:e].lstrip())
        think_span = (s + lead - offset, s + lead + len(thinking) - offset)

    # Whatever is not inside a tag pair must be whitespace.
    covered = sorted([outer(b) for b in thinks] + [outer(b) for b in candidates])
    pos, outside = 0, []
    for s, e in covered:
        if s > pos:
            outside.append(text[pos:s])
        pos = max(pos, e)
    outside.append(text[pos:])
    stray = _TAG_RE.sub("", "".join(outside))
    if stray.strip():
        problems.append("text_outside_tags")

    return ParsedResponse(thinking, answer, think_span, answer_span, not problems, problems)


_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"\\[{}]|[{}]")
_WS_RE = re.compile(r"\s*")


def extract_boxed(text: str) -> list[str]:
    """Contents of every outermost ``\\boxed{…}`` (and ``\\fbox{…}``) in order, with balanced braces.

    A box nested inside another box is part of that box's content, not a second answer; a box whose whole
    content is one box is unwrapped (``\\boxed{\\boxed{2}}`` states one answer, 2). An unclosed
    ``\\boxed{`` is skipped: it has no content to trust. Linear time in ``len(text)`` at any nesting depth
    (a list of every nested box's content would be quadratic: 5,000 nested boxes cost seconds).

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}} and \\boxed{3}")
    ['\\\\frac{1}{2}', '3']
    >>> extract_boxed(r"\\boxed{unclosed")
    []
    >>> extract_boxed(r"\\boxed{ \\boxed{2} }")
    ['2']
    """
    starts = [m.end() - 1 for m in _BOXED_RE.finditer(text)]  # index of each box's "{"
    if not starts:
        return []
    closing = _matching_braces(text)
    out: list[str] = []
    outer_end = -1
    for i in starts:
        if i <= outer_end or i not in closing:
            continue  # inside a closed box already taken, or never closed
        j = outer_end = closing[i]
        while True:  # unwrap \boxed{\boxed{…}}: content that is exactly one closed box
            k = _WS_RE.match(text, i + 1).end()
            m = _BOXED_RE.match(text, k)
            if m is None:
                break
            inner = m.end() - 1
            end = closing.get(inner)
            if end is None or text[end + 1 : j].strip():
                break
            i, j = inner, end
        out.append(text[i + 1 : j].strip())
    return out


def box_key(content: str) -> object:
    """What two boxed answers are compared by to decide whether they are one answer: the number they
    state (``\\boxed{2}`` and ``\\boxed{2.0}`` are one answer), else their normalised text."""
    value = read_bare_number(content)
    return value if value is not None else normalize_answer(content)


def _matching_braces(text: str) -> dict[int, int]:
    """Index of each "{" -> its matching "}" in one linear pass (escaped \\{ \\} do not count)."""
    stack: list[int] = []
    match: dict[int, int] = {}
    for m in _BRACE_RE.finditer(text):
        c = m.group()
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            match[stack.pop()] = m.start()
    return match


def locate_answer(text: str, template: str = "r1", think_prefilled: bool = False) -> tuple[str | None, list[str]]:
    """The final answer of a response and the problems met finding it.

    ``template="r1"``: the single ``<answer>`` block (see ``split_think_answer``); a ``\\boxed{}`` inside it
    is unwrapped. ``template="boxed"``: the ``\\boxed{}`` contents after the thinking (text after the last
    ``</think>``, or all of it when there is no thinking). ``template="raw"``: the whole text after the
    thinking, stripped (for responses without answer tags). In every template, two *different* boxed
    answers mean there is no single final answer (``"several_boxed"``) — a model must commit to one.
    Format problems that still leave one answer (missing think block, text outside tags) are returned but
    do not withhold the answer: the ``format`` reward scores those.
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown answer template {template!r}; known: {', '.join(TEMPLATES)}")
    if template == "r1":
        parsed = split_think_answer(text, think_prefilled=think_prefilled)
        problems = list(parsed.problems)
        answer = parsed.answer
        if answer is None or "\\boxed" not in answer and "\\fbox" not in answer:
            return answer, problems
        region = answer
    else:
        problems = []
        if think_prefilled and THINK_OPEN not in text:
            text = THINK_OPEN + text
        if THINK_OPEN in text and THINK_CLOSE not in text:
            return None, ["unclosed_think"]
        region = text.rsplit(THINK_CLOSE, 1)[-1]
        if template == "raw" and "\\boxed" not in region and "\\fbox" not in region:
            region = region.strip()
            return (region, problems) if not is_blank(region) else (None, ["empty_answer"])
    boxed = extract_boxed(region)
    if not boxed:
        problems.append("no_boxed" if "\\boxed" not in region and "\\fbox" not in region else "unclosed_boxed")
        return None, problems
    distinct = {box_key(b) for b in boxed}
    if len(distinct) > 1:
        problems.append("several_boxed")
        return None, problems
    if is_blank(boxed[-1]):
        problems.append("empty_answer")
        return None, problems
    if _BOXED_RE.search(boxed[-1]):  # \boxed{1 + \boxed{2}}: a box inside a box beside other text
        problems.append("nested_boxed")
        return None, problems
    return boxed[-1], problems


def extract_final_answer(text: str, template: str = "r1", think_prefilled: bool = False) -> str | None:
    """The final answer string of a response, or None when it has no single usable answer.

    >>> extract_final_answer("<think>1+1</think><answer>2</answer>")
    '2'
    >>> extract_final_answer("<think>..</think><answer>\\\\boxed{\\\\frac{1}{2}}</answer>")
    '\\\\frac{1}{2}'
    >>> extract_final_answer("so the answer is \\\\boxed{7}.", template="boxed")
    '7'
    >>> extract_final_answer("\\\\boxed{2} or \\\\boxed{3}", template="boxed") is None
    True
    """
    return locate_answer(text, template, think_prefilled)[0]


#: English cardinal words below twenty and the tens (``parse_number_words``; the consistency extractor's patterns)
NUMBER_WORDS_BELOW_20 = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
                         "nineteen")
TENS_WORDS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
#: a number below one hundred in words, as a regex ("seven", "twenty-one", "ninety nine"); case is the caller's
NUMBER_WORD_PATTERN = (r"(?:(?:" + "|".join(TENS_WORDS) + r")(?:[- ](?:" + "|".join(NUMBER_WORDS_BELOW_20[1:10])
                       + r"))?|" + "|".join(sorted(NUMBER_WORDS_BELOW_20, key=len, reverse=True)) + ")")
_LEAD_IN_RE = re.compile(
    r"^\s*(?:(?:so|thus|therefore|hence|then)\s*,?\s+)?(?:i\s+think\s+)?(?:the\s+)?(?:final\s+|correct\s+)?"
    r"(?:answer|option|choice)\s*(?:is|:|=)?\s*:?\s*|^\s*(?:it\s+is|it's)\s+",
    re.IGNORECASE,
)
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textit|operatorname)\s*\{([^{}]*)\}")
_ARTICLE_RE = re.compile(r"^(?:a|an|the)\s+(?=[A-Za-z]{2})", re.IGNORECASE)  # "a + b" keeps its a
# Thousands separators: "1,000", "12,345,678"; never "0,125" (a decimal comma: 0.125, not 125).
_THOUSANDS_RE = re.compile(r"(?<![\d.])([1-9]\d{0,2}(?:,\d{3})+)(?![\d,])")
_SPACE_THOUSANDS_RE = re.compile(r"^[-+]?[1-9]\d{0,2}(?: \d{3})+$")


_MAX_LEAD_INS = 8


#: words before a number that state it rather than hedge it: "There are 5", "a total of 5", "about 5", "exactly
#: five", "≈ 5" (an answer block of one number; "about 5 or 6" is still two candidates once they are gone). Not
#: "nearly", "almost", "over", "at least": those name another number.
_NUMBER_LEAD_IN_RE = re.compile(
    r"^\s*(?:there\s+(?:is|are|was|were)\s+(?:only\s+|exactly\s+)?|(?:in\s+)?(?:a\s+)?total(?:\s+of\s+|\s+is\s+|\s*:\s*)|"
    r"about\s+|approximately\s+|approx\.?\s*|around\s+|roughly\s+|exactly\s+|precisely\s+|≈\s*)"
    r"(?=[-+−$\\]?\d|\.\d|\\[dt]?frac|(?:" + NUMBER_WORD_PATTERN + r"|minus|negative)\b)",
    re.IGNORECASE,
)


def strip_lead_in(s: str) -> str:
    """Remove phrases such as "The answer is", "Answer:", "option", "So the final answer is", and before a number
    "There are", "a total of", "about", "exactly" (``_NUMBER_LEAD_IN_RE``).

    At most ``_MAX_LEAD_INS`` stacked lead-ins are removed: each removal copies the string, and a hostile
    answer repeating "answer:" 100,000 times would otherwise cost quadratic time.

    >>> strip_lead_in("The answer is C.")
    'C.'
    """
    for _ in range(_MAX_LEAD_INS):
        prev, s = s, _LEAD_IN_RE.sub("", s, count=1)
        s = _NUMBER_LEAD_IN_RE.sub("", s, count=1)
        if s == prev:
            break
    return s.strip()


def normalize_answer(s: str | None, lower: bool = True) -> str:
    """Canonical text for exact-match comparison of short answers.

    Lower-cases; removes lead-ins ("The answer is"), math delimiters ($…$, \\(…\\)), ``\\text{}`` wrappers,
    a leading article, surrounding quotes/brackets of a lone word, trailing punctuation, thousands separators;
    collapses whitespace (``lower=False`` keeps the case: ``X`` and ``x`` differ in math). Numbers are not re-formatted ("3.0" stays "3.0": numeric comparison is the
    ``numeric`` reward's job).

    >>> normalize_answer("  The answer is: **Red**. ")
    'red'
    >>> normalize_answer("$\\\\text{left}$")
    'left'
    >>> normalize_answer("1,000")
    '1000'
    >>> normalize_answer("A")
    'a'
    """
    if s is None:
        return ""
    s = fold_unicode(s).strip()
    s = s.replace("**", "").replace("__", "")
    for _ in range(3):
        s = strip_lead_in(s)
        if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
            s = s.strip("$").strip()
        if s.startswith("\\(") and s.endswith("\\)"):
            s = s[2:-2].strip()
        if s.startswith("\\[") and s.endswith("\\]"):
            s = s[2:-2].strip()
        s = _TEXT_CMD_RE.sub(r"\1", s)
        s = s.rstrip(" .;:").strip()
        if s.endswith("!") and not re.search(r"[\d)}\]]!+$", s):  # "5!" is 120, not an exclamation
            s = s.rstrip("!").strip()
        if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'`":
            s = s[1:-1].strip()
    s = _THOUSANDS_RE.sub(lambda m: m.group(1).replace(",", ""), s)
    s = _ARTICLE_RE.sub("", s)
    s = re.sub(r"\s+", " ", s).strip()
    return s.lower() if lower else s


_UNSIGNED = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NUM = r"[-+]?" + _UNSIGNED
_NUMBER_RE = re.compile(rf"^{_NUM}$")
_FRACTION_RE = re.compile(rf"^([-+]?)\s*({_UNSIGNED})\s*/\s*({_UNSIGNED})$")
_MIXED_RE = re.compile(r"^([-+]?)(\d+)\s+(\d+)\s*/\s*(\d+)$")
# a × 10^b written with \times, \cdot, ×, · or *: "2 \times 10^{5}", "1.5 \cdot 10^{-3}"
_SCI_RE = re.compile(rf"^({_NUM})\s*(?:\\times|\\cdot|×|·|\*)\s*10\s*\^\s*(?:\{{\s*([-+]?\d+)\s*\}}|([-+]?\d+))$")
# a decimal comma can only be read for sure after a leading 0: "0,125" = 0.125 ("1,250" is thousands)
_ZERO_DECIMAL_COMMA_RE = re.compile(r"^([-+]?)0,(\d+)$")
_LATEX_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_LATEX_FRAC_SHORT_RE = re.compile(r"\\[dt]?frac\s*(\d)(\d)")


# A currency sign before the number (plain, LaTeX-escaped, or a LaTeX command): "$12", "\\$12", "€5".
_CURRENCY_RE = re.compile(r"^([-+]?)\s*(?:\\\$|\$|€|£|¥|₹|\\euro\b|\\pounds\b|\\yen\b|\\textdollar\b)\s*")


def _frac_sub(replacement: str):
    """A \\frac right after a digit is the fraction part of a mixed number: 1\\frac{1}{2} = 1 1/2, not 11/2."""

    def sub(m: re.Match[str]) -> str:
        lead = " " if m.start() > 0 and m.string[m.start() - 1].isdigit() else ""
        return lead + m.expand(replacement)

    return sub


def _canonical_number_text(s: str) -> str:
    s = fold_unicode(s).strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$" and s[-2] != "\\":
        s = s[1:-1].strip()  # math delimiters (an escaped \\$ at the end is a currency sign)
    s = s.replace("−", "-").replace("\\left", "").replace("\\right", "").replace("{,}", ",")
    s = _CURRENCY_RE.sub(r"\1", s).strip()
    s = s.strip("$").strip()
    if s.startswith("~") and s[1:2].isdigit():  # "~3": about 3 (or LaTeX's space before it); either way 3
        s = s[1:]
    s = re.sub(r"(?<=\d)\\[,;: ](?=\d{3}(?!\d))", "", s)  # thin-space thousands separators: 1\\,000
    s = re.sub(r"\\!", "", s)
    s = re.sub(r"\\[,;: ]", " ", s)  # other LaTeX spaces are spaces: "3\\,\\,4" is two numbers, not 34
    s = _SPACE_THOUSANDS_RE.sub(lambda m: m.group(0).replace(" ", ""), s)  # SI style: "1 000 000"
    s = _THOUSANDS_RE.sub(lambda m: m.group(1).replace(",", ""), s)
    s = _LATEX_FRAC_SHORT_RE.sub(_frac_sub(r"\1/\2"), s)
    s = _LATEX_FRAC_RE.sub(_frac_sub(r"(\1)/(\2)"), s)
    s = re.sub(r"\((" + _NUM + r")\)", r"\1", s)  # (3)/(4) -> 3/4
    return s.strip()


@_memoised
def parse_number(s: str | None) -> float | None:
    """The number a short string states, or None unless the whole string is one number.

    Accepts integers, decimals, scientific notation, thousands separators (``1,000``, ``1{,}000``,
    ``1\\,000``; ``0,125`` is not one: it is 0.125, a decimal comma), ``a/b``, ``\\frac{a}{b}``, mixed
    numbers ``1 1/2`` and ``1\\frac{1}{2}``, scientific notation ``2 \\times 10^{5}``, a leading currency sign (``$``, ``\\$``, ``€``, ``£``) and ``$…$`` delimiters. Units are not stripped here (see
    ``split_number_unit``).

    >>> parse_number("-3.5"), parse_number("\\\\frac{3}{4}"), parse_number("1,000"), parse_number("1 1/2")
    (-3.5, 0.75, 1000.0, 1.5)
    >>> parse_number("1\\\\frac{1}{2}"), parse_number("\\\\$1{,}000"), parse_number("0,125")
    (1.5, 1000.0, 0.125)
    >>> parse_number("2 or 3") is None
    True
    """
    if s is None:
        return None
    t = _canonical_number_text(s)
    if not t or len(t) > 64:
        return None
    try:
        if _NUMBER_RE.match(t):
            return float(t)
        m = _FRACTION_RE.match(t)
        if m:
            num, den = float(m.group(2)), float(m.group(3))
            if den == 0:
                return None
            return (-1.0 if m.group(1) == "-" else 1.0) * num / den
        m = _SCI_RE.match(t)
        if m:
            exponent = int(m.group(2) or m.group(3))
            return float(m.group(1)) * 10.0 ** exponent if abs(exponent) <= 308 else None
        m = _ZERO_DECIMAL_COMMA_RE.match(t)
        if m:
            return float(f"{m.group(1)}0.{m.group(2)}")
        m = _MIXED_RE.match(t)
        if m:
            whole, num, den = int(m.group(2)), int(m.group(3)), int(m.group(4))
            if den == 0 or num >= den:
                return None
            value = float(whole + Fraction(num, den))
            return -value if m.group(1) == "-" else value
    except (ValueError, OverflowError):
        return None
    return None


_BELOW_20 = {w: i for i, w in enumerate(NUMBER_WORDS_BELOW_20)}
_TENS = {w: 20 + 10 * i for i, w in enumerate(TENS_WORDS)}
_SCALES = {"thousand": 10 ** 3, "million": 10 ** 6, "billion": 10 ** 9, "trillion": 10 ** 12}
_SIGN_WORDS = {"minus": -1, "negative": -1}
_MAX_NUMBER_WORDS = 24
#: how a number in words can open (``_number_word_unit`` tries nothing else: most answers open with no such word)
_NUMBER_WORD_START_RE = re.compile(r"(?:a|minus|negative|" + NUMBER_WORD_PATTERN + r")\b", re.IGNORECASE)


def _below_100(toks: list[str], i: int) -> tuple[int | None, int]:
    """"seven", "seventeen", "twenty", "twenty one" (hyphens are already spaces) at ``toks[i]``; zero is not one."""
    t = toks[i] if i < len(toks) else None
    if t in _TENS:
        value, i = _TENS[t], i + 1
        if i < len(toks) and 1 <= _BELOW_20.get(toks[i], 0) <= 9:
            value, i = value + _BELOW_20[toks[i]], i + 1
        return value, i
    if t is not None and _BELOW_20.get(t, 0) >= 1:
        return _BELOW_20[t], i + 1
    return None, i


def _below_1000(toks: list[str], i: int) -> tuple[int | None, int]:
    """A group before a scale word: "five", "one hundred and five", "fifteen hundred", "a hundred"."""
    if i + 1 < len(toks) and toks[i] == "a" and (toks[i + 1] == "hundred" or toks[i + 1] in _SCALES):
        value, j = 1, i + 1
    else:
        value, j = _below_100(toks, i)
        if value is None:
            return None, i
    if j < len(toks) and toks[j] == "hundred":
        value, j = value * 100, j + 1
        k = j + 1 if j < len(toks) and toks[j] == "and" else j
        rest, k2 = _below_100(toks, k)
        if rest is not None:
            value, j = value + rest, k2
        elif k != j:
            return None, i  # "one hundred and" with nothing after it
    return value, j


def parse_number_words(s: str | None) -> int | None:
    """The integer an English cardinal written in words states, or None unless the whole string is one.

    Reads "zero" to "nineteen", the tens with their units ("twenty-one", "ninety nine"), "hundred" ("one hundred
    and five", "fifteen hundred", "a hundred"), thousand / million / billion / trillion in falling order, and a
    leading "minus" / "negative". Case and a trailing full stop do not matter. Not read: two numbers side by side
    ("three four"), ordinals ("third"), fractions and decimals in words ("a half", "three point five"), "dozen",
    and "no" / "none" (answers to yes/no and which-questions as often as counts).

    >>> parse_number_words("Three"), parse_number_words("twenty-one"), parse_number_words("one hundred and five")
    (3, 21, 105)
    >>> parse_number_words("two thousand three hundred"), parse_number_words("minus seven")
    (2300, -7)
    >>> parse_number_words("three four") is None, parse_number_words("a") is None
    (True, True)
    """
    if s is None:
        return None
    toks = s.strip().rstrip(".").lower().replace("-", " ").split()
    if not toks or len(toks) > _MAX_NUMBER_WORDS:
        return None
    sign = _SIGN_WORDS.get(toks[0], 1)
    if toks[0] in _SIGN_WORDS:
        toks = toks[1:]
    if toks == ["zero"]:
        return 0
    total, i, last_scale = 0, 0, None
    while i < len(toks):
        group, j = _below_1000(toks, i)
        if group is None:
            return None
        if j < len(toks) and toks[j] in _SCALES:
            scale = _SCALES[toks[j]]
            if last_scale is not None and scale >= last_scale:
                return None  # "two thousand three thousand"
            total, last_scale, i = total + group * scale, scale, j + 1
            if i < len(toks) and toks[i] == "and":
                i += 1
                if i == len(toks):
                    return None
            continue
        if j != len(toks):
            return None  # something after the last group: "three four", "twenty thirty"
        total, i = total + group, j
    return sign * total if toks else None


def read_bare_number(s: str | None) -> float | None:
    """The number a short string states in digits (``parse_number``) or in words (``parse_number_words``), with
    no unit; None otherwise. ``read_bare_number("Three.") == read_bare_number("3") == 3.0``."""
    value = parse_number(s)
    if value is None:
        words = parse_number_words(s)
        value = float(words) if words is not None else None
    return value


def _number_word_unit(t: str) -> tuple[int, str] | None:
    """(value, the rest) for text that opens with a number in words ("three apples" -> (3, "apples")), the
    longest such opening first; None when it opens with none."""
    if not _NUMBER_WORD_START_RE.match(t):
        return None
    words = t.split()
    for k in range(min(len(words), _MAX_NUMBER_WORDS), 0, -1):
        value = parse_number_words(" ".join(words[:k]))
        if value is not None:
            return value, " ".join(words[k:])
    return None


# A unit is a few words/symbols with no digits except exponents: "cm", "cm^2", "square units", "°", "%".
_UNIT_RE = re.compile(
    r"^(?:\^\s*\{?\\circ\}?|\\circ|°|\\%|%|¢|degrees?|"
    r"(?:[a-zA-Zµμ]+\.?(?:\s*(?:\^\s*\{?[23]\}?|[²³]))?)(?:\s*/\s*[a-zA-Z]+(?:\s*(?:\^\s*\{?[23]\}?|[²³]))?)?"
    r"(?:\s+[a-zA-Z]+\.?(?:\^?[23])?){0,1})$"
)
#: one LaTeX spacing command (``\\,``, ``\\quad``, ``\\hspace{1em}``, ``~``, ...): space, not content
LATEX_SPACE = r"\\(?:quad|qquad|enspace|thinspace|medspace|thickspace|hspace\s*\{[^{}]*\}|[,;:! ])|~"
#: what may stand between a number and its unit: spaces, and LaTeX's (``50\\,\\%``, ``3~\\text{cm}``, ``5\\;\\%``)
_UNIT_GAP_RE = re.compile(rf"(?:\s|{LATEX_SPACE})*")
_NOT_UNITS = {"or", "and", "to", "either", "nor", "than", "ignore", "instructions", "answer", "is", "maybe", "not"}
# Units that may follow a number with no space ("5cm", "3m", "2kg"). Any other letters right after a
# number are a variable ("2x", "2A": math-verify compares those), not a unit to ignore.
_ATTACHED_UNITS = {
    "mm", "cm", "dm", "m", "km", "in", "ft", "yd", "mi", "mg", "g", "kg", "t", "lb", "lbs", "oz", "ml", "l",
    "s", "sec", "ms", "min", "h", "hr", "hrs", "mph", "kph", "kmh", "hz", "khz", "w", "kw", "v", "j", "kj", "n",
    "pa", "kpa", "k", "c", "f", "px", "deg", "rad", "cal", "kcal", "mol", "st", "nd", "rd", "th",
}


#: longer text is not one number with a unit ("1\\,000\\,000 \\text{ square centimetres}" is 40 characters)
_MAX_NUMBER_UNIT_CHARS = 256


@_memoised
def split_number_unit(s: str | None) -> tuple[float | None, str]:
    """Split "12 cm^2" into (12.0, "cm^2"); (None, "") unless the string is one number plus an optional unit.

    Units are letters (at most three words), ``°``, ``^\\circ``, ``%``, ``¢``, after a space or LaTeX's (``\\,``, ``~``);
    words that join candidates ("or", "and", "to") and numbers in words are not units, so "2 or 3" and "3 four"
    are not a number. A number may be written in words (``parse_number_words``): "three apples" is (3.0, "apples").

    >>> split_number_unit("12 cm^2"), split_number_unit("40^\\\\circ"), split_number_unit("3 or 4")
    ((12.0, 'cm^2'), (40.0, '^\\\\circ'), (None, ''))
    """
    if s is None or len(s) > _MAX_NUMBER_UNIT_CHARS:  # each digit is a place to split: long text is quadratic work
        return None, ""
    t = _TEXT_CMD_RE.sub(r" \1", s.strip().strip("$")).strip()
    value = parse_number(t)
    if value is not None:
        return value, ""
    worded = _number_word_unit(t)
    if worded is not None:  # "three", "Twenty-one.", "three apples"
        value, unit = worded
        unit = unit.rstrip(".").strip()
        return (float(value), unit) if not unit or _is_unit(unit, attached=False) else (None, "")
    # The number ends at some digit (maybe followed by "}" or ")"); try the latest such split first.
    for m in reversed(list(re.finditer(r"\d[})]*", t))):
        gap = _UNIT_GAP_RE.match(t, m.end()).group()  # type: ignore[union-attr]
        head, unit = t[: m.end()].strip(), t[m.end() + len(gap) :].strip()
        if not unit or unit[0].isdigit():
            continue
        value = parse_number(head)
        if value is None:
            continue
        return (value, unit) if _is_unit(unit, attached=not gap) else (None, "")
    return None, ""


def _is_unit(unit: str, attached: bool) -> bool:
    """Can ``unit`` follow a number as its unit? Not words that join candidates ("or", "to"), not a second
    number in words ("3 four"), not a lone letter or an unknown attached word ("2x", "2 y", "2A": a product with
    a variable)."""
    words = {w.lower().strip(".") for w in re.findall(r"[a-zA-Z]+\.?", unit)}
    if not _UNIT_RE.match(unit) or words & _NOT_UNITS or any(w in _BELOW_20 or w in _TENS for w in words):
        return False
    first_word = re.match(r"[a-zA-Zµμ]*", unit).group()  # type: ignore[union-attr]
    return not (first_word and (attached or len(first_word) == 1) and first_word.lower() not in _ATTACHED_UNITS)


_ANY_NUMBER_RE = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?![\w.])")


def find_numbers(s: str) -> list[float]:
    """Every stand-alone number in a text, in order (used to spot answers listing several candidates).

    >>> find_numbers("2 or 3.5")
    [2.0, 3.5]
    """
    return [float(x) for x in _ANY_NUMBER_RE.findall(_THOUSANDS_RE.sub(lambda m: m.group(1).replace(",", ""), s))]
