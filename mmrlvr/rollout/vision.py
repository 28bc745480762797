"""Run the vision tower once per distinct image and hand the features to every later pass.

The G rollouts of a prompt share its image(s). Transformers' Qwen-VL models accept precomputed vision
features (``mm_encoder_outputs={"image": BaseModelOutputWithPooling(pooler_output=per-image tuple)}``)
in ``forward`` and ``generate``; we encode the B distinct prompts' images once and reuse the features for
the N = B*G rows of generation, the reference pass and (with a frozen vision tower) the policy passes,
where TRL runs the processor twice and the vision tower three times per rollout.
Models without that argument fall back to ``pixel_values`` (``supports_precomputed_vision`` is False).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def find_vlm_core(model: torch.nn.Module) -> torch.nn.Module | None:
    """The inner module that owns ``get_image_features`` (through peft / DDP wrappers)."""
    for module in model.modules():
        if hasattr(module, "get_image_features") and hasattr(module, "visual"):
            return module
    return None


def supports_precomputed_vision(model: torch.nn.Module) -> bool:
    core = find_vlm_core(model)
    return core is not None and "mm_encoder_outputs" in inspect.signature(core.forward).parameters


@torch.no_grad()
def encode_images(model: torch.nn.Module, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> list[torch.Tensor]:
    """Per-image vision features (one [tokens_i, hidden] tensor per row of ``image_grid_thw``)."""
    core = find_vlm_core(model)
    out = core.get_image_features(pixel_values, image_grid_thw, return_dict=True)
    return list(out.pooler_output)


def repeat_per_row(features: list[torch.Tensor], images_per_prompt: list[int], repeats: int) -> list[torch.Tensor]:
    """Features of B prompts' images -> features of N = B*repeats rows' images (group-contiguous)."""
    out: list[torch.Tensor] = []
    cursor = 0
    for k in images_per_prompt:
        group = features[cursor:cursor + k]
        cursor += k
        for _ in range(repeats):
            out.extend(group)
    return out


def encoder_outputs(features: list[torch.Tensor]) -> dict[str, Any]:
    """The ``mm_encoder_outputs`` keyword for a list of per-image features."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    return {"image": BaseModelOutputWithPooling(pooler_output=tuple(features))}
