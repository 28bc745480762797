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
(``generate`` with the cache runs only the uncached tokens; transformers recomputes the 3D positions when they hold
new images) and the returned images go through the vision tower once, their features handed to the model
(``mm_encoder_outputs``) — so a turn costs its own tokens, not the whole history again. All rows advance turn by
turn in one batch (``generate_multiturn``); each row samples with its own generator seeded from (seed, step, prompt
id, sample index, turn), so every process and a resumed run draw the same trajectories.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mmrlvr.models.cache_arg import continues_with_new_images, output_cache, with_cache
from mmrlvr.rollout.base import RolloutBatch, SamplingParams
from mmrlvr.run_settings import TOOL_DEFAULTS
from mmrlvr.tools.base import ToolContext, ToolResult, tool_schema
from mmrlvr.tools.calls import parse_tool_calls
from mmrlvr.tools.runner import ToolCounters, error_text, run_call
from mmrlvr.types import Completion, Sample

#: a stand-in for the model's turn when rendering where a tool turn starts (never tokenized)
_SENTINEL = "\u2063MMRLVR-TURN-END\u2063"


@dataclass
class ToolUse:
    """How a multi-turn rollout runs: the tools offered (name -> function), turn and token limits, tool budgets."""

    tools: dict[str, Callable[..., Any]]
    max_turns: int = 4
    max_tokens: int = 1024  # response tokens per trajectory: model turns + tool turns (image tokens included)
    time_budget_s: float = TOOL_DEFAULTS["time_budget_s"]
    max_image_pixels: int = TOOL_DEFAULTS["max_image_pixels"]
    describe: bool = TOOL_DEFAULTS["describe"]  # list the tools' schemas in the prompt (the chat template's tools=)
    counters: ToolCounters = field(default_factory=ToolCounters)

    def schemas(self) -> list[dict[str, Any]]:
        """The schemas the chat template lists in the system turn; [] when ``describe`` is off (a model trained on
        the calls already knows them, and the block is hundreds of tokens in every prompt)."""
        return [tool_schema(fn) for fn in self.tools.values()] if self.describe else []


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


def text_after_model_turn(processor: Any, messages: list[dict[str, Any]], eos_text: str) -> str:
    """What the chat template puts between the end of the model's turn (its end-of-turn token, which the model
    sampled) and the start of its next turn, when ``messages`` (tool or user turns) come in between."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}]
    rendered = processor.apply_chat_template(history + messages, tokenize=False, add_generation_prompt=True)
    after = rendered[rendered.index(_SENTINEL) + len(_SENTINEL):]
    if not after.startswith(eos_text):
        raise ValueError(f"the chat template does not end an assistant turn with {eos_text!r} (the end-of-turn token "
                         f"the model samples); multi-turn rollouts need it")
    return after[len(eos_text):]


def tool_turn_text(processor: Any, results: list[ToolResult], eos_text: str) -> str:
    """The tool turn's text for one tool message per result (images as image parts, an error as its message)."""
    messages = []
    for r in results:
        parts: list[dict[str, Any]] = [{"type": "image"} for _ in r.images]
        parts.append({"type": "text", "text": r.text if r.ok else error_text(r)})
        messages.append({"role": "tool", "content": parts})
    return text_after_model_turn(processor, messages, eos_text)


@dataclass
class _Row:
    """One segment of a trajectory being built: its prompt, its response so far (model tokens, tool turns and the
    padding between them) and its images. Without summaries a trajectory is one segment."""

    sample_index: int  # which of the samples (prompts)
    index: int  # the trajectory's sample index within its group (0..G-1)
    prompt: torch.Tensor  # [p] the segment's prompt tokens (no padding)
    prompt_types: torch.Tensor | None  # [p] mm_token_type_ids of the prompt, when the processor gives them
    images: list[Any]  # PIL images, the prompt's then returned ones
    grids: list[torch.Tensor]  # per image its [3] grid
    pixels: list[torch.Tensor]  # per image its patch rows
    features: list[Any]  # per image its ImageFeatures (models that take precomputed features)
    segment: int = 0  # ReSum: 0 for the first, k after k summaries
    turns_before: int = 0  # model turns spent by earlier segments
    response: list[int] = field(default_factory=list)
    real: list[int] = field(default_factory=list)  # attention: 1 on real tokens, 0 on padding between turns
    loss_mask: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    types: list[int] = field(default_factory=list)  # mm_token_type_ids of the response
    turns: list[Turn] = field(default_factory=list)
    finish: str = "turns"
    summary: str | None = None  # the summary this segment ended with (finish "summarized")
    restart_with: str | None = None  # the user turn the next segment starts from (the summary, framed)

    @property
    def model_turns(self) -> int:
        """Turns the model generated in this segment (summaries included)."""
        return sum(1 for t in self.turns if t.kind in ("model", "summary"))

    @property
    def used(self) -> int:
        """Real response tokens so far (what the trajectory budget counts)."""
        return sum(self.real)

    def add(self, ids: list[int], real: list[int], loss: float, logprobs: list[float] | None = None,
            types: list[int] | None = None) -> None:
        self.response += ids
        self.real += real
        self.loss_mask += [loss * r for r in real]
        self.logprobs += [lp * r for lp, r in zip(logprobs, real)] if logprobs is not None else [0.0] * len(ids)
        self.types += types if types is not None else [0] * len(ids)


