"""PNG plots of a run's metrics (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from mmrlvr.train.metrics import read_metrics

PANELS = [
    ("reward/mean", "reward"), ("accuracy", "train accuracy (T=1)"), ("eval/avg@8", "held-out avg@8 (T=1)"),
    ("eval/greedy_accuracy", "held-out greedy"), ("inconsistency_rate", "inconsistency rate"),
    ("response_length/mean", "response length"), ("kl", "KL to reference"),
    ("credit/selected_fraction", "credit: selected fraction"), ("reward/rubric", "rubric score"),
]


def _moving_average(ys: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_run(run_dir: Path, out: Path | None = None) -> Path | None:
    """Write ``curves.png`` with one panel per metric the run logged; returns its path (None if empty)."""
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    panels = [(k, t) for k, t in PANELS if any(r.get(k) is not None for r in rows)]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels):
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        xs, ys = zip(*pts)
        if len(pts) < 20:
            ax.plot(xs, ys, marker="o", linewidth=1.2)
        else:  # noisy per-step values: thin raw line + a moving average over ~5% of the run
            ax.plot(xs, ys, linewidth=0.6, alpha=0.35)
            ax.plot(xs, _moving_average(list(ys), max(3, len(ys) // 20)), linewidth=1.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out or Path(run_dir) / "curves.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
