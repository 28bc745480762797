"""The reward-function contract, its registry, and the guard every reward runs under.

A reward is a callable ``(completion: Completion, sample: Sample) -> RewardResult``. Rewards with
parameters are classes: the registry holds *factories*, ``REWARDS.get(name)(**params)`` returns the
callable. A reward that is cheaper in batches (model judges) may also define
``score_batch(completions, samples) -> list[RewardResult]``; ``score_batch`` below uses it when present.

Rewards never see trainer internals; they get the sample's images and metadata through ``Sample``.

The guard (``score_batch``): nothing a policy writes may stop a run. Every call is contained — an
exception (``RecursionError`` on 1,000 nested brackets, a bug in a plugin reward), a non-finite or
non-numeric score, a missing result or a call slower than its time budget becomes a scored failure:
score 0.0, ``parsed["error"]`` saying why, counted in ``guard_metrics(fn)`` (``reward/errors``,
``reward/over_budget``). A ``DataError`` (the *row* is unusable: no ground truth, an unreadable box)
drops the row instead (``RewardResult.dropped``, ``reward/dropped``). Only configuration errors
(``UserError`` that is not a ``DataError``: e.g. a judge criterion without a judge) still raise — they
are the user's to fix and would otherwise zero every reward silently.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any, Callable, Protocol, Sequence

from mmrlvr.errors import DataError, UserError
from mmrlvr.metric import Metric
from mmrlvr.registry import Registry
from mmrlvr.types import Completion, RewardResult, Sample

#: default wall-clock budget of one reward call per row (seconds); a reward may set ``time_budget_s``
DEFAULT_TIME_BUDGET_S = 30.0


class RewardFn(Protocol):
    def __call__(self, completion: Completion, sample: Sample) -> RewardResult: ...


#: name -> factory(**params) -> RewardFn
REWARDS: Registry[Callable[..., RewardFn]] = Registry("reward")


#: run-wide settings every reward built inside ``run_settings(...)`` receives when its factory takes the parameter
#: and its params do not set it: the answer convention (``template``), the group size (``group_size``), ...
_RUN_SETTINGS: list[dict[str, Any]] = []


class run_settings:
    """Context manager: rewards built inside it (``build_reward``, at any depth — a combinator that builds its own
    rewards passes them on too) get these settings for the parameters their factory takes and their params leave
    unset. The trainer builds the run's reward inside ``run_settings(template=..., group_size=...)``."""

    def __init__(self, **settings: Any) -> None:
        self.settings = {k: v for k, v in settings.items() if v is not None}

    def __enter__(self) -> "run_settings":
        _RUN_SETTINGS.append(self.settings)
        return self

    def __exit__(self, *exc: Any) -> None:
        _RUN_SETTINGS.pop()


