"""``mmrlvr analyze saturation RUN_DIR``: the training reward's pre-saturation phase vs held-out accuracy.

The weak-supervision study (arXiv 2604.18574) finds that RL generalises when the training reward has a long
pre-saturation phase — it rises slowly before it flattens — while a reward that saturates at once signals
memorisation; and that the faithfulness of the model's reasoning before RL predicts which of the two happens.
This analysis reads ``metrics.jsonl`` and reports both sides:

- the **training reward curve**: ``reward/mean`` per step (the last row of a step when a resumed run logged it
  twice), smoothed by a centred moving average of ``window`` steps (odd; default ≈ 5% of the logged steps,
  ``2·floor(0.025·n) + 1``, so 1 — no smoothing — below 40 steps; near the ends the window shrinks to the steps
  that exist);
- the **plateau**: the mean of the raw reward over the last ``tail`` = 10% of the logged steps (at least one);
- the **saturation step**: the first step at which the smoothed reward has covered ``fraction`` = 95% of its rise
  from the start (the smoothed value at the first step) to the plateau, i.e. smoothed ≥ start + 0.95·(plateau −
  start). The **pre-saturation phase** is the steps from the first logged step to it (also as a share of the
  run). A reward that never rises above its start has no saturation step ("no rise");
- **held-out accuracy**: ``eval/accuracy`` at every eval step (the greedy accuracy eval logs), with its value at
  the last eval at or before saturation and at the end;
- **faithfulness at the start**, the predictor the paper names: 1 − ``inconsistency_rate`` as the run's
  consistency judge logs it during training (the mean over the first ``FIRST_STEPS`` steps that log it), else
  1 − ``eval/inconsistency_rate`` at the first eval (the rule analysis of held-out responses; step 0 when the
  run evaluated before training), else "not logged".

Ours, where the paper is not explicit: the 95%-of-rise threshold (rather than 95% of the plateau value, which
depends on where the reward scale starts), the plateau as the last 10%, the centred window and the choice of
faithfulness source. The paper's ideas are used; no number of it is reproduced here.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError

NAME = "saturation"
FRACTION = 0.95
TAIL = 0.1
FIRST_STEPS = 3
REWARD = "reward/mean"
EVAL_ACCURACY = "eval/accuracy"


# ------------------------------------------------------------------------------------------ pure curve math
def default_window(n: int) -> int:
    """Odd window of about 5% of ``n`` steps: 2·floor(0.025·n) + 1 (1 below 40 steps, 15 at 300)."""
    return 2 * int(math.floor(0.025 * n)) + 1


def smooth(values: list[float], window: int) -> list[float]:
    """Centred moving average: out[i] = mean(values[i − h .. i + h]) with h = window // 2, the window cut at the
    ends (the mean of the values that exist). values: [T] -> [T]."""
    h = max(0, int(window) // 2)
    n = len(values)
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    return [(prefix[min(n, i + h + 1)] - prefix[max(0, i - h)]) / (min(n, i + h + 1) - max(0, i - h))
            for i in range(n)]


def plateau(values: list[float], tail: float = TAIL) -> float:
    """Mean of the last max(1, ceil(tail · T)) raw values."""
    m = max(1, int(math.ceil(tail * len(values))))
    return sum(values[-m:]) / m


def saturation_index(smoothed: list[float], top: float, fraction: float = FRACTION) -> int | None:
    """First index i with smoothed[i] ≥ start + fraction·(top − start), start = smoothed[0]; None when the curve
    never rises (top ≤ start)."""
    start = smoothed[0]
    if not top > start:
        return None
    threshold = start + fraction * (top - start)
    return next((i for i, v in enumerate(smoothed) if v >= threshold - 1e-12 * max(1.0, abs(threshold))), None)


def saturation_curve(steps: list[int], rewards: list[float], *, window: int | None = None,
                     fraction: float = FRACTION, tail: float = TAIL) -> dict[str, Any]:
    """The numbers of the pre-saturation phase of one reward curve (steps ascending, rewards [T])."""
    w = window if window is not None else default_window(len(rewards))
    sm = smooth(rewards, w)
    top = plateau(rewards, tail)
    i = saturation_index(sm, top, fraction)
    span = steps[-1] - steps[0]
    sat = steps[i] if i is not None else None
    return {"window": w, "fraction": fraction, "tail": tail, "start": sm[0], "plateau": top,
            "threshold": sm[0] + fraction * (top - sm[0]) if top > sm[0] else None,
            "saturation_step": sat, "pre_saturation_steps": (sat - steps[0]) if sat is not None else None,
            "pre_saturation_share": ((sat - steps[0]) / span if span else 0.0) if sat is not None else None,
            "no_rise": i is None, "smoothed": sm}


# ------------------------------------------------------------------------------------------ reading the run
def reward_series(rows: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(steps, reward/mean) from metrics rows: one value per step (the last logged), finite values only."""
    by_step: dict[int, float] = {}
    for r in rows:
        v = r.get(REWARD)
        if isinstance(v, (int, float)) and math.isfinite(v):
            by_step[int(r["step"])] = float(v)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def eval_series(rows: list[dict[str, Any]], key: str = EVAL_ACCURACY) -> list[tuple[int, float]]:
    """(step, value) of ``key`` on the eval rows, ascending by step (the last value of a step)."""
    by_step = {int(r["step"]): float(r[key]) for r in rows
               if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])}
    return sorted(by_step.items())


