"""Record: the step's metrics (reduced over processes) to metrics.jsonl / trackers, and its rollouts to the store.

Step numbers in files are 1-based: "step k" is the k-th update and the rollouts it learned from. Diagnostics
from other stages (reward counters, credit statistics, ``batch.diagnostics``) are merged in that order.

Several processes: each metric is combined by the reduction it carries (sums, means weighted by this process's
count, maxima, ...; ``mmrlvr.metric``), so every rank logs the metrics of the whole global batch.
"""

from __future__ import annotations

from typing import Any

from mmrlvr.train.batch import StepBatch
from mmrlvr.metric import Metric, check_declared, reduce_over_processes
from mmrlvr.train.stages.base import Stage, register_stage

#: the metrics shown beside the progress bar
PROGRESS_KEYS: tuple[str, ...] = ("reward/mean", "accuracy")


def update_metrics(stats: dict[str, float]) -> dict[str, Metric]:
    """Per-token means of the update's sums (KL, entropy, clipping, ratios) over its tokens; the loss (each
    process's share of the globally normalised loss, so summed), the gradient norm (of the all-reduced
    gradient: the same everywhere) and the largest ratio."""
    if "tokens" not in stats:
        return {}
    n = stats.get("tokens", 0.0)
    tokens = max(n, 1.0)
    return {
        "loss": Metric.sum(stats["loss"]), "grad_norm": Metric.same(stats["grad_norm"]),
        "kl": Metric.mean(stats["kl_sum"] / tokens, n=n),
        "entropy/mean": Metric.mean(stats["entropy_sum"] / tokens, n=n),
        "clip_fraction": Metric.mean(stats["clip_sum"] / tokens, n=n),
        "ratio/mean": Metric.mean(stats["ratio_sum"] / tokens, n=n),
        "ratio/max": Metric.max(stats["ratio_max"]),
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
        m["skipped"] = Metric.max(stats.get("skipped", 0.0))  # one process's skip is the step's
        m.update(b.reward_metrics)
        m.update(b.credit_stats)
        m.update(b.diagnostics)
        if self.rt.padding is not None:  # the padded share of the reference, credit and update passes
            m.update(self.rt.padding.take())
        return m

    def reduce(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The metrics of the whole global batch, on every process (``mmrlvr.metric``)."""
        return reduce_over_processes(metrics, self.rt.accel.num_processes)

    def __call__(self, b: StepBatch) -> None:
        metrics = self.step_metrics(b)
        metrics.update({"time/step_s": Metric.max(sum(b.timings.values())),
                        "time/generate_s": Metric.max(b.rollouts.timings.get("generate_s", 0.0)),
                        "time/train_s": Metric.max(b.timings.get("update", 0.0)),
                        "lr": Metric.same(self.rt.scheduler.get_last_lr()[0])})
        check_declared(metrics)
        if self.rt.accel.num_processes > 1:
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