def takes_param(factory: Any, name: str) -> bool:
    """Whether ``factory`` (a class or function) accepts keyword ``name`` explicitly."""
    import inspect

    try:
        return name in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def with_run_settings(factory: Any, params: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``params`` plus the active run settings ``factory`` takes and ``params`` does not set."""
    out = dict(params)
    for settings in _RUN_SETTINGS[-1:]:
        for k, v in settings.items():
            if k not in out and k not in skip and takes_param(factory, k):
                out[k] = v
    return out


def build_reward(name: str, **params: Any) -> RewardFn:
    """Instantiate a registered reward by name (unknown names list the known ones), with the active run settings
    (``run_settings``) for the parameters it takes and ``params`` leaves unset."""
    factory = REWARDS.get(name)
    return factory(**with_run_settings(factory, params))


def build_nested_reward(spec: dict[str, Any] | str, owner: str, role: str) -> RewardFn:
    """A reward a reward is built from (``gated_process``'s outcome, ``cocov``'s verifier): a spec ``{name: ...,
    params: {...}}`` or a bare name, built like any configured reward (the run settings reach it)."""
    from mmrlvr.errors import UserError

    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise UserError(f"{owner}: {role} must be a reward spec like {{name: auto_accuracy, params: {{}}}}, "
                        f"got {spec!r}")
    return build_reward(spec["name"], **dict(spec.get("params") or {}))


def is_group_aware(fn: Any) -> bool:
    """A reward that scores a row against its group (``group_aware = True``): majority votes, group-normalised
    judges, rubric saturation. The guard hands it whole groups and never splits one."""
    return bool(getattr(fn, "group_aware", False))


_STATS_ATTR = "_mmrlvr_guard_stats"


def _stats(fn: Any) -> Counter:
    stats = getattr(fn, _STATS_ATTR, None)
    if stats is None:
        stats = Counter()
        try:
            setattr(fn, _STATS_ATTR, stats)
        except (AttributeError, TypeError):  # a builtin or __slots__ callable: count nowhere
            pass
    return stats


def guard_metrics(fn: Any, reset: bool = True) -> dict[str, float]:
    """What the guard counted for ``fn`` since the last reset: ``reward/rows``, ``reward/errors``,
    ``reward/over_budget``, ``reward/dropped`` (always present, 0.0 when nothing happened)."""
    stats = getattr(fn, _STATS_ATTR, None) or Counter()
    out = {f"reward/{k}": Metric.sum(float(stats.get(k, 0))) for k in ("rows", "errors", "over_budget", "dropped")}
    if reset and stats:
        stats.clear()
    return out


def _failure(error: str, dropped: bool = False) -> RewardResult:
    parsed: dict[str, Any] = {"error": error, "problems": ["dropped" if dropped else "reward_error"]}
    if dropped:
        parsed["dropped_reason"] = error
    return RewardResult(0.0, {}, parsed, dropped=dropped)


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails must not escape either
        text = "?"
    return f"{type(exc).__name__}: {text[:300]}"


def _checked(result: Any) -> RewardResult:
    """``result`` if it is a usable RewardResult, else a failure saying what was wrong."""
    if not isinstance(result, RewardResult):
        return _failure(f"reward returned {type(result).__name__}, not a RewardResult")
    try:
        score = float(result.score)
    except (TypeError, ValueError):
        return _failure(f"reward returned a non-numeric score {result.score!r}")
    if not math.isfinite(score):
        return _failure(f"reward returned a non-finite score {score}")
    if not isinstance(result.components, dict) or not isinstance(result.parsed, dict):
        return _failure("reward returned components/parsed that are not dicts")
    bad = [k for k, v in result.components.items()
           if not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))]
    if bad:
        result.components = {k: v for k, v in result.components.items() if k not in bad}
        result.parsed.setdefault("dropped_components", bad)
    if result.dropped:
        result.score = 0.0
    else:
        result.score = score
    return result


def _guarded(call: Callable[[], Any], n: int, budget_s: float, stats: Counter) -> tuple[list[RewardResult] | None, str | None]:
    """Run ``call``; (results, None) or (None, why it failed). Configuration errors re-raise."""
    t0 = time.perf_counter()
    try:
        out = call()
    except DataError as e:
        return None, "data:" + _describe(e)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - the point of the guard
        return None, _describe(e)
    elapsed = time.perf_counter() - t0
    if elapsed > budget_s * max(1, n):
        stats["over_budget"] += n
        return None, f"over_budget: {elapsed:.1f}s for {n} row(s), budget {budget_s:g}s per row"
    return out, None


def groups_of(n: int, group_index: Sequence[int] | None, samples: Sequence[Sample]) -> list[list[int]]:
    """Row indices of each group: runs of equal ``group_index`` (the trainer's), else runs of equal sample ids."""
    keys = list(group_index) if group_index is not None else [id(s) if s.id is None else s.id for s in samples]
    out: list[list[int]] = []
    for i in range(n):
        if out and keys[out[-1][-1]] == keys[i]:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _call_batch(batch: Callable[..., Any], completions: list, samples: list, group_index: list | None) -> list:
    if group_index is not None and takes_param(batch, "group_index"):
        return list(batch(completions, samples, group_index=group_index))
    return list(batch(completions, samples))


def score_batch(fn: RewardFn, completions: Sequence[Completion], samples: Sequence[Sample],
                group_index: Sequence[int] | None = None) -> list[RewardResult]:
    """Score a batch under the guard (module docstring), using ``fn.score_batch`` when the reward has one.

    A batch call that fails is retried row by row, so one bad row does not zero its neighbours — except for a
    group-aware reward (``is_group_aware``), which is retried group by group (``group_index`` [N], the rows of one
    group contiguous; else runs of equal sample ids): a group is never split, and a group that fails alone scores
    0 on every row with its reason. A ``score_batch`` that takes ``group_index`` receives it.
    Never raises, except ``ValueError`` for mismatched lengths (a caller's bug) and configuration
    ``UserError``s.
    """
    if len(completions) != len(samples):
        raise ValueError(f"{len(completions)} completions for {len(samples)} samples")
    if group_index is not None:
        group_index = [int(g) for g in group_index]
        if len(group_index) != len(samples):
            raise ValueError(f"{len(group_index)} group indices for {len(samples)} samples")
    if is_group_aware(fn) and getattr(fn, "score_batch", None) is not None:
        return _score_groups(fn, completions, samples, group_index)
    stats = _stats(fn)
    budget = float(getattr(fn, "time_budget_s", None) or DEFAULT_TIME_BUDGET_S)
    n = len(completions)
    stats["rows"] += n
    results: list[RewardResult | None] = [None] * n
    batch = getattr(fn, "score_batch", None)
    if batch is not None and n:
        out, why = _guarded(lambda: _call_batch(batch, list(completions), list(samples), group_index), n, budget,
                            stats)
        if out is not None and len(out) == n:
            results = [_checked(r) for r in out]
        elif out is not None:
            why = f"score_batch returned {len(out)} results for {n} rows"
        if why is not None and n == 1:
            results = [_failure(why[5:], dropped=True) if why.startswith("data:") else _failure(why)]
        elif why is not None and not why.startswith("over_budget"):
            alone = [_guarded(lambda i=i: _call_batch(batch, [completions[i]], [samples[i]],
                                                      None if group_index is None else [group_index[i]]),
                              1, budget, stats)
                     for i in range(n)]  # one row at a time: a row that fails alone is the bad one
            for i, (one, why_i) in enumerate(alone):
                if one is not None and len(one) == 1:
                    results[i] = _checked(one[0])
                elif why_i is not None and why_i.startswith("data:"):
                    results[i] = _failure(why_i[5:], dropped=True)
                else:
                    results[i] = _failure(why_i or f"score_batch returned {len(one or [])} results for 1 row")
        elif why is not None:
            results = [_failure(why) for _ in range(n)]
    else:
        for i, (c, s) in enumerate(zip(completions, samples)):
            one, why = _guarded(lambda c=c, s=s: [fn(c, s)], 1, budget, stats)
            if one is not None:
                results[i] = _checked(one[0])
            elif why.startswith("data:"):
                results[i] = _failure(why[5:], dropped=True)
            else:
                results[i] = _failure(why)
    final: list[RewardResult] = [r if r is not None else _failure("no result") for r in results]
    return _counted(final, stats)


def _counted(final: list[RewardResult], stats: Counter) -> list[RewardResult]:
    """``final``, with its dropped rows and reward errors added to the guard's counts."""
    for r in final:
        if r.dropped:
            stats["dropped"] += 1
        elif r.parsed.get("problems") and "reward_error" in r.parsed["problems"]:
            stats["errors"] += 1
    return final


def _score_groups(fn: Any, completions: Sequence[Completion], samples: Sequence[Sample],
                  group_index: list[int] | None) -> list[RewardResult]:
    """The guard for a group-aware reward: the whole batch, then (if it fails) each group on its own."""
    stats = _stats(fn)
    budget = float(getattr(fn, "time_budget_s", None) or DEFAULT_TIME_BUDGET_S)
    n = len(completions)
    stats["rows"] += n
    if n == 0:
        return []
    cs, ss = list(completions), list(samples)
    out, why = _guarded(lambda: _call_batch(fn.score_batch, cs, ss, group_index), n, budget, stats)
    if out is not None and len(out) != n:
        out, why = None, f"score_batch returned {len(out)} results for {n} rows"
    if out is not None:
        final = [_checked(r) for r in out]
    else:
        final = [None] * n  # type: ignore[list-item]
        groups = groups_of(n, group_index, samples)
        for rows in groups:
            if len(groups) == 1 or (why or "").startswith("over_budget"):
                one, why_g = None, why  # nothing smaller to retry (a group is the smallest unit)
            else:
                gi = [group_index[i] for i in rows] if group_index is not None else None
                one, why_g = _guarded(lambda rows=rows, gi=gi: _call_batch(fn.score_batch, [cs[i] for i in rows],
                                                                           [ss[i] for i in rows], gi),
                                      len(rows), budget, stats)
                if one is not None and len(one) != len(rows):
                    one, why_g = None, f"score_batch returned {len(one)} results for a group of {len(rows)}"
            for j, i in enumerate(rows):
                if one is not None:
                    final[i] = _checked(one[j])
                elif (why_g or "").startswith("data:"):
                    final[i] = _failure(f"group: {why_g[5:]}", dropped=True)
                else:
                    final[i] = _failure(f"group: {why_g}")
    return _counted(final, stats)