@dataclass
class Summarize:
    """ReSum (Wu et al., "ReSum: Unlocking Long-Horizon Search Intelligence via Context Summarization", arXiv
    2509.13313), ``rollout.summarize``.

    When a segment's context (prompt + response) reaches ``at_tokens`` before a model turn, or a model turn runs out
    of tokens, the model is asked (``instruction``, a user turn, masked) to summarise its progress; the trajectory
    restarts from the original prompt plus the summary (``restart``, a user turn), the history dropped. ReSum-GRPO's
    advantage broadcasting: the trajectory's advantage is computed once (from its final segment's reward, among the
    group's trajectories) and every segment, the summary turn included, trains with it.

    Deviations: the paper's summaries come from a separate summary model (ReSumTool-30B) called as a tool; here the
    policy summarises itself (no second model in the run, and the summary turn is trained like any other turn). The
    trigger is the context length checked at turn boundaries, plus a turn cut by ``max_new_tokens`` (a reasoning
    longer than a turn's budget); the paper triggers at its context limit. ``instruction`` and ``restart`` are ours
    (the paper's prompts are for web search).
    """

    at_tokens: int
    instruction: str = ("Your context is nearly full. Summarise your progress so far (what you found and what is "
                        "left) briefly; you will continue from the summary.")
    restart: str = "Summary of your progress so far:\n{summary}\nContinue from it."


def generate_multiturn(engine: Any, samples: list[Sample], group_size: int, params: SamplingParams, use: ToolUse, *,
                       seed: int, step: int, summarize: Summarize | None = None) -> RolloutBatch:
    """G multi-turn trajectories for each of B prompts with an ``HFEngine`` (its model, processor and ids).

    All N = B*G rows advance turn by turn in one batch sharing one KV cache: a model turn is one ``generate`` call
    over the rows still going; rows that end leave the batch (``DynamicCache.batch_select_indices``); each
    continuing row's tool turn is left-padded to the longest one, so the rows' new tokens stay aligned. The padding
    (after a row's end of turn, before its tool turn) has attention 0 here and in the teacher-forced pass alike, so
    positions and log-probs are the same in both.

    With ``summarize`` (ReSum) a trajectory may end in several segments, each a row of the batch (the segments of one
    trajectory follow each other; ``RolloutBatch.trajectory_index`` and ``final_segment`` say which is which); the
    segments after a summary run as a new batch from their new prompts.
    """
    from mmrlvr.rollout.hf import encode_prompt_batch
    from mmrlvr.rollout.vision import encode_images, supports_precomputed_vision

    # an engine without a model of its own here (vLLM) samples each turn as requests (``_run_turns_by_requests``)
    model, processor = getattr(engine, "model", None), engine.processor
    run_turns = _run_turns if model is not None else _run_turns_by_requests
    t0 = time.perf_counter()
    inputs = encode_prompt_batch(processor, samples, tools=use.schemas())
    grid_all = inputs.get("image_grid_thw")
    cuts = [0]
    for r in (grid_all.prod(-1).tolist() if grid_all is not None else []):
        cuts.append(cuts[-1] + int(r))
    precomputed = model is not None and supports_precomputed_vision(model) and "pixel_values" in inputs
    was_training = model.training if model is not None else False
    if model is not None:
        model.eval()
    features = encode_images(model, inputs["pixel_values"], grid_all) if precomputed else []
    types = inputs.get("mm_token_type_ids")
    rows: list[_Row] = []
    first = 0
    for b, s in enumerate(samples):
        mine = range(first, first + len(s.images))
        first += len(s.images)
        keep = inputs["attention_mask"][b].bool()
        for g in range(group_size):
            rows.append(_Row(sample_index=b, index=g, prompt=inputs["input_ids"][b][keep],
                             prompt_types=types[b][keep] if types is not None else None,
                             images=list(s.images), grids=[grid_all[i] for i in mine],
                             pixels=[inputs["pixel_values"][cuts[i]:cuts[i + 1]] for i in mine],
                             features=[features[i] for i in mine] if precomputed else []))
    t1 = time.perf_counter()
    done: list[_Row] = []
    try:
        going = rows
        while going:
            run_turns(engine, going, samples, params, use, seed=seed, step=step, precomputed=precomputed,
                      summarize=summarize)
            done += going
            going = [_restart(engine, r, samples[r.sample_index], use, precomputed)
                     for r in going if r.finish == "summarized"]
    finally:
        if model is not None:
            model.train(was_training)
    t2 = time.perf_counter()
    # the segments of each trajectory together, in order: trajectory-major, then segment
    done.sort(key=lambda r: (r.sample_index, r.index, r.segment))
    batch = _assemble(engine, samples, group_size, done, inputs)
    batch.timings = {"processor_s": t1 - t0, "generate_s": t2 - t1, "total_s": time.perf_counter() - t0}
    if precomputed:
        batch.image_features = [f for r in done for f in r.features]
    return batch


