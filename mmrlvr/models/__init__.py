"""Models: load a policy + processor, wrap it with LoRA, build the offline tiny Qwen-family VLMs.

- ``load_policy(path, dtype=..., device=...) -> (model, processor)``: any local image-text-to-text folder.
- ``apply_lora`` / ``freeze_vision`` / ``reference_logits_context``: LoRA on the language model only.
- ``build_tiny(family, out_dir)``: a tiny random Qwen2-VL / Qwen2.5-VL / Qwen3-VL saved like a checkpoint.
- ``warm_start(out_dir, ...)``: a tiny model SFT-ed on a synthetic task to 30-60% accuracy (cached).

Importing this package registers the image-only Qwen processors with ``AutoProcessor`` when torchvision
is missing (``mmrlvr.models.compat``).
"""

from mmrlvr.models.compat import HAS_TORCHVISION, load_processor, register_image_only_processors
from mmrlvr.models.loading import load_policy
from mmrlvr.models.lora import apply_lora, freeze_vision, reference_logits_context
from mmrlvr.models.tiny import FAMILIES, build_tiny

register_image_only_processors()


def __getattr__(name: str):
    # warm_start pulls in data + evaluation; import it only when asked for
    if name == "warm_start":
        from mmrlvr.models.warmstart import warm_start

        return warm_start
    raise AttributeError(name)


__all__ = [
    "FAMILIES", "HAS_TORCHVISION", "apply_lora", "build_tiny", "freeze_vision", "load_policy",
    "load_processor", "reference_logits_context", "register_image_only_processors", "warm_start",
]
