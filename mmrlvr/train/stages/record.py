"""Record: the step's metrics (reduced over processes) to metrics.jsonl / trackers, and its rollouts to the store.

Metric names follow DESIGN.md. Step numbers in files are 1-based: "step k" is the k-th update and the rollouts
it learned from. Diagnostics from other stages (reward counters, credit statistics, ``batch.diagnostics``) are
merged in that order.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrlvr.train.batch import StepBatch
from mmrlvr.train.stages.base import Stage, register_stage
from mmrlvr.train.step_metrics import rollout_metrics

#: the metrics shown beside the progress bar
PROGRESS_KEYS: tuple[str, ...] = ("reward/mean", "accuracy")


def update_metrics(stats: dict[str, float]) -> dict[str, float]:
    """Per-token means of the update's sums (loss, gradient norm, KL, entropy, clipping, ratios)."""
    if "tokens" not in stats:
        return {}
    tokens = max(stats.get("tokens", 0.0), 1.0)
    return {
        "loss": stats["loss"], "grad_norm": stats["grad_norm"],
        "kl": stats["kl_sum"] / tokens, "entropy/mean": stats["entropy_sum"] / tokens,
        "clip_fraction": stats["clip_sum"] / tokens, "ratio/mean": stats["ratio_sum"] / tokens,
        "ratio/max": stats["ratio_max"],
    }


@register_stage("record", "metrics_and_rollouts")
class Record(Stage):
    def step_metrics(self, b: StepBatch) -> dict[str, Any]:
        stats = b.update_stats
        m = rollout_metrics(b.rollouts, b.rewards, b.results, self.cfg.rollout.group_size)
        m.update(update_metrics(stats))
        m["skipped"] = stats.get("skipped", 0.0)
        m.update(b.reward_metrics)
        m.update(b.credit_stats)
        m.update(b.diagnostics)
        return m

    def reduce(self, metrics: dict[str, Any]) -> dict[str, Any]:
        accel = self.rt.accel
        if accel.num_processes == 1:
            return metrics
        keys = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))
        t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=accel.device)
        t = accel.reduce(t, reduction="mean")
        return {**metrics, **{k: float(v) for k, v in zip(keys, t.tolist())}}

    def __call__(self, b: StepBatch) -> None:
        metrics = self.step_metrics(b)
        metrics.update({"time/step_s": sum(b.timings.values()), "time/generate_s": b.rollouts.timings.get("generate_s", 0.0),
                        "time/train_s": b.timings.get("update", 0.0), "lr": self.rt.scheduler.get_last_lr()[0]})
        metrics = self.reduce(metrics)
        metrics.update(self.rt.extra_metrics)  # once-per-run values (the topology), identical on every rank
        self.rt.extra_metrics = {}
        rt = self.rt
        if rt.metrics_writer is not None:
            rt.metrics_writer.log(b.step + 1, metrics)
        if rt.rollout_writer is not None:
            from mmrlvr.train.records import build_records

            rt.rollout_writer.write_step(b.step + 1, build_records(b.step + 1, b, rt.processor, rt.rollout_writer,
                                                                   self.cfg))
        b.logged = metrics