def _restart(engine: Any, row: _Row, sample: Sample, use: ToolUse, precomputed: bool) -> _Row:
    """ReSum: the next segment of a summarised trajectory: the original prompt plus the summary as a user turn."""
    from mmrlvr.rollout.hf import ASSISTANT_PREFIX

    processor = engine.processor
    messages = list(sample.messages) + [{"role": "user", "content": row.restart_with}]
    extra = {"tools": use.schemas()} if use.schemas() else {}
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra) \
        + (sample.meta.get(ASSISTANT_PREFIX) or "")
    n_prompt = len(sample.images)
    enc = processor(text=[text], images=[list(sample.images)] if sample.images else None, return_tensors="pt")
    types = enc.get("mm_token_type_ids")
    return _Row(sample_index=row.sample_index, index=row.index, prompt=enc["input_ids"][0],
                prompt_types=types[0] if types is not None else None, images=row.images[:n_prompt],
                grids=row.grids[:n_prompt], pixels=row.pixels[:n_prompt],
                features=row.features[:n_prompt] if precomputed else [], segment=row.segment + 1,
                turns_before=row.turns_before + row.model_turns)


def _select_rows(model: torch.nn.Module, cache: Any, keep: list[int], n: int) -> None:
    """Keep rows ``keep`` of the cache and of the per-row rope deltas Qwen-VL stored for the ``n`` rows."""
    if len(keep) == n:
        return
    index = torch.tensor(keep, dtype=torch.long)
    if cache is not None:
        cache.batch_select_indices(index.to(_cache_device(cache)))
    for module in model.modules():
        deltas = getattr(module, "rope_deltas", None)
        if torch.is_tensor(deltas) and deltas.shape[0] == n:
            module.rope_deltas = deltas[index.to(deltas.device)]


def _cache_device(cache: Any) -> torch.device:
    for layer in getattr(cache, "layers", []):
        keys = getattr(layer, "keys", None)
        if torch.is_tensor(keys):
            return keys.device
    return torch.device("cpu")


def _left_pad(seqs: list[list[int]], value: int, dtype: torch.dtype) -> torch.Tensor:
    width = max(len(q) for q in seqs)
    return torch.tensor([[value] * (width - len(q)) + list(q) for q in seqs], dtype=dtype)


@dataclass
class _TurnBatch:
    """The HF turn loop's state: the active rows' whole sequences (prompt and every turn so far) left-padded to one
    width, which rows they are, and per row (indexed like ``rows``) what the next model turn still has to see."""

    ids: torch.Tensor  # [A, T] token ids of the active rows
    mask: torch.Tensor  # [A, T] attention: 1 on real tokens
    types: torch.Tensor | None  # [A, T] mm_token_type_ids, when the processor gives them
    active: list[int]  # rows still going, in batch order
    fresh: list[int]  # per row: images the model has not seen yet
    asked: list[bool]  # per row, ReSum: its last non-model turn asked for its summary
    device: torch.device
    cache: Any = None

    @classmethod
    def start(cls, engine: Any, rows: list[_Row], precomputed: bool) -> "_TurnBatch":
        """The rows' prompts, left-padded to one width, with every prompt image still to be seen."""
        from mmrlvr.models.placement import model_device

        ids = _left_pad([r.prompt.tolist() for r in rows], engine.pad_id, torch.long)
        mask = _left_pad([[1] * len(r.prompt) for r in rows], 0, torch.long)
        first = rows[0].prompt_types
        types = _left_pad([r.prompt_types.tolist() for r in rows], 0, first.dtype) if first is not None else None
        return cls(ids=ids, mask=mask, types=types, active=list(range(len(rows))),
                   fresh=[len(r.features) if precomputed else len(r.pixels) for r in rows],
                   asked=[False] * len(rows), device=model_device(engine.model))

    def extend(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None) -> None:
        """Append the same number of new positions to every active row."""
        self.ids = torch.cat([self.ids, ids.to(self.ids.dtype)], dim=1)
        self.mask = torch.cat([self.mask, mask.to(self.mask.dtype)], dim=1)
        if self.types is not None:
            self.types = torch.cat([self.types, types.to(self.types.dtype)], dim=1)

    def keep(self, model: torch.nn.Module, going: list[int]) -> None:
        """Keep the active rows at batch positions ``going`` (sequences, cache and rope deltas); the others ended."""
        _select_rows(model, self.cache, going, len(self.active))
        self.ids, self.mask = self.ids[going], self.mask[going]
        self.types = self.types[going] if self.types is not None else None
        self.active = [self.active[a] for a in going]


