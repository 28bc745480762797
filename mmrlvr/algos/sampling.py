"""DAPO's batch-level extras: dynamic sampling, overlong reward shaping, masking truncated responses.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv:2503.14476):
- Dynamic sampling (§3.2): a group whose accuracy is all 1 or all 0 has no task signal and only dilutes
  the batch, so drop it and keep sampling until ``target`` groups with signal are collected
  (``dynamic_sampling_filter`` with ``metric="accuracy"``, then ``refill`` per generation round).
- Overlong reward shaping (§3.4, eq. 13): a linear penalty in the last ``cache_len`` tokens before the
  length limit, and -1 beyond it, added to the reward.
- Overlong filtering (§3.4): alternatively, mask truncated responses out of the loss.

Pure functions over tensors and lists; the trainer owns the generation loop and its round limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

from mmrlvr.algos.groups import group_stats

T = TypeVar("T")


FILTER_METRICS = ("accuracy", "reward")


def dynamic_sampling_filter(rewards: torch.Tensor, group_index: torch.Tensor, *,
                            accuracy: torch.Tensor | None = None, metric: str = "accuracy") -> torch.Tensor:
    """Groups to keep: ``keep_groups[g]`` is True where group g's ``metric`` values are not all equal.

    rewards: [N] float total rewards; accuracy: [N] float, the accuracy component alone (verifier
    score); group_index: [N] int labels >= 0 (groups of any size, e.g. RolloutBatch's prompt index
    0..B-1). Returns keep_groups [max(group_index) + 1] bool, indexed by label (a label with no rows,
    or a group of one, is False); ``keep_groups[group_index]`` is the [N] row mask.

    ``metric`` — which values must vary within a group:
    - ``"accuracy"`` (default): DAPO's filter (§3.2, "filter out prompts with accuracy equal to 1 and
      0"; verl's ``filter_groups.metric: acc``, VPPO/EasyR1's ``filter_key: accuracy``). A group that
      is all right or all wrong is dropped even when a format or length term makes its total rewards
      differ: that spread is not the task signal the batch is being filled for.
    - ``"reward"``: the total reward (keeps groups whose only spread is a shaping term).
    """
    if metric not in FILTER_METRICS:
        raise ValueError(f"dynamic sampling metric must be one of {FILTER_METRICS}, got {metric!r}")
    if metric == "accuracy":
        if accuracy is None:
            raise ValueError("dynamic_sampling_filter(metric='accuracy') needs the accuracy component "
                             "([N] float); pass accuracy=..., or metric='reward' to filter on the total reward")
        values = accuracy
    else:
        values = rewards
    if values.shape != group_index.shape:
        raise ValueError(f"{metric} {tuple(values.shape)} and group_index {tuple(group_index.shape)} must both be [N]")
    stats = group_stats(values.to(torch.float32), group_index)
    if group_index.numel() and int(group_index.min()) < 0:
        raise ValueError(f"group_index labels must be >= 0, got {int(group_index.min())}")
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    keep = torch.zeros(n_groups, dtype=torch.bool, device=values.device)
    return keep.index_put_((group_index.long(),), stats.has_spread)  # every row of a group agrees


def refill(buffer_groups: Sequence[T], new_groups: Sequence[T], target: int, *,
           keep_leftover: bool = False) -> tuple[list[T] | None, list[T]]:
    """Accumulate groups that passed ``dynamic_sampling_filter`` until a batch of ``target`` is ready.

    buffer_groups: groups kept from earlier generation rounds of this step; new_groups: groups kept from
    the latest round (any objects; order is preserved). Returns ``(batch, buffer)``: ``batch`` is the
    first ``target`` groups once enough are collected, else None (generate another round with
    ``buffer``). Surplus groups are discarded by default, as in DAPO, because the next step's policy
    will differ; ``keep_leftover=True`` carries them over in ``buffer``.
    """
    if target < 1:
        raise ValueError(f"target must be >= 1 group, got {target}")
    pool = [*buffer_groups, *new_groups]
    if len(pool) < target:
        return None, pool
    return pool[:target], (pool[target:] if keep_leftover else [])


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, to be added to the reward (DAPO eq. 13, scaled by ``penalty``).

    lengths: [N] response lengths in tokens; max_len: the generation limit L_max; cache_len: L_cache,
    the width of the linear zone (DAPO: 4,096 of 20,480). Returns [N] float values in [-penalty, 0]:
    0 up to L_max - L_cache, then (L_max - L_cache - len) / L_cache * penalty, and -penalty beyond L_max.
    """
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    lengths = lengths.to(torch.float32)
    start = max_len - cache_len
    over = (lengths - start).clamp(min=0)  # [N] tokens into the zone
    linear = -over / cache_len if cache_len > 0 else torch.zeros_like(lengths)
    shaped = torch.where(lengths > max_len, torch.full_like(lengths, -1.0), linear)
    return shaped * penalty


def truncation_mask(truncated: torch.Tensor | Sequence[bool] | Sequence[str]) -> torch.Tensor:
    """Row weights that drop truncated responses from the loss (DAPO's overlong filtering).

    truncated: [N] bool (True = hit the length limit), or N finish reasons ("length" = truncated,
    anything else, e.g. "stop", is kept). Returns [N] float, 1.0 keep / 0.0 drop; multiply it into
    the response mask as ``response_mask * keep[:, None]``.
    """
    if isinstance(truncated, torch.Tensor):
        if truncated.dim() != 1:
            raise ValueError(f"truncated must be [N], got {tuple(truncated.shape)}")
        return (~truncated.bool()).to(torch.float32)
    flags = [item == "length" if isinstance(item, str) else bool(item) for item in truncated]
    return torch.tensor([0.0 if f else 1.0 for f in flags], dtype=torch.float32)
