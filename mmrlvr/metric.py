"""Step metrics that carry how several processes combine them.

Each process computes its step metrics from its own shard of the batch, and a metric's meaning decides how the
shards' values combine into the value of the whole batch: counts add up, maxima take the max, a rate is a mean
whose denominator differs from process to process (3 kept rows on one, 30 on another), a spread is pooled from
each shard's count, mean and spread. So the code that computes a metric says which, on the value itself:

    m["judge/requests"] = Metric.sum(requests)                       # a count
    m["reward/accuracy"] = Metric.mean(acc, n=rows_scored)          # a rate over this process's rows_scored
    m["reward/std"] = Metric.std(s, n=rows, mean=mean, unbiased=True)
    m["ratio/max"] = Metric.max(r); m["lr"] = Metric.same(lr)        # same: every process holds the same value

A ``Metric`` is a ``float`` (arithmetic, formatting, JSON and comparisons see the number), with the reduction
and its weight attached. ``combine`` merges every process's metrics dict with one pure function, so every
process ends with the metrics of the whole global batch; a key that only some processes report (an off-policy
probability bin that holds tokens on one of them) is combined over those. Percentiles cannot be combined exactly
from per-process percentiles: they are declared as means over the tokens they were taken from.

A plain number has no reduction. ``combine`` averages it over the processes with a one-time warning naming the
key; under ``MMRLVR_STRICT_METRICS=1`` (the test suite) it is an error, so a metric without a declaration fails
the tests that produce it instead of being averaged wrongly on several GPUs.

Torch-free: config checks and reward modules import this without torch.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any, Mapping, Sequence

KINDS = ("sum", "mean", "std", "max", "min", "same")
STRICT_ENV = "MMRLVR_STRICT_METRICS"


class UndeclaredMetric(TypeError):
    """A metric value that does not say how several processes combine it."""


class Metric(float):
    """A metric value with its reduction over processes (module docstring).

    ``n``: for ``mean`` and ``std``, what the value is a mean over on this process (rows, tokens, groups; 0 when
    there is nothing, the value is then ignored where another process has some). ``mean``: for ``std``, the mean
    of the same values. ``unbiased``: for ``std``, Bessel-corrected (torch's default) rather than population."""

    __slots__ = ("kind", "n", "mean_of", "unbiased")

    def __new__(cls, value: float, kind: str, n: float | None = None, mean: float | None = None,
                unbiased: bool = False) -> "Metric":
        if kind not in KINDS:
            raise ValueError(f"unknown reduction kind {kind!r}; kinds: {', '.join(KINDS)}")
        if kind in ("mean", "std") and (n is None or not math.isfinite(float(n)) or float(n) < 0):
            raise ValueError(f"a {kind} metric needs its count n >= 0 (what it is a {kind} over), got {n!r}")
        if kind == "std" and mean is None:
            raise ValueError("a std metric needs the mean of the same values")
        self = super().__new__(cls, value)
        self.kind = kind
        self.n = None if n is None else float(n)
        self.mean_of = None if mean is None else float(mean)
        self.unbiased = bool(unbiased)
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # processes exchange metrics pickled (all_gather_object)
        return (Metric, (float(self), self.kind, self.n, self.mean_of, self.unbiased))

    # the constructors call sites use
    @classmethod
    def sum(cls, value: float) -> "Metric":
        """A count, or a per-process share of a total (the loss): summed over processes."""
        return cls(value, "sum")

    @classmethod
    def mean(cls, value: float, n: float) -> "Metric":
        """A mean over ``n`` things on this process (rows, tokens, groups): weighted by ``n`` over processes."""
        return cls(value, "mean", n=n)

    @classmethod
    def std(cls, value: float, n: float, mean: float, unbiased: bool = False) -> "Metric":
        """A standard deviation of ``n`` values with mean ``mean``: pooled exactly over processes."""
        return cls(value, "std", n=n, mean=mean, unbiased=unbiased)

    @classmethod
    def max(cls, value: float) -> "Metric":
        """A maximum, a time (the slowest process), or a decision any process can take (a skipped step)."""
        return cls(value, "max")

    @classmethod
    def min(cls, value: float) -> "Metric":
        return cls(value, "min")

    @classmethod
    def same(cls, value: float) -> "Metric":
        """A value every process holds the same (the learning rate, the gradient norm, the topology)."""
        return cls(value, "same")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def undeclared(metrics: Mapping[str, Any]) -> list[str]:
    """The numeric keys of ``metrics`` whose value is a plain number (no reduction)."""
    return [k for k, v in metrics.items() if _num(v) and not isinstance(v, Metric)]


_warned: set[str] = set()


def check_declared(metrics: Mapping[str, Any], where: str = "step metrics") -> None:
    """Every numeric metric declares its reduction: an error under ``MMRLVR_STRICT_METRICS``, else a warning once
    per key (the key is then averaged over processes)."""
    missing = undeclared(metrics)
    if not missing:
        return
    hint = ("wrap the value where it is computed: mmrlvr.metric.Metric.sum(x) for a count, .mean(x, n=...) for a "
            "rate, .max / .min / .same / .std (docs/extending.md, \"Metrics\")")
    if strict():
        raise UndeclaredMetric(f"{where}: {', '.join(sorted(missing))} declare no reduction over processes; {hint}")
    new = [k for k in missing if k not in _warned]
    if new:
        _warned.update(new)
        warnings.warn(f"{where}: {', '.join(sorted(new))} declare no reduction over processes and are averaged "
                      f"over them; {hint}", stacklevel=2)


def combine(per_process: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The metrics of the whole batch from each process's metrics (module docstring); pure, and independent of the
    processes' order except for ``same`` (the first process's) and non-numeric values (the first process's)."""
    keys: list[str] = []
    seen: set[str] = set()
    for values in per_process:
        for k in values:
            if k not in seen:
                seen.add(k)
                keys.append(k)
    out: dict[str, Any] = {}
    for key in keys:
        have = [v[key] for v in per_process if key in v]
        if not all(_num(x) for x in have):
            out[key] = have[0]
            continue
        check_declared({key: x for x in have if not isinstance(x, Metric)}, where="combining step metrics")
        kinds = {x.kind for x in have if isinstance(x, Metric)}
        if len(kinds) > 1:
            raise ValueError(f"metric {key!r}: processes declare different reductions: {', '.join(sorted(kinds))}")
        out[key] = _combine_one(kinds.pop() if kinds else None, have)
    return out


def _combine_one(kind: str | None, xs: list[Any]) -> float:
    if kind is None:  # undeclared: a plain mean over the processes that have it (warned above)
        return sum(float(x) for x in xs) / len(xs)
    if kind == "same":
        return xs[0]
    if kind == "sum":
        return Metric.sum(sum(float(x) for x in xs))
    if kind == "max":
        return Metric.max(max(float(x) for x in xs))
    if kind == "min":
        return Metric.min(min(float(x) for x in xs))
    counted = [x for x in xs if x.n > 0]
    if not counted:  # nothing on any process: the first value (all are empty-set placeholders)
        return xs[0]
    total = sum(x.n for x in counted)
    if kind == "mean":
        return Metric.mean(sum(float(x) * x.n for x in counted) / total, n=total)
    grand = sum(x.mean_of * x.n for x in counted) / total
    if xs[0].unbiased:  # each process's sum of squares about its own mean is (n - 1) * std^2
        ss = sum((x.n - 1) * float(x) ** 2 + x.n * x.mean_of ** 2 for x in counted)
        value = math.sqrt(max(ss - total * grand * grand, 0.0) / (total - 1)) if total > 1 else 0.0
    else:
        ss = sum(x.n * (float(x) ** 2 + x.mean_of ** 2) for x in counted)
        value = math.sqrt(max(ss / total - grand * grand, 0.0))
    return Metric.std(value, n=total, mean=grand, unbiased=xs[0].unbiased)


def reduce_over_processes(metrics: dict[str, Any], world: int) -> dict[str, Any]:
    """``combine`` over every process (a collective: every process calls it once per step); ``metrics`` itself in
    one process.

    The processes exchange their dicts as Python objects (``all_gather_object``: the collective exchanges sizes
    first), so differently keyed dicts never make two processes disagree on a tensor's size."""
    if world <= 1:
        return metrics
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return metrics
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, dict(metrics))
    return combine(gathered)