def start_faithfulness(rows: list[dict[str, Any]], first: int = FIRST_STEPS) -> dict[str, Any] | None:
    """1 − inconsistency rate at the start of training (see the module docstring), with its source; None when
    the run logged neither rate."""
    train = [(int(r["step"]), float(r["inconsistency_rate"])) for r in rows
             if "eval/n" not in r and isinstance(r.get("inconsistency_rate"), (int, float))]
    if train:
        picked = sorted(train)[:first]
        rate = sum(v for _, v in picked) / len(picked)
        return {"faithfulness": 1.0 - rate, "inconsistency_rate": rate, "source": "inconsistency_rate (training, "
                "the consistency reward's judge)", "steps": [s for s, _ in picked]}
    ev = eval_series(rows, "eval/inconsistency_rate")
    if ev:
        step, rate = ev[0]
        return {"faithfulness": 1.0 - rate, "inconsistency_rate": rate,
                "source": "eval/inconsistency_rate (rule analysis of held-out responses)", "steps": [step]}
    return None


def _accuracy_at(evals: list[tuple[int, float]], step: int | None) -> dict[str, Any] | None:
    """The last eval at or before ``step`` ({step, accuracy}), None when there is none."""
    if step is None:
        return None
    before = [(s, v) for s, v in evals if s <= step]
    return {"step": before[-1][0], "accuracy": before[-1][1]} if before else None


# ------------------------------------------------------------------------------------------ runner
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN_DIR", help="a run directory (reads its metrics.jsonl)")
    p.add_argument("--window", type=int, default=None,
                   help="moving-average window in steps, odd (default: about 5%% of the logged steps)")
    p.add_argument("--fraction", type=float, default=FRACTION,
                   help=f"share of the rise to the plateau that marks saturation (default {FRACTION})")
    p.add_argument("--tail", type=float, default=TAIL,
                   help=f"the plateau is the mean reward of this last share of the steps (default {TAIL})")


def analyse(run_dir: str | Path, *, window: int | None = None, fraction: float = FRACTION,
            tail: float = TAIL) -> dict[str, Any]:
    """The saturation numbers of a run folder (the function behind the sub-command)."""
    from mmrlvr.store.reader import read_metrics

    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"{run}: no such run directory")
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path}: no such file (not a run directory, or a run that logged no step yet)")
    if window is not None and (window < 1 or window % 2 == 0):
        raise UserError(f"--window must be an odd number of steps >= 1, got {window}")
    if not 0 < fraction <= 1:
        raise UserError(f"--fraction must be in (0, 1], got {fraction}")
    if not 0 < tail <= 1:
        raise UserError(f"--tail must be in (0, 1], got {tail}")
    rows = read_metrics(path)
    steps, rewards = reward_series(rows)
    if not steps:
        raise UserError(f"{path}: no row has {REWARD} ({len(rows)} rows read); nothing to analyse")
    curve = saturation_curve(steps, rewards, window=window, fraction=fraction, tail=tail)
    evals = eval_series(rows)
    return {"run": str(run), "steps": steps, "reward": rewards, **curve,
            "eval_accuracy": [{"step": s, "accuracy": v} for s, v in evals],
            "eval_at_saturation": _accuracy_at(evals, curve["saturation_step"]),
            "eval_first": {"step": evals[0][0], "accuracy": evals[0][1]} if evals else None,
            "eval_last": {"step": evals[-1][0], "accuracy": evals[-1][1]} if evals else None,
            "start_faithfulness": start_faithfulness(rows) or "not logged"}


