"""Process rewards that can never pay a wrong answer (LongTraceRL, arXiv 2605.31584), and a VLM process term.

``gated_process`` (group-aware):

    r_i = 0                                                       if the outcome is wrong
    r_i = (1 − η) · r_out,i + η · r_proc,i / max_{j ∈ group} r_proc,j   otherwise,   η = 0.3

``outcome`` and ``process`` are reward specs (``{name: ..., params: {...}}``) built like any configured reward (the
run's answer template and group size reach them); the outcome is right when its score ≥ ``threshold`` (1.0). The
process term is normalised by the group's best process score (0 when no row of the group has one), so the bonus
ranks thinking within the group and never exceeds η. The gate is the paper's point: a long, plausible trace with a
wrong answer earns nothing, so the process term cannot be farmed.

``named_objects``, the VLM process term: the share of the gold objects of the image the thinking names
(``sample.meta["gold_objects"]``, a list of phrases a dataset column can carry; synthetic scenes derive them from
their shapes, ``"red triangle"``). A phrase counts when the thinking contains it case-insensitively, a trailing
plural ``s`` allowed. Ours: the matching rule (the paper's process reward is a trained judge over text traces; the
share of named gold objects is our reading of it for images). Rows without gold objects score 0 and say so.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from mmrlvr.rewards.base import REWARDS, build_nested_reward, score_batch
from mmrlvr.rewards.parsing import split_think_answer
from mmrlvr.types import Completion, RewardResult, Sample


def gold_objects(sample: Sample) -> list[str]:
    """The phrases of the objects a row's image holds: ``meta["gold_objects"]``, else its synthetic shapes."""
    meta = sample.meta or {}
    if isinstance(meta.get("gold_objects"), list):
        return [str(o) for o in meta["gold_objects"] if str(o).strip()]
    shapes = meta.get("shapes")
    if isinstance(shapes, list):
        return sorted({f"{s.get('colour', '')} {s.get('shape', '')}".strip() for s in shapes
                       if isinstance(s, dict) and s.get("shape")})
    return []


@REWARDS.register("named_objects")
class NamedObjects:
    """Share of the image's gold objects the thinking names (module docstring)."""

    def __init__(self, think_prefilled: bool = False) -> None:
        self.think_prefilled = think_prefilled

    def __call__(self, completion: Completion | str, sample: Sample) -> RewardResult:
        text = completion if isinstance(completion, str) else completion.text
        think = split_think_answer(text, think_prefilled=self.think_prefilled).thinking or ""
        objects = gold_objects(sample)
        if not objects:
            return RewardResult(0.0, {}, {"problems": ["no gold objects for this row"]})
        named = [o for o in objects
                 if re.search(r"(?<!\w)" + re.escape(o.lower()) + r"s?(?!\w)", think.lower()) is not None]
        return RewardResult(len(named) / len(objects), {}, {"named": named, "gold_objects": objects})


def gate(outcome: Sequence[float], process: Sequence[float], group_index: Sequence[int], *, eta: float = 0.3,
         threshold: float = 1.0) -> list[float]:
    """The gated reward of every row (module docstring): 0 for a wrong outcome, else the blend with the process
    score normalised by its group's best. Pure: lists in, list out."""
    best: dict[int, float] = {}
    for p, g in zip(process, group_index):
        best[g] = max(best.get(g, 0.0), float(p))
    out = []
    for o, p, g in zip(outcome, process, group_index):
        if o < threshold:
            out.append(0.0)
            continue
        proc = float(p) / best[g] if best[g] > 0 else 0.0
        out.append((1.0 - eta) * float(o) + eta * proc)
    return out


@REWARDS.register("gated_process")
class GatedProcess:
    """LongTraceRL's gated process reward (arXiv 2605.31584): no process credit without a right outcome."""

    group_aware = True  # the process term is normalised by the group's best

    def __init__(self, outcome: dict[str, Any] | str | None = None, process: dict[str, Any] | str | None = None,
                 eta: float = 0.3, threshold: float = 1.0) -> None:
        if not 0.0 <= float(eta) <= 1.0:
            raise ValueError(f"eta must be in [0, 1], got {eta}")
        self.outcome = build_nested_reward(outcome or {"name": "auto_accuracy"}, "gated_process", "outcome")
        self.process = build_nested_reward(process or {"name": "named_objects"}, "gated_process", "process")
        self.eta, self.threshold = float(eta), float(threshold)

    def __call__(self, completion: Completion | str, sample: Sample) -> RewardResult:
        return self.score_batch([completion], [sample], group_index=[0])[0]

    def score_batch(self, completions: Sequence[Completion | str], samples: Sequence[Sample], *,
                    group_index: Sequence[int]) -> list[RewardResult]:
        comps = [Completion(c) if isinstance(c, str) else c for c in completions]
        out_r = score_batch(self.outcome, comps, samples, group_index)
        proc_r = score_batch(self.process, comps, samples, group_index)
        scores = gate([r.score for r in out_r], [r.score for r in proc_r], list(group_index), eta=self.eta,
                      threshold=self.threshold)
        return [RewardResult(s, {"outcome": o.score, "process": p.score},
                             {"outcome": o.parsed, "process": p.parsed, "gated": o.score < self.threshold},
                             dropped=o.dropped)
                for s, o, p in zip(scores, out_r, proc_r)]
