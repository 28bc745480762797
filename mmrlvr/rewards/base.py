"""The reward-function contract and its registry.

A reward is a callable ``(completion: Completion, sample: Sample) -> RewardResult``. Rewards with
parameters are classes: the registry holds *factories*, ``REWARDS.get(name)(**params)`` returns the
callable. A reward that is cheaper in batches (model judges) may also define
``score_batch(completions, samples) -> list[RewardResult]``; ``score_batch`` below uses it when present.

Rewards never see trainer internals; they get the sample's images and metadata through ``Sample``.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from mmrlvr.registry import Registry
from mmrlvr.types import Completion, RewardResult, Sample


class RewardFn(Protocol):
    def __call__(self, completion: Completion, sample: Sample) -> RewardResult: ...


#: name -> factory(**params) -> RewardFn
REWARDS: Registry[Callable[..., RewardFn]] = Registry("reward")


def build_reward(name: str, **params: Any) -> RewardFn:
    """Instantiate a registered reward by name (unknown names list the known ones)."""
    return REWARDS.get(name)(**params)


def score_batch(fn: RewardFn, completions: Sequence[Completion], samples: Sequence[Sample]) -> list[RewardResult]:
    """Score a batch, using ``fn.score_batch`` when the reward has one."""
    if len(completions) != len(samples):
        raise ValueError(f"{len(completions)} completions for {len(samples)} samples")
    batch = getattr(fn, "score_batch", None)
    if batch is not None:
        return list(batch(list(completions), list(samples)))
    return [fn(c, s) for c, s in zip(completions, samples)]
