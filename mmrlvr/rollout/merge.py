"""Select and join whole groups of ``RolloutBatch``es (DAPO's refill: keep the groups that carry signal from
several generation rounds, mmrlvr.train.stages.shape).

Joining re-pads to the common layout of ``mmrlvr.rollout.base``: prompts left-padded to the longest prompt,
responses right-padded to the longest response. Per-image vision inputs (``pixel_values`` patches,
``image_grid_thw`` rows, cached image features) are kept in row order, so every row keeps exactly its images.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrlvr.rollout.base import RolloutBatch


def select_rows(batch: RolloutBatch, rows: list[int], vision_start_id: int) -> RolloutBatch:
    """The rows ``rows`` (whole groups, in order) of ``batch``, with their images; groups renumbered from 0."""
    per_row = batch.images_per_row(vision_start_id)
    first = [0]
    for k in per_row:
        first.append(first[-1] + k)
    images = [i for r in rows for i in range(first[r], first[r + 1])]
    idx = torch.tensor(rows, dtype=torch.long)
    n = batch.num_rows
    grid = batch.vision.get("image_grid_thw")
    vision: dict[str, Any] = {}
    for key, value in batch.vision.items():
        if key == "pixel_values" and grid is not None:
            patches = grid.prod(-1).tolist()
            offsets = [0]
            for p in patches:
                offsets.append(offsets[-1] + p)
            vision[key] = torch.cat([value[offsets[i]:offsets[i + 1]] for i in images]) if images else value[:0]
        elif key == "image_grid_thw":
            vision[key] = value[images] if images else value[:0]
        elif torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == n:
            vision[key] = value[idx]
        else:
            vision[key] = value
    groups = batch.group_index[idx]
    _, renumbered = torch.unique_consecutive(groups, return_inverse=True)
    return RolloutBatch(
        samples=[batch.samples[r] for r in rows], group_index=renumbered, sample_index=batch.sample_index[idx],
        input_ids=batch.input_ids[idx], attention_mask=batch.attention_mask[idx],
        response_ids=batch.response_ids[idx], response_mask=batch.response_mask[idx],
        old_logprobs=batch.old_logprobs[idx], vision=vision, prompt_length=batch.prompt_length,
        completions=[batch.completions[r] for r in rows], timings=dict(batch.timings),
        image_features=[batch.image_features[i] for i in images] if batch.image_features is not None else None,
        turns=[batch.turns[r] for r in rows] if batch.turns is not None else None,
        row_images=[batch.row_images[r] for r in rows] if batch.row_images is not None else None,
    )


def _pad_seq(t: torch.Tensor, p_old: int, p_new: int, l_new: int, fill: Any) -> torch.Tensor:
    """[n, p_old + l_old] -> [n, p_new + l_new]: left-pad the prompt part, right-pad the response part."""
    n, total = t.shape
    out = torch.full((n, p_new + l_new), fill, dtype=t.dtype)
    out[:, p_new - p_old:p_new] = t[:, :p_old]
    l_old = total - p_old
    out[:, p_new:p_new + l_old] = t[:, p_old:]
    return out


def _pad_resp(t: torch.Tensor, l_new: int, fill: Any) -> torch.Tensor:
    out = torch.full((t.shape[0], l_new), fill, dtype=t.dtype)
    out[:, :t.shape[1]] = t
    return out


def concat_rollouts(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Join batches of whole groups into one (groups renumbered consecutively, samples and images in order)."""
    if len(batches) == 1:
        return batches[0]
    p = max(b.prompt_length for b in batches)
    length = max(b.response_ids.shape[1] for b in batches)
    parts: dict[str, list] = {k: [] for k in ("input_ids", "attention_mask", "response_ids", "response_mask",
                                             "old_logprobs", "group_index", "sample_index")}
    vision: dict[str, list] = {}
    offset = 0
    for b in batches:
        n, bp = b.num_rows, b.prompt_length
        parts["input_ids"].append(_pad_seq(b.input_ids, bp, p, length, pad_id))
        parts["attention_mask"].append(_pad_seq(b.attention_mask, bp, p, length, 0))
        parts["response_ids"].append(_pad_resp(b.response_ids, length, pad_id))
        parts["response_mask"].append(_pad_resp(b.response_mask, length, 0.0))
        parts["old_logprobs"].append(_pad_resp(b.old_logprobs, length, 0.0))
        parts["group_index"].append(b.group_index + offset)
        parts["sample_index"].append(b.sample_index)
        offset += int(b.group_index.max()) + 1 if n else 0
        for key, value in b.vision.items():
            if torch.is_tensor(value) and value.dim() == 2 and tuple(value.shape) == (n, bp + b.response_ids.shape[1]):
                value = _pad_seq(value, bp, p, length, 0)  # per-token entries (mm_token_type_ids)
            vision.setdefault(key, []).append(value)
    joined: dict[str, Any] = {}
    for key, values in vision.items():
        joined[key] = torch.cat(values) if all(torch.is_tensor(v) and v.dim() > 0 for v in values) else values[0]
    feats = None
    if all(b.image_features is not None for b in batches):
        feats = [f for b in batches for f in b.image_features]
    return RolloutBatch(
        samples=[s for b in batches for s in b.samples], **{k: torch.cat(v) for k, v in parts.items()},
        vision=joined, prompt_length=p, completions=[c for b in batches for c in b.completions],
        timings=dict(batches[0].timings), image_features=feats,
        turns=[t for b in batches for t in b.turns] if all(b.turns is not None for b in batches) else None,
        row_images=([im for b in batches for im in b.row_images] if all(b.row_images is not None for b in batches)
                    else None),
    )


def trim_responses(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` without the trailing response positions no row uses (every row padding there): a subset of a
    batch's rows needs only its own longest response, not the longest of the rows it was taken from. Per-token
    vision entries ([N, P+L]) are cut with the ids; ``batch`` itself when nothing can go."""
    import dataclasses

    P, width = batch.prompt_length, batch.response_ids.shape[1]
    used = ((batch.attention_mask[:, P:] > 0) | (batch.response_mask > 0)).any(dim=0).nonzero()
    length = max(int(used[-1]) + 1 if len(used) else 0, 1)
    if length >= width:
        return batch
    n = batch.num_rows
    vision = {k: (v[:, :P + length] if torch.is_tensor(v) and v.dim() == 2 and tuple(v.shape) == (n, P + width)
                  else v) for k, v in batch.vision.items()}
    return dataclasses.replace(batch, input_ids=batch.input_ids[:, :P + length],
                               attention_mask=batch.attention_mask[:, :P + length],
                               response_ids=batch.response_ids[:, :length],
                               response_mask=batch.response_mask[:, :length],
                               old_logprobs=batch.old_logprobs[:, :length], vision=vision)
