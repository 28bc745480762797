"""Weighted sums of rewards (the config's ``rewards:`` list) and the answer judge used by evaluation.

``CombinedReward([RewardSpec("format", 0.2), RewardSpec("auto_accuracy", 1.0)])`` returns, per rollout,
``RewardResult(score = Σ weight·score, components = {"format": …, "auto_accuracy": …,
"auto_accuracy/iou": …}, parsed = {"format": {...}, "auto_accuracy": {...}})``: each reward's own score
under its label, its sub-components as ``label/sub``, its parsed fields under its label. Component values
are the rewards' *unweighted* scores, so ``reward/<name>`` in the metrics reads on the reward's own scale.
Every component runs under the guard of ``mmrlvr.rewards.base.score_batch`` (a failing component scores 0
with its reason, never raises); a row that any component drops (``RewardResult.dropped``: its ground truth
does not parse) is dropped as a whole. ``metrics()`` returns the guard's counts of the last batches.

``answer_judge(completion, sample) -> (correct, formatted)`` is the pass/fail judge for
``mmrlvr.evaluation.heldout_accuracy(judge=...)``: correct by the verifier for ``sample.answer_type`` (boxes:
every box matched with IoU ≥ 0.5), formatted by the strict format check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from mmrlvr.errors import UserError
from mmrlvr.metric import Metric
from mmrlvr.registry import RegistryError
from mmrlvr.rewards.auto import AutoAccuracyReward
from mmrlvr.rewards.base import RewardFn, build_reward, guard_metrics, score_batch
from mmrlvr.rewards.common import completion_text
from mmrlvr.rewards.format import FormatReward
from mmrlvr.rewards.parsing import locate_answer
from mmrlvr.types import Completion, RewardResult, Sample


@dataclass
class RewardSpec:
    """One term of the total reward: registered ``name``, ``weight``, constructor ``params``.

    ``label`` names the component (default: ``name``); set it to use one reward twice with different params.
    """

    name: str
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    label: str | None = None

    @classmethod
    def coerce(cls, spec: Any, where: str = "rewards") -> "RewardSpec":
        """Accept a RewardSpec, a mapping ``{name, weight, params, label}`` or any object with those attributes
        (e.g. ``mmrlvr.config.RewardSpecConfig``)."""
        if isinstance(spec, RewardSpec):
            return spec
        if isinstance(spec, Mapping):
            unknown = set(spec) - {"name", "weight", "params", "label"}
            if unknown:
                raise UserError(f"{where}: unknown key(s) {sorted(unknown)}; expected name, weight, params, label")
            get = spec.get
        else:
            def get(key: str, default: Any = None) -> Any:
                return getattr(spec, key, default)
        name = get("name")
        if not name or not isinstance(name, str):
            raise UserError(f"{where}.name: a registered reward name is required, got {name!r}")
        try:
            weight = float(get("weight", 1.0))
        except (TypeError, ValueError):
            raise UserError(f"{where}.weight: must be a number, got {get('weight')!r}") from None
        if not math.isfinite(weight):
            raise UserError(f"{where}.weight: must be finite, got {weight}")
        params = get("params") or {}
        if not isinstance(params, Mapping):
            raise UserError(f"{where}.params: must be a mapping, got {type(params).__name__}")
        return cls(name, weight, dict(params), get("label"))


class CombinedReward:
    """Σ weight·score over several registered rewards; components and parsed kept per reward.

    >>> from mmrlvr.types import Sample
    >>> s = Sample(id="c", messages=[], images=[], answer="3", answer_type="number")
    >>> total = CombinedReward([RewardSpec("format", 0.2), RewardSpec("auto_accuracy", 1.0)])
    >>> r = total("<think>3 shapes</think><answer>3</answer>", s)
    >>> r.score, r.components  # 0.2*1 + 1.0*1
    (1.2, {'format': 1.0, 'auto_accuracy': 1.0})
    """

    def __init__(self, specs: Sequence[Any]) -> None:
        self.specs = [RewardSpec.coerce(s, f"rewards[{i}]") for i, s in enumerate(specs)]
        if not self.specs:
            raise UserError("rewards: at least one reward is needed")
        labels = [s.label or s.name for s in self.specs]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise UserError(f"rewards: {dupes} listed twice; give each copy a distinct 'label'")
        self.labels = labels
        self.fns: list[RewardFn] = []
        for i, spec in enumerate(self.specs):
            try:
                self.fns.append(build_reward(spec.name, **spec.params))
            except RegistryError as e:
                raise UserError(f"rewards[{i}].name: {e}") from None
            except (TypeError, ValueError) as e:
                raise UserError(f"rewards[{i}] ({spec.name}): bad params {spec.params}: {e}") from None

    @property
    def weights(self) -> dict[str, float]:
        return {label: spec.weight for label, spec in zip(self.labels, self.specs)}

    def _combine(self, results: Sequence[RewardResult]) -> RewardResult:
        total, components, parsed, dropped = 0.0, {}, {}, []
        for label, spec, r in zip(self.labels, self.specs, results):
            score = float(r.score)
            if not math.isfinite(score):  # score_batch's guard already turned these into failures
                score = 0.0
            total += spec.weight * score
            components[label] = score
            for sub, value in r.components.items():
                components[f"{label}/{sub}"] = float(value)
            parsed[label] = r.parsed
            if r.dropped:
                dropped.append(label)
        if dropped:
            parsed["dropped_by"] = dropped
            return RewardResult(0.0, components, parsed, dropped=True)
        return RewardResult(total, components, parsed)

    def __call__(self, completion: Completion | str, sample: Sample) -> RewardResult:
        return self.score_batch([completion], [sample])[0]  # type: ignore[list-item]

    def score_batch(self, completions: Sequence[Completion], samples: Sequence[Sample],
                    group_index: Sequence[int] | None = None) -> list[RewardResult]:
        """Score a batch; rewards with a batch form (model judges) get the whole batch at once, group-aware ones
        whole groups (``group_index`` [N]: the rollout -> prompt group map, rows of a group contiguous)."""
        per_reward = [score_batch(fn, completions, samples, group_index) for fn in self.fns]  # [R][B]
        results = [self._combine([rs[b] for rs in per_reward]) for b in range(len(completions))]
        self._last_dropped = sum(r.dropped for r in results)
        return results

    def metrics(self) -> dict[str, float]:
        """The guard's counts since the last call, summed over the components (``reward/errors``,
        ``reward/over_budget``, ``reward/dropped`` — rows any component dropped) and per component
        (``reward/<label>/errors``, ...). Components' own ``metrics()`` are not repeated here."""
        out: dict[str, float] = {"reward/errors": 0.0, "reward/over_budget": 0.0,
                                 "reward/dropped": float(getattr(self, "_last_dropped", 0))}
        for label, fn in zip(self.labels, self.fns):
            m = guard_metrics(fn)
            out["reward/errors"] += m["reward/errors"]
            out["reward/over_budget"] += m["reward/over_budget"]
            for key in ("errors", "over_budget", "dropped"):
                out[f"reward/{label}/{key}"] = m[f"reward/{key}"]
        self._last_dropped = 0
        return {k: Metric.sum(v) for k, v in out.items()}


