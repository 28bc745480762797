"""Step metrics of thinking–answer consistency, from the ``parsed`` dicts of the ``consistency`` reward.

``consistency_metrics(parsed_list) -> dict`` (names as logged to metrics.jsonl):

- ``inconsistency_rate``: inconsistent / (consistent + inconsistent) — over rollouts with a verdict;
- ``consistency/unknown_rate``: rollouts without a verdict / all rollouts;
- the four-way breakdown over rollouts whose thinking's conclusion *and* answer can both be checked
  against the ground truth (fractions of that set, summing to 1):
  ``consistency/think_right_answer_right``, ``…/think_right_answer_wrong``,
  ``…/think_wrong_answer_right``, ``…/think_wrong_answer_wrong``;
- ``consistency/both_wrong_consistent``: of the same set, thinking and answer wrong *and* agreeing —
  the shortcut a plain consistency reward pays for (docs/consistency.md, "The study");
- ``consistency/thinking_accuracy``: thinking's conclusion correct / conclusions that could be checked;
- ``consistency/verifiable_fraction``: share of rollouts in the four-way set.

A rate whose denominator is empty is left out (no data is not 0, and JSON has no NaN).

``score_completions(completions, samples)`` gives the same metrics for completions that were never
scored by the reward (held-out eval, another trainer's samples): it runs the rule analysis
(``mmrlvr.consistency.analysis.analyse``) on each and aggregates its verdicts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from mmrlvr.metric import Metric

if TYPE_CHECKING:
    from mmrlvr.consistency.analysis import RolloutAnalysis
    from mmrlvr.types import Completion, Sample

__all__ = ["consistency_metrics", "consistency_counts", "analysis_fields", "score_completions"]


def consistency_metrics(parsed_list: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Aggregate per-rollout consistency fields (verdict, thinking_correct, answer_correct, agrees); each rate is
    a mean over the rollouts it is a share of (how the rates of several processes combine)."""
    return {k: Metric.mean(num / den, n=den) for k, (num, den) in consistency_counts(parsed_list).items() if den}


def consistency_counts(parsed_list: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """(numerator, denominator) of every rate ``consistency_metrics`` reports."""
    rows = list(parsed_list)
    verdicts = [r.get("verdict", "unknown") for r in rows]
    consistent = sum(v == "consistent" for v in verdicts)
    inconsistent = sum(v == "inconsistent" for v in verdicts)
    unknown = len(rows) - consistent - inconsistent
    both = [r for r in rows if r.get("thinking_correct") is not None and r.get("answer_correct") is not None]
    tr_ar = sum(bool(r["thinking_correct"]) and bool(r["answer_correct"]) for r in both)
    tr_aw = sum(bool(r["thinking_correct"]) and not r["answer_correct"] for r in both)
    tw_ar = sum(not r["thinking_correct"] and bool(r["answer_correct"]) for r in both)
    tw_aw = len(both) - tr_ar - tr_aw - tw_ar

    def agrees(r: Mapping[str, Any]) -> bool:
        a = r.get("agrees")
        return bool(a) if a is not None else r.get("verdict") == "consistent"

    bw_cons = sum(not r["thinking_correct"] and not r["answer_correct"] and agrees(r) for r in both)
    think_checked = [r for r in rows if r.get("thinking_correct") is not None]
    return {
        "inconsistency_rate": (inconsistent, consistent + inconsistent),
        "consistency/unknown_rate": (unknown, len(rows)),
        "consistency/think_right_answer_right": (tr_ar, len(both)),
        "consistency/think_right_answer_wrong": (tr_aw, len(both)),
        "consistency/think_wrong_answer_right": (tw_ar, len(both)),
        "consistency/think_wrong_answer_wrong": (tw_aw, len(both)),
        "consistency/both_wrong_consistent": (bw_cons, len(both)),
        "consistency/thinking_accuracy": (sum(bool(r["thinking_correct"]) for r in think_checked), len(think_checked)),
        "consistency/verifiable_fraction": (len(both), len(rows)),
    }


def analysis_fields(a: "RolloutAnalysis") -> dict[str, Any]:
    """The fields ``consistency_metrics`` reads, from one rule analysis (verdict by the rule comparison)."""
    return {"verdict": a.rule_verdict, "agrees": a.agrees, "thinking_correct": a.thinking_correct,
            "answer_correct": a.answer_correct}


def score_completions(completions: Sequence["Completion | str"], samples: Sequence["Sample"],
                      think_prefilled: bool = False) -> dict[str, float]:
    """``consistency_metrics`` of completions judged by the rule analysis alone (no reward, no judge model).

    >>> from mmrlvr.types import Sample
    >>> s = Sample(id="q", messages=[], images=[], answer="2", answer_type="number")
    >>> m = score_completions(["<think>I count 2.</think><answer>2</answer>",
    ...                        "<think>I count 2.</think><answer>3</answer>"], [s, s])
    >>> m["inconsistency_rate"], m["consistency/think_right_answer_wrong"]
    (0.5, 0.5)
    """
    from mmrlvr.consistency.analysis import analyse
    from mmrlvr.types import Completion

    if len(completions) != len(samples):
        raise ValueError(f"{len(completions)} completions for {len(samples)} samples")
    rows = [analysis_fields(analyse(Completion(c) if isinstance(c, str) else c, s, think_prefilled))
            for c, s in zip(completions, samples)]
    return consistency_metrics(rows)
