"""A scripted policy for multi-turn tests: every model turn writes given text, with the model's own log-probs.

``scripted_sampler(tokenizer, turns, by_seed)`` returns a ``RowSampler`` stand-in. Multi-turn rollouts build one
sampler per turn over the rows still going, so its n-th instance serves turn n: each row forces the tokens of
``by_seed[its seed]`` when given (``turn_seed`` computes a row's seed for a turn), else of ``turns[n]`` (the last
entry repeats), followed by the end-of-turn token. It records log pi(token) from the real logits, like ``RowSampler``,
so trainer/sampler log-prob checks still test the model.
"""

from __future__ import annotations

import itertools

import torch

from mmrlvr.rollout.sampling import RowSampler, row_seed


def turn_seed(sample_id: str, index: int, turn: int, seed: int = 0, step: int = 0) -> int:
    """The seed ``mmrlvr.rollout.multiturn`` gives sample ``index`` of ``sample_id`` for model turn ``turn``."""
    return row_seed(seed, step, sample_id if turn == 0 else f"{sample_id}/turn{turn}", index)


def scripted_sampler(tokenizer, turns: list[str], by_seed: dict[int, str] | None = None) -> type:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"] + [end]

    counter = itertools.count()
    forced = {k: encode(v) for k, v in (by_seed or {}).items()}

    class Scripted(RowSampler):
        def __init__(self, seeds, params, device="cpu", banned_ids=None):
            super().__init__(seeds, params, device=device, banned_ids=banned_ids)
            n = next(counter)
            default = encode(turns[min(n, len(turns) - 1)])
            self.scripts = [forced.get(s, default) for s in seeds]

        def __call__(self, input_ids, scores):
            logits = scores.float() / self.params.temperature
            logprobs = torch.log_softmax(logits, dim=-1)
            j = len(self.tokens)
            chosen = torch.tensor([sc[min(j, len(sc) - 1)] for sc in self.scripts], dtype=torch.long,
                                  device=scores.device)
            self.tokens.append(chosen)
            self.logprobs.append(logprobs.gather(-1, chosen[:, None]).squeeze(-1))
            out = torch.full_like(scores, float("-inf"))
            return out.scatter_(-1, chosen[:, None], 0.0)

    return Scripted
