"""Assemble a ``RolloutBatch`` from prompts + sampled response tokens (shared by the HF and vLLM engines).

Everything here is a pure function of tensors and token lists, so the layout every later stage relies on
(``mmrlvr.rollout.base``) is built in one place and tested without a model.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrlvr.rollout.base import RolloutBatch
from mmrlvr.types import Completion, Sample


def response_mask_from(ids: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """[N, L] float: 1 through the first end-of-sequence token of each row, 0 after it.

    >>> response_mask_from(torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8]]), eos_ids=[2, 0]).tolist()
    [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    """
    is_eos = torch.isin(ids, torch.tensor(eos_ids, device=ids.device)).long()  # [N, L]
    eos_before = torch.cumsum(is_eos, dim=-1) - is_eos  # EOS tokens strictly before position j
    return (eos_before == 0).float()


def pad_rows(rows: list[list[float]] | list[list[int]], value: float | int, dtype: torch.dtype) -> torch.Tensor:
    """Right-pad lists of different lengths into an [N, max length] tensor."""
    length = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), length), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(r, dtype=dtype)
    return out


def decode_completions(tokenizer: Any, response_ids: torch.Tensor, response_mask: torch.Tensor,
                       logprobs: torch.Tensor, eos_ids: list[int],
                       finish_reasons: list[str] | None = None) -> list[Completion]:
    """One ``Completion`` per row: text without special tokens, ids and log-probs of the counted tokens."""
    out = []
    eos = set(eos_ids)
    for i, (ids, mask, lps) in enumerate(zip(response_ids.tolist(), response_mask.tolist(), logprobs.tolist())):
        kept = [t for t, m in zip(ids, mask) if m > 0]
        finish = "stop" if kept and kept[-1] in eos else "length"
        if finish_reasons is not None:
            finish = finish_reasons[i]
        out.append(Completion(text=tokenizer.decode(kept, skip_special_tokens=True), finish_reason=finish,
                              token_ids=kept, meta={"logprobs": [lp for lp, m in zip(lps, mask) if m > 0]}))
    return out


def assemble_batch(samples: list[Sample], group_size: int, prompt_inputs: dict[str, Any], vision: dict[str, Any],
                   response_ids: torch.Tensor, logprobs: torch.Tensor, *, eos_ids: list[int], pad_id: int,
                   tokenizer: Any, timings: dict[str, float] | None = None,
                   finish_reasons: list[str] | None = None) -> RolloutBatch:
    """The ``RolloutBatch`` for B prompts x G responses.

    prompt_inputs: processor output for the B distinct prompts (input_ids / attention_mask [B, P]).
    vision: the vision inputs already expanded to N = B*G rows (``expand_vision``); per-token entries
        of shape [N, P] (e.g. ``mm_token_type_ids``) are extended with zeros over the response.
    response_ids: [N, L] sampled tokens (anything after the first EOS is ignored and replaced by pad).
    logprobs: [N, L] log pi_old of those tokens; set to 0 where masked.
    """
    n = len(samples) * group_size
    prompt_ids = prompt_inputs["input_ids"].repeat_interleave(group_size, dim=0)  # [N, P]
    prompt_mask = prompt_inputs["attention_mask"].repeat_interleave(group_size, dim=0)  # [N, P]
    p = prompt_ids.shape[1]
    length = response_ids.shape[1]
    response_mask = response_mask_from(response_ids, eos_ids)  # [N, L]
    response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad_id))
    # 0 where masked (never -inf: masked positions must be harmless inside exp(logp - old_logp))
    old_logprobs = torch.where(response_mask.bool(), logprobs.float(), torch.zeros_like(logprobs, dtype=torch.float))
    full_vision = {}
    for key, value in vision.items():
        if isinstance(value, torch.Tensor) and value.dim() == 2 and tuple(value.shape) == (n, p):
            value = torch.cat([value, torch.zeros(n, length, dtype=value.dtype)], dim=1)  # response = text
        full_vision[key] = value
    return RolloutBatch(
        samples=[s for s in samples for _ in range(group_size)],
        group_index=torch.arange(len(samples)).repeat_interleave(group_size),
        sample_index=torch.arange(group_size).repeat(len(samples)),
        input_ids=torch.cat([prompt_ids, response_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask.long()], dim=1),
        response_ids=response_ids, response_mask=response_mask, old_logprobs=old_logprobs,
        vision=full_vision, prompt_length=p,
        completions=decode_completions(tokenizer, response_ids, response_mask, old_logprobs, eos_ids, finish_reasons),
        timings=dict(timings or {}),
    )
