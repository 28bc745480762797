"""The ``consistency`` reward: credit for an answer that follows from the thinking, in four variants.

``REWARDS.get("consistency")(variant=..., judge=..., ...)``. Each variant turns the judge's P(consistent)
p (rule judge: 0/1) and the rule analysis (``mmrlvr.consistency.analysis``) into a score in [0, 1]:

- ``accurate_only`` (default): score = p · [answer correct]. GRPO-CARE's idea without its group bar:
  consistency is credited only where the answer is right.
- ``plain``: score = p. CORA-style "thinking's conclusion = answer". Kept for comparisons; see below.
- ``follow_correct_thinking`` [ours]: needs ground truth for the thinking's conclusion.
  score = think_credit · [thinking correct] + (1 − think_credit) · [thinking correct] · p.
  A correct thinking earns credit on its own and more when the answer follows it; a wrong thinking earns
  nothing, whatever the answer. So there is no reward for copying a wrong thinking into the answer and
  no reward for rewriting a correct thinking; with ``think_credit=0`` it is ``accurate_only`` on every
  rollout whose conclusion can be verified, and 0 where it cannot.
- ``care``: GRPO-CARE's bonus (``bonus.care_bonus``) — needs the whole group, so it only has a batch form
  (``score_batch``); default judge ``likelihood`` (EMA reference), the rule judge works too.

Why the default is ``accurate_only`` and not ``plain``: a plain consistency reward pays as much for
"both wrong but consistent" as for "both right". docs/consistency.md ("The study") measured it on a warm start whose thinking was
right 80% of the time but whose answers were right only 41%: plain consistency (λ 0.5, summed or
CORA-split) cut the inconsistency rate 0.49 → 0.23–0.26 mostly by rewriting correct thinking to match
wrong answers (thinking accuracy 0.80 → 0.67–0.73, both-wrong-consistent 0.12 → 0.27–0.32) and did not
raise accuracy. ``accurate_only`` cannot pay for a wrong answer, so that shortcut earns nothing.

``parsed`` (what the store and inspector read): verdict ("consistent" / "inconsistent" / "unknown"),
verdict_source ("rule" or the judge name), p_consistent (None = not judged), conclusion, conclusion_span
(offsets into the response text), conclusion_cue, candidates, agrees, thinking_correct, answer_correct,
variant, judge. The verdict comes from the rule comparison whenever it can compare (it is the definition
of the inconsistency rate) and from the judge's p ≥ ``verdict_threshold`` otherwise.

Grouping for ``care``: ``completion.meta["group_index"]`` when every completion has it, else consecutive
blocks of ``group_size`` (the trainer passes its group size), else runs of equal ``sample.id``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from mmrlvr.errors import UserError
from mmrlvr.rewards.base import REWARDS
from mmrlvr.types import Completion, RewardResult, Sample

if TYPE_CHECKING:
    from mmrlvr.consistency.analysis import RolloutAnalysis
    from mmrlvr.consistency.judges import ConsistencyJudge

# The consistency internals (analysis, judges) import mmrlvr.rewards; this module is imported *by*
# mmrlvr.rewards to register the reward, so it imports them lazily and works in either import order.

__all__ = ["ConsistencyReward", "VARIANTS", "DEFAULT_VARIANT", "group_indices"]

VARIANTS = ("accurate_only", "plain", "follow_correct_thinking", "care")
DEFAULT_VARIANT = "accurate_only"


def group_indices(completions: Sequence[Completion], samples: Sequence[Sample],
                  group_size: int | None = None) -> list[int]:
    """Group label per rollout (see module docstring for the order of sources)."""
    metas = [c.meta.get("group_index") for c in completions]
    if metas and all(m is not None for m in metas):
        return [int(m) for m in metas]
    if group_size:
        if len(samples) % group_size:
            raise UserError(f"consistency (care): {len(samples)} rollouts are not whole groups of {group_size}")
        return [i // group_size for i in range(len(samples))]
    out, label = [], -1
    for i, s in enumerate(samples):
        if i == 0 or s.id != samples[i - 1].id:
            label += 1
        out.append(label)
    return out


@REWARDS.register("consistency")
class ConsistencyReward:
    """Thinking–answer consistency reward; see the module docstring for the variants.

    variant: one of ``VARIANTS`` (default ``accurate_only``, the safe one).
    judge: a ``CONSISTENCY_JUDGES`` name ("rule", "nli", "likelihood") or a judge object; default
        "likelihood" for ``care`` and "rule" otherwise. judge_params: constructor params of a named judge.
    think_credit: ``follow_correct_thinking``'s credit for a correct thinking alone (default 0.5) [ours].
    acc_threshold, margin, care_scale: ``care_bonus`` constants (0.1, 0.01, 0.5) [code, GRPO-CARE].
    verdict_threshold: p at which a soft judge's verdict becomes "consistent" (0.5) [ours].
    group_size: rollouts per prompt (the trainer fills it in).

    >>> from mmrlvr.types import Sample
    >>> s = Sample(id="q", messages=[], images=[], answer="2", answer_type="number")
    >>> reward = ConsistencyReward()
    >>> reward("<think>I count 2.</think><answer>2</answer>", s).score
    1.0
    >>> reward("<think>I count 3.</think><answer>3</answer>", s).score  # consistent but wrong: no credit
    0.0
    >>> ConsistencyReward(variant="plain")("<think>I count 3.</think><answer>3</answer>", s).score
    1.0
    """

    group_aware = True  # the CARE variant normalises within the group (mmrlvr.rewards.base: never split)

    def __init__(self, variant: str = DEFAULT_VARIANT, judge: "str | ConsistencyJudge | None" = None,
                 judge_params: dict[str, Any] | None = None, *, think_credit: float = 0.5,
                 acc_threshold: float = 0.1, margin: float = 0.01, care_scale: float = 0.5,
                 verdict_threshold: float = 0.5, group_size: int | None = None,
                 think_prefilled: bool = False) -> None:
        if variant not in VARIANTS:
            raise UserError(f"consistency: unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
        if not 0.0 <= think_credit <= 1.0:
            raise UserError(f"consistency: think_credit must be in [0, 1], got {think_credit}")
        from mmrlvr.consistency.judges import build_judge

        self.variant = variant
        params = dict(judge_params or {})
        if judge is None:
            judge = "likelihood" if variant == "care" else "rule"
        if isinstance(judge, str) and judge in ("rule", "nli", "likelihood"):
            params.setdefault("think_prefilled", think_prefilled)
        self.judge = build_judge(judge, **params)
        self.think_credit, self.verdict_threshold = float(think_credit), float(verdict_threshold)
        self.acc_threshold, self.margin, self.care_scale = float(acc_threshold), float(margin), float(care_scale)
        self.group_size = int(group_size) if group_size else None
        self.think_prefilled = bool(think_prefilled)

    # ---- hooks for judges that score with the policy (likelihood) ----------------------------------
    @property
    def needs_policy(self) -> bool:
        return hasattr(self.judge, "attach")

    def attach_policy(self, model: Any, processor: Any) -> None:
        """Give a policy-based judge the model being trained (call once, before the first step)."""
        if self.needs_policy:
            self.judge.attach(model, processor)  # type: ignore[attr-defined]

    def on_optimizer_step(self, model: Any, step: int) -> None:
        """Call after each optimizer step (``step`` = steps done) so an EMA reference can follow."""
        hook = getattr(self.judge, "on_optimizer_step", None)
        if hook is not None:
            hook(model, step)

    # ---- scoring -----------------------------------------------------------------------------------
    def __call__(self, completion: Completion | str, sample: Sample) -> RewardResult:
        if self.variant == "care":
            raise UserError("consistency variant 'care' compares rollouts within a group: score it with "
                            "score_batch(completions, samples) (mmrlvr.rewards.base.score_batch does)")
        return self.score_batch([completion], [sample])[0]

    def score_batch(self, completions: Sequence[Completion | str], samples: Sequence[Sample]) -> list[RewardResult]:
        if len(completions) != len(samples):
            raise ValueError(f"{len(completions)} completions for {len(samples)} samples")
        # like the other rewards, accept plain strings (notebooks, tests)
        completions = [Completion(c) if isinstance(c, str) else c for c in completions]
        from mmrlvr.consistency.analysis import analyse
        from mmrlvr.consistency.judges import RuleJudge

        analyses = [analyse(c, s, self.think_prefilled) for c, s in zip(completions, samples)]
        if isinstance(self.judge, RuleJudge):
            p = [None if a.agrees is None else float(a.agrees) for a in analyses]
        else:
            p = list(self.judge.p_consistent(completions, samples))
        if self.variant == "care":
            scores = self._care(analyses, p, completions, samples)
        else:
            scores = [self._score(a, pi) for a, pi in zip(analyses, p)]
        return [RewardResult(float(sc), {}, self._parsed(a, pi)) for a, pi, sc in zip(analyses, p, scores)]

    def _score(self, a: RolloutAnalysis, p: float | None) -> float:
        pv = 0.0 if p is None else p
        if self.variant == "plain":
            return pv
        if self.variant == "accurate_only":
            return pv if a.answer_correct else 0.0
        # follow_correct_thinking
        if not a.thinking_correct:
            return 0.0
        return self.think_credit + (1.0 - self.think_credit) * pv

    def _care(self, analyses: list[RolloutAnalysis], p: list[float | None], completions: Sequence[Completion],
              samples: Sequence[Sample]) -> list[float]:
        import torch  # only the group bonus needs it; the rest of this reward is torch-free

        from mmrlvr.consistency.bonus import care_bonus

        acc = torch.tensor([1.0 if a.answer_correct else 0.0 for a in analyses])
        pt = torch.tensor([float("nan") if x is None else x for x in p], dtype=torch.float64)
        groups = torch.tensor(group_indices(completions, samples, self.group_size))
        bonus = care_bonus(acc, pt, groups, acc_threshold=self.acc_threshold, margin=self.margin,
                           scale=self.care_scale)
        return bonus.tolist()

    def _parsed(self, a: RolloutAnalysis, p: float | None) -> dict[str, Any]:
        if a.agrees is not None:
            verdict, source = a.rule_verdict, "rule"
        elif p is not None:
            verdict = "consistent" if p >= self.verdict_threshold else "inconsistent"
            source = getattr(self.judge, "name", type(self.judge).__name__)
        else:
            verdict, source = "unknown", None
        offset = a.think_span[0] if a.think_span else 0
        return {
            "verdict": verdict,
            "verdict_source": source,
            "p_consistent": p,
            "conclusion": a.conclusion.value,
            "conclusion_span": list(a.conclusion_span) if a.conclusion_span else None,
            "conclusion_cue": a.conclusion.cue,
            "candidates": [{"value": c.value, "span": [offset + c.span[0], offset + c.span[1]], "cue": c.cue,
                            "asserted": c.asserted} for c in a.conclusion.candidates],
            "agrees": a.agrees,
            "thinking_correct": a.thinking_correct,
            "answer_correct": a.answer_correct,
            "variant": self.variant,
            "judge": getattr(self.judge, "name", type(self.judge).__name__),
            "problems": a.problems,
        }
