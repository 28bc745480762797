"""Find JSON values in untrusted text in linear time, without recursion.

Policy responses and judge outputs are untrusted: ``json.JSONDecoder.raw_decode`` recurses once per
nesting level (``RecursionError`` at ~1,000 nested ``[``) and, tried at every bracket, costs quadratic
time on unclosed input. ``json_span`` instead scans a candidate iteratively - strings and escapes
respected, at most ``max_depth`` open brackets - and returns where the value ends; only a span that
closes within the depth limit is handed to ``json.loads``.
"""

from __future__ import annotations

import re

# a complete string, a bracket, or a run of the other characters a JSON value may hold outside strings
# (numbers, literals true/false/null/NaN/Infinity, separators, whitespace); anything else ends a candidate
_TOKEN_RE = re.compile(r'"(?:[^"\\\x00-\x1f]|\\.)*"|[\[\]{}]|[-+.0-9A-Za-z:,\s]+')
_CLOSERS = {"]": "[", "}": "{"}
OPEN_RE = re.compile(r"[\[{]")


def json_span(text: str, start: int, max_depth: int) -> tuple[int, str]:
    """(end, "") of the bracketed value opening at ``text[start]``, else (position reached, "bad" | "depth").

    The position reached counts the characters the scan read, also inside a string that never closes
    (callers charge them to a search budget). "depth": more than ``max_depth`` brackets were open.
    """
    stack: list[str] = []
    pos, n = start, len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        if m is None:  # a character no JSON value contains, or a string that does not close validly
            if text[pos] == '"':
                nxt = text.find('"', pos + 1)
                return (nxt if nxt >= 0 else n), "bad"
            return pos + 1, "bad"
        tok = m.group()
        pos = m.end()
        if tok in ("[", "{"):
            stack.append(tok)
            if len(stack) > max_depth:
                return pos, "depth"
        elif tok in _CLOSERS:
            if not stack or stack.pop() != _CLOSERS[tok]:
                return pos, "bad"
            if not stack:
                return pos, ""
        elif not stack:
            return pos, "bad"
    return pos, "bad"