@torch.no_grad()
def _run_turns(engine: Any, rows: list[_Row], samples: list[Sample], params: SamplingParams, use: ToolUse, *,
               seed: int, step: int, precomputed: bool, summarize: Summarize | None = None) -> None:
    """The HF turn loop: each turn generates for the active rows at once, decides which of them end and why, and
    appends the tool (or ReSum summary request) turns of the rows that go on, left-padded so they stay aligned."""
    batch = _TurnBatch.start(engine, rows, precomputed)
    base = min(r.turns_before for r in rows)
    for turn in range(use.max_turns - base):
        out, sampler, room = _generate_turn(engine, rows, samples, params, use, batch, turn, seed=seed, step=step,
                                            precomputed=precomputed)
        _add_model_turns(engine, rows, batch, out, sampler, room)
        going, segments = _next_segments(engine, rows, samples, use, summarize, batch,
                                         last_turn=turn == use.max_turns - 1 - base)
        if not going:
            return
        batch.keep(engine.model, going)
        _add_tool_turns(engine, rows, batch, segments, precomputed)
    for i in batch.active:
        _trim(rows[i])


def _generate_turn(engine: Any, rows: list[_Row], samples: list[Sample], params: SamplingParams, use: ToolUse,
                   batch: _TurnBatch, turn: int, *, seed: int, step: int, precomputed: bool
                   ) -> tuple[Any, Any, list[int]]:
    """One model turn for the active rows, each sampling with its own seeded generator within its token budget;
    returns ``generate``'s output, the sampler (its log-probs) and each active row's room left."""
    from transformers import LogitsProcessorList

    from mmrlvr.models.placement import to_model
    from mmrlvr.rollout.sampling import RowSampler

    model = engine.model
    room = [use.max_tokens - rows[i].used for i in batch.active]
    seeds = [_turn_seed(seed, step, samples[rows[i].sample_index], rows[i], turn) for i in batch.active]
    sampler = RowSampler(seeds, params, device=batch.device, banned_ids=engine.banned_ids)
    config = engine.generation_config(SamplingParams(max_new_tokens=max(1, min(params.max_new_tokens, max(room)))))
    config.return_dict_in_generate = True
    kwargs = _generate_inputs(model, rows, batch, precomputed)
    with engine.own_generation_defaults():
        out = model.generate(**to_model(kwargs, model), generation_config=config,
                             logits_processor=LogitsProcessorList([sampler]))
    batch.cache = output_cache(out)
    return out, sampler, room


def _generate_inputs(model: torch.nn.Module, rows: list[_Row], batch: _TurnBatch, precomputed: bool) -> dict[str, Any]:
    """``generate``'s inputs for this turn: the sequences, the active rows' image grids, the images the model has
    not seen (pixels, or precomputed features) and the cache; drops the cache when the whole history must rerun."""
    from mmrlvr.rollout.vision import encoder_outputs

    active = batch.active
    kwargs: dict[str, Any] = {"input_ids": batch.ids, "attention_mask": batch.mask}
    if batch.types is not None:
        kwargs["mm_token_type_ids"] = batch.types
    grids = [g for i in active for g in rows[i].grids]
    if grids:
        kwargs["image_grid_thw"] = torch.stack(grids)
    if any(batch.fresh[i] for i in active):
        # the whole history runs again when the model needs every image's pixels, or when this transformers
        # release cannot place a new image's positions on top of a cache (``continues_with_new_images``)
        whole = not precomputed or not continues_with_new_images(model)
        if precomputed:
            kwargs["mm_encoder_outputs"] = encoder_outputs(
                [f for i in active for f in rows[i].features[0 if whole else len(rows[i].features) - batch.fresh[i]:]])
        else:
            kwargs["pixel_values"] = torch.cat([p for i in active for p in rows[i].pixels])
        if whole:
            batch.cache = None
    if batch.cache is not None:
        kwargs.update(with_cache(model, batch.cache))
    return kwargs


