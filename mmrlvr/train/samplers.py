"""Prompt samplers: which prompts each step draws (``rollout.sampler`` + ``rollout.sampler_params``).

A sampler is a registered class built once per run with ``(n, batch_size, seed, **params)``:

- ``indices(step, round)`` returns the *global* batch of step ``step`` (``batch_size`` dataset indices; round r > 0
  is a dynamic-sampling refill round and should draw other prompts). Every process calls it with the same
  arguments and must get the same answer: each takes its contiguous share.
- ``observe(outcome)`` is called after every step with the step's prompts and their rewards (``StepOutcome``,
  gathered from every process, so every rank's sampler sees the same numbers and stays identical). A curriculum
  or a budget allocator learns here.
- ``state_dict()`` / ``load_state_dict(state)`` put what it learned in checkpoints, so a resumed run draws exactly
  what an uninterrupted one would.

The built-in ``uniform`` (also registered as ``shuffle``, its old name) draws a fresh permutation of the data per
epoch, a pure function of (seed, step): it has no state. ``disagreement`` (SGAC) learns which prompts' answers
disagree. No torch here: the sampler's names and parameters are checked at config load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import math
import random

from mmrlvr.methods import Param, declare
from mmrlvr.registry import Registry
from mmrlvr.train.data import DataOrder


@dataclass
class StepOutcome:
    """What a step learned about its prompts, over every process (in rank order)."""

    step: int
    prompts: list[int]  # dataset index of each of the step's prompts
    rewards: list[list[float]]  # [prompts][G] total reward of each rollout (after shaping)
    accuracy: list[list[float]] | None = None  # [prompts][G] 1.0 where the verifier judged the answer right
    answers: list[list[str | None]] | None = None  # [prompts][G] each rollout's final answer (None: unparsable)


class Sampler:
    """Base class: a stateless sampler needs only ``indices``."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed

    def indices(self, step: int, round: int = 0) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from a finished step (default: nothing)."""

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


#: name -> Sampler subclass (config key ``rollout.sampler``)
SAMPLERS: Registry[type[Sampler]] = Registry("prompt sampler")


@SAMPLERS.register("uniform")
@SAMPLERS.register("shuffle")
class ShuffleSampler(Sampler):
    """A fresh permutation of the data per epoch, seeded by (seed, epoch); refill round r > 0 walks an order of its
    own (seeded by seed and r), so its prompts differ from round 0's and every process and a resumed run agree."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        super().__init__(n, batch_size, seed)
        self._orders: dict[int, DataOrder] = {0: DataOrder(n, batch_size, seed)}

    def indices(self, step: int, round: int = 0) -> list[int]:
        if round not in self._orders:
            self._orders[round] = DataOrder(self.n, self.batch_size, self.seed * 1_000_003 + round)
        return self._orders[round].indices(step)


declare("sampler", "uniform", "a fresh permutation of the training data per epoch (stateless; the default)")
declare("sampler", "shuffle", "the old name of uniform")


def answer_entropy(answers: list[str | None]) -> float:
    """Shannon entropy (nats) of a group's final answers: −Σ_a (c_a/G)·ln(c_a/G) over distinct answers, compared
    after light normalisation (case, spaces, numbers as numbers: ``mmrlvr.evaluation.normalise_answer``); an
    unparsable answer (None) is one more category of its own [ours]. 0 when every answer agrees, ln G at most."""
    from collections import Counter

    from mmrlvr.evaluation import normalise_answer

    if not answers:
        return 0.0
    counts = Counter(None if a is None else normalise_answer(str(a)) for a in answers)
    g = len(answers)
    return -sum(c / g * math.log(c / g) for c in counts.values())


@SAMPLERS.register("disagreement")
class DisagreementSampler(Sampler):
    """SGAC-style disagreement curriculum (arXiv 2605.01823; no official code is public): prompts whose last G
    final answers disagree most are drawn most.

    Per prompt the entropy H of its last group's final answers (``answer_entropy``; the paper's strongest predictor
    of later gains); a prompt's weight is max(H / ln G, ``floor``), so every prompt keeps a chance (``floor``
    0.05 [ours: the paper gives no floor value]). Each step first takes prompts never seen (in a seeded
    permutation, so the curriculum starts from the whole set), then draws the rest without replacement with
    probability proportional to the weights (Efraimidis–Spirakis keys from a generator seeded by seed, step and
    round: every process and a resumed run draw the same). Refill rounds exclude the step's earlier rounds'
    prompts. State in checkpoints: each seen prompt's entropy.
    """

    def __init__(self, n: int, batch_size: int, seed: int, floor: float = 0.05) -> None:
        super().__init__(n, batch_size, seed)
        if not 0.0 < float(floor) <= 1.0:
            raise ValueError(f"disagreement: floor must be in (0, 1], got {floor}")
        self.floor = float(floor)
        self.entropy: dict[int, float] = {}  # prompt index -> entropy of its last group's answers (normalised)
        order = list(range(n))
        random.Random(seed * 7_919 + 17).shuffle(order)
        self._order = order  # unseen prompts are taken in this order

    def weight(self, i: int) -> float:
        return max(self.entropy.get(i, 0.0), self.floor)

    def indices(self, step: int, round: int = 0) -> list[int]:
        exclude: set[int] = set()
        for r in range(round):
            exclude.update(self.indices(step, r))
        k = self.batch_size
        out = [i for i in self._order if i not in self.entropy and i not in exclude][:k]
        rest = [i for i in range(self.n) if i in self.entropy and i not in exclude and i not in out]
        rng = random.Random((self.seed * 1_000_003 + step) * 101 + round)
        keys = sorted(((rng.random() ** (1.0 / self.weight(i)), i) for i in rest), reverse=True)
        out += [i for _, i in keys[:k - len(out)]]
        if len(out) < self.batch_size:  # fewer prompts than a batch: repeat, as the uniform sampler's epochs do
            out += [out[j % len(out)] for j in range(self.batch_size - len(out))] if out else []
        return out

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.answers is None:
            return
        for i, answers in zip(outcome.prompts, outcome.answers):
            if i >= 0 and answers:
                g = len(answers)
                self.entropy[i] = answer_entropy(answers) / math.log(g) if g > 1 else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"entropy": dict(self.entropy)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entropy = {int(k): float(v) for k, v in (state or {}).get("entropy", {}).items()}


declare("sampler", "disagreement", "SGAC: unseen prompts first, then prompts drawn in proportion to the entropy of "
        "their last group's final answers",
        Param("floor", 0.05, "the smallest weight (of the normalised entropy H / ln G), so every prompt keeps a "
              "chance", "in (0, 1]", lambda v: 0 < v <= 1),
        source="arXiv:2605.01823")


def build_sampler(name: str, n: int, batch_size: int, seed: int, params: dict[str, Any]) -> Sampler:
    """The sampler ``name`` for ``n`` samples, ``batch_size`` prompts per step."""
    return SAMPLERS.get(name)(n, batch_size, seed, **params)
