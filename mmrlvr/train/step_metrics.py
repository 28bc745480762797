"""Metrics of one step's rollouts (names: docs/training.md, "Metrics"): rewards per component, accuracy, format rate,
lengths, zero-variance groups, inconsistency rate, judge unknown rate. Pure: values in, dict out.

``metric_denominators`` gives what each mean is a mean *over* on this process (rows, response tokens, the rows
a reward component scored, a consistency rate's rollouts), so the metrics of several processes combine into
those of the whole batch (``mmrlvr.train.metric_reduce``)."""

from __future__ import annotations

from typing import Any

import torch

from mmrlvr.rollout.base import RolloutBatch


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


def rollout_metrics(batch: RolloutBatch, rewards: torch.Tensor, results: list, group_size: int) -> dict[str, Any]:
    from mmrlvr.rewards import answer_judge

    m: dict[str, Any] = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0}
    names = sorted({k for r in results for k in r.components})
    for name in names:
        vals = [r.components[name] for r in results if name in r.components]
        m[f"reward/{name}"] = _mean(vals)
    judged = [answer_judge(c, s) for c, s in zip(batch.completions, batch.samples)]
    m["accuracy"] = _mean([float(ok) for ok, _ in judged])
    m["format_rate"] = _mean([float(fmt) for _, fmt in judged])
    lengths = batch.response_mask.sum(dim=1)
    m["response_length/mean"] = float(lengths.mean())
    m["truncated_fraction"] = _mean([float(c.finish_reason == "length") for c in batch.completions])
    uniform = batch.uniform_group_size()
    if uniform is not None:  # one reduction over [groups, G] (the same floats as before groups could differ in size)
        # all equal, compared exactly: a float32 std of equal values can round to ~1e-7 (e.g. six rewards of 1.2)
        grouped = rewards.view(-1, uniform)
        m["zero_std_group_fraction"] = float((grouped.amax(dim=1) == grouped.amin(dim=1)).float().mean())
        sizes = [uniform] * (len(rewards) // uniform)
    else:  # groups of several sizes (a budget sampler): one at a time
        groups = [rewards[s] for s in batch.group_slices()]
        m["zero_std_group_fraction"] = _mean([float(bool(g.max() == g.min())) for g in groups])
        sizes = [len(g) for g in groups]
    m["group_size/mean"] = _mean([float(x) for x in sizes])
    m["group_size/max"] = float(max(sizes)) if sizes else 0.0
    m["group_size/min"] = float(min(sizes)) if sizes else 0.0
    verdicts = [r.parsed.get("consistency", {}).get("verdict") for r in results
                if isinstance(r.parsed.get("consistency"), dict)]
    if verdicts:
        from mmrlvr.consistency.metrics import consistency_metrics

        m.update(consistency_metrics([r.parsed["consistency"] for r in results if isinstance(r.parsed.get("consistency"), dict)]))
    return m


def metric_denominators(batch: RolloutBatch, results: list, metrics: dict[str, Any],
                        update_tokens: float | None = None) -> dict[str, float]:
    """This process's denominators: ``rows``, ``tokens`` (response tokens), ``update_tokens`` (tokens the
    update's per-token means are over), per reward component the rows it scored, each consistency rate's
    rollouts, and the off-policy diagnostics' overall token count and ratio mean (from their bins)."""
    w: dict[str, float] = {"rows": float(len(results)), "tokens": float(batch.response_mask.sum())}
    if update_tokens is not None:
        w["update_tokens"] = float(update_tokens)
    for name in {k for r in results for k in r.components}:
        w[f"reward/{name}"] = float(sum(name in r.components for r in results))
    parsed = [r.parsed["consistency"] for r in results if isinstance(r.parsed.get("consistency"), dict)]
    if parsed:
        from mmrlvr.consistency.metrics import consistency_denominators

        w.update(consistency_denominators(parsed))
    bins = [k[:-len("/tokens")] for k in metrics if k.startswith("offpolicy/bin") and k.endswith("/tokens")]
    n = sum(float(metrics[f"{b}/tokens"]) for b in bins)
    if n:
        w["offpolicy/tokens"] = n
        w["offpolicy/ratio_mean"] = sum(float(metrics[f"{b}/tokens"]) * float(metrics[f"{b}/ratio_mean"])
                                        for b in bins) / n
    return w