def _add_model_turns(engine: Any, rows: list[_Row], batch: _TurnBatch, out: Any, sampler: Any, room: list[int]) -> None:
    """Append each active row's sampled turn, real through its end-of-turn token or its token budget (the rest is
    padding of the batch's longest turn, attention 0), to the row and to the batch's sequences."""
    eos = set(engine.eos_ids)
    new = out.sequences[:, batch.ids.shape[1]:].cpu()  # [A, l]
    l = int(new.shape[1])
    lps = torch.stack(sampler.logprobs[:l], dim=1).float().cpu() if l else torch.zeros(len(batch.active), 0)
    new_real = torch.zeros_like(new)
    for a, i in enumerate(batch.active):
        batch.fresh[i] = 0
        toks = new[a].tolist()
        end = next((j + 1 for j, t in enumerate(toks) if t in eos), l)  # through the end-of-turn token
        end = min(end, room[a])
        new_real[a, :end] = 1
        _add_model_turn(rows[i], toks, end, lps[a].tolist(), engine.tokenizer, batch.asked[i])
    batch.extend(new, new_real, torch.zeros_like(new, dtype=batch.types.dtype) if batch.types is not None else None)


def _next_segments(engine: Any, rows: list[_Row], samples: list[Sample], use: ToolUse, summarize: Summarize | None,
                   batch: _TurnBatch, *, last_turn: bool) -> tuple[list[int], list[dict[str, Any]]]:
    """Who goes on after this model turn: a complete turn that calls a tool (or, under ReSum, one that must summarise),
    with a turn left. Returns their batch positions and their next segments; the other rows end (``row.finish``)."""
    going, segments = [], []
    for a, i in enumerate(batch.active):
        segment = _after_model_turn(engine, rows[i], samples, use, summarize, batch.asked, i, last_turn)
        if segment is not None:
            going.append(a)
            segments.append(segment)
    return going, segments


def _add_tool_turns(engine: Any, rows: list[_Row], batch: _TurnBatch, segments: list[dict[str, Any]],
                    precomputed: bool) -> None:
    """Append the tool (or summary request) turns, left-padded to the longest so the next model turns start together;
    with precomputed vision the images they returned go through the vision tower here, once."""
    from mmrlvr.rollout.vision import encode_images

    width = max(len(seg["ids"]) for seg in segments)
    pad_ids, pad_mask, pad_types = [], [], []
    for i, seg in zip(batch.active, segments):
        row = rows[i]
        start = _add_segment(row, seg, width - len(seg["ids"]), engine.pad_id)
        batch.fresh[i] = len(seg["images"])
        pad_ids.append(row.response[start:])
        pad_mask.append(row.real[start:])
        pad_types.append(row.types[start:])
    active = batch.active
    if precomputed and any(batch.fresh[i] for i in active):
        pixels = torch.cat([p for i in active for p in rows[i].pixels[len(rows[i].pixels) - batch.fresh[i]:]])
        grid = torch.stack([g for i in active for g in rows[i].grids[len(rows[i].grids) - batch.fresh[i]:]])
        encoded = iter(encode_images(engine.model, pixels, grid))
        for i in active:
            rows[i].features += [next(encoded) for _ in range(batch.fresh[i])]
    batch.extend(torch.tensor(pad_ids, dtype=batch.ids.dtype), torch.tensor(pad_mask, dtype=batch.mask.dtype),
                 torch.tensor(pad_types, dtype=batch.types.dtype) if batch.types is not None else None)


def _add_model_turn(row: _Row, toks: list[int], end: int, logprobs: list[float], tok: Any, summary: bool) -> None:
    """Append a model turn: ``toks`` sampled, the first ``end`` of them kept (through the end-of-turn token or the
    token budget; the rest is padding of the batch's longest turn)."""
    start = len(row.response)
    row.add(toks, [1] * end + [0] * (len(toks) - end), 1.0, logprobs)
    row.turns.append(Turn("summary" if summary else "model", start, start + end,
                          tok.decode(toks[:end], skip_special_tokens=True)))


def _add_segment(row: _Row, seg: dict[str, Any], gap: int, pad_id: int) -> int:
    """Append a tool (or user) turn to the row after ``gap`` padding tokens (attention 0; the HF engine aligns its
    rows' next turns with them), with its images and its turn record; returns where the padding starts."""
    start = len(row.response)
    row.add([pad_id] * gap + seg["ids"], [0] * gap + [1] * len(seg["ids"]), 0.0, types=[0] * gap + seg["types"])
    first_new = len(row.images)
    row.images += seg["images"]
    row.grids += seg["grids"]
    row.pixels += seg["pixels"]
    row.turns.append(Turn(seg["kind"], start + gap, len(row.response), seg["text"], calls=seg["calls"],
                          images=list(range(first_new, len(row.images)))))
    return start


