"""Reduce a per-token loss matrix to the scalar that is back-propagated, by named mode.

``agg_loss(loss_mat [N, L], mask [N, L], mode)``; modes (names as in verl):

    token-mean               sum_it w l / sum_it w                 DAPO (every token weighs the same)
    seq-mean-token-mean      mean_i (sum_t w l / sum_t w)          GRPO paper (every sequence weighs the same)
    seq-mean-token-sum       mean_i sum_t w l
    seq-mean-token-sum-norm  sum_it w l / (N * C), C = L by default Dr.GRPO (a constant normaliser)

``mask`` may be token weights w in [0, inf). Rows whose weights are all 0 have no token mean and are
left out of ``seq-mean-token-mean``; the token-sum modes divide by N, a constant, as Dr.GRPO intends.
The result is the mean over *this* call's rows: with gradient accumulation over micro-batches the
trainer must weight each micro-batch (e.g. by its share of tokens for ``token-mean``).

Each mode is declared (``mmrlvr.methods.declare``: name and help line) just above its function; the config checks
import this module without torch (``torch = lazy_module("torch")``) to read them.
"""

from __future__ import annotations

from typing import Callable

from mmrlvr.algos.masked import masked_mean, masked_sum
from mmrlvr.lazy_import import lazy_module
from mmrlvr.methods import declare
from mmrlvr.registry import Registry

torch = lazy_module("torch")  # declarations and config checks read this module without torch

#: name -> fn(loss_mat [N, L], mask [N, L], norm_constant) -> scalar
AGG_MODES: Registry[Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]] = Registry(
    "loss aggregation mode")


declare("agg", "token-mean", "mean over every response token of the batch (DAPO)")


@AGG_MODES.register("token-mean")
def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, norm_constant: float | None) -> torch.Tensor:
    return masked_mean(loss_mat, mask)


declare("agg", "seq-mean-token-mean", "mean over tokens per sequence, then over sequences (GRPO)")


@AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor,
                         norm_constant: float | None) -> torch.Tensor:
    per_seq = masked_mean(loss_mat, mask, dim=-1)  # [N]
    has_tokens = (mask.sum(-1) > 0).to(per_seq.dtype)  # [N]
    return masked_mean(per_seq, has_tokens)


declare("agg", "seq-mean-token-sum", "sum over tokens per sequence, mean over sequences")


@AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor,
                        norm_constant: float | None) -> torch.Tensor:
    return masked_sum(loss_mat, mask, dim=-1).mean() if loss_mat.shape[0] else masked_sum(loss_mat, mask)


declare("agg", "seq-mean-token-sum-norm", "sum over tokens / max_new_tokens, mean over sequences (Dr.GRPO)")


@AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor,
                             norm_constant: float | None) -> torch.Tensor:
    constant = float(loss_mat.shape[-1]) if norm_constant is None else float(norm_constant)
    if constant <= 0:
        raise ValueError(f"norm_constant must be > 0, got {norm_constant}")
    return masked_sum(loss_mat, mask) / (max(loss_mat.shape[0], 1) * constant)


def agg_denominator(weights: torch.Tensor, mode: str) -> float:
    """What ``agg_loss(mode)`` divides by for these [N, L] weights: their sum (token-mean), the rows
    with any weight (seq-mean-token-mean) or the row count (the token-sum modes; their constant C
    aside). With gradient accumulation the trainer sums this over micro-batches for the global mean."""
    if mode == "token-mean":
        return float(weights.sum())
    if mode == "seq-mean-token-mean":
        return float((weights.sum(dim=-1) > 0).sum())
    return float(weights.shape[0])


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, *,
             norm_constant: float | None = None, norm_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Aggregate a per-token loss into a scalar by ``mode`` (see the module docstring for formulas).

    loss_mat: [N, L] per-token loss (values where mask == 0 are ignored, even -inf/NaN);
    mask: [N, L] response mask or token weights >= 0; norm_constant: C for ``seq-mean-token-sum-norm``
    (Dr.GRPO's "MAX_TOKENS", default L = the padded response length, i.e. the generation budget when
    rollouts are padded to max_new_tokens). Returns a 0-dim tensor (0.0 when nothing is masked in).

    norm_mask: [N, L] weights of the tokens counted in the *normaliser* when it differs from the
    numerator's (a credit scheme's ``norm_weights``: VPPO's official loss sums over the selected tokens
    but divides by all response tokens). token-mean: sum(w l) / sum(d); seq-mean-token-mean:
    mean over rows with sum_t d > 0 of sum_t(w l) / sum_t d; the token-sum modes have no token
    normaliser and ignore it. None: the normaliser counts ``mask`` (the usual case).
    """
    if loss_mat.dim() != 2 or mask.shape != loss_mat.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must both be [N, L]")
    if norm_mask is None or mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        return AGG_MODES.get(mode)(loss_mat, mask.to(loss_mat.dtype), norm_constant)
    if norm_mask.shape != mask.shape:
        raise ValueError(f"norm_mask {tuple(norm_mask.shape)} must match mask {tuple(mask.shape)}")
    d = norm_mask.to(loss_mat.dtype)
    num = masked_sum(loss_mat, mask.to(loss_mat.dtype), dim=-1)  # [N]
    den = torch.where(d > 0, d, torch.zeros_like(d)).sum(-1)  # [N]
    if mode == "token-mean":
        total = den.sum()
        return num.sum() / total if float(total) > 0 else num.sum() * 0.0
    if mode == "seq-mean-token-mean":
        live = den > 0
        per_seq = torch.where(live, num / torch.where(live, den, torch.ones_like(den)), torch.zeros_like(num))
        n_live = int(live.sum())
        return per_seq.sum() / n_live if n_live else per_seq.sum() * 0.0
    raise ValueError(f"aggregation mode {mode!r} does not support a separate norm_mask")
