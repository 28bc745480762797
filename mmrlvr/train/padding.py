"""How much of each training pass is padding: ``tokens/padding_share`` and its per-pass parts.

Why. A step's rows are padded to one width (left-padded prompts, right-padded responses) and micro-batches are
formed by row count, so every padded position costs a full forward (and, in the update, a backward) like a real
token. VLM batches are ragged — short and long thinking, one-turn rows beside tool trajectories with a second image
— and how much of the compute is padding is the first number token-budget batching or packing has to beat.

What. A forward pre-hook on the language model of the policy (and of a separate reference model) counts, for every
call made while a training pass runs, the positions it computes (rows × new positions: a prefix-shared pass's
response part counts only the response positions) and how many of them are real (the attention mask over those
positions). Which pass a call belongs to is the stage running it (``Pipeline.run`` names it, ``in_stage``):
``reference``, ``credit`` (a credit scheme's own passes, the perturbed image's included) and ``update`` (every
micro-batch and epoch of the policy update). Generation is not counted: its cost is decoding, which padding shapes
differently. The record stage logs, per step, the padded share of each pass that ran (``tokens/padding_share/<pass>``)
and of all of them together (``tokens/padding_share``); over several processes each is a mean weighted by the
positions computed (exact: the share of the whole global batch).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Iterator

import torch

from mmrlvr.metric import Metric

#: the training passes counted (stage kinds)
PASSES = ("reference", "credit", "update")
_CURRENT: ContextVar[str | None] = ContextVar("mmrlvr_stage_kind", default=None)


@contextlib.contextmanager
def in_stage(kind: str) -> Iterator[None]:
    """Model calls inside belong to stage kind ``kind`` (``Pipeline.run`` wraps every stage in it)."""
    token = _CURRENT.set(kind)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def language_model(model: torch.nn.Module) -> torch.nn.Module:
    """The text decoder every pass goes through (also the backbone-only passes that stop at hidden states):
    ``model.language_model`` of a Qwen-VL model, through peft / DDP / FSDP wrappers; the model itself otherwise."""
    m = model
    for _ in range(4):  # DDP .module, peft .base_model.model, ...
        inner = getattr(m, "module", None) or (m.get_base_model() if hasattr(m, "get_base_model") else None)
        if inner is None or inner is m:
            break
        m = inner
    backbone = getattr(m, "model", m)
    return getattr(backbone, "language_model", None) or m


class PaddingMeter:
    """Counts computed and real positions per pass (module docstring); ``take()`` returns and resets them."""

    def __init__(self) -> None:
        # pass -> [real positions, computed positions]; real ones as a tensor sum until ``take`` (no device sync
        # per forward call on a GPU)
        self.counts: dict[str, list[Any]] = {}
        self._handles: list[Any] = []

    def attach(self, *models: torch.nn.Module | None) -> PaddingMeter:
        """Hook the language model of each of ``models`` (None and repeats skipped)."""
        seen: set[int] = set()
        for model in models:
            if model is None:
                continue
            lm = language_model(model)
            if id(lm) in seen:
                continue
            seen.add(id(lm))
            self._handles.append(lm.register_forward_pre_hook(self._count, with_kwargs=True))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _count(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        kind = _CURRENT.get()
        if kind not in PASSES:
            return
        x = kwargs.get("inputs_embeds")
        if x is None:
            x = kwargs.get("input_ids", args[0] if args else None)
        if not torch.is_tensor(x) or x.dim() < 2:
            return
        rows, new = int(x.shape[0]), int(x.shape[1])
        mask = kwargs.get("attention_mask")
        if torch.is_tensor(mask) and mask.dim() == 2 and mask.shape[0] == rows:
            real: Any = mask[:, -new:].detach().sum()
        else:  # no 2D mask (an unpadded call): every position is real
            real = rows * new
        c = self.counts.setdefault(kind, [0, 0])
        c[0] += real
        c[1] += rows * new

    def take(self) -> dict[str, Metric]:
        """The padded shares of the passes counted since the last call, each a mean over its positions; counts
        reset."""
        metrics: dict[str, Metric] = {}
        total_real = total = 0
        for kind, (real, positions) in sorted(self.counts.items()):
            real = int(real)
            if positions:
                metrics[f"tokens/padding_share/{kind}"] = Metric.mean(1.0 - real / positions, n=positions)
                total_real, total = total_real + real, total + positions
        if total:
            metrics["tokens/padding_share"] = Metric.mean(1.0 - total_real / total, n=total)
        self.counts = {}
        return metrics