def _after_model_turn(engine: Any, row: _Row, samples: list[Sample], use: ToolUse, summarize: Summarize | None,
                      asked: list[bool], i: int, last_turn: bool) -> dict[str, Any] | None:
    """What follows the model turn ``row`` just ended: the next segment (a tool turn, or under ReSum the request for a
    summary) when the trajectory goes on, else None with ``row.finish`` set and the row trimmed. ``asked[i]``: the
    row's last non-model turn asked for its summary (set here when this one does). Shared by every engine's turn
    loop, so HF and vLLM trajectories end for the same reasons."""
    processor, tok = engine.processor, engine.tokenizer
    eos = set(engine.eos_ids)
    eos_text = tok.decode([engine.eos_ids[0]])
    info = row.turns[-1]
    ended = info.end > info.start and row.response[info.end - 1] in eos
    context = len(row.prompt) + row.used
    left = use.max_turns - row.turns_before - row.model_turns
    turns_left = left > 0
    if asked[i]:  # this was the summary: the segment ends, the trajectory restarts from it
        row.finish, row.summary = "summarized", info.text
        row.restart_with = summarize.restart.format(summary=info.text)
        _trim(row)
        return None
    calls = parse_tool_calls(info.text) if ended else []
    wants_more = (not ended) or bool(calls)
    # a summary needs a turn for itself and one to go on from it
    if summarize is not None and left >= 2 and wants_more and (not ended or context >= summarize.at_tokens):
        segment = _user_turn(processor, tok, summarize.instruction, eos_text, ended, engine.eos_ids[0])
        if row.used + len(segment["ids"]) < use.max_tokens:
            asked[i] = True
            return segment
    if not ended:
        row.finish = "length"
    elif not calls:
        row.finish = "stop"
    elif not turns_left or last_turn:
        row.finish = "turns"  # it asked for a tool with no turn left to read the answer
    else:
        segment = tool_turn(processor, row.images, samples[row.sample_index], calls, use, eos_text)
        if row.used + len(segment["ids"]) >= use.max_tokens:  # no room for the answer and a turn after it
            row.finish = "length"
        else:
            return segment
    _trim(row)
    return None


def _turn_seed(seed: int, step: int, sample: Sample, row: _Row, turn: int) -> int:
    """The seed of a row's model turn: (seed, step, prompt id, sample index), the turn and ReSum segment in the key."""
    from mmrlvr.rollout.sampling import row_seed

    key = sample.id if turn == 0 else f"{sample.id}/turn{turn}"
    return row_seed(seed, step, key if row.segment == 0 else f"{key}/segment{row.segment}", row.index)


def _run_turns_by_requests(engine: Any, rows: list[_Row], samples: list[Sample], params: SamplingParams,
                           use: ToolUse, *, seed: int, step: int, precomputed: bool = False,
                           summarize: Summarize | None = None) -> None:
    """The turn loop for an engine that samples each model turn as one request per row (vLLM): the row's whole
    sequence so far (prompt, model turns, tool turns; no padding) and every image in it go with each request, the
    engine's prefix cache keeps the shared history from being recomputed, and a row that ends leaves the batch.
    ``engine.sample_continuations(requests, params)`` -> [(tokens, log-probs)]; the seeds, budgets and the decisions
    after each turn are the HF loop's (``_turn_seed``, ``_after_model_turn``)."""
    eos = set(engine.eos_ids)
    active = list(range(len(rows)))
    asked = [False] * len(rows)
    base = min(r.turns_before for r in rows)
    for turn in range(use.max_turns - base):
        room = [use.max_tokens - rows[i].used for i in active]
        requests = []
        for a, i in enumerate(active):
            r = rows[i]
            requests.append({"ids": r.prompt.tolist() + r.response, "images": list(r.images),
                             "seed": _turn_seed(seed, step, samples[r.sample_index], r, turn),
                             "max_new_tokens": max(1, min(params.max_new_tokens, room[a])),
                             "sample_id": samples[r.sample_index].id})
        outputs = engine.sample_continuations(requests, params)
        for a, i in enumerate(active):
            toks, lps = outputs[a]
            end = min(next((j + 1 for j, t in enumerate(toks) if t in eos), len(toks)), room[a])
            _add_model_turn(rows[i], list(toks[:end]), end, list(lps[:end]), engine.tokenizer, asked[i])
        last_turn = turn == use.max_turns - 1 - base
        going = []
        for i in active:
            segment = _after_model_turn(engine, rows[i], samples, use, summarize, asked, i, last_turn)
            if segment is not None:
                _add_segment(rows[i], segment, 0, engine.pad_id)
                going.append(i)
        if not going:
            return
        active = going
    for i in active:
        _trim(rows[i])


