"""LoRA on the language model of a VLM, and the reference policy as "the same model, adapter off".

Defaults follow DESIGN.md: adapters on the language model's attention projections only (vLLM ignores
vision-tower LoRA, and the vision tower stays exactly as pretrained); the reference model for KL is the
adapter disabled (``reference_logits_context``), not a second copy in memory.

Initialisations (METHODS.md §5, compared for stability): "default" (B = 0, so the adapted model starts
equal to the base), "gaussian", "orthogonal", and the SVD-based "pissa", "olora", "mica". Note that
"pissa" and "olora" move the principal components out of the base weights: with them the adapted model
still starts equal to the original, but the adapter-disabled model is the *residual*, not the original,
so it is not a faithful KL reference (``BASE_PRESERVING_INITS`` lists the inits where it is).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from mmrlvr.errors import UserError

# peft's PeftModel (get_peft_model, PeftModel.from_pretrained) asks the model `is_gradient_checkpointing`,
# which transformers 5 deprecates for `is_activation_checkpointing`: a FutureWarning on every LoRA run that
# no user can act on (peft's call, not theirs). Only that message is silenced.
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)

# our name -> peft's init_lora_weights value
INITS: dict[str, Any] = {
    "default": True, "gaussian": "gaussian", "orthogonal": "orthogonal", "pissa": "pissa", "olora": "olora",
    "mica": "mica",
}
BASE_PRESERVING_INITS: tuple[str, ...] = ("default", "gaussian", "orthogonal", "mica")

# module-name parts that mark the vision side of a VLM (Qwen "visual", LLaVA "vision_tower", ...)
VISION_MARKERS: tuple[str, ...] = ("visual", "vision_tower", "vision_model", "vision_encoder",
                                   "multi_modal_projector", "mm_projector", "image_newline")


def is_vision_module(name: str) -> bool:
    """True for modules of the vision tower / projector (by name)."""
    return any(part in VISION_MARKERS for part in name.split("."))


def freeze_vision(model: torch.nn.Module) -> int:
    """Stop gradients into the vision tower and projector; returns the number of parameters frozen."""
    frozen = 0
    for name, param in model.named_parameters():
        if is_vision_module(name) and param.requires_grad:
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def _language_targets(model: torch.nn.Module, target_modules: tuple[str, ...]) -> list[str] | tuple[str, ...]:
    """peft target_modules restricted to the language model.

    Where no vision module carries one of the suffixes (Qwen: the vision tower uses ``qkv``/``proj``),
    the short suffix list is kept (a clean adapter_config that vLLM reads); otherwise the full names of
    the language-model modules are listed.
    """
    matches = [name for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in target_modules]
    if not matches:
        raise UserError(f"no Linear module named any of {list(target_modules)} in {type(model).__name__}")
    if not any(is_vision_module(n) for n in matches):
        return tuple(target_modules)
    language = [n for n in matches if not is_vision_module(n)]
    if not language:
        raise UserError(f"all modules named {list(target_modules)} are in the vision tower")
    return language


def apply_lora(model: torch.nn.Module, *, r: int = 16, alpha: int = 32, dropout: float = 0.0,
               target_modules: tuple[str, ...] | list[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
               language_only: bool = True, init: str = "default") -> PeftModel:
    """Wrap ``model`` with a LoRA adapter (trainable) and freeze everything else.

    language_only: adapters only on language-model modules (vision tower untouched, and frozen).
    init: one of ``INITS``.
    """
    if init not in INITS:
        raise UserError(f"unknown LoRA init {init!r}; known: {', '.join(INITS)}")
    if r < 1:
        raise UserError(f"LoRA rank r must be >= 1, got {r}")
    targets = tuple(target_modules)
    if language_only:
        targets = _language_targets(model, targets)  # type: ignore[assignment]
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets),
                        init_lora_weights=INITS[init], bias="none")
    peft_model = get_peft_model(model, config)
    if language_only:
        freeze_vision(peft_model)
    return peft_model


@contextlib.contextmanager
def reference_logits_context(model: torch.nn.Module) -> Iterator[None]:
    """Inside this block ``model`` computes the reference policy: the adapter disabled.

    For a model without an adapter this is a no-op (the caller must then keep its own reference copy).
    """
    if isinstance(model, PeftModel):
        with model.disable_adapter():
            yield
    else:
        yield


def enable_gradient_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Turn on transformers' own gradient checkpointing (``model.gradient_checkpointing: true``).

    Activations of each decoder layer (and vision block) are recomputed in the backward instead of kept:
    less memory for about one extra forward. Non-reentrant checkpointing (``use_reentrant=False``, the
    torch recommendation) works with frozen inputs; for a peft model the embedding output is still made
    to require grad (peft's ``enable_input_require_grads``, as TRL does), so the reentrant variant a
    user might configure elsewhere also gets gradients into LoRA layers. The KV cache is switched off
    for training passes (generation passes ``use_cache=True`` explicitly). Call it before or after
    ``apply_lora``; returns ``model``. Raises UserError for a model without transformers' support.
    """
    core = model.get_base_model() if isinstance(model, PeftModel) else model
    enable = getattr(core, "gradient_checkpointing_enable", None)
    if enable is None or not getattr(core, "supports_gradient_checkpointing", False):
        raise UserError(f"model.gradient_checkpointing: {type(core).__name__} does not support gradient checkpointing")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if getattr(core, "config", None) is not None:
        core.config.use_cache = False
    if isinstance(model, PeftModel) or any(p.requires_grad is False for p in core.get_input_embeddings().parameters()):
        model.enable_input_require_grads()
    return model
