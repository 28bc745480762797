"""GRPO-CARE's likelihood consistency: how probable is the answer given the question and the thinking,
under a slowly moving (EMA) copy of the policy.

p_i = exp(mean_t log π_ref(a_t | question, image, thinking, a_<t)), clamped to ≤ 0.95 [code, GRPO-CARE].
A high p says the thinking leads to this answer; a reference that lags the policy (EMA, decay 0.995,
updated every 10 optimizer steps) makes the signal hard to game by the policy itself.

- ``EMAReference`` keeps an EMA of the *trainable* parameters only (for LoRA: the adapter weights), in
  float32, and swaps them into the live model for a forward (``with ema.applied(model): …``). No second
  model is held in memory; the swap is exact (the policy's tensors are put back untouched).
- ``answer_probs`` is the pure tensor part: logits -> p_i.
- ``build_answer_inputs`` / ``answer_likelihoods`` turn (Sample, Completion) pairs into a teacher-forced
  batch: chat-templated prompt (with images) + the response up to the answer, then the answer tokens.
  Rows are laid out as in ``mmrlvr.rollout.base``: left-padded prefix of P tokens, answer tokens after it,
  so answer token j is predicted at position P-1+j.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from mmrlvr.algos import logprobs_from_logits
from mmrlvr.consistency.verify import parse_response
from mmrlvr.models.placement import model_device, to_model
from mmrlvr.types import Completion, Sample

__all__ = ["EMAReference", "answer_probs", "AnswerBatch", "build_answer_inputs", "answer_likelihoods"]


class EMAReference:
    """Exponential moving average of a model's trainable parameters, usable as a reference policy.

    ema <- decay * ema + (1 - decay) * θ, applied by ``maybe_update(model, step)`` whenever ``step`` (the
    number of optimizer steps done, 1-based) is a multiple of ``every``. Starts equal to the model's
    parameters at construction (the warm start). Kept in float32 whatever the parameters' dtype: in bf16 a
    0.005 step would round away.
    """

    def __init__(self, model: torch.nn.Module, decay: float = 0.995, every: int = 10) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA decay must be in [0, 1], got {decay}")
        if every < 1:
            raise ValueError(f"EMA 'every' must be >= 1, got {every}")
        self.decay, self.every = float(decay), int(every)
        self.shadow: dict[str, torch.Tensor] = {
            name: p.detach().to(torch.float32).clone() for name, p in model.named_parameters() if p.requires_grad}
        if not self.shadow:
            raise ValueError("EMAReference: the model has no trainable parameters")
        self.num_updates = 0

    def _params(self, model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
        params = dict(model.named_parameters())
        missing = [n for n in self.shadow if n not in params]
        if missing:
            raise ValueError(f"EMAReference: model lacks parameters {missing[:5]} (a different model?)")
        return {n: params[n] for n in self.shadow}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """One EMA step towards the model's current parameters."""
        for name, p in self._params(model).items():
            self.shadow[name].lerp_(p.detach().to(torch.float32), 1.0 - self.decay)
        self.num_updates += 1

    def maybe_update(self, model: torch.nn.Module, step: int) -> bool:
        """Update when ``step`` (optimizer steps done) is a positive multiple of ``every``; say whether it did."""
        if step > 0 and step % self.every == 0:
            self.update(model)
            return True
        return False

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """Within the block the model computes with the EMA weights; afterwards its own are back."""
        params = self._params(model)
        saved = {}
        with torch.no_grad():
            for name, p in params.items():
                saved[name] = p.data
                p.data = self.shadow[name].to(device=p.device, dtype=p.dtype, copy=True)
        try:
            yield model
        finally:
            with torch.no_grad():
                for name, p in params.items():
                    p.data = saved[name]

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "every": self.every, "num_updates": self.num_updates,
                "shadow": {k: v.clone() for k, v in self.shadow.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state["shadow"]) != set(self.shadow):
            raise ValueError("EMAReference state does not match this model's trainable parameters")
        self.decay, self.every = float(state["decay"]), int(state["every"])
        self.num_updates = int(state["num_updates"])
        self.shadow = {k: v.to(torch.float32).clone() for k, v in state["shadow"].items()}


def answer_probs(logits: torch.Tensor, answer_ids: torch.Tensor, answer_mask: torch.Tensor,
                 p_max: float = 0.95) -> torch.Tensor:
    """p_i = min(exp(mean_t log softmax(logits)[a_t]), p_max) over each row's answer tokens.

    logits:      [N, A, V] logits predicting answer token t (already shifted: row position P-1+t)
    answer_ids:  [N, A] long (anything where masked)
    answer_mask: [N, A] float/bool, 1 on real answer tokens
    returns      [N] float; NaN for rows without answer tokens (cannot be judged)
    """
    logp = logprobs_from_logits(logits, answer_ids)  # [N, A]
    mask = answer_mask.to(logp.dtype)
    n = mask.sum(-1)  # [N]
    mean = (logp * mask).sum(-1) / n.clamp(min=1)
    p = mean.exp().clamp(max=p_max)
    return torch.where(n > 0, p, torch.full_like(p, float("nan")))