def _trim(row: _Row) -> None:
    """Drop what follows the row's last real token (padding of a turn that ended before the batch's longest)."""
    last = max((j for j, r in enumerate(row.real) if r), default=-1) + 1
    for name in ("response", "real", "loss_mask", "logprobs", "types"):
        setattr(row, name, getattr(row, name)[:last])


def _user_turn(processor: Any, tok: Any, text: str, eos_text: str, ended: bool, eos_id: int) -> dict[str, Any]:
    """A user turn after the model's (ReSum's summary request), as the chat template renders it; when the model's
    turn was cut before its end-of-turn token, that token opens this segment (it carries no loss: not sampled)."""
    after = text_after_model_turn(processor, [{"role": "user", "content": text}], eos_text)
    ids = tok(after, add_special_tokens=False)["input_ids"]
    if not ended:
        ids = [eos_id] + ids
    return {"ids": ids, "text": text, "images": [], "grids": [], "pixels": [], "types": [0] * len(ids), "calls": [],
            "kind": "user"}


def tool_turn(processor: Any, images: list[Any], sample: Sample, calls: list[Any], use: ToolUse, eos_text: str
              ) -> dict[str, Any]:
    """Run a turn's calls and encode their answers as the tool turn's tokens (ids, image inputs, the record).

    ``images``: the conversation's images so far (what a call's ``image`` index refers to). The SFT warm start of
    a tool task encodes its references with this same function, so it trains on the tokens rollouts produce."""
    context = ToolContext(images=list(images), tools_kwargs=dict(sample.meta.get("tools_kwargs") or {}),
                          sample_id=sample.id)
    check = _image_check(processor)
    results = [run_call(c, use.tools, context, time_budget_s=use.time_budget_s, max_image_pixels=use.max_image_pixels,
                        counters=use.counters, check_image=check) for c in calls]
    returned = [im for r in results if r.ok for im in r.images]
    text = tool_turn_text(processor, results, eos_text)
    enc = processor(text=[text], images=[returned] if returned else None, return_tensors="pt")
    grids, pixels = [], []
    if returned:
        grid = enc["image_grid_thw"]
        at = 0
        for g in grid:
            n = int(g.prod())
            grids.append(g)
            pixels.append(enc["pixel_values"][at:at + n])
            at += n
    types = enc.get("mm_token_type_ids")
    return {"ids": enc["input_ids"][0].tolist(), "text": text, "images": returned, "grids": grids, "pixels": pixels,
            "types": types[0].tolist() if types is not None else [0] * int(enc["input_ids"].shape[1]),
            "calls": [{"name": c.name, "arguments": c.arguments, "error": r.error} for c, r in zip(calls, results)],
            "kind": "tool"}


def _image_check(processor: Any) -> Callable[[Any], Any] | None:
    """Encodes one returned image with the model's own image processor, so an image it refuses (an empty crop, a
    sliver past Qwen's 200:1 aspect limit, a mode it cannot convert) fails as that call's error, not the rollout."""
    ip = getattr(processor, "image_processor", None)
    if ip is None:
        return None
    return lambda image: ip(images=[image], return_tensors="pt")


