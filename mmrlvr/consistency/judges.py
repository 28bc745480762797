"""Judges of thinking–answer consistency behind one interface (docs/consistency.md).

``judge.p_consistent(completions, samples) -> list[float | None]``: P(the answer follows from the
thinking) per rollout, in [0, 1]; ``None`` when the judge cannot tell (no thinking, no answer, no
conclusion found). ``None`` is counted as unknown by the metrics and never treated as consistent.

Registered in ``CONSISTENCY_JUDGES`` (``CONSISTENCY_JUDGES.get(name)(**params)``):

- ``rule``: extract the thinking's conclusion (``mmrlvr.consistency.extract``) and compare it with the
  answer using the accuracy verifier of the sample's answer type. p ∈ {0, 1}. No model, CPU-cheap.
- ``nli``: a local ``AutoModelForSequenceClassification`` checkpoint folder (an NLI model the user
  provides): premise = question + thinking, hypothesis = "The final answer is {answer}", p = P(entail)
  read through the checkpoint's ``id2label``.
- ``likelihood``: GRPO-CARE. p = exp(mean log π_ref(answer | question, image, thinking)), clamped ≤ 0.95,
  under an EMA copy of the policy. Needs the policy: the trainer calls ``attach(model, processor)`` once
  and ``on_optimizer_step(model, step)`` after every optimizer step (EMA every ``every`` steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from mmrlvr.consistency.analysis import analyse
from mmrlvr.consistency.verify import parse_response
from mmrlvr.errors import UserError
from mmrlvr.registry import Registry
from mmrlvr.types import Completion, Sample

if TYPE_CHECKING:  # torch is imported only by the judges that run a model, so the rule path stays light
    import torch

    from mmrlvr.consistency.likelihood import EMAReference

__all__ = ["ConsistencyJudge", "CONSISTENCY_JUDGES", "RuleJudge", "NLIJudge", "LikelihoodJudge", "build_judge"]


class ConsistencyJudge(Protocol):
    name: str

    def p_consistent(self, completions: Sequence[Completion], samples: Sequence[Sample]) -> list[float | None]: ...


#: name -> factory(**params) -> ConsistencyJudge
CONSISTENCY_JUDGES: Registry[Callable[..., ConsistencyJudge]] = Registry("consistency judge")


def build_judge(judge: str | ConsistencyJudge, **params: Any) -> ConsistencyJudge:
    """A judge instance from a registered name (with params) or an already built judge."""
    if isinstance(judge, str):
        return CONSISTENCY_JUDGES.get(judge)(**params)
    if params:
        raise UserError("judge_params are only used when the judge is given by name")
    return judge


def _check_lengths(completions: Sequence[Completion], samples: Sequence[Sample]) -> None:
    if len(completions) != len(samples):
        raise ValueError(f"{len(completions)} completions for {len(samples)} samples")


@CONSISTENCY_JUDGES.register("rule")
class RuleJudge:
    """p = 1 when the thinking's stated conclusion equals the answer under the accuracy verifier, else 0."""

    name = "rule"

    def __init__(self, think_prefilled: bool = False) -> None:
        self.think_prefilled = think_prefilled

    def p_consistent(self, completions: Sequence[Completion], samples: Sequence[Sample]) -> list[float | None]:
        _check_lengths(completions, samples)
        out: list[float | None] = []
        for c, s in zip(completions, samples):
            agrees = analyse(c, s, self.think_prefilled).agrees
            out.append(None if agrees is None else float(agrees))
        return out


