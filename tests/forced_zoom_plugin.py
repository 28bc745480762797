"""Test plug-in (``plugins: [tests/forced_zoom_plugin.py]``): the policy's first turn of every multi-turn trajectory
is a zoom call on the prompt's image; every later turn is sampled by the model as usual.

It makes a multi-turn run out of any tiny model (one that never learnt the call) in every process a run starts
(ranks, resumed runs, eval), so training, resume and several processes are tested on real multi-turn sequences:
the tool really runs, its image enters the sequence, and the later turns are the model's own samples. It replaces
``mmrlvr.rollout.sampling.RowSampler``, which only the multi-turn and tree rollouts look up at call time.
"""

from __future__ import annotations

import json

import torch

import mmrlvr.rollout.sampling as sampling

CALL = '<tool_call>\n' + json.dumps({"name": "zoom", "arguments": {"image": 0, "box": [0, 0, 56, 56]}}) + '\n</tool_call>'
_RealSampler = getattr(sampling, "_RealRowSampler", sampling.RowSampler)
sampling._RealRowSampler = _RealSampler


class FirstTurnZooms(_RealSampler):
    """Rows whose sequence is still the prompt alone (one ``<|im_start|>`` per prompt turn, no tool turn yet) are
    forced through ``CALL`` and the end-of-turn token; other rows sample from the model."""

    _ids: dict[int, list[int]] = {}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        chosen = super().__call__(input_ids, scores).argmax(dim=-1)  # the model's own draw (advances the generator)
        tok = _tokenizer()
        start = tok.convert_tokens_to_ids("<|im_start|>")
        script = self._ids.setdefault(id(tok), tok(CALL, add_special_tokens=False)["input_ids"]
                                      + [tok.convert_tokens_to_ids("<|im_end|>")])
        j = len(self.tokens) - 1  # this position within the turn
        first_turn = (input_ids == start).sum(dim=1) <= 3  # system, user, assistant: the prompt alone
        forced = chosen.clone()
        forced[first_turn] = script[min(j, len(script) - 1)]
        logprobs = torch.log_softmax(scores.float() / self.params.temperature, dim=-1)
        self.tokens[-1] = forced
        self.logprobs[-1] = logprobs.gather(-1, forced[:, None]).squeeze(-1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, forced[:, None], 0.0)


_TOKENIZER = {}


def _tokenizer():
    if "tok" not in _TOKENIZER:
        from transformers import AutoTokenizer

        from mmrlvr.train.model_path import resolve_model_path

        _TOKENIZER["tok"] = AutoTokenizer.from_pretrained(resolve_model_path("tiny:qwen2_5_vl:warm"))
    return _TOKENIZER["tok"]


sampling.RowSampler = FirstTurnZooms