def make_answer_judge(template: str = "r1", think_prefilled: bool = False, iou_threshold: float = 0.5,
                      **auto_params: Any) -> Callable[[Completion | str, Sample], tuple[bool, bool]]:
    """A ``(completion, sample) -> (correct, formatted)`` judge with the given answer template.

    ``auto_params`` go to ``AutoAccuracyReward`` (e.g. ``number={"abs_tol": 0.5}``); box answers are correct
    when every box is matched with IoU ≥ ``iou_threshold``.
    """
    box = {**auto_params.pop("box", {}), "threshold": iou_threshold}
    auto = AutoAccuracyReward(template=template, think_prefilled=think_prefilled, box=box, **auto_params)
    fmt = FormatReward(template=template, think_prefilled=think_prefilled) if template != "raw" else None

    def judge(completion: Completion | str, sample: Sample) -> tuple[bool, bool]:
        text = completion_text(completion)
        correct = auto(text, sample).score >= 1.0 - 1e-9
        if fmt is not None:
            formatted = fmt(text, sample).score == 1.0
        else:
            formatted = locate_answer(text, "raw", think_prefilled)[0] is not None
        return correct, formatted

    return judge


_default_judge: Callable[[Completion | str, Sample], tuple[bool, bool]] | None = None


def judge_rows(results: Sequence[RewardResult], completions: Sequence[Completion], samples: Sequence[Sample]) -> None:
    """Each result's ``judged``: (correct, formatted) of its completion by ``answer_judge`` (the trainer's score
    stage writes it once per row; everything that needs a row's correctness reads it)."""
    for r, c, s in zip(results, completions, samples):
        r.judged = answer_judge(c, s)


def answer_judge(completion: Completion | str, sample: Sample) -> tuple[bool, bool]:
    """(correct, formatted) with the R1 template; see ``make_answer_judge`` for other templates.

    >>> s = Sample(id="c", messages=[], images=[], answer="3", answer_type="number")
    >>> answer_judge("<think>3</think><answer>3</answer>", s), answer_judge("3", s)
    ((True, True), (False, False))
    """
    global _default_judge
    if _default_judge is None:
        _default_judge = make_answer_judge()
    return _default_judge(completion, sample)
