"""Frozen teacher models that score the policy's own tokens: on-policy distillation's teacher (``algo.advantage:
opd``) and forward CE's expert (``algo.aux_losses: [{name: forward_ce, params: {expert: ...}}]``) load here.

A teacher is named by

- a ``tiny:`` spec (the offline tiny VLMs, built in the cache on first use: ``mmrlvr.train.model_path``),
- a model folder in the ``save_pretrained`` layout (a Hugging Face checkpoint, an ``mmrlvr export``), or
- a checkpoint of a run, ``RUN_DIR/checkpoints/step-K`` (it holds ``state.json``): its base model with the
  checkpoint's weights, as ``mmrlvr eval`` loads one (``mmrlvr.train.export.load_checkpoint_model``; a LoRA
  checkpoint's adapter is merged, the teacher never trains).

It is loaded once, in the run's ``model.dtype`` on the policy's device, in eval mode with no gradient. It may be
larger than the policy (other widths and depths) but must read the same token ids and image inputs: the same
vocabulary, special tokens and image-patch geometry, and the same image / video token ids in its config
(``processor_mismatch``), else ``UserError`` naming both models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError
from mmrlvr.lazy_import import lazy_module

torch = lazy_module("torch")

#: image processor settings that decide how many vision tokens an image becomes (and which patches they hold)
_GEOMETRY = ("patch_size", "merge_size", "temporal_patch_size")
#: model-config token ids the vision inputs are spliced at
_VISION_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def _tok(processor: Any) -> Any:
    return getattr(processor, "tokenizer", processor)


def processor_mismatch(ours: Any, theirs: Any) -> str | None:
    """How two processors (or tokenizers) would read the same inputs differently, in words, or None when they
    agree: vocabulary (token -> id), special tokens, and the image processor's patch geometry."""
    a, b = _tok(ours), _tok(theirs)
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        moved = sum(1 for t, i in va.items() if t in vb and vb[t] != i)
        missing = len(set(va) - set(vb))
        return (f"the vocabularies differ ({len(vb)} vs {len(va)} tokens; {missing} of the policy's tokens missing, "
                f"{moved} with another id)")
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        if str(getattr(a, name, None)) != str(getattr(b, name, None)):
            return f"{name} differs ({getattr(b, name, None)!r} vs the policy's {getattr(a, name, None)!r})"
    sa, sb = sorted(map(str, a.all_special_tokens)), sorted(map(str, b.all_special_tokens))
    if sa != sb:
        diff = sorted(set(sa) ^ set(sb))
        return f"the special tokens differ ({', '.join(diff[:5])}{' ...' if len(diff) > 5 else ''})"
    ia, ib = getattr(ours, "image_processor", None), getattr(theirs, "image_processor", None)
    if ia is not None and ib is not None:
        for key in _GEOMETRY:
            if getattr(ia, key, None) != getattr(ib, key, None):
                return f"the image processor's {key} differs ({getattr(ib, key, None)} vs {getattr(ia, key, None)})"
    return None


def config_mismatch(policy: Any, teacher: Any) -> str | None:
    """The vision token ids of two models' configs, when they differ (the image features go in at those ids)."""
    ca, cb = getattr(policy, "config", None), getattr(teacher, "config", None)
    for key in _VISION_IDS:
        va, vb = getattr(ca, key, None), getattr(cb, key, None)
        if va is not None and vb is not None and va != vb:
            return f"the model config's {key} differs ({vb} vs {va})"
    return None


def load_frozen(spec: str, *, dtype: str = "float32", device: str = "cpu", attn_implementation: str | None = None,
                who: str = "teacher") -> tuple[Any, Any]:
    """(model, processor) of a teacher named by ``spec`` (module docstring), frozen. ``who`` names the config key in
    errors."""
    from mmrlvr.models import load_policy

    if not isinstance(spec, str) or not spec:
        raise UserError(f"{who}: a model folder, a RUN_DIR/checkpoints/step-K or a tiny: spec is required")
    if spec.startswith("tiny:"):
        from mmrlvr.train.model_path import resolve_model_path

        folder = Path(resolve_model_path(spec))
    else:
        folder = Path(spec)
        if not folder.is_dir():
            raise UserError(f"{who}: {spec}: no such folder (a model folder, a RUN_DIR/checkpoints/step-K or a "
                            "tiny: spec; nothing is downloaded)")
    if (folder / "state.json").is_file():  # a checkpoint of a run: its base model + the checkpoint's weights
        from mmrlvr.train.export import load_checkpoint_model

        model, processor, _ = load_checkpoint_model(folder, dtype=dtype)
        if hasattr(model, "merge_and_unload"):  # a LoRA run's adapter: merged, the teacher never trains
            model = model.merge_and_unload()
        model.to(device)
    else:
        model, processor = load_policy(folder, dtype=dtype, device=device, attn_implementation=attn_implementation)
    model.eval()
    model.requires_grad_(False)
    return model, processor


def load_teacher(rt: Any, spec: str, who: str) -> Any:
    """The frozen teacher ``spec`` for the run ``rt``: the run's dtype and attention kernel, the policy's device;
    refused (``UserError`` naming both models) when it does not read the policy's inputs alike."""
    from mmrlvr.models.placement import model_device

    cfg = rt.cfg
    model, processor = load_frozen(spec, dtype=cfg.model.dtype, device=str(model_device(rt.policy)),
                                   attn_implementation=cfg.model.attn_implementation, who=who)
    problem = processor_mismatch(rt.processor, processor) or config_mismatch(rt.policy, model)
    if problem:
        raise UserError(f"{who}: the teacher {spec} has another tokenizer/processor than the policy "
                        f"{cfg.model.path}: {problem}; the teacher scores the policy's own token ids and images, so "
                        "both need the same vocabulary, special tokens and image processor")
    return model


def same_vision_tower(policy: Any, teacher: Any) -> bool:
    """Whether the two models' vision towers are one function (same weights, bit for bit): then the policy's frozen
    vision features are the teacher's too and its pass reuses them (the student's own earlier checkpoint with
    ``model.freeze_vision``)."""
    from mmrlvr.rollout.vision import find_vlm_core

    ca, cb = find_vlm_core(policy), find_vlm_core(teacher)
    if ca is None or cb is None or type(ca.visual) is not type(cb.visual):
        return False
    conf_a, conf_b = getattr(ca.visual, "config", None), getattr(cb.visual, "config", None)
    if conf_a is not None and conf_b is not None and conf_a.to_dict() != conf_b.to_dict():
        return False
    sa, sb = ca.visual.state_dict(), cb.visual.state_dict()
    if sa.keys() != sb.keys():
        return False
    return all(sa[k].shape == sb[k].shape and sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k].to(sa[k].device))
               for k in sa)
