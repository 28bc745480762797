"""Shape: reward transforms and row filters that see the whole batch, applied in priority order.

- ``overlong`` (DAPO soft overlong punishment, arXiv:2503.14476 §3.4): a linear penalty in the last
  ``algo.overlong_cache`` tokens before ``rollout.max_new_tokens``, added to the reward.
- ``mask_truncated`` (DAPO overlong filtering): responses that hit the length limit leave the loss.
- ``dynamic_sampling`` (DAPO §3.2): groups whose rewards are all equal carry no signal and leave the loss
  and its normaliser.

Group-aware reward transforms (majority-vote labels, gating, normalisation) register here too: they read
``batch.results`` / ``batch.rewards`` and ``batch.rollouts.group_index`` and write ``batch.rewards``.
"""

from __future__ import annotations

import torch

from mmrlvr.algos import dynamic_sampling_filter, overlong_penalty
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.stages.base import Stage, register_stage


@register_stage("shape", "overlong", priority=30)
class Overlong(Stage):
    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.overlong_cache > 0

    @classmethod
    def validate(cls, cfg) -> list[str]:
        a = cfg.algo
        if a.overlong_cache < 0 or a.overlong_cache >= cfg.rollout.max_new_tokens:
            return [f"algo.overlong_cache: must be in [0, rollout.max_new_tokens) (got {a.overlong_cache})"]
        return []

    def __call__(self, b: StepBatch) -> None:
        lengths = b.rollouts.response_mask.sum(dim=1)
        a = self.cfg.algo
        b.rewards = b.rewards + overlong_penalty(lengths, self.cfg.rollout.max_new_tokens, a.overlong_cache,
                                                 a.overlong_penalty)


@register_stage("shape", "mask_truncated", priority=20)
class MaskTruncated(Stage):
    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.mask_truncated

    def __call__(self, b: StepBatch) -> None:
        trunc = torch.tensor([c.finish_reason == "length" for c in b.rollouts.completions])
        b.token_weights[trunc] = 0.0


@register_stage("shape", "dynamic_sampling", priority=10)
class DynamicSampling(Stage):
    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.dynamic_sampling

    def __call__(self, b: StepBatch) -> None:
        keep = dynamic_sampling_filter(b.rewards, b.rollouts.group_index)[b.rollouts.group_index]  # [N] bool
        b.token_weights[~keep] = 0.0
