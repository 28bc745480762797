"""Qwen-VL's 3D rope positions of a batch's rows, each row's computed once however many passes read it.

A step runs several teacher-forced passes over the same rows (the reference pass, the policy update's
micro-batches, the perturbed pass of token credit), and the prefix-shared path
(``mmrlvr.credit.signals.shared_prefix_states``) has to give the model its positions explicitly. The models'
own ``compute_3d_position_ids`` walks every row's tokens in Python (transformers' ``get_rope_index``): in the
demo that took ~18 ms a call, about a tenth of the run. A row's positions depend only on that row (its ids,
its attention mask, the grids of its images and its token types) and on the model's config, never on the
other rows of its batch, so ``row_positions`` keeps them by a digest of exactly that and computes the rows
it has not seen (once per distinct row: the G rollouts of a prompt that sampled the same response share
one). The positions are integers: reused ones are the ones a fresh call returns, bit for bit.

Generation reads the same positions: ``generate`` calls the model's ``get_rope_index`` on every prompt row before
its prefill, G rows per prompt, and the prompts recur across steps and in the evaluations. ``cached_rope_index``
puts the cache in front of that call for the duration of a ``generate`` (the rollout engine's).

The cache holds at most ``CACHE_BYTES`` of positions (least recently used first out): a row of S tokens takes
24·S bytes, so 64 MiB keeps ~680 rows of 4,096 tokens (several steps' micro-batches at real shapes) and tens of
thousands of the demo's short rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mmrlvr.models.cache_arg import positions_cache_kwargs

CACHE_BYTES = 64 << 20

_ROWS: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # row digest -> its positions [3, S]
_SIZE = [0]  # bytes held in _ROWS
_CONFIG_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _config_key(backbone: torch.nn.Module) -> bytes:
    """What the positions depend on besides the row: the model class and its config (token ids, merge size,
    temporal scale). A copy of the model (the reference policy) shares the key, so it reuses the rows too."""
    key = _CONFIG_KEYS.get(backbone)
    if key is None:
        config = getattr(backbone, "config", None)
        text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
        key = hashlib.blake2b(f"{type(backbone).__qualname__}\n{text}".encode(), digest_size=16).digest()
        _CONFIG_KEYS[backbone] = key
    return key


def _as_bytes(t: torch.Tensor):
    """``t`` [rows, ...] as a numpy array of its raw bytes, one row per row (slicing numpy rows is ~3x cheaper
    than slicing the tensor for each row)."""
    t = t.detach().cpu().contiguous()
    width = t[0].numel() * t.element_size() if len(t) else 0
    return t.view(torch.uint8).reshape(len(t), width).numpy()


def _compute(backbone: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, grid: torch.Tensor | None,
             extra: dict[str, torch.Tensor]) -> torch.Tensor | None:
    return backbone.compute_3d_position_ids(input_ids=ids, inputs_embeds=None, image_grid_thw=grid,
                                            video_grid_thw=None, attention_mask=mask,
                                            **positions_cache_kwargs(backbone), **extra)


def row_positions(backbone: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, grid: torch.Tensor | None,
                  images_per_row: list[int] | None, extra: dict[str, torch.Tensor] | None = None, *,
                  compute: Callable[..., torch.Tensor | None] | None = None) -> torch.Tensor | None:
    """``backbone.compute_3d_position_ids`` for image (not video) rows: [3, N, S], or None where the model
    has no 3D positions for them (its language model then numbers tokens 0..S-1).

    ids, mask: [N, S]; grid: [I, 3], the images of all rows in row order; images_per_row: how many of them
    each row holds (None, or counts that do not add up to ``grid``: computed without the cache); extra:
    per-row tensors the model also reads (``mm_token_type_ids``); compute: what computes the rows not kept,
    called as ``compute(backbone, ids, mask, grid, extra)`` (default: the model's ``compute_3d_position_ids``;
    it must return what that does, since both fill one cache)."""
    extra = extra or {}
    compute = compute or _compute
    if grid is None or images_per_row is None or sum(images_per_row) != grid.shape[0] or len(images_per_row) != len(ids):
        return compute(backbone, ids, mask, grid, extra)
    starts = [0]
    for k in images_per_row:
        starts.append(starts[-1] + k)
    per_row = {"ids": ids, "mask": mask, **extra}
    base = hashlib.blake2b(_config_key(backbone), digest_size=16)
    for name, t in per_row.items():  # the dtypes: the same bytes read as another dtype are another row
        base.update(f"{name}:{t.dtype};".encode())
    rows_bytes = [_as_bytes(t) for t in per_row.values()]  # [N, bytes per row] each, converted once
    grid_bytes = _as_bytes(grid.to(torch.int64))
    keys = []
    for r in range(len(ids)):
        h = base.copy()
        for b in rows_bytes:
            h.update(b[r].tobytes())
        h.update(grid_bytes[starts[r]:starts[r + 1]].tobytes())
        keys.append(h.digest())
    found = {k: _ROWS[k] for k in keys if k in _ROWS}
    missing: dict[bytes, int] = {}
    for r, k in enumerate(keys):
        if k not in found and k not in missing:
            missing[k] = r
    if missing:
        rows = list(missing.values())
        image_rows = [i for r in rows for i in range(starts[r], starts[r + 1])]
        sub = compute(backbone, ids[rows], mask[rows], grid[image_rows], {k: v[rows] for k, v in extra.items()})
        if sub is None:
            return None
        for j, k in enumerate(missing):
            found[k] = sub[:, j].clone()
    for k in found:
        if k in _ROWS:
            _ROWS.move_to_end(k)
        else:
            _store(k, found[k])
    return torch.stack([found[k] for k in keys], dim=1).to(ids.device)


def _image_runs(token_types: torch.Tensor, mask: torch.Tensor) -> list[int] | None:
    """Images per row as ``get_rope_index`` assigns them: one per run of image tokens (type 1) among a row's
    attended tokens. None where a row's attended tokens are not one contiguous block (a run could then span
    a gap, as the original reads it) or a row holds video tokens (type 2): the caller computes those itself."""
    attended = mask.bool()
    blocks = (attended[:, 1:] & ~attended[:, :-1]).sum(dim=1) + attended[:, 0]  # attended runs per row
    if bool((token_types == 2).any()) or bool(blocks.gt(1).any()):
        return None
    image = (token_types == 1) & attended
    starts = image.clone()
    starts[:, 1:] &= ~image[:, :-1]
    return starts.sum(dim=1).tolist()


@contextlib.contextmanager
def cached_rope_index(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, ``model``'s ``get_rope_index`` (which ``generate`` calls on every prompt row before its
    prefill) computes only rows ``row_positions`` has not kept: a GRPO step's G rollouts of a prompt share one
    prompt row, and the prompts recur across steps and evaluations. Video rows, rows without token types or
    grids, and calls with arguments it does not read go to the original. The deltas it returns beside the
    positions (the text position after each row's last token minus the row's length) are derived from the
    positions exactly as the original derives them: ``max(positions) + 1 - attended tokens``, integers.

    A model without ``get_rope_index`` (a text model, another family) is left as it is."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model: the model it wraps
    backbone = next((m for m in (getattr(base, "model", None), base)
                     if m is not None and callable(getattr(m, "get_rope_index", None))), None)
    if backbone is None or "get_rope_index" in vars(backbone):  # none, or already wrapped: nothing to do
        yield
        return
    original = backbone.get_rope_index

    def compute(_backbone, ids, mask, grid, extra):
        return original(ids, mm_token_type_ids=extra["mm_token_type_ids"], image_grid_thw=grid, attention_mask=mask)[0]

    def get_rope_index(input_ids, mm_token_type_ids=None, image_grid_thw=None, video_grid_thw=None,
                       second_per_grid_ts=None, attention_mask=None, **kwargs):
        # kwargs: the rest of generate's model inputs (pixel values, cache, ...), which positions do not read
        def fallback():
            return original(input_ids, mm_token_type_ids=mm_token_type_ids, image_grid_thw=image_grid_thw,
                            video_grid_thw=video_grid_thw, attention_mask=attention_mask, **kwargs,
                            **({} if second_per_grid_ts is None else {"second_per_grid_ts": second_per_grid_ts}))

        if (mm_token_type_ids is None or image_grid_thw is None or attention_mask is None or video_grid_thw is not None
                or second_per_grid_ts is not None or input_ids.dim() != 2):
            return fallback()
        runs = _image_runs(mm_token_type_ids, attention_mask)
        if runs is None:
            return fallback()
        positions = row_positions(backbone, input_ids, attention_mask, image_grid_thw, runs,
                                  {"mm_token_type_ids": mm_token_type_ids}, compute=compute)
        deltas = positions.amax(dim=(0, 2)) + 1 - attention_mask.bool().sum(dim=-1)
        return positions, deltas.unsqueeze(1)

    backbone.get_rope_index = get_rope_index
    try:
        yield
    finally:
        del backbone.get_rope_index


def _store(key: bytes, positions: torch.Tensor) -> None:
    _ROWS[key] = positions
    _SIZE[0] += positions.numel() * positions.element_size()
    while _SIZE[0] > CACHE_BYTES and len(_ROWS) > 1:
        _, old = _ROWS.popitem(last=False)
        _SIZE[0] -= old.numel() * old.element_size()


def clear() -> None:
    """Forget every cached row (tests; nothing else needs it)."""
    _ROWS.clear()
    _SIZE[0] = 0
