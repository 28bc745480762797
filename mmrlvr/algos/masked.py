"""Masked reductions used by every loss and statistic in ``mmrlvr.algos``.

A mask here may hold token *weights* in [0, inf), not only 0/1: credit schemes pass weights through the
same argument. Positions where the mask is 0 may hold anything, including -inf or NaN (blocked tokens
after end-of-sequence have log-prob -inf), so every helper selects with ``torch.where`` before
multiplying. A plain ``values * mask`` would turn -inf * 0 into NaN and poison the gradients.
"""

from __future__ import annotations

from mmrlvr.lazy_import import lazy_module

torch = lazy_module("torch")  # imported by torch-free declarations (mmrlvr.algos.losses); the functions need it


def zero_masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with every position where ``mask == 0`` replaced by 0. values, mask: [*] -> [*].

    Do this *first*, before any arithmetic: a later ``torch.where`` blocks the forward value but the
    backward of the op that produced the garbage still multiplies 0 by an infinite local derivative.
    """
    return torch.where(mask != 0, values, torch.zeros_like(values))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` that ignores whatever sits where ``mask == 0``.

    values: [*] any floating tensor; mask: same shape (weights >= 0). ``dim=None`` sums everything.
    """
    weighted = zero_masked(values, mask) * mask
    return weighted.sum() if dim is None else weighted.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Weighted mean sum(v*m)/sum(m); 0 (with a finite gradient) where the mask sums to 0.

    values: [*]; mask: same shape, weights >= 0. Returns a scalar, or the shape without ``dim``.
    """
    total = mask.sum() if dim is None else mask.sum(dim=dim)
    # A safe denominator keeps 0/0 out of the graph: torch.where alone would still back-propagate NaN.
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return masked_sum(values, mask, dim) / safe


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = False) -> torch.Tensor:
    """Weighted variance of ``values`` over all positions where ``mask > 0``. values, mask: [*] -> scalar.

    ``unbiased`` applies Bessel's correction n/(n-1) with n = number of positions with weight > 0.
    """
    values = zero_masked(values, mask)
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = (mask > 0).sum()
        var = var * n / (n - 1).clamp_min(1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``values`` to zero mean and unit variance over the masked positions.

    values, mask: [*] (mask may be weights). The variance is the biased (population) one, as a
    normaliser should be for a fixed batch. ``shift_mean=False`` only rescales (keeps the mean), which
    preserves the sign of every value. Masked positions come back as 0.
    """
    values = zero_masked(values, mask)
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    centred = values - mean if shift_mean else values
    whitened = centred * torch.rsqrt(var + eps)
    return torch.where(mask != 0, whitened, torch.zeros_like(whitened))