@CONSISTENCY_JUDGES.register("nli")
class NLIJudge:
    """P(entailment) of "The final answer is {answer}" given question + thinking, by a local NLI model.

    path: folder with a sequence-classification checkpoint and its tokenizer (loaded offline).
    entail_label: label name meaning entailment; by default the one of ``config.id2label`` whose name
        starts with "entail" (case-insensitive). Other labels (neutral, contradiction) count as "not".
    max_length: longer pairs lose the end of the premise (truncation "only_first"), never the hypothesis.
    """

    name = "nli"

    def __init__(self, path: str | Path, *, entail_label: str | None = None, max_length: int = 512,
                 batch_size: int = 16, device: str = "cpu",
                 hypothesis: str = "The final answer is {answer}.", think_prefilled: bool = False) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise UserError(f"NLI consistency judge: {folder} is not a model folder (no config.json)")
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.model = AutoModelForSequenceClassification.from_pretrained(str(folder)).to(device).eval()
        self.entail_index = self.find_entail_index(self.model.config.id2label, entail_label, folder)
        self.max_length, self.batch_size, self.device = int(max_length), int(batch_size), device
        if "{answer}" not in hypothesis:
            raise UserError("NLI consistency judge: hypothesis template must contain {answer}")
        self.hypothesis, self.think_prefilled = hypothesis, think_prefilled

    @staticmethod
    def find_entail_index(id2label: dict[Any, str], entail_label: str | None, where: Any = "model") -> int:
        """Index of the entailment class in ``id2label`` (keys may be ints or strings)."""
        labels = {int(k): str(v) for k, v in id2label.items()}
        if entail_label is not None:
            hits = [i for i, name in labels.items() if name == entail_label]
        else:
            hits = [i for i, name in labels.items() if name.lower().startswith("entail")]
        if len(hits) != 1:
            raise UserError(f"NLI consistency judge: cannot find the entailment label in {where}'s id2label "
                            f"{dict(sorted(labels.items()))}; set entail_label to one of those names")
        return hits[0]

    def pairs(self, completions: Sequence[Completion], samples: Sequence[Sample]) -> list[tuple[str, str] | None]:
        """(premise, hypothesis) per rollout; None without thinking or answer."""
        out: list[tuple[str, str] | None] = []
        for c, s in zip(completions, samples):
            parsed = parse_response(c.text, self.think_prefilled)
            if not parsed.thinking or parsed.answer is None:
                out.append(None)
                continue
            premise = (s.question.strip() + "\n" + parsed.thinking).strip()
            out.append((premise, self.hypothesis.format(answer=parsed.answer)))
        return out

    def p_consistent(self, completions: Sequence[Completion], samples: Sequence[Sample]) -> list[float | None]:
        import torch

        _check_lengths(completions, samples)
        pairs = self.pairs(completions, samples)
        todo = [i for i, p in enumerate(pairs) if p is not None]
        out: list[float | None] = [None] * len(pairs)
        for start in range(0, len(todo), self.batch_size):
            rows = todo[start:start + self.batch_size]
            premises = [pairs[i][0] for i in rows]  # type: ignore[index]
            hyps = [pairs[i][1] for i in rows]  # type: ignore[index]
            enc = self.tokenizer(premises, hyps, truncation="only_first", max_length=self.max_length,
                                 padding=True, return_tensors="pt").to(self.device)
            with torch.no_grad():
                probs = self.model(**enc).logits.float().softmax(-1)[:, self.entail_index]
            for i, p in zip(rows, probs.tolist()):
                out[i] = float(p)
        return out


@CONSISTENCY_JUDGES.register("likelihood")
class LikelihoodJudge:
    """GRPO-CARE: p = min(exp(mean log π_EMA(answer | question, image, thinking)), p_max).

    decay / every: the EMA reference (0.995, every 10 optimizer steps) [code, GRPO-CARE].
    p_max: clamp (0.95) so one over-confident rollout does not set the group's bar.
    """

    name = "likelihood"

    def __init__(self, model: "torch.nn.Module | None" = None, processor: Any = None, *, decay: float = 0.995,
                 every: int = 10, p_max: float = 0.95, batch_size: int = 8, think_prefilled: bool = False) -> None:
        self.decay, self.every, self.p_max = decay, every, p_max
        self.batch_size, self.think_prefilled = batch_size, think_prefilled
        self.model: "torch.nn.Module | None" = None
        self.processor = None
        self.ema: "EMAReference | None" = None
        if model is not None:
            self.attach(model, processor)

    def attach(self, model: "torch.nn.Module", processor: Any) -> None:
        """Use ``model`` (the policy being trained) and start its EMA from its current weights."""
        from mmrlvr.consistency.likelihood import EMAReference

        if processor is None:
            raise UserError("likelihood consistency judge: attach() needs the model's processor or tokenizer")
        self.model, self.processor = model, processor
        self.ema = EMAReference(model, self.decay, self.every)

    def on_optimizer_step(self, model: "torch.nn.Module", step: int) -> bool:
        """Call after each optimizer step (``step`` = steps done); updates the EMA every ``every`` steps."""
        if self.ema is None:
            raise UserError("likelihood consistency judge: on_optimizer_step() before attach()")
        return self.ema.maybe_update(model, step)

    def p_consistent(self, completions: Sequence[Completion], samples: Sequence[Sample]) -> list[float | None]:
        _check_lengths(completions, samples)
        if self.model is None or self.ema is None:
            raise UserError("the 'likelihood' consistency judge needs the policy: the trainer must call "
                            "attach(model, processor) before scoring (GRPO-CARE scores under an EMA of the policy)")
        from mmrlvr.consistency.likelihood import answer_likelihoods

        with self.ema.applied(self.model):
            return answer_likelihoods(self.model, self.processor, completions, samples, p_max=self.p_max,
                                      batch_size=self.batch_size, think_prefilled=self.think_prefilled)
