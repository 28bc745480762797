"""A scripted policy for multi-turn tests: every model turn writes given text, with the model's own log-probs.

``scripted_sampler(tokenizer, turns)`` returns a ``RowSampler`` stand-in whose n-th instance (one per model turn of
each trajectory, in order) forces the tokens of ``turns[n % len(turns)]`` followed by the end-of-turn token. It
records log pi(token) from the real logits, like ``RowSampler``, so trainer/sampler log-prob checks still test the
model.
"""

from __future__ import annotations

import itertools

import torch

from mmrlvr.rollout.sampling import RowSampler


def scripted_sampler(tokenizer, turns: list[str]) -> type:
    scripts = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
               for t in turns]
    counter = itertools.count()

    class Scripted(RowSampler):
        def __init__(self, seeds, params, device="cpu", banned_ids=None):
            super().__init__(seeds, params, device=device, banned_ids=banned_ids)
            self.script = scripts[next(counter) % len(scripts)]

        def __call__(self, input_ids, scores):
            logits = scores.float() / self.params.temperature
            logprobs = torch.log_softmax(logits, dim=-1)
            j = len(self.tokens)
            token = self.script[min(j, len(self.script) - 1)]
            chosen = torch.full((scores.shape[0],), token, dtype=torch.long, device=scores.device)
            self.tokens.append(chosen)
            self.logprobs.append(logprobs.gather(-1, chosen[:, None]).squeeze(-1))
            out = torch.full_like(scores, float("-inf"))
            return out.scatter_(-1, chosen[:, None], 0.0)

    return Scripted
