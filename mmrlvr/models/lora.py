"""LoRA on the language model of a VLM, and the reference policy as "the same model, adapter off".

Defaults: adapters on the language model's attention projections only (vLLM ignores
vision-tower LoRA, and the vision tower stays exactly as pretrained); the reference model for KL is the
adapter disabled (``reference_logits_context``), not a second copy in memory.

Initialisations (peft's, plus the RL-specific ones below): "default" (B = 0, so the adapted model starts
equal to the base), "gaussian", "orthogonal", and the SVD-based "pissa", "olora", "mica". Note that
"pissa" and "olora" move the principal components out of the base weights: with them the adapted model
still starts equal to the original, but the adapter-disabled model is the *residual*, not the original,
so it is not a faithful KL reference (``BASE_PRESERVING_INITS`` lists the inits where it is).

RL-specific SVD inits (``init_svd_lora``, arXiv 2606.31813; docs/methods.md, "LoRA initialisation"):
"rlpo" sets A0 = Vh[:r] (the top right singular vectors of each adapted W = U diag(s) Vh, fp32 thin SVD)
and "rlmo" A0 = Vh[-r:] (the minor ones), both with B0 = 0 and W untouched: the adapted model *and* the
adapter-off reference equal the base exactly at step 0 (base-preserving). "milora" (MiLoRA, Wang et al.
2024, arXiv:2406.09044) is PiSSA on the minor components: B0 = U_r sqrt(S_r), A0 = sqrt(S_r) Vh_r over the
r smallest singular values, and W_res = W - scale B0 A0; like PiSSA it moves that energy out of the frozen
base, so the adapter-off model is the residual, not the original (not base-preserving).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from mmrlvr.errors import UserError
from mmrlvr.lazy_import import lazy_module

torch = lazy_module("torch")  # config checks read INITS without torch; building an adapter imports it

if TYPE_CHECKING:
    from peft import PeftModel

# peft is imported where an adapter is built or loaded, not with this module: a full fine-tuning run never
# needs it, and importing it costs ~100 MiB of resident memory (measured, torch + transformers + peft).


def is_peft_model(model: object) -> bool:
    """True for a peft ``PeftModel``; never imports peft (a model can only be one if peft is loaded)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)

# peft's PeftModel (get_peft_model, PeftModel.from_pretrained) asks the model `is_gradient_checkpointing`,
# which transformers 5 deprecates for `is_activation_checkpointing`: a FutureWarning on every LoRA run that
# no user can act on (peft's call, not theirs). Only that message is silenced.
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)

# our name -> peft's init_lora_weights value
INITS: dict[str, Any] = {
    "default": True, "gaussian": "gaussian", "orthogonal": "orthogonal", "pissa": "pissa", "olora": "olora",
    "mica": "mica", "rlpo": True, "rlmo": True, "milora": True,
}
#: inits computed here from an fp32 SVD of each adapted weight (peft builds the layers with B = 0 first)
SVD_INITS: tuple[str, ...] = ("rlpo", "rlmo", "milora")
BASE_PRESERVING_INITS: tuple[str, ...] = ("default", "gaussian", "orthogonal", "mica", "rlpo", "rlmo")

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


