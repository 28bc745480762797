"""The default rollout engine: transformers ``generate`` on the trainer's own model (CPU or one GPU).

One call samples G responses for each of B prompts:
1. chat template (``add_generation_prompt``) + images through the processor once per distinct prompt,
   left-padded to P tokens;
2. rows repeated G times (group-contiguous), the vision inputs expanded in the processor's own layout
   (``expand_vision``), optionally in row chunks of ``batch_size``;
3. ``generate`` with ``RowSampler`` (per-row seeded sampling, log pi_old recorded from the same logits);
4. response ids right-padded to L, mask through the first end-of-sequence token, text decoded.

The result (``RolloutBatch``) can be teacher-forced without running the processor again.
``sync_weights`` is a no-op: the engine shares the trainer's model.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import torch
from transformers import GenerationConfig, LogitsProcessorList

from mmrlvr.algos.cpu_linear import onednn_linears
from mmrlvr.errors import UserError
from mmrlvr.models.placement import model_device, to_model
from mmrlvr.models.positions import cached_rope_index
from mmrlvr.rollout.base import RolloutBatch, SamplingParams
from mmrlvr.rollout.batch import assemble_batch
from mmrlvr.rollout.sampling import RowSampler, row_seed
from mmrlvr.rollout.vision import encode_images, encoder_outputs, repeat_per_row, supports_precomputed_vision
from mmrlvr.types import Sample

# Processor outputs that hold one row of patches per image, with per-image grid sizes (Qwen layout).
PATCH_KEYS: dict[str, str] = {"pixel_values": "image_grid_thw", "pixel_values_videos": "video_grid_thw"}


#: ``Sample.meta`` key: text the assistant turn already starts with; generation continues from it (both engines
#: build prompts through ``prompt_texts``). Used by ``mmrlvr analyze prefix`` to answer from a thinking prefix.
ASSISTANT_PREFIX = "assistant_prefix"


def prompt_texts(processor: Any, samples: list[Sample], tools: list[dict[str, Any]] | None = None) -> list[str]:
    """The chat-templated prompt of each sample, ending with the assistant turn's opening, followed by
    ``sample.meta["assistant_prefix"]`` when a sample has one (the response is then what follows it).
    ``tools``: JSON schemas the template lists for the model (multi-turn rollouts; ``mmrlvr.tools``)."""
    extra = {"tools": tools} if tools else {}
    return [processor.apply_chat_template(s.messages, tokenize=False, add_generation_prompt=True, **extra)
            + (s.meta.get(ASSISTANT_PREFIX) or "") for s in samples]


def _rows_per_prompt(grid: torch.Tensor, images_per_prompt: list[int]) -> list[int]:
    """Patch rows per prompt: sum over its images of t*h*w (grid: [n_images, 3])."""
    per_image = grid.prod(dim=-1).tolist()
    if len(per_image) != sum(images_per_prompt):
        raise ValueError(f"the processor returned {len(per_image)} image grids for {sum(images_per_prompt)} images")
    out, i = [], 0
    for n in images_per_prompt:
        out.append(int(sum(per_image[i:i + n])))
        i += n
    return out


def expand_vision(inputs: dict[str, Any], images_per_prompt: list[int], repeats: int,
                  videos_per_prompt: list[int] | None = None) -> dict[str, Any]:
    """Repeat every prompt's vision inputs ``repeats`` times, group-contiguous, in the processor's layout.

    Qwen layout: ``pixel_values`` is [sum of patches, D] (all images' patches concatenated) with one
    ``image_grid_thw`` row [t, h, w] per image; a prompt owns the patch rows of its images. Other
    processors give per-prompt tensors with B rows first ([B, ...]), repeated with ``repeat_interleave``.
    ``input_ids`` / ``attention_mask`` are not touched here.
    """
    b = len(images_per_prompt)
    out: dict[str, Any] = {}
    grids_done: set[str] = set()
    for key, value in inputs.items():
        if key in ("input_ids", "attention_mask") or key in grids_done:
            continue
        if key in PATCH_KEYS and PATCH_KEYS[key] in inputs:
            grid_key = PATCH_KEYS[key]
            grid = inputs[grid_key]
            n_images = images_per_prompt if key == "pixel_values" else (videos_per_prompt or [1] * b)
            rows = _rows_per_prompt(grid, n_images)
            chunks = torch.split(value, rows, dim=0)
            grids = torch.split(grid, n_images, dim=0)
            out[key] = torch.cat([c for c in chunks for _ in range(repeats)], dim=0)
            out[grid_key] = torch.cat([g for g in grids for _ in range(repeats)], dim=0)
            grids_done.add(grid_key)
        elif key in PATCH_KEYS.values():
            continue  # handled with its pixel values
        elif isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == b:
            out[key] = value.repeat_interleave(repeats, dim=0)
        else:
            raise ValueError(f"don't know how to repeat processor output {key!r} of shape "
                             f"{tuple(getattr(value, 'shape', ()))} for {b} prompts")
    return out


def _slice_rows(vision: dict[str, Any], images_per_row: list[int], start: int, stop: int,
                videos_per_row: list[int] | None = None) -> dict[str, Any]:
    """Rows start..stop-1 of N-row vision inputs (as built by ``expand_vision``)."""
    out: dict[str, Any] = {}
    for key, value in vision.items():
        if key in PATCH_KEYS and PATCH_KEYS[key] in vision:
            grid = vision[PATCH_KEYS[key]]
            n_images = images_per_row if key == "pixel_values" else (videos_per_row or [1] * len(images_per_row))
            rows = _rows_per_prompt(grid, n_images)
            p0, p1 = sum(rows[:start]), sum(rows[:stop])
            g0, g1 = sum(n_images[:start]), sum(n_images[:stop])
            out[key], out[PATCH_KEYS[key]] = value[p0:p1], grid[g0:g1]
        elif key in PATCH_KEYS.values():
            continue
        else:
            out[key] = value[start:stop]
    return out


VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


def vision_token_ids(tokenizer: Any) -> list[int]:
    """Ids of the vision placeholder tokens this tokenizer has (never sampled in a response)."""
    vocab = tokenizer.get_vocab()
    return sorted(vocab[t] for t in VISION_TOKENS if t in vocab)


def encode_prompt_batch(processor: Any, samples: list[Sample], tools: list[dict[str, Any]] | None = None
                        ) -> dict[str, Any]:
    """Processor outputs for B distinct prompts: input_ids [B, P] (left-padded) + image and video inputs.

    The one place prompts become tensors for any engine (the HF sampler, and the vLLM engine's teacher-forcing
    tensors), so both see the same images and the same sampled video frames (``sample.meta["videos"]``).
    """
    from mmrlvr.data.video_processing import ensure_video_processor, video_processor_kwargs

    video = video_processor_kwargs(samples)  # sampled frames of meta["videos"] (mmrlvr.data.video)
    if video:
        ensure_video_processor(processor)
    texts = prompt_texts(processor, samples, tools)
    images = [list(s.images) for s in samples]
    kwargs: dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True}
    if any(images):
        if not all(images):
            raise UserError("a batch mixes samples with and without images; "
                            f"sample {next(s.id for s in samples if not s.images)!r} has none")
        kwargs["images"] = images
    kwargs.update(video)
    tokenizer = getattr(processor, "tokenizer", processor)
    if getattr(tokenizer, "padding_side", "left") != "left":
        tokenizer.padding_side = "left"  # generation needs the prompt's end aligned
    return dict(processor(**kwargs))


class HFEngine:
    """``RolloutEngine`` over a transformers model + processor (see the module docstring).

    max_prompt_tokens: a prompt longer than this is an error naming the sample (truncating a prompt
        with image tokens would break it). batch_size: rows per ``generate`` call (None = all at once).
    """

    def __init__(self, model: torch.nn.Module, processor: Any, *, max_prompt_tokens: int | None = None,
                 batch_size: int | None = None) -> None:
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.max_prompt_tokens = max_prompt_tokens
        self.batch_size = batch_size
        if self.tokenizer.pad_token_id is None:
            raise UserError("the tokenizer has no pad token; set one (e.g. tokenizer.pad_token = eos) first")
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        self.eos_ids: list[int] = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
        self.pad_id: int = int(self.tokenizer.pad_token_id)
        self.banned_ids: list[int] = vision_token_ids(self.tokenizer)

    # -- prompts ---------------------------------------------------------------------------------------
    def encode_prompts(self, samples: list[Sample]) -> dict[str, Any]:
        """Processor outputs for B distinct prompts: input_ids [B, P] (left-padded) + vision inputs."""
        inputs = encode_prompt_batch(self.processor, samples)
        lengths = inputs["attention_mask"].sum(dim=-1)
        if self.max_prompt_tokens is not None:
            for s, n in zip(samples, lengths.tolist()):
                if n > self.max_prompt_tokens:
                    raise UserError(f"sample {s.id!r}: prompt is {n} tokens, over max_prompt_tokens="
                                    f"{self.max_prompt_tokens}")
        return inputs

    # -- generation ------------------------------------------------------------------------------------
    def generation_config(self, params: SamplingParams) -> GenerationConfig:
        """A fresh ``GenerationConfig`` for ``params`` (greedy fields; sampling is done by our own seeded loop):
        a checkpoint's own defaults (repetition penalty, top_p, ...) would change the distribution sampled from
        without changing the log-probs recorded. Rollout loops that call ``model.generate`` themselves (tree
        segments, tool turns) use it with ``own_generation_defaults``."""
        return GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=params.max_new_tokens,
                                eos_token_id=self.eos_ids, pad_token_id=self.pad_id, use_cache=True)

    @contextlib.contextmanager
    def own_generation_defaults(self) -> Iterator[None]:
        """Hide the checkpoint's generation_config while we generate.

        ``generate`` fills every field our config leaves unset from ``model.generation_config`` (a real Qwen
        checkpoint sets repetition_penalty 1.05, top_k 1, ...), and such processors would change the tokens
        without changing the log-probs we record. A blank default config leaves only ours.
        """
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        saved = getattr(base, "generation_config", None)
        base.generation_config = GenerationConfig(eos_token_id=self.eos_ids, pad_token_id=self.pad_id)
        try:
            yield
        finally:
            base.generation_config = saved

    @torch.no_grad()
    def _generate_rows(self, inputs: dict[str, Any], seeds: list[int], params: SamplingParams
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(response ids [n, l], log-probs [n, l]) for one chunk of rows."""
        inputs = to_model(inputs, self.model)
        sampler = RowSampler(seeds, params, device=model_device(self.model), banned_ids=self.banned_ids)
        with self.own_generation_defaults(), onednn_linears(self.model), cached_rope_index(self.model):
            out = self.model.generate(**inputs, generation_config=self.generation_config(params),
                                      logits_processor=LogitsProcessorList([sampler]))
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        response = sequences[:, inputs["input_ids"].shape[1]:]  # [n, l]
        length = response.shape[1]
        logprobs = torch.stack(sampler.logprobs[:length], dim=1) if length else response.float()
        return response.cpu(), logprobs.float().cpu()

    def generate(self, samples: list[Sample], group_size: int, params: SamplingParams, *,
                 seed: int, step: int) -> RolloutBatch:
        if group_size < 1:
            raise UserError(f"group_size must be >= 1, got {group_size}")
        if not samples:
            raise UserError("generate() needs at least one sample")
        t0 = time.perf_counter()
        inputs = self.encode_prompts(samples)
        images_per_prompt = [len(s.images) for s in samples]
        videos_per_prompt = [len(s.meta.get("videos") or []) for s in samples]
        vision = expand_vision(inputs, images_per_prompt, group_size, videos_per_prompt)
        prompt_ids = inputs["input_ids"].repeat_interleave(group_size, dim=0)  # [N, P]
        prompt_mask = inputs["attention_mask"].repeat_interleave(group_size, dim=0)  # [N, P]
        n = prompt_ids.shape[0]
        rows = [(s, g) for s in samples for g in range(group_size)]
        seeds = [row_seed(seed, step, s.id, g) for s, g in rows]
        images_per_row = [len(s.images) for s, _ in rows]
        features = None
        if "pixel_values" in inputs and "image_grid_thw" in inputs and supports_precomputed_vision(self.model):
            # one vision-tower run per distinct prompt instead of one per row
            with onednn_linears(self.model):
                distinct = encode_images(self.model, inputs["pixel_values"], inputs["image_grid_thw"])  # moves them
            features = repeat_per_row(distinct, images_per_prompt, group_size)
        first_image = [0]
        for k in images_per_row:
            first_image.append(first_image[-1] + k)
        t1 = time.perf_counter()

        was_training = self.model.training
        self.model.eval()
        chunk = self.batch_size or n
        pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
        try:
            for start in range(0, n, chunk):
                stop = min(n, start + chunk)
                part = {"input_ids": prompt_ids[start:stop], "attention_mask": prompt_mask[start:stop],
                        **_slice_rows(vision, images_per_row, start, stop,
                                      [v for v in videos_per_prompt for _ in range(group_size)])}
                if features is not None:
                    part.pop("pixel_values", None)
                    part["mm_encoder_outputs"] = encoder_outputs(features[first_image[start]:first_image[stop]])
                pieces.append(self._generate_rows(part, seeds[start:stop], params))
        finally:
            self.model.train(was_training)
        t2 = time.perf_counter()

        length = max(r.shape[1] for r, _ in pieces)
        response_ids = torch.full((n, length), self.pad_id, dtype=torch.long)
        old_logprobs = torch.zeros(n, length)
        row = 0
        for ids, lps in pieces:
            response_ids[row:row + ids.shape[0], :ids.shape[1]] = ids
            old_logprobs[row:row + ids.shape[0], :ids.shape[1]] = lps
            row += ids.shape[0]
        batch = assemble_batch(samples, group_size, inputs, vision, response_ids, old_logprobs,
                               eos_ids=self.eos_ids, pad_id=self.pad_id, tokenizer=self.tokenizer,
                               timings={"processor_s": t1 - t0, "generate_s": t2 - t1,
                                        "total_s": time.perf_counter() - t0})
        batch.image_features = features
        return batch

    def sync_weights(self, model: torch.nn.Module) -> None:
        """No-op: this engine generates with the trainer's model object itself."""
