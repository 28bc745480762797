"""A rollout engine with fixed responses, for tests whose arithmetic needs known completions."""

from __future__ import annotations

import torch

from mmrlvr.rollout.base import RolloutBatch, SamplingParams
from mmrlvr.types import Completion


class ScriptedEngine:
    """Fixed completion texts per (sample id, greedy?)."""

    def __init__(self, greedy: dict[str, str], sampled: dict[str, list[str]]):
        self.greedy, self.sampled = greedy, sampled

    def generate(self, samples, group_size, params: SamplingParams, *, seed, step) -> RolloutBatch:
        texts = []
        for s in samples:
            texts += [self.greedy[s.id]] if params.greedy else self.sampled[s.id][:group_size]
        n = len(texts)
        z = torch.zeros(n, 1)
        return RolloutBatch(samples=[s for s in samples for _ in range(group_size)],
                            group_index=torch.zeros(n, dtype=torch.long), sample_index=torch.zeros(n, dtype=torch.long),
                            input_ids=z.long(), attention_mask=z.long(), response_ids=z.long(), response_mask=z,
                            old_logprobs=z, vision={}, prompt_length=1,
                            completions=[Completion(text=t) for t in texts])

    def sync_weights(self, model):
        pass
