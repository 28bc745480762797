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

The built-in ``shuffle`` draws a fresh permutation of the data per epoch, a pure function of (seed, step): it has
no state. No torch here: the sampler's names and parameters are checked at config load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmrlvr.methods import declare
from mmrlvr.registry import Registry
from mmrlvr.train.data import DataOrder


@dataclass
class StepOutcome:
    """What a step learned about its prompts, over every process (in rank order)."""

    step: int
    prompts: list[int]  # dataset index of each of the step's prompts
    rewards: list[list[float]]  # [prompts][G] total reward of each rollout (after shaping)
    accuracy: list[list[float]] | None = None  # [prompts][G] 1.0 where the verifier judged the answer right


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


declare("sampler", "shuffle", "a fresh permutation of the training data per epoch (stateless)")


def build_sampler(name: str, n: int, batch_size: int, seed: int, params: dict[str, Any]) -> Sampler:
    """The sampler ``name`` for ``n`` samples, ``batch_size`` prompts per step."""
    return SAMPLERS.get(name)(n, batch_size, seed, **params)
