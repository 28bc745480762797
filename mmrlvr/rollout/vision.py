"""Run the vision tower once per distinct image and hand the features to every later pass.

The G rollouts of a prompt share its image(s). Transformers' Qwen-VL models accept precomputed vision
features (``mm_encoder_outputs={"image": BaseModelOutputWithPooling(pooler_output=per-image tuple)}``)
in ``forward`` and ``generate``; we encode the B distinct prompts' images once and reuse the features for
the N = B*G rows of generation, the reference pass and (with a frozen vision tower) the policy passes,
where TRL runs the processor twice and the vision tower three times per rollout.
Models without that argument fall back to ``pixel_values`` (``supports_precomputed_vision`` is False).

Qwen3-VL also injects per-layer "deepstack" features of each image into the first decoder layers; an
``ImageFeatures`` keeps them beside the merged tokens, so the reused features are the complete output of
the vision tower for that image.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from mmrlvr.models.placement import to_model


@dataclass(frozen=True)
class ImageFeatures:
    """One image's vision-tower output.

    pooled:      [tokens, hidden] the merged tokens that replace the image placeholders
    deepstack:   Qwen3-VL's per-layer features of this image ([tokens, hidden] each); () for other models
    output_type: the ``ModelOutput`` class the model's ``get_image_features`` returns (rebuilt for reuse)
    """

    pooled: torch.Tensor
    deepstack: tuple[torch.Tensor, ...] = ()
    output_type: type | None = None


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
def encode_images(model: torch.nn.Module, pixel_values: torch.Tensor,
                  image_grid_thw: torch.Tensor) -> list[ImageFeatures]:
    """Per-image vision features, one ``ImageFeatures`` per row of ``image_grid_thw``, on the model's device
    (the inputs are moved there)."""
    core = find_vlm_core(model)
    pixel_values, image_grid_thw = to_model((pixel_values, image_grid_thw), core)
    out = core.get_image_features(pixel_values, image_grid_thw, return_dict=True)
    layers = getattr(out, "deepstack_features", None) or []  # per layer: a per-image tuple
    return [ImageFeatures(pooled=p, deepstack=tuple(layer[i] for layer in layers), output_type=type(out))
            for i, p in enumerate(out.pooler_output)]


def repeat_per_row(features: list[ImageFeatures], images_per_prompt: list[int], repeats: int) -> list[ImageFeatures]:
    """Features of B prompts' images -> features of N = B*repeats rows' images (group-contiguous)."""
    out: list[ImageFeatures] = []
    cursor = 0
    for k in images_per_prompt:
        group = features[cursor:cursor + k]
        cursor += k
        for _ in range(repeats):
            out.extend(group)
    return out


def select_images(mm_encoder_outputs: dict[str, Any], keep: list[int]) -> dict[str, Any] | None:
    """The ``mm_encoder_outputs`` of images ``keep`` only (their order), or None when it holds anything but
    per-image features (``encoder_outputs``'s layout)."""
    out = mm_encoder_outputs.get("image") if set(mm_encoder_outputs) == {"image"} else None
    pooled = getattr(out, "pooler_output", None)
    if not isinstance(pooled, (tuple, list)):
        return None
    layers = getattr(out, "deepstack_features", None) or []
    return encoder_outputs([ImageFeatures(pooled=pooled[i], deepstack=tuple(layer[i] for layer in layers),
                                          output_type=type(out)) for i in keep])


def encoder_outputs(features: list[ImageFeatures]) -> dict[str, Any]:
    """The ``mm_encoder_outputs`` keyword for a list of per-image features (deepstack layers included)."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    pooled = tuple(f.pooled for f in features)
    if not features or not features[0].deepstack:
        return {"image": BaseModelOutputWithPooling(pooler_output=pooled)}
    layers = [tuple(f.deepstack[k] for f in features) for k in range(len(features[0].deepstack))]
    return {"image": features[0].output_type(pooler_output=pooled, deepstack_features=layers)}
