"""Step metrics over several processes: every metric is reduced by its *kind*, never by a blind mean.

Why: each rank computes its step metrics from its own shard of the batch. The dict's keys depend on the data
(the off-policy diagnostics write ``offpolicy/binK/*`` only for probability bins that hold tokens on that rank),
and its values have different meanings: counts add up, maxima take the max, rates are means whose denominators
differ from rank to rank (3 kept rows on one, 30 on another). Packing the values into one tensor by sorted key
and averaging (what this replaced) made ranks exchange differently sized tensors — a gloo "data size doesn't
match" abort — and averaged counts and maxima.

Here every rank gathers every rank's ``(values, denominators)`` as Python objects (``all_gather_object``: the
collective exchanges sizes first, so no two ranks can disagree on a tensor's size), and each rank combines them
with the same pure function, ``combine``, so every rank ends with the same metrics: those of the whole global
batch. A key missing on a rank is absent data on that rank, not a zero.

Kinds (``Reduction.kind``):

- ``sum``: counts (``*/tokens``, ``reward/dropped_rows``, ``judge/requests``, ...), and ``loss`` (each rank's
  loss is already its share of the globally normalised loss);
- ``mean``: a weighted mean, ``sum_r n_r * v_r / sum_r n_r``. The denominator ``n_r`` is, in order: what the
  rank declared for that key (``StepBatch.metric_weights[key]``: e.g. the rollouts a consistency verdict was
  given for), else the rule's ``weight`` (another metric, e.g. ``offpolicy/bin3/tokens``, or a count every
  rank reports: ``rows``, ``tokens``, ``update_tokens``), else ``rows``;
- ``std``: a pooled standard deviation from each rank's mean, std and count (exact, not a mean of stds);
- ``max`` / ``min``; ``first``: a value every rank holds the same (``lr``, ``dist/*``), rank 0's.

The rules are matched in order (first full regex match wins); ``declare_reduction`` puts a plug-in's rule in
front. Unknown keys are row-weighted means, which equals the old mean whenever ranks hold equal shards.
Percentiles (``rollout/is_ratio_p50``) cannot be combined exactly from per-rank percentiles: they are
row-weighted means of the ranks' percentiles (said here, not hidden).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

KINDS = ("sum", "mean", "std", "max", "min", "first")


@dataclass(frozen=True)
class Reduction:
    kind: str  # sum | mean | std | max | min | first
    weight: str | None = None  # mean / std: the metric (or reported count) holding the denominator; "{0}" = group 1
    mean: str | None = None  # std: the metric holding the mean of the same values
    unbiased: bool = False  # std: Bessel-corrected (torch's default std), else population std

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown reduction kind {self.kind!r}; kinds: {', '.join(KINDS)}")
        if self.kind == "std" and not (self.mean and self.weight):
            raise ValueError("a std reduction needs the metric of its mean and of its count")


SUM, MAX, MIN, FIRST = Reduction("sum"), Reduction("max"), Reduction("min"), Reduction("first")


def _mean(weight: str | None = None) -> Reduction:
    return Reduction("mean", weight=weight)


#: (pattern, reduction), first full match wins. Counts are named by what they count.
RULES: list[tuple[re.Pattern[str], Reduction]] = [(re.compile(p), r) for p, r in [
    # a multi-turn rollout's per-row means; every other tools/* metric counts calls (all of them, or one error kind:
    # ``mmrlvr.tools.runner.ERROR_KINDS``, not imported here: the tools package pulls in transformers on import, and
    # config checks import this module without torch)
    (r"tools/(turns_mean|calls_per_row)", _mean("rows")),
    # identical on every rank
    (r"lr|optim/lr|dist/.*|data/.*|grad_norm", FIRST),  # data/*: every rank loads the whole data set
    # counts
    (r"loss|.*/tokens|.*_rows|.*/rows|reward/(errors|over_budget|dropped)|rubric/check_errors"
     r"|judge/(requests|calls|timeouts|retries|errors|unparseable|cache_hits)"
     r"|popo/groups(_without_positive)?|poise/lone_rows|dynamic_sampling/(kept|fill)_groups"
     r"|distill/teacher_tokens|sampler/samples|rollout/decoded_tokens|rollout/samples"
     r"|tools/.*", SUM),
    # the slowest rank's time; maxima; decisions every rank shares (also maxima: one rank's skip is the step's)
    (r"time/.*|.*(/|_)max|skipped|update/zero_signal|dynamic_sampling/rounds", MAX),
    (r".*(/|_)min", MIN),
    # spreads
    (r"reward/std", Reduction("std", weight="rows", mean="reward/mean", unbiased=True)),
    (r"offpolicy/(bin\d+)/ratio_std", Reduction("std", weight="offpolicy/{0}/tokens", mean="offpolicy/{0}/ratio_mean")),
    (r"offpolicy/(bin\d+)/.*", _mean("offpolicy/{0}/tokens")),
    (r"offpolicy/ratio_std", Reduction("std", weight="offpolicy/tokens", mean="offpolicy/ratio_mean")),
    # per-token means of the update (its tokens) and of the rollouts (their response tokens)
    (r"kl|entropy/mean|clip_fraction|ratio/mean", _mean("update_tokens")),
    (r"rollout/(after_image|rest)/logprob_abs_diff", _mean("rollout/{0}/tokens")),
    (r"credit/.*|rollout/.*", _mean("tokens")),
    (r"judge/unknown_rate", _mean("judge/requests")),
    # per-row means of a reward component: the rows that have it (declared), else every row
    (r"reward/.*", _mean("rows")),
]]


def declare_reduction(pattern: str, reduction: Reduction) -> None:
    """Reduce the metrics whose name fully matches ``pattern`` by ``reduction`` (ahead of the built-in rules).

    For a plug-in's diagnostics: ``declare_reduction(r"myprm/steps", Reduction("sum"))``."""
    RULES.insert(0, (re.compile(pattern), reduction))


