"""Which response tokens belong to the final answer, so a consistency advantage can reach only them.

Why: a sequence-level consistency reward pays every token of a rollout, thinking included. When the
thinking and the answer disagree, the cheapest way to agree is often to rewrite the *thinking* to match
the answer — the known failure of a plain consistency reward (measured in docs/consistency.md, "The study"). Restricting the consistency
advantage to the answer span (``consistency.scope: answer``) leaves the thinking tokens to the task
reward alone: the only way the consistency term can be earned is for the answer to follow the thinking.

How tokens are located: by incremental decoding of the *prefix*. The response is decoded once as a whole
(``decode(ids[:n], skip_special_tokens=True)``), the answer's character start is found in that text, and
token j belongs to the answer once ``decode(ids[:j+1])`` reaches past that character. Decoding prefixes
(not single tokens) is what makes this exact for multi-byte text: a byte-level BPE splits "°", "π", "×",
Chinese characters and emoji into several tokens, each of which decodes on its own to U+FFFD
replacement characters; adding up those per-token lengths (the old method) drifts by one character per
split character, so the answer boundary moved into the thinking (or past the answer's first tokens). A
prefix that ends inside a character decodes to at most one replacement character, never past the
character's own end, so prefix lengths are monotone and the boundary is found by binary search:
O(log n) decodes per row. The text is the tokenizer's own decoding of ``response_ids``, so the character
positions and the tokens always agree (a completion string cleaned up elsewhere cannot shift them).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

ANSWER_MARKERS = ("<answer>", "</think>")


def answer_char_start(text: str, markers: Sequence[str] = ANSWER_MARKERS) -> int | None:
    """Character index where the answer part of ``text`` begins, or None when there is none.

    The first marker found wins, searching from the end (the *final* answer): "<answer>" itself is part
    of the answer span; after "</think>" the answer starts right behind the tag."""
    for marker in markers:
        at = text.rfind(marker)
        if at >= 0:
            return at if marker == markers[0] else at + len(marker)
    return None


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def first_token_past(tokenizer: Any, ids: list[int], char_pos: int) -> int | None:
    """Smallest j such that ``decode(ids[:j+1])`` is longer than ``char_pos`` characters, else None.

    ids: one response's valid token ids; char_pos: a character index into ``decode(ids)``. Binary search
    over prefix lengths (monotone in j, see the module docstring)."""
    lo, hi = 0, len(ids)  # answer in [lo, hi]; hi = len(ids) means "no such token"
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_decode(tokenizer, ids[:mid + 1])) > char_pos:
            hi = mid
        else:
            lo = mid + 1
    return lo if lo < len(ids) else None


def answer_token_mask(texts: Sequence[str] | None, response_ids: torch.Tensor, response_mask: torch.Tensor,
                      tokenizer: Any, markers: Sequence[str] = ANSWER_MARKERS) -> torch.Tensor:
    """[N, L] float: 1 on the valid response tokens that belong to each row's final answer, else 0.

    response_ids / response_mask: [N, L] (valid tokens, then padding; a multi-turn row's tool turns sit between its
    valid tokens with mask 0 and are decoded with them); tokenizer: the tokenizer (or
    processor) that decoded them, called as ``decode(ids, skip_special_tokens=True)``. ``texts`` (the N
    decoded completions) is accepted for the callers' convenience but not used for positions: the span is
    located in the tokenizer's own decoding of ``response_ids`` (see the module docstring). A row with no
    answer marker has no answer tokens (all 0), so it gets no consistency advantage at token level."""
    N, L = response_ids.shape
    out = torch.zeros(N, L)
    for i in range(N):
        nz = (response_mask[i] > 0).nonzero()
        n = int(nz[-1]) + 1 if len(nz) else 0  # through the last valid token (multi-turn: tool turns between)
        ids = response_ids[i, :n].tolist()
        start = answer_char_start(_decode(tokenizer, ids), markers)
        if start is None:
            continue
        j = first_token_past(tokenizer, ids, start)
        if j is not None:
            out[i, j:n] = 1.0
    return out * (response_mask > 0)