def _assemble(engine: Any, samples: list[Sample], group_size: int, rows: list[_Row], inputs: dict[str, Any]
              ) -> RolloutBatch:
    """The segments as one ``RolloutBatch``: prompts left-padded to the longest, responses (all turns) right-padded."""
    from mmrlvr.rollout.batch import pad_rows
    from mmrlvr.rollout.hf import PATCH_KEYS

    n = len(rows)
    P = max(len(r.prompt) for r in rows)
    L = max((len(r.response) for r in rows), default=0)
    response_ids = pad_rows([r.response for r in rows], engine.pad_id, torch.long)[:, :L].reshape(n, L)
    response_mask = pad_rows([r.loss_mask for r in rows], 0.0, torch.float)[:, :L].reshape(n, L)
    old_logprobs = pad_rows([r.logprobs for r in rows], 0.0, torch.float)[:, :L].reshape(n, L)
    real = pad_rows([r.real for r in rows], 0, torch.long)[:, :L].reshape(n, L)
    prompt_ids = _left_pad([r.prompt.tolist() for r in rows], engine.pad_id, torch.long) if n else torch.zeros(0, 0)
    prompt_ids = torch.cat([torch.full((n, P - prompt_ids.shape[1]), engine.pad_id), prompt_ids], 1).long()
    prompt_mask = _left_pad([[1] * len(r.prompt) for r in rows], 0, torch.long)
    prompt_mask = torch.cat([torch.zeros(n, P - prompt_mask.shape[1], dtype=torch.long), prompt_mask], 1)
    vision: dict[str, Any] = {}
    if any(r.grids for r in rows):
        vision["pixel_values"] = torch.cat([p for r in rows for p in r.pixels])
        vision["image_grid_thw"] = torch.stack([gr for r in rows for gr in r.grids])
    if rows[0].prompt_types is not None:
        dtype = rows[0].prompt_types.dtype
        prompt_types = _left_pad([r.prompt_types.tolist() for r in rows], 0, dtype)
        prompt_types = torch.cat([torch.zeros(n, P - prompt_types.shape[1], dtype=dtype), prompt_types], 1)
        resp_types = pad_rows([r.types for r in rows], 0, dtype)[:, :L].reshape(n, L)
        vision["mm_token_type_ids"] = torch.cat([prompt_types, resp_types], dim=1)
    for key, value in inputs.items():  # anything else the processor gives per prompt (not per image or token)
        if key in ("input_ids", "attention_mask", "mm_token_type_ids") or key in PATCH_KEYS or key in PATCH_KEYS.values():
            continue
        if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == len(samples):
            vision[key] = value[torch.tensor([r.sample_index for r in rows], dtype=torch.long)]
    trajectory = [r.sample_index * group_size + r.index for r in rows]
    final = [j == n - 1 or trajectory[j + 1] != trajectory[j] for j in range(n)]
    final_text = {t: r for t, r, f in zip(trajectory, rows, final) if f}
    completions = []
    for r, t, f in zip(rows, trajectory, final):
        last = final_text[t]
        model_turns = [x for x in last.turns if x.kind == "model"]
        kept = [tk for tk, m in zip(r.response, r.loss_mask) if m > 0]
        meta = {"logprobs": [lp for lp, m in zip(r.logprobs, r.loss_mask) if m > 0],
                "turns": [x.as_dict() for x in r.turns], "num_turns": sum(1 for x in r.turns if x.kind == "model"),
                "tool_calls": sum(len(x.calls) for x in r.turns),
                "tool_errors": sum(1 for x in r.turns for c in x.calls if c["error"])}
        if r.segment or not f:  # ReSum: which segment of its trajectory this row is
            meta.update(segment=r.segment, final_segment=f, summary=r.summary)
        # every segment is scored on the trajectory's final turn: it trains with the trajectory's final reward
        completions.append(Completion(text=model_turns[-1].text if model_turns else "",
                                      finish_reason=last.finish if f else "summarized", token_ids=kept, meta=meta))
    segmented = any(not f for f in final)
    return RolloutBatch(
        samples=[samples[r.sample_index] for r in rows],
        group_index=torch.tensor([r.sample_index for r in rows], dtype=torch.long),
        sample_index=torch.tensor([r.index for r in rows], dtype=torch.long),
        input_ids=torch.cat([prompt_ids, response_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, real], dim=1),
        response_ids=response_ids, response_mask=response_mask, old_logprobs=old_logprobs,
        vision=vision, prompt_length=P, completions=completions,
        turns=[[t.as_dict() for t in r.turns] for r in rows],
        row_images=[list(r.images) for r in rows],
        trajectory_index=torch.tensor(trajectory, dtype=torch.long) if segmented else None,
        final_segment=torch.tensor(final, dtype=torch.bool) if segmented else None,
    )


class ToolEngine:
    """A ``RolloutEngine`` whose responses are multi-turn trajectories: an ``HFEngine`` plus the tools it offers.
    What held-out evaluation, ``mmrlvr eval`` of a run with tools and the warm start of a tool task sample with."""

    def __init__(self, engine: Any, use: ToolUse, summarize: Summarize | None = None) -> None:
        self.engine, self.use, self.summarize = engine, use, summarize

    def generate(self, samples: list[Sample], group_size: int, params: SamplingParams, *, seed: int,
                 step: int) -> RolloutBatch:
        return generate_multiturn(self.engine, samples, group_size, params, self.use, seed=seed, step=step,
                                  summarize=self.summarize)

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.engine.sync_weights(model)

    def __getattr__(self, name: str) -> Any:  # model, processor, tokenizer, eos / pad ids of the wrapped engine
        if name in ("engine", "use", "summarize"):
            raise AttributeError(name)
        return getattr(self.engine, name)
