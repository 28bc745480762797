"""Per-group statistics of per-rollout values (rewards), vectorised over groups of any sizes.

Rollouts come group-contiguous (G per prompt), but filtering (DAPO dynamic sampling, dropped rows) can
leave groups of unequal sizes, so nothing here assumes equal sizes or sorted ids: ``group_index`` is any
integer label per row. A group is *zero-variance* when all its values are exactly equal (max == min);
this exact test is used instead of ``std < eps`` so that, e.g., three rewards of 0.1 are recognised
even though their float mean is not exactly 0.1.
"""

from __future__ import annotations

from typing import NamedTuple

from mmrlvr.lazy_import import lazy_module

torch = lazy_module("torch")  # imported by torch-free declarations (mmrlvr.algos.advantages); the functions need it


class GroupStats(NamedTuple):
    """Statistics of each row's group, broadcast back to rows. Every field is [N]."""

    mean: torch.Tensor  # [N] float, mean of the row's group
    std: torch.Tensor  # [N] float, std of the row's group (0 for a group of one)
    size: torch.Tensor  # [N] float, number of rows in the row's group
    has_spread: torch.Tensor  # [N] bool, False where every value of the group is equal


def check_rows(values: torch.Tensor, group_index: torch.Tensor, what: str = "rewards") -> None:
    """Raise ValueError unless values is [N] finite float and group_index is [N] integer."""
    if values.dim() != 1 or group_index.shape != values.shape:
        raise ValueError(f"{what} must be [N] and group_index [N]; got {tuple(values.shape)} "
                         f"and {tuple(group_index.shape)}")
    if not values.is_floating_point():
        raise ValueError(f"{what} must be a float tensor, got {values.dtype}")
    if group_index.is_floating_point() or group_index.dtype == torch.bool:
        raise ValueError(f"group_index must be an integer tensor, got {group_index.dtype}")
    bad = (~torch.isfinite(values)).nonzero().flatten()
    if bad.numel():
        raise ValueError(f"{what} are not finite at rows {bad[:10].tolist()} (a reward returned NaN/inf?)")


def group_stats(values: torch.Tensor, group_index: torch.Tensor, *, unbiased: bool = True) -> GroupStats:
    """Mean, std, size and spread of each row's group.

    values: [N] float; group_index: [N] integer labels (any values, any order, any group sizes).
    ``unbiased`` divides the squared deviations by n - 1 (torch.std's default); a group of one then
    has std 0 and no spread.
    """
    check_rows(values, group_index)
    _, dense = torch.unique(group_index, return_inverse=True)  # [N] in 0..K-1
    k = int(dense.max()) + 1 if dense.numel() else 0
    size = torch.bincount(dense, minlength=k).to(values.dtype)  # [K]
    mean = torch.zeros(k, dtype=values.dtype, device=values.device).index_add_(0, dense, values) / size
    dev2 = (values - mean[dense]) ** 2  # [N]
    sq = torch.zeros_like(mean).index_add_(0, dense, dev2)  # [K]
    var = sq / ((size - 1) if unbiased else size).clamp_min(1)
    gmax = torch.full_like(mean, -torch.inf).scatter_reduce_(0, dense, values, "amax")
    gmin = torch.full_like(mean, torch.inf).scatter_reduce_(0, dense, values, "amin")
    return GroupStats(mean[dense], var.sqrt()[dense], size[dense], (gmax > gmin)[dense])


def zero_std_group_fraction(values: torch.Tensor, group_index: torch.Tensor) -> float:
    """Share of groups whose values are all equal (metric ``zero_std_group_fraction``).

    values: [N] float; group_index: [N] integer. Returns a float in [0, 1] (0.0 for an empty batch).
    """
    stats = group_stats(values, group_index)
    if values.numel() == 0:
        return 0.0
    # Each group of size n contributes n rows; weighting rows by 1/n counts groups.
    flat = (~stats.has_spread).to(values.dtype) / stats.size
    return float(flat.sum() / (1.0 / stats.size).sum())
