"""Record: the step's metrics (reduced over processes) to metrics.jsonl / trackers, and its rollouts to the store.

Step numbers in files are 1-based: "step k" is the k-th update and the rollouts it learned from. Diagnostics
from other stages (reward counters, credit statistics, ``batch.diagnostics``) are merged in that order.

Several processes: each metric is reduced by its kind (sums, weighted means over this process's denominators,
maxima, ...; ``mmrlvr.train.metric_reduce``), so every rank logs the metrics of the whole global batch.
"""

from __future__ import annotations

from typing import Any

from mmrlvr.train.batch import StepBatch
from mmrlvr.train.metric_reduce import reduce_over_processes
from mmrlvr.train.stages.base import Stage, register_stage

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
    fallback = True
    reads = ("log_rollouts",)

    def step_metrics(self, b: StepBatch) -> dict[str, Any]:
        from mmrlvr.train.step_metrics import rollout_metrics

        stats = b.update_stats
        m = rollout_metrics(b.rollouts, b.rewards, b.results, self.cfg.rollout.group_size)
        m.update(update_metrics(stats))
        m["skipped"] = stats.get("skipped", 0.0)
        m.update(b.reward_metrics)
        m.update(b.credit_stats)
        m.update(b.diagnostics)
        if self.rt.padding is not None:  # the padded share of the reference, credit and update passes
            padding, positions = self.rt.padding.take()
            m.update(padding)
            b.metric_weights.update(positions)
        return m

    def denominators(self, b: StepBatch, metrics: dict[str, Any]) -> dict[str, float]:
        """What this process's means are over (rows, tokens, ...), plus what stages declared."""
        from mmrlvr.train.step_metrics import metric_denominators

        w = metric_denominators(b.rollouts, b.results, metrics, b.update_stats.get("tokens"))
        w.update(b.metric_weights)
        return w

    def reduce(self, metrics: dict[str, Any], weights: dict[str, float] | None = None) -> dict[str, Any]:
        """The metrics of the whole global batch, on every process (``mmrlvr.train.metric_reduce``)."""
        return reduce_over_processes(metrics, weights or {}, self.rt.accel.num_processes)

    def __call__(self, b: StepBatch) -> None:
        metrics = self.step_metrics(b)
        metrics.update({"time/step_s": sum(b.timings.values()), "time/generate_s": b.rollouts.timings.get("generate_s", 0.0),
                        "time/train_s": b.timings.get("update", 0.0), "lr": self.rt.scheduler.get_last_lr()[0]})
        if self.rt.accel.num_processes > 1:
            metrics = self.reduce(metrics, self.denominators(b, metrics))
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
