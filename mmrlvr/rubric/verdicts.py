"""Verdicts and the strict parser of judge output.

A verdict is ``met`` True / False, or None = unknown. Unknown verdicts are excluded from the score and
counted (``judge/unknown_rate``); they are NEVER read as a pass.

Verdicts a response cannot forge. A judge that echoes or quotes the response it grades (a weak model, a
prompt-injected one, a broken server) would otherwise hand the response's own last line - ``VERDICT:
PASS`` or ``{"verdict": "pass"}`` - to the parser. So every request carries a request id
(``JudgeRequest.nonce``: a hash of everything the judge is shown, the response included, so no response
can contain its own request's id), the judge is asked for exactly one JSON object
``{"request_id": ID, "verdict": "pass"|"fail", "rationale": "..."}``, and the parser accepts only that:

* a JSON object that starts a line, carries the request's id and ends the output (optionally inside a
  ```json fence, optionally after the judge's reasoning);
* everything else is unknown: no such object, a verdict other than pass/fail, an object with the id that
  is not at the end, two objects with the id that disagree, an output over ``MAX_OUTPUT_CHARS``, or an
  output that opens with a refusal ("I'm sorry, but I can't help ..."). Objects without the id - e.g. a
  verdict copied from the response - and free-text lines such as ``VERDICT: PASS`` are never read.

JSON is found with ``jsonscan.json_span`` (iterative, depth-limited): a judge output cannot crash or stall
the parser either.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from mmrlvr.rubric.jsonscan import json_span

# status of one judge vote or of a final verdict
OK, UNPARSEABLE, CONTRADICTION, REFUSAL, TIE, TIMEOUT, ERROR = (
    "ok", "unparseable", "contradiction", "refusal", "tie", "timeout", "error")

MAX_OUTPUT_CHARS = 20_000  # a verdict is ~100 characters; longer outputs are not parsed
_MAX_DEPTH = 8
_LINE_OBJECT_RE = re.compile(r"^[ \t]*(?:```(?:json)?[ \t]*)?\{", re.M)
_REFUSAL_RE = re.compile(
    r"^\s*(?:i'?m sorry|i am sorry|sorry,|as an ai|i (?:cannot|can'?t|won'?t|will not|am unable to|"
    r"am not able to) (?:help|assist|comply|evaluate|grade|judge|do that|provide|complete))", re.I)


@dataclass
class Verdict:
    """The decision on one criterion for one response.

    met: True (property holds), False, or None (unknown: excluded from the score, counted).
    status: ok | unparseable | contradiction | refusal | tie | timeout | error.
    source: "program:<kind>" or the judge identity.
    votes: per-vote decisions when a judge voted (k > 1).
    raw: the judge's raw output (first vote), shown in the inspector.
    """

    met: bool | None
    rationale: str = ""
    status: str = OK
    source: str = ""
    votes: tuple[bool | None, ...] = field(default_factory=tuple)
    raw: str = ""

    @property
    def known(self) -> bool:
        return self.met is not None


def parse_verdict(text: str | None, nonce: str) -> tuple[bool | None, str, str]:
    """Strictly parse a judge's output for the request with id ``nonce``: (met or None, rationale, status)."""
    if text is None or not text.strip():
        return None, "empty judge output", UNPARSEABLE
    if len(text) > MAX_OUTPUT_CHARS:
        return None, f"judge output of {len(text):,} characters (over {MAX_OUTPUT_CHARS:,}) was not parsed", \
            UNPARSEABLE
    text = text.strip()
    if _REFUSAL_RE.match(text):
        return None, "the judge refused", REFUSAL
    statements = _verdict_objects(text, nonce)
    if not statements:
        return None, "no verdict object with this request's id found", UNPARSEABLE
    if len({met for met, _, _ in statements}) > 1:
        return None, "the judge output states both pass and fail (or a verdict other than pass/fail)", \
            CONTRADICTION
    end = max(e for _, _, e in statements)
    if text[end:].strip().strip("`").strip():
        return None, "the verdict is not at the end of the judge output", UNPARSEABLE
    return statements[-1][0], statements[-1][1], OK


def _verdict_objects(text: str, nonce: str) -> list[tuple[bool, str, int]]:
    """(met, rationale, end offset) of every line-starting JSON object that carries ``request_id == nonce``.

    A bad verdict value in such an object poisons the parse (represented as both pass and fail).
    """
    out = []
    for m in _LINE_OBJECT_RE.finditer(text):  # an object after text on its line is a quote, not a verdict
        i = m.end() - 1
        end, why = json_span(text, i, _MAX_DEPTH)
        if why:
            continue
        try:
            obj = json.loads(text[i:end])
        except ValueError:
            continue
        if not isinstance(obj, dict) or obj.get("request_id") != nonce:
            continue
        value = obj.get("verdict")
        value = value.strip().lower() if isinstance(value, str) else value
        if value not in ("pass", "fail"):
            out += [(True, "", end), (False, "", end)]
        else:
            out.append((value == "pass", str(obj.get("rationale", ""))[:500], end))
    return out


def majority(votes: list[tuple[bool | None, str, str]]) -> tuple[bool | None, str, str]:
    """Combine k parsed votes: the majority of known votes; a tie or no known vote is unknown.

    The status of an unknown result is the most common failure among the votes (or ``tie``).
    """
    known = [met for met, _, _ in votes if met is not None]
    if not known:
        statuses = Counter(status for _, _, status in votes)
        if not votes:
            return None, "no vote", ERROR
        why = votes[0][1] if len(votes) == 1 else f"no usable vote of {len(votes)} (first: {votes[0][1]})"
        return None, why, statuses.most_common(1)[0][0]
    passes = sum(known)
    fails = len(known) - passes
    if passes == fails:
        return None, f"votes tied {passes}-{fails}", TIE
    met = passes > fails
    rationale = next(r for m, r, _ in votes if m == met)
    return met, rationale if len(votes) == 1 else f"{max(passes, fails)}/{len(votes)} votes: {rationale}", OK