@dataclass
class AnswerBatch:
    """Teacher-forcing inputs for answer likelihoods. N rows that had an answer.

    rows:         indices (into the caller's lists) of the rows present
    inputs:       model kwargs: input_ids [N, P+A], attention_mask [N, P+A], and vision tensors
    answer_ids:   [N, A] long, answer tokens right-padded
    answer_mask:  [N, A] float
    prefix_length: P
    """

    rows: list[int]
    inputs: dict[str, Any]
    answer_ids: torch.Tensor
    answer_mask: torch.Tensor
    prefix_length: int


def _tokenizer(processor: Any) -> Any:
    return getattr(processor, "tokenizer", processor)


def build_answer_inputs(processor: Any, completions: Sequence[Completion], samples: Sequence[Sample],
                        think_prefilled: bool = False) -> AnswerBatch:
    """Prompt (chat template + images) + response up to the answer, then the answer tokens.

    Rows whose response has no usable answer are left out (``rows`` lists the kept ones). The answer is
    the text inside ``<answer>…</answer>``; everything before it in the response (thinking, tags) is
    conditioning. Works with a VLM processor (images) or a bare tokenizer (text-only samples).
    """
    tok = _tokenizer(processor)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    rows, prefixes, answers, token_rows, vision_rows = [], [], [], [], []
    for i, (c, s) in enumerate(zip(completions, samples)):
        parsed = parse_response(c.text, think_prefilled)
        if parsed.answer is None or parsed.answer_span is None:
            continue
        a0, a1 = parsed.answer_span
        prompt = processor.apply_chat_template(s.messages, add_generation_prompt=True, tokenize=False)
        text = prompt + c.text[:a0]
        if s.images:
            enc = processor(text=[text], images=list(s.images), return_tensors="pt")
        else:
            enc = tok([text], return_tensors="pt")
        ans = tok(c.text[a0:a1], add_special_tokens=False)["input_ids"]
        if not ans:
            continue
        length = enc["input_ids"].shape[1]
        rows.append(i)
        prefixes.append(enc["input_ids"][0])
        answers.append(torch.tensor(ans, dtype=torch.long))
        # per-token extras ([1, P], e.g. mm_token_type_ids) are padded like input_ids; the rest is vision
        token_rows.append({k: v[0] for k, v in enc.items() if k not in ("input_ids", "attention_mask")
                           and torch.is_tensor(v) and v.dim() == 2 and tuple(v.shape) == (1, length)})
        vision_rows.append({k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")
                            and k not in token_rows[-1]})
    if not rows:
        return AnswerBatch([], {}, torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0), 0)
    P = max(len(p) for p in prefixes)
    A = max(len(a) for a in answers)
    n = len(rows)
    input_ids = torch.full((n, P + A), pad_id, dtype=torch.long)
    attention = torch.zeros((n, P + A), dtype=torch.long)
    answer_ids = torch.full((n, A), pad_id, dtype=torch.long)
    answer_mask = torch.zeros((n, A))
    token_keys = sorted({k for t in token_rows for k in t})
    per_token = {k: torch.zeros((n, P + A), dtype=torch.long) for k in token_keys}
    for r, (p, a) in enumerate(zip(prefixes, answers)):
        input_ids[r, P - len(p):P] = p  # left-padded prefix
        attention[r, P - len(p):P] = 1
        input_ids[r, P:P + len(a)] = a  # answer right after it, right-padded
        attention[r, P:P + len(a)] = 1
        answer_ids[r, :len(a)] = a
        answer_mask[r, :len(a)] = 1.0
        for k, v in token_rows[r].items():  # the answer is text: zeros there (as RolloutBatch does)
            per_token[k] = per_token[k].to(v.dtype)
            per_token[k][r, P - len(p):P] = v
    inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention, **per_token}
    keys = {k for v in vision_rows for k in v}
    for k in sorted(keys):  # the Qwen processors concatenate image patches / grids along dim 0
        parts = [v[k] for v in vision_rows if k in v]
        inputs[k] = torch.cat(parts, dim=0)
    return AnswerBatch(rows, inputs, answer_ids, answer_mask, P)


@torch.no_grad()
def answer_likelihoods(model: torch.nn.Module, processor: Any, completions: Sequence[Completion],
                       samples: Sequence[Sample], *, p_max: float = 0.95, batch_size: int = 8,
                       think_prefilled: bool = False) -> list[float | None]:
    """p_i (see ``answer_probs``) for each completion under ``model`` as it is now; None without an answer.

    Call it inside ``EMAReference.applied(model)`` to score under the EMA reference. Runs in eval mode
    (restored afterwards) and in chunks of ``batch_size`` rows.
    """
    out: list[float | None] = [None] * len(completions)
    was_training = model.training
    model.eval()
    device = model_device(model)
    try:
        for start in range(0, len(completions), batch_size):
            chunk = build_answer_inputs(processor, completions[start:start + batch_size],
                                        samples[start:start + batch_size], think_prefilled)
            if not chunk.rows:
                continue
            inputs = to_model(chunk.inputs, model)
            A = chunk.answer_ids.shape[1]
            logits = model(**inputs, logits_to_keep=A + 1, use_cache=False).logits[:, :-1, :]  # [N, A, V]
            p = answer_probs(logits.float(), chunk.answer_ids.to(device), chunk.answer_mask.to(device), p_max)
            for r, value in zip(chunk.rows, p.tolist()):
                out[start + r] = None if value != value else float(value)
    finally:
        model.train(was_training)
    return out
