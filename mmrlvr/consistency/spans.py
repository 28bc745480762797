"""Which response tokens belong to the final answer, so a consistency advantage can reach only them.

Why: a sequence-level consistency reward pays every token of a rollout, thinking included. When the
thinking and the answer disagree, the cheapest way to agree is often to rewrite the *thinking* to match
the answer — the known failure of a plain consistency reward (STACK.md). Restricting the consistency
advantage to the answer span (``consistency.scope: answer``) leaves the thinking tokens to the task
reward alone: the only way the consistency term can be earned is for the answer to follow the thinking.

Tokens are located by decoding each response token on its own (as the completion text was decoded, with
special tokens skipped) and accumulating lengths; a token belongs to the answer once the text decoded so
far reaches the answer's opening tag. With byte-level BPE a multi-byte character split across tokens can
shift the boundary by one token; the tags themselves are ASCII, so the boundary is exact for them.
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


def answer_token_mask(texts: Sequence[str], response_ids: torch.Tensor, response_mask: torch.Tensor,
                      tokenizer: Any, markers: Sequence[str] = ANSWER_MARKERS) -> torch.Tensor:
    """[N, L] float: 1 on the valid response tokens that belong to each row's final answer, else 0.

    texts: the N decoded completions; response_ids / response_mask: [N, L]; tokenizer: the one that
    decoded them (``decode([id], skip_special_tokens=True)`` per token). A row with no answer marker has
    no answer tokens (all 0), so it gets no consistency advantage at token level."""
    N, L = response_ids.shape
    out = torch.zeros(N, L)
    for i, text in enumerate(texts):
        start = answer_char_start(text, markers)
        if start is None:
            continue
        n = int((response_mask[i] > 0).sum())
        pieces = tokenizer.batch_decode([[t] for t in response_ids[i, :n].tolist()], skip_special_tokens=True)
        pos = 0
        for j, piece in enumerate(pieces):
            if pos + len(piece) > start:  # this token ends past the answer's start: it is in the answer
                out[i, j:n] = 1.0
                break
            pos += len(piece)
    return out * (response_mask > 0)
