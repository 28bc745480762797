"""Multi-turn rollouts with tools that return images ("thinking with images").

A trajectory alternates the model's turns and tool turns: the model generates until it ends its turn; when that
turn holds ``<tool_call>`` blocks (``mmrlvr.tools.calls``), each call runs (``mmrlvr.tools.runner.run_call``: any
failure is a counted error message, never an exception), the answers go back through the chat template as ``tool``
messages with their images, and the model continues — up to ``max_turns`` model turns and ``max_tokens`` response
tokens (model and tool tokens together) per trajectory.

The trajectory is laid out like a one-turn response (``mmrlvr.rollout.base``): ``[left-padded prompt] +
[turn 1, tool turn 1, turn 2, ...]``, so every later stage works on it unchanged. What differs:

- ``response_mask`` is 1 on the model's own tokens only: tool turns (their text and image tokens) carry no loss
  and no credit; ``attention_mask`` is 1 on every real token, tool tokens included;
- a row's images are its prompt's followed by every image a tool returned, in the order they appear in the
  sequence; ``vision`` holds them row by row in the processor's layout (``image_grid_thw`` one row per image), so
  a teacher-forced forward of the whole sequence sees what the sampler saw;
- each ``Completion`` carries its turns (``meta["turns"]``: every turn's text, span, calls and their results);
  its ``text`` is the final model turn (what answer, format and consistency rewards read).

The HF engine keeps each trajectory's KV cache across its turns: a tool turn is prefilled on top of the cache
(``generate(cache=...)`` runs only the uncached tokens; transformers recomputes the 3D positions when they hold
new images) and the returned images go through the vision tower once, their features handed to the model
(``mm_encoder_outputs``) — so a turn costs its own tokens, not the whole history again. Trajectories run one row at
a time (rows' histories diverge after the first call); each row samples with its own generator seeded from
(seed, step, prompt id, sample index, turn), so every process and a resumed run draw the same trajectories.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mmrlvr.rollout.base import RolloutBatch, SamplingParams
from mmrlvr.tools.base import ToolContext, ToolResult, tool_schema
from mmrlvr.tools.calls import parse_tool_calls
from mmrlvr.tools.runner import MAX_IMAGE_PIXELS, ToolCounters, error_text, run_call
from mmrlvr.types import Completion, Sample

#: a stand-in for the model's turn when rendering where a tool turn starts (never tokenized)
_SENTINEL = "\u2063MMRLVR-TURN-END\u2063"


@dataclass
class ToolUse:
    """How a multi-turn rollout runs: the tools offered (name -> function), turn and token limits, tool budgets."""

    tools: dict[str, Callable[..., Any]]
    max_turns: int = 4
    max_tokens: int = 1024  # response tokens per trajectory: model turns + tool turns (image tokens included)
    time_budget_s: float = 10.0
    max_image_pixels: int = MAX_IMAGE_PIXELS
    counters: ToolCounters = field(default_factory=ToolCounters)

    def schemas(self) -> list[dict[str, Any]]:
        return [tool_schema(fn) for fn in self.tools.values()]


@dataclass
class Turn:
    """One turn of a trajectory. kind: "model" | "tool"; start/end: its span in the response (token positions);
    calls: for a tool turn, each call's name, arguments and error (None when it ran); images: indices of the
    images it returned in the row's image list (prompt images first)."""

    kind: str
    start: int
    end: int
    text: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    images: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "end": self.end, "text": self.text, "calls": self.calls,
                "images": self.images}