def reduction_for(key: str) -> tuple[Reduction, tuple[str, ...]]:
    """The rule for ``key`` and its regex groups (a row-weighted mean when no rule matches)."""
    for pat, red in RULES:
        m = pat.fullmatch(key)
        if m:
            return red, m.groups()
    return _mean("rows"), ()


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _weight(key: str, red: Reduction, groups: tuple[str, ...], values: Mapping[str, Any],
            weights: Mapping[str, float]) -> float | None:
    """This rank's denominator of ``key``: declared for the key, else the rule's named metric/count, else rows."""
    if key in weights:
        return float(weights[key])
    if red.weight:
        name = red.weight.format(*groups)
        for src in (values, weights):
            if _num(src.get(name)):
                return float(src[name])
    return float(weights["rows"]) if "rows" in weights else None


def combine(per_rank: Sequence[tuple[Mapping[str, Any], Mapping[str, float]]]) -> dict[str, Any]:
    """Metrics of the whole batch from each rank's ``(metrics, denominators)``; pure and order-independent
    except for ``first`` (rank 0's, or the first rank that has the key). Non-numeric values: the first rank's."""
    keys: list[str] = []
    for values, _ in per_rank:
        keys.extend(k for k in values if k not in keys)
    out: dict[str, Any] = {}
    for key in keys:
        have = [(v, w) for v, w in per_rank if key in v]
        if not all(_num(v[key]) for v, _ in have):
            out[key] = have[0][0][key]
            continue
        red, groups = reduction_for(key)
        xs = [float(v[key]) for v, _ in have]
        if red.kind == "first":
            out[key] = xs[0]
        elif red.kind == "sum":
            out[key] = sum(xs)
        elif red.kind == "max":
            out[key] = max(xs)
        elif red.kind == "min":
            out[key] = min(xs)
        else:
            out[key] = _weighted(key, red, groups, have)
    return out


def _weighted(key: str, red: Reduction, groups: tuple[str, ...],
              have: list[tuple[Mapping[str, Any], Mapping[str, float]]]) -> float:
    ns = [_weight(key, red, groups, v, w) for v, w in have]
    if any(n is None for n in ns):  # a rank with no denominator at all: the plain mean of what there is
        xs = [float(v[key]) for v, _ in have]
        return sum(xs) / len(xs)
    pairs = [(float(v[key]), n, v, w) for (v, w), n in zip(have, ns) if n > 0]
    if not pairs:
        return float(have[0][0][key])
    total = sum(n for _, n, _, _ in pairs)
    if red.kind == "mean":
        return sum(x * n for x, n, _, _ in pairs) / total
    # std: pooled from each rank's (count, mean, std)
    mean_key = red.mean.format(*groups)  # type: ignore[union-attr]
    means = [_rank_mean(mean_key, v, w) for _, _, v, w in pairs]
    if any(m is None for m in means):
        return sum(x * n for x, n, _, _ in pairs) / total
    grand = sum(m * n for m, (_, n, _, _) in zip(means, pairs)) / total
    if red.unbiased:
        ss = sum((n - 1) * x * x + n * m * m for m, (x, n, _, _) in zip(means, pairs))
        return math.sqrt(max(ss - total * grand * grand, 0.0) / (total - 1)) if total > 1 else 0.0
    ss = sum(n * (x * x + m * m) for m, (x, n, _, _) in zip(means, pairs))
    return math.sqrt(max(ss / total - grand * grand, 0.0))


def _rank_mean(name: str, values: Mapping[str, Any], weights: Mapping[str, float]) -> float | None:
    for src in (values, weights):
        if _num(src.get(name)):
            return float(src[name])
    return None


def reduce_over_processes(metrics: dict[str, Any], weights: Mapping[str, float], world: int) -> dict[str, Any]:
    """``combine`` over every process (collective: every rank calls it once per step). ``metrics`` unchanged in
    one process."""
    if world <= 1:
        return metrics
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return metrics
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (dict(metrics), dict(weights)))
    return combine(gathered)
