"""The rollout-engine contract: prompts in, sampled responses with their log-probs out.

An engine turns ``B`` Samples into ``B * G`` responses (G per prompt, group-contiguous: rows
``g*G .. g*G+G-1`` belong to prompt ``g``). The result, ``RolloutBatch``, carries everything the trainer
needs for a teacher-forced forward of prompt + response without running the processor again.

Sequence layout (the one every stage relies on):
    input_ids = [left-padded prompt (P tokens)] + [response (L tokens), right-padded]
    logits predicting response token j sit at position P - 1 + j of the model output,
    i.e. ``logits[:, P-1 : P-1+L]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mmrlvr.types import Completion, Sample


@dataclass
class SamplingParams:
    """Sampling settings shared by every engine."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    greedy: bool = False


@dataclass
class RolloutBatch:
    """G responses for each of B prompts, ready for teacher forcing. N = B*G rows.

    samples:         list of N Samples (prompt g repeated G times, group-contiguous)
    group_index:     [N] long, prompt index g in 0..B-1
    sample_index:    [N] long, index within the group 0..G-1
    input_ids:       [N, P+L] long, prompt left-padded then response right-padded with pad id
    attention_mask:  [N, P+L] long, 1 on real prompt and response tokens
    response_ids:    [N, L] long (pad id after the end)
    response_mask:   [N, L] float, 1.0 on response tokens that count (the sampled EOS included)
    old_logprobs:    [N, L] float, log pi_old(token) under the sampling policy (0 where masked);
                     computed with the same temperature as sampling
    vision:          extra model inputs for the N rows (pixel_values, image_grid_thw, ...)
                     already expanded to N rows in the processor's own layout
    prompt_length:   P
    completions:     N Completions (decoded text, finish_reason "stop" | "length", token ids)
    image_features:  optional per-image vision-tower outputs for the N rows' images (in image_grid_thw
                     order), computed once per distinct prompt; reusable while the vision tower is frozen
    turns:           multi-turn rollouts (``mmrlvr.rollout.multiturn``): per row, its turns in order (dicts: kind
                     "model" | "tool", start/end response positions, text, calls, images); None for one turn.
                     Tool turns are real tokens (attention_mask 1) that carry no loss (response_mask 0)
    row_images:      multi-turn: per row, its images in sequence order (the prompt's, then every returned one)
    trajectory_index / final_segment: ReSum (``rollout.summarize``): a trajectory that summarised its history is
                     several rows (segments, consecutive); every segment trains with the trajectory's advantage,
                     computed once per trajectory from its final segment. None otherwise
    """

    samples: list[Sample]
    group_index: torch.Tensor
    sample_index: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    vision: dict[str, Any]
    prompt_length: int
    completions: list[Completion]
    timings: dict[str, float] = field(default_factory=dict)
    image_features: list | None = None  # list[mmrlvr.rollout.vision.ImageFeatures]
    turns: list[list[dict[str, Any]]] | None = None
    row_images: list[list[Any]] | None = None
    trajectory_index: torch.Tensor | None = None  # ReSum: [N] the trajectory of each segment row (None: row = one)
    final_segment: torch.Tensor | None = None  # ReSum: [N] bool, the trajectory's last segment (holds its answer)

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def group_slices(self) -> list[slice]:
        """The rows of each group, in order (groups are contiguous; their sizes may differ: a budget sampler)."""
        gi = self.group_index.tolist()
        starts = [i for i in range(len(gi)) if i == 0 or gi[i] != gi[i - 1]]
        return [slice(a, b) for a, b in zip(starts, starts[1:] + [len(gi)])]

    def rows_per_group(self) -> int | list[int]:
        """G when every group has G rows, else each group's row count (``VisionFeatureCache``'s layout)."""
        g = self.uniform_group_size()
        return g if g is not None else [s.stop - s.start for s in self.group_slices()]

    def rows_sharing_images(self) -> int | list[int]:
        """Rows that carry the same images, in ``rows_per_group`` form (``VisionFeatureCache`` encodes one row of
        each): a group's rows share their prompt's images, but each multi-turn row has its own returned images."""
        return 1 if self.turns is not None else self.rows_per_group()

    def uniform_group_size(self) -> int | None:
        """G when every group has G rows, else None (then nothing may assume rows_per_prompt = G)."""
        sizes = {s.stop - s.start for s in self.group_slices()}
        return sizes.pop() if len(sizes) == 1 else None

    def images_per_row(self, vision_start_id: int) -> list[int]:
        """Images in each row: its prompt's, then (multi-turn) those tool turns returned. A ``<|vision_start|>`` the
        model sampled itself (an engine that does not ban it) is text in a response, not an image, so only the
        prompt and the tool turns (real tokens without loss) are counted."""
        starts = self.input_ids == vision_start_id
        P = self.prompt_length
        tool = (self.attention_mask[:, P:] > 0) & (self.response_mask <= 0)
        return (starts[:, :P].sum(dim=1) + (starts[:, P:] & tool).sum(dim=1)).tolist()

    def response_extent(self, row: int) -> int:
        """Response positions up to and including the row's last token that carries loss (its end-of-sequence
        token): the whole trajectory for a multi-turn row, whose tool turns sit between the model's own tokens."""
        nz = (self.response_mask[row] > 0).nonzero()
        return int(nz[-1]) + 1 if len(nz) else 0

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments for ``model(**inputs)`` (teacher forcing of prompt + response)."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, **self.vision}


class RolloutEngine(Protocol):
    """Anything that samples G responses per Sample with per-(seed, step, prompt, sample) determinism."""

    def generate(self, samples: list[Sample], group_size: int, params: SamplingParams, *,
                 seed: int, step: int) -> RolloutBatch: ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Bring the engine's copy of the policy up to date (no-op when it shares the trainer's model)."""
        ...