def tool_turn_text(processor: Any, results: list[ToolResult], eos_text: str) -> str:
    """The text the chat template puts between the end of the model's turn (its end-of-turn token, which the model
    sampled) and the start of its next turn, for one tool message per result (images as image parts)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}]
    for r in results:
        parts: list[dict[str, Any]] = [{"type": "image"} for _ in r.images]
        parts.append({"type": "text", "text": r.text if r.ok else error_text(r)})
        messages.append({"role": "tool", "content": parts})
    rendered = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    after = rendered[rendered.index(_SENTINEL) + len(_SENTINEL):]
    if not after.startswith(eos_text):
        raise ValueError(f"the chat template does not end an assistant turn with {eos_text!r} (the end-of-turn token "
                         f"the model samples); multi-turn rollouts need it")
    return after[len(eos_text):]


@dataclass
class _Row:
    """One trajectory being built."""

    ids: torch.Tensor  # [1, T] the whole sequence so far (left-padded prompt first)
    mask: torch.Tensor  # [1, T]
    types: torch.Tensor | None  # [1, T] mm_token_type_ids when the processor gives them
    grids: list[torch.Tensor]  # per image [3]
    pixels: list[torch.Tensor]  # per image its patch rows
    features: list[Any]  # per image ImageFeatures (when the model takes precomputed features)
    images: list[Any]  # PIL images, prompt's then returned
    response: list[int] = field(default_factory=list)
    loss_mask: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    finish: str = "stop"


def generate_multiturn(engine: Any, samples: list[Sample], group_size: int, params: SamplingParams, use: ToolUse, *,
                       seed: int, step: int) -> RolloutBatch:
    """G multi-turn trajectories for each of B prompts with an ``HFEngine`` (its model, processor and ids)."""
    from mmrlvr.rollout.hf import PATCH_KEYS, encode_prompt_batch
    from mmrlvr.rollout.vision import encode_images, supports_precomputed_vision

    model, processor, tok = engine.model, engine.processor, engine.tokenizer
    t0 = time.perf_counter()
    inputs = encode_prompt_batch(processor, samples, tools=use.schemas())
    P = int(inputs["input_ids"].shape[1])
    grid_all = inputs.get("image_grid_thw")
    per_image_rows = grid_all.prod(-1).tolist() if grid_all is not None else []
    offsets = [0]
    for r in per_image_rows:
        offsets.append(offsets[-1] + int(r))
    precomputed = supports_precomputed_vision(model) and "pixel_values" in inputs
    features = encode_images(model, inputs["pixel_values"], grid_all) if precomputed else []
    eos_text = tok.decode([engine.eos_ids[0]])
    rows: list[_Row] = []
    was_training = model.training
    model.eval()
    t1 = time.perf_counter()
    try:
        image_cursor = 0
        for b, s in enumerate(samples):
            k = len(s.images)
            mine = list(range(image_cursor, image_cursor + k))
            image_cursor += k
            for g in range(group_size):
                row = _Row(ids=inputs["input_ids"][b:b + 1], mask=inputs["attention_mask"][b:b + 1],
                           types=inputs["mm_token_type_ids"][b:b + 1] if "mm_token_type_ids" in inputs else None,
                           grids=[grid_all[i] for i in mine],
                           pixels=[inputs["pixel_values"][offsets[i]:offsets[i + 1]] for i in mine],
                           features=[features[i] for i in mine] if precomputed else [],
                           images=list(s.images))
                _run_trajectory(engine, row, s, g, params, use, seed=seed, step=step, eos_text=eos_text,
                                precomputed=precomputed, P=P)
                rows.append(row)
    finally:
        model.train(was_training)
    t2 = time.perf_counter()
    batch = _assemble(engine, samples, group_size, rows, P, inputs, PATCH_KEYS)
    batch.timings = {"processor_s": t1 - t0, "generate_s": t2 - t1, "total_s": time.perf_counter() - t0}
    if precomputed:
        batch.image_features = [f for r in rows for f in r.features]
    return batch


@torch.no_grad()
def _run_trajectory(engine: Any, row: _Row, sample: Sample, g: int, params: SamplingParams, use: ToolUse, *,
                    seed: int, step: int, eos_text: str, precomputed: bool, P: int) -> None:
    from transformers import LogitsProcessorList

    from mmrlvr.models.placement import model_device, to_model
    from mmrlvr.rollout.sampling import RowSampler, row_seed
    from mmrlvr.rollout.vision import encode_images, encoder_outputs

    model, processor, tok = engine.model, engine.processor, engine.tokenizer
    device = model_device(model)
    cache = None
    fresh = len(row.features) if precomputed else len(row.pixels)  # images not yet seen by the model (the last ones)
    for turn in range(use.max_turns):
        left = use.max_tokens - len(row.response)
        if left <= 0:
            row.finish = "length"
            return
        key = sample.id if turn == 0 else f"{sample.id}/turn{turn}"
        sampler = RowSampler([row_seed(seed, step, key, g)], params, device=device, banned_ids=engine.banned_ids)
        config = engine._generation_config(SamplingParams(max_new_tokens=min(params.max_new_tokens, left)))
        config.return_dict_in_generate = True
        kwargs: dict[str, Any] = {"input_ids": row.ids, "attention_mask": row.mask}
        if row.types is not None:
            kwargs["mm_token_type_ids"] = row.types
        if row.grids:
            kwargs["image_grid_thw"] = torch.stack(row.grids)
        if fresh:
            if precomputed:
                kwargs["mm_encoder_outputs"] = encoder_outputs(row.features[len(row.features) - fresh:])
            elif cache is None:
                kwargs["pixel_values"] = torch.cat(row.pixels)
        if cache is not None:
            kwargs["cache"] = cache
        kwargs = to_model(kwargs, model)
        with engine._own_generation_defaults():
            out = model.generate(**kwargs, generation_config=config, logits_processor=LogitsProcessorList([sampler]))
        cache = getattr(out, "cache", None) or out.past_key_values
        new = out.sequences[0, row.ids.shape[1]:].cpu()
        n = int(new.shape[0])
        lps = torch.stack(sampler.logprobs[:n], dim=1)[0].float().cpu().tolist() if n else []
        start = len(row.response)
        row.response += new.tolist()
        row.loss_mask += [1.0] * n
        row.logprobs += lps
        row.ids = torch.cat([row.ids, new[None]], dim=1)
        row.mask = torch.cat([row.mask, torch.ones(1, n, dtype=row.mask.dtype)], dim=1)
        if row.types is not None:
            row.types = torch.cat([row.types, torch.zeros(1, n, dtype=row.types.dtype)], dim=1)
        fresh = 0
        text = tok.decode(new.tolist(), skip_special_tokens=True)
        row.turns.append(Turn("model", start, len(row.response), text))
        ended = n > 0 and int(new[-1]) in engine.eos_ids
        if not ended:
            row.finish = "length"
            return
        calls = parse_tool_calls(text)
        if not calls:
            row.finish = "stop"
            return
        if turn == use.max_turns - 1:
            row.finish = "turns"  # it asked for a tool with no turn left to read the answer
            return
        context = ToolContext(images=list(row.images), tools_kwargs=dict(sample.meta.get("tools_kwargs") or {}),
                              sample_id=sample.id)
        results = [run_call(c, use.tools, context, time_budget_s=use.time_budget_s,
                            max_image_pixels=use.max_image_pixels, counters=use.counters) for c in calls]
        returned = [im for r in results if r.ok for im in r.images]
        delta_text = tool_turn_text(processor, [r if r.ok else ToolResult(error=r.error) for r in results], eos_text)
        enc = processor(text=[delta_text], images=[returned] if returned else None, return_tensors="pt")
        d_ids = enc["input_ids"]
        d = int(d_ids.shape[1])
        if len(row.response) + d >= use.max_tokens:  # no room for the tool turn and an answer after it
            row.finish = "length"
            return
        start = len(row.response)
        row.response += d_ids[0].tolist()
        row.loss_mask += [0.0] * d
        row.logprobs += [0.0] * d
        row.ids = torch.cat([row.ids, d_ids], dim=1)
        row.mask = torch.cat([row.mask, torch.ones(1, d, dtype=row.mask.dtype)], dim=1)
        if row.types is not None:
            types = enc.get("mm_token_type_ids")
            row.types = torch.cat([row.types, types if types is not None else torch.zeros(1, d, dtype=row.types.dtype)],
                                  dim=1)
        first_new = len(row.images)
        if returned:
            grid = enc["image_grid_thw"]
            rows_per = grid.prod(-1).tolist()
            cut = [0]
            for r in rows_per:
                cut.append(cut[-1] + int(r))
            row.grids += [grid[i] for i in range(grid.shape[0])]
            row.pixels += [enc["pixel_values"][cut[i]:cut[i + 1]] for i in range(grid.shape[0])]
            row.images += returned
            if precomputed:
                row.features += encode_images(model, enc["pixel_values"], grid)
            fresh = len(returned)
            if not precomputed:
                cache = None  # without precomputed features the model must see every image's pixels again
        row.turns.append(Turn("tool", start, len(row.response), delta_text,
                              calls=[{"name": c.name, "arguments": c.arguments, "error": r.error}
                                     for c, r in zip(calls, results)],
                              images=list(range(first_new, len(row.images)))))
    row.finish = "turns"


def _assemble(engine: Any, samples: list[Sample], group_size: int, rows: list[_Row], P: int, inputs: dict[str, Any],
              patch_keys: dict[str, str]) -> RolloutBatch:
    """The trajectories as one ``RolloutBatch``: prompt left-padded to P, response (all turns) right-padded."""
    from mmrlvr.rollout.batch import pad_rows

    n = len(rows)
    response_ids = pad_rows([r.response for r in rows], engine.pad_id, torch.long)
    L = int(response_ids.shape[1])
    response_mask = pad_rows([r.loss_mask for r in rows], 0.0, torch.float)
    old_logprobs = pad_rows([r.logprobs for r in rows], 0.0, torch.float)
    real = pad_rows([[1] * len(r.response) for r in rows], 0, torch.long)
    if L == 0:
        response_ids = torch.zeros(n, 0, dtype=torch.long)
        response_mask, old_logprobs, real = torch.zeros(n, 0), torch.zeros(n, 0), torch.zeros(n, 0, dtype=torch.long)
    prompt_ids = torch.cat([r.ids[:, :P] for r in rows])
    prompt_mask = torch.cat([r.mask[:, :P] for r in rows])
    vision: dict[str, Any] = {}
    if any(r.grids for r in rows):
        vision["pixel_values"] = torch.cat([p for r in rows for p in r.pixels])
        vision["image_grid_thw"] = torch.stack([gr for r in rows for gr in r.grids])
    if rows and rows[0].types is not None:
        vision["mm_token_type_ids"] = pad_rows([r.types[0].tolist() for r in rows], 0, rows[0].types.dtype)
    for key, value in inputs.items():  # anything else the processor gives per prompt (not per image or token)
        if key in ("input_ids", "attention_mask", "mm_token_type_ids") or key in patch_keys or key in patch_keys.values():
            continue
        if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == len(samples):
            vision[key] = value.repeat_interleave(group_size, dim=0)
    completions = []
    for r in rows:
        model_turns = [t for t in r.turns if t.kind == "model"]
        kept = [t for t, m in zip(r.response, r.loss_mask) if m > 0]
        completions.append(Completion(
            text=model_turns[-1].text if model_turns else "", finish_reason=r.finish, token_ids=kept,
            meta={"logprobs": [lp for lp, m in zip(r.logprobs, r.loss_mask) if m > 0],
                  "turns": [t.as_dict() for t in r.turns], "num_turns": len(model_turns),
                  "tool_calls": sum(len(t.calls) for t in r.turns),
                  "tool_errors": sum(1 for t in r.turns for c in t.calls if c["error"])}))
    return RolloutBatch(
        samples=[s for s in samples for _ in range(group_size)],
        group_index=torch.arange(len(samples)).repeat_interleave(group_size),
        sample_index=torch.arange(group_size).repeat(len(samples)),
        input_ids=torch.cat([prompt_ids, response_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, real], dim=1),
        response_ids=response_ids, response_mask=response_mask, old_logprobs=old_logprobs,
        vision=vision, prompt_length=P, completions=completions,
        turns=[[t.as_dict() for t in r.turns] for r in rows],
        row_images=[list(r.images) for r in rows],
    )
