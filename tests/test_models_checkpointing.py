"""model.gradient_checkpointing: layers really recompute in the backward, gradients unchanged (full
fine-tuning and LoRA), and the training pass's saved activations shrink."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.models.lora import apply_lora, enable_gradient_checkpointing, freeze_vision
from mmrlvr.train.forward import token_logprobs


@pytest.fixture(scope="module")
def tiny_and_batch():
    import numpy as np
    from PIL import Image

    from mmrlvr.models.tiny import MODEL_CLASSES, build_tokenizer, make_config, make_processor

    tok = build_tokenizer()
    cfg = make_config("qwen2_5_vl", tok)
    torch.manual_seed(0)
    model = MODEL_CLASSES["qwen2_5_vl"](cfg)
    ip = make_processor("qwen2_5_vl", tok, cfg).image_processor
    img = Image.fromarray(np.random.RandomState(0).randint(0, 256, (56, 56, 3), dtype=np.uint8))
    vis = ip([img, img], return_tensors="pt")
    prompt = [5, cfg.vision_start_token_id] + [cfg.image_token_id] * 4 + [cfg.vision_end_token_id, 7]
    resp = torch.randint(20, 400, (2, 6), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([torch.tensor([prompt] * 2), resp], 1)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), **vis}, resp


def _grads_and_layer_calls(model, inputs, resp):
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    layer = core.model.language_model.layers[0].mlp  # inside the checkpointed forward (hooks on the layer are not)
    calls = []
    handle = layer.register_forward_pre_hook(lambda m, a: calls.append(torch.is_grad_enabled()))
    saved = []
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            logp, _ = token_logprobs(model, inputs, resp)
        n_forward = len(calls)
        (logp * torch.linspace(-1, 1, resp.numel()).view_as(logp)).sum().backward()
    finally:
        handle.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, n_forward, len(calls) - n_forward, sum(saved)


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointing_recomputes_layers_with_the_same_gradients(tiny_and_batch, lora):
    base, inputs, resp = tiny_and_batch
    plain, ckpt = copy.deepcopy(base), copy.deepcopy(base)
    freeze_vision(plain)
    freeze_vision(ckpt)
    if lora:
        plain = apply_lora(plain, r=4, init="gaussian")
        ckpt = apply_lora(ckpt, r=4, init="gaussian")
        ckpt.load_state_dict(plain.state_dict())
    assert enable_gradient_checkpointing(ckpt) is ckpt
    g_plain, fwd_plain, re_plain, saved_plain = _grads_and_layer_calls(plain, inputs, resp)
    g_ckpt, fwd_ckpt, re_ckpt, saved_ckpt = _grads_and_layer_calls(ckpt, inputs, resp)
    assert (fwd_plain, re_plain) == (1, 0)
    assert (fwd_ckpt, re_ckpt) == (1, 1)  # the layer ran again inside the backward
    assert saved_ckpt < saved_plain  # fewer activations kept from forward to backward
    assert g_ckpt.keys() == g_plain.keys() and g_plain
    assert all("lora_" in n for n in g_plain) == lora
    for name in g_plain:
        assert_close(g_ckpt[name], g_plain[name], atol=1e-5, rtol=1e-4, msg=name)


def test_model_without_support_is_a_user_error():
    from mmrlvr.errors import UserError

    with pytest.raises(UserError, match="gradient checkpointing"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))
