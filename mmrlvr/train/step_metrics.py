"""Metrics of one step's rollouts (names: docs/training.md, "Metrics"): rewards per component, accuracy, format rate,
lengths, zero-variance groups, inconsistency rate. Pure: values in, dict out; each value declares how the metrics of
several processes combine (``mmrlvr.metric``): rates are means over this process's rows (a reward component: the
rows it scored; group statistics: the groups)."""

from __future__ import annotations

from typing import Any

import torch

from mmrlvr.metric import Metric
from mmrlvr.rollout.base import RolloutBatch


def _mean(xs: list[float]) -> Metric:
    return Metric.mean(float(sum(xs) / len(xs)) if xs else float("nan"), n=len(xs))


def rollout_metrics(batch: RolloutBatch, rewards: torch.Tensor, results: list, group_size: int) -> dict[str, Any]:
    from mmrlvr.rewards import answer_judge

    rows = len(rewards)
    mean = float(rewards.mean())
    m: dict[str, Any] = {"reward/mean": Metric.mean(mean, n=rows),
                         "reward/std": Metric.std(float(rewards.std()) if rows > 1 else 0.0, n=rows, mean=mean,
                                                  unbiased=True)}
    names = sorted({k for r in results for k in r.components})
    for name in names:
        vals = [r.components[name] for r in results if name in r.components]
        m[f"reward/{name}"] = _mean(vals)
    # the score stage's verdicts; results scored elsewhere (a caller's own) are judged here
    judged = [r.judged if r.judged is not None else answer_judge(c, s)
              for r, c, s in zip(results, batch.completions, batch.samples)]
    m["accuracy"] = _mean([float(ok) for ok, _ in judged])
    m["format_rate"] = _mean([float(fmt) for _, fmt in judged])
    lengths = batch.response_mask.sum(dim=1)
    m["response_length/mean"] = Metric.mean(float(lengths.mean()), n=rows)
    m["truncated_fraction"] = _mean([float(c.finish_reason == "length") for c in batch.completions])
    uniform = batch.uniform_group_size()
    if uniform is not None:  # one reduction over [groups, G]
        # all equal, compared exactly: a float32 std of equal values can round to ~1e-7 (e.g. six rewards of 1.2)
        grouped = rewards.view(-1, uniform)
        m["zero_std_group_fraction"] = Metric.mean(float((grouped.amax(dim=1) == grouped.amin(dim=1)).float().mean()),
                                                   n=grouped.shape[0])
        sizes = [uniform] * (len(rewards) // uniform)
    else:  # groups of several sizes (a budget sampler): one at a time
        groups = [rewards[s] for s in batch.group_slices()]
        m["zero_std_group_fraction"] = _mean([float(bool(g.max() == g.min())) for g in groups])
        sizes = [len(g) for g in groups]
    m["group_size/mean"] = _mean([float(x) for x in sizes])
    m["group_size/max"] = Metric.max(float(max(sizes)) if sizes else 0.0)
    m["group_size/min"] = Metric.min(float(min(sizes)) if sizes else 0.0)
    verdicts = [r.parsed.get("consistency", {}).get("verdict") for r in results
                if isinstance(r.parsed.get("consistency"), dict)]
    if verdicts:
        from mmrlvr.consistency.metrics import consistency_metrics

        m.update(consistency_metrics([r.parsed["consistency"] for r in results if isinstance(r.parsed.get("consistency"), dict)]))
    return m