def meta_model(folder: str | Path) -> torch.nn.Module:
    """The architecture of the model in ``folder`` (its ``config.json``) on the meta device: every module, no
    weights read, no memory — what a check of the model's *structure* needs before a run loads it."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)


def lora_target_problems(folder: str | Path, target_modules: tuple[str, ...] | list[str]) -> list[str]:
    """Why ``target_modules`` cannot adapt the language model of the model in ``folder`` (the rule ``apply_lora``
    applies, checked on the meta-device architecture), or []."""
    try:
        _language_targets(meta_model(folder), tuple(target_modules))
    except UserError as exc:
        return [str(exc)]
    return []


def apply_lora(model: torch.nn.Module, *, r: int = 16, alpha: int = 32, dropout: float = 0.0,
               target_modules: tuple[str, ...] | list[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
               language_only: bool = True, init: str = "default", progress: bool = True) -> "PeftModel":
    """Wrap ``model`` with a LoRA adapter (trainable) and freeze everything else.

    language_only: adapters only on language-model modules (vision tower untouched, and frozen).
    init: one of ``INITS``. progress: a progress bar over layers for the SVD inits (rlpo/rlmo/milora).
    """
    if init not in INITS:
        raise UserError(f"unknown LoRA init {init!r}; known: {', '.join(INITS)}")
    if r < 1:
        raise UserError(f"LoRA rank r must be >= 1, got {r}")
    targets = tuple(target_modules)
    if language_only:
        targets = _language_targets(model, targets)  # type: ignore[assignment]
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets),
                        init_lora_weights=INITS[init], bias="none")
    peft_model = get_peft_model(model, config)
    if init in SVD_INITS:
        init_svd_lora(peft_model, init, progress=progress)
    if language_only:
        freeze_vision(peft_model)
    return peft_model


def _lora_layers(model: torch.nn.Module, adapter: str) -> list[tuple[str, torch.nn.Module]]:
    """(name, peft LoRA layer) for every layer carrying ``adapter`` with a 2-D base weight."""
    out = []
    for name, module in model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        base = getattr(module, "base_layer", None)
        if isinstance(lora_a, torch.nn.ModuleDict) and adapter in lora_a and base is not None \
                and getattr(base, "weight", None) is not None and base.weight.dim() == 2:
            out.append((name, module))
    return out


def svd_lora_factors(weight: torch.Tensor, r: int, init: str, scale: float = 1.0
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(A0 [r, in], B0 [out, r], W_res [out, in] or None) for one weight W [out, in], in float32.

    Thin SVD W = U diag(S) Vh (fp32, whatever W's dtype). rlpo: A0 = Vh[:r], B0 = 0; rlmo: A0 = Vh[-r:],
    B0 = 0 (W_res None: the base stays as it is; singular values are not folded in, arXiv 2606.31813).
    milora: over the r smallest singular values, A0 = sqrt(S_r/scale) Vh_r, B0 = U_r sqrt(S_r/scale), and
    W_res = W - scale B0 A0 (peft's PiSSA convention, divided by the LoRA scale alpha/r so that
    scale B0 A0 is exactly the removed part). r larger than min(out, in) is capped there (the rest of A
    stays zero, B zero).
    """
    with torch.no_grad():
        w = weight.detach().float()
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        k = min(r, s.numel())
        a = w.new_zeros(r, w.shape[1])
        b = w.new_zeros(w.shape[0], r)
        if init == "rlpo":
            a[:k] = vh[:k]
            return a, b, None
        if init == "rlmo":
            a[:k] = vh[vh.shape[0] - k:]
            return a, b, None
        if init == "milora":
            root = (s[s.numel() - k:] / scale).sqrt()  # [k]
            a[:k] = root[:, None] * vh[vh.shape[0] - k:]
            b[:, :k] = u[:, u.shape[1] - k:] * root[None, :]
            return a, b, w - scale * (b @ a)
        raise ValueError(f"not an SVD init: {init!r} (known: {', '.join(SVD_INITS)})")


def init_svd_lora(model: torch.nn.Module, init: str, *, adapter: str = "default", progress: bool = True) -> int:
    """Set the LoRA factors of every adapted layer of ``model`` from an fp32 SVD of its base weight.

    Runs once at start-up, one layer at a time on the weight's own device (a GPU SVD for a large model),
    with a tqdm bar over layers. Works on whatever peft adapted: with ``language_only`` the vision tower
    has no LoRA layer and is never touched. Returns the number of layers initialised.
    """
    from tqdm.auto import tqdm

    with torch.no_grad():
        layers = _lora_layers(model, adapter)
        for _name, layer in tqdm(layers, desc=f"LoRA init ({init}, fp32 SVD)", disable=not progress or not layers,
                                 leave=False):
            base = layer.base_layer
            weight = base.weight
            fan_in_fan_out = bool(getattr(layer, "fan_in_fan_out", False))
            w = weight.T if fan_in_fan_out else weight
            lora_a, lora_b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
            a, b, residual = svd_lora_factors(w, lora_a.shape[0], init, scale=float(layer.scaling[adapter]))
            lora_a.copy_(a.to(lora_a.dtype))
            lora_b.copy_(b.to(lora_b.dtype))
            if residual is not None:
                residual = residual.T if fan_in_fan_out else residual
                weight.data.copy_(residual.to(weight.dtype))
        return len(layers)


@contextlib.contextmanager
def reference_logits_context(model: torch.nn.Module) -> Iterator[None]:
    """Inside this block ``model`` computes the reference policy: the adapter disabled.

    For a model without an adapter this is a no-op (the caller must then keep its own reference copy).
    """
    if is_peft_model(model):
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
    core = model.get_base_model() if is_peft_model(model) else model
    if not getattr(core, "supports_gradient_checkpointing", False):
        raise UserError(f"model.gradient_checkpointing: {type(core).__name__} does not support gradient checkpointing")
    new_api = getattr(core, "activation_checkpointing_enable", None)  # transformers >= 5.2x; the old name warns
    if new_api is not None:
        new_api(activation_checkpointing_kwargs={"use_reentrant": False})
    elif getattr(core, "gradient_checkpointing_enable", None) is not None:
        core.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise UserError(f"model.gradient_checkpointing: {type(core).__name__} does not support gradient checkpointing")
    if getattr(core, "config", None) is not None:
        core.config.use_cache = False
    if is_peft_model(model) or any(p.requires_grad is False for p in core.get_input_embeddings().parameters()):
        model.enable_input_require_grads()
    return model