def run(args: argparse.Namespace) -> Path:
    from mmrlvr.analysis.report import write_report

    n = analyse(args.run, window=args.window, fraction=args.fraction, tail=args.tail)
    return write_report(args.run, NAME, n, _markdown(n), {"saturation.png": lambda: _plot(n)})


def _markdown(n: dict[str, Any]) -> str:
    from mmrlvr.analysis.report import markdown_table

    def num(v: Any) -> Any:
        return "–" if v is None else v

    sat = n["saturation_step"]
    rows = [["logged steps", f"{len(n['steps'])} ({n['steps'][0]}..{n['steps'][-1]})"],
            ["smoothing window (steps, centred)", n["window"]],
            ["start (smoothed reward at the first step)", n["start"]],
            [f"plateau (mean of the last {n['tail']:.0%} of steps)", n["plateau"]],
            [f"threshold (start + {n['fraction']:.0%} of the rise)", num(n["threshold"])],
            ["saturation step", sat if sat is not None else "no rise (the reward never exceeds its start)"],
            ["pre-saturation phase (steps)", num(n["pre_saturation_steps"])],
            ["pre-saturation share of the run", num(n["pre_saturation_share"])]]
    acc = [["first eval", *(_eval_cells(n["eval_first"]))], ["last eval at or before saturation",
                                                            *(_eval_cells(n["eval_at_saturation"]))],
           ["last eval", *(_eval_cells(n["eval_last"]))]]
    f = n["start_faithfulness"]
    faith = ("not logged (no `inconsistency_rate` during training and no `eval/inconsistency_rate`)"
             if f == "not logged" else
             f"{f['faithfulness']:.4g} (1 − {f['inconsistency_rate']:.4g}, from {f['source']}, step(s) {f['steps']})")
    return "\n".join([
        "# Pre-saturation phase of the training reward (arXiv 2604.18574)", "",
        f"Run `{n['run']}`: `reward/mean` per step, centred moving average, saturation where the smoothed reward "
        "has covered the given share of its rise from the start to the plateau (definitions: "
        "mmrlvr/analysis/saturation.py).", "",
        markdown_table(["", "value"], rows), "",
        "## Held-out accuracy (`eval/accuracy`)", "",
        markdown_table(["", "step", "accuracy"], acc) if n["eval_accuracy"] else "not logged (the run never evaluated)",
        "", "## Faithfulness at the start (the paper's predictor)", "", faith,
    ])


def _eval_cells(e: dict[str, Any] | None) -> list[Any]:
    return ["–", "–"] if e is None else [e["step"], e["accuracy"]]


def _plot(n: dict[str, Any]):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(n["steps"], n["reward"], color="tab:blue", alpha=0.3, lw=1, label="reward/mean")
    ax.plot(n["steps"], n["smoothed"], color="tab:blue", lw=2, label=f"smoothed (window {n['window']})")
    if n["threshold"] is not None:
        ax.axhline(n["threshold"], color="tab:blue", ls=":", lw=1, label=f"{n['fraction']:.0%} of the rise")
    if n["saturation_step"] is not None:
        ax.axvline(n["saturation_step"], color="k", ls="--", lw=1, label=f"saturation (step {n['saturation_step']})")
    ax.set_xlabel("step")
    ax.set_ylabel("training reward")
    handles, labels = ax.get_legend_handles_labels()
    if n["eval_accuracy"]:
        ax2 = ax.twinx()
        ax2.plot([e["step"] for e in n["eval_accuracy"]], [e["accuracy"] for e in n["eval_accuracy"]], "o-",
                 color="tab:orange", label="eval/accuracy")
        ax2.set_ylabel("held-out accuracy")
        ax2.set_ylim(0, 1.02)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=8, loc="best")
    return fig
