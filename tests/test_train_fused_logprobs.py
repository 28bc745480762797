"""Fused LM head + log-softmax + gather (``logprobs_from_hidden``) and the trainer's ``token_logprobs`` on it:
equal to today's logits path (``response_logits`` + ``logprobs_from_logits``) within 1e-5 in float32, on
hand-sized tensors, the tiny VLM and a Qwen2.5-VL-3B-shaped stand-in, and never a [N, L, V] tensor."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.algos import entropy_from_logits, logprobs_from_logits
from mmrlvr.algos.logits import logprobs_from_hidden
from mmrlvr.train.forward import VisionFeatureCache, fusable_head, prefix_shared_logprobs, response_logits, token_logprobs


def _logits_path(hidden, weight, ids, temperature=1.0):
    logits = hidden @ weight.t()
    return (logprobs_from_logits(logits, ids, temperature=temperature),
            entropy_from_logits(logits.detach(), temperature=temperature))


def test_hand_worked_two_token_vocabulary():
    # h = [1, 0], W rows (log 3, 0) and (0, 0): logits (log 3, 0) -> p = (.75, .25)
    hidden = torch.tensor([[[1.0, 0.0]]])
    weight = torch.tensor([[math.log(3), 0.0], [0.0, 0.0]])
    logp, ent = logprobs_from_hidden(hidden, weight, torch.tensor([[1]]), with_entropy=True)
    assert_close(logp, torch.tensor([[math.log(0.25)]]))
    assert_close(ent, torch.tensor([[-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]]))
    # temperature 2: logits (log 3 / 2, 0) -> p(0) = sqrt(3) / (sqrt(3) + 1)
    logp2, _ = logprobs_from_hidden(hidden, weight, torch.tensor([[0]]), temperature=2.0)
    assert_close(logp2, torch.tensor([[math.log(math.sqrt(3) / (math.sqrt(3) + 1))]]))


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_logits_path(chunk_size, temperature):
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(3, 9, 16, generator=gen)  # [N, S, H]
    weight = torch.randn(50, 16, generator=gen) * 0.5
    ids = torch.randint(0, 50, (3, 5), generator=gen)
    h1, w1 = full.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    h2, w2 = full.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logp, ent = logprobs_from_hidden(h1[:, 2:7], w1, ids, temperature=temperature, chunk_size=chunk_size,
                                     with_entropy=True)  # a non-contiguous slice, like the trainer's
    ref_logp, ref_ent = _logits_path(h2[:, 2:7], w2, ids, temperature)
    assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert not ent.requires_grad
    up = torch.randn(3, 5, generator=gen)
    (logp * up).sum().backward()
    (ref_logp * up).sum().backward()
    assert_close(h1.grad, h2.grad, atol=1e-5, rtol=1e-5)
    assert_close(w1.grad, w2.grad, atol=1e-5, rtol=1e-5)
    assert h1.grad[:, :2].eq(0).all() and h1.grad[:, 7:].eq(0).all()


def test_frozen_head_hand_worked_gradient():
    # h = [1, 0], W rows (log 3, 0) and (0, 0): p = (.75, .25); the expected row p @ W = (.75 log 3, 0), so
    # d log p(1) / dh = (W[1] - p @ W) / T = (-.75 log 3, 0) at T = 1 (the head frozen: no dL/dW)
    hidden = torch.tensor([[[1.0, 0.0]]], requires_grad=True)
    weight = torch.tensor([[math.log(3), 0.0], [0.0, 0.0]])
    logp, _ = logprobs_from_hidden(hidden, weight, torch.tensor([[1]]))
    (2.0 * logp).sum().backward()
    assert_close(hidden.grad, torch.tensor([[[-2.0 * 0.75 * math.log(3), 0.0]]]))


@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_frozen_head_gradient_equals_the_logits_path_and_never_rereads_the_head(chunk_size, temperature):
    """LoRA's case: the head is frozen, so the forward computes dlogp/dh = (W[y] - softmax @ W) / T and the
    backward only scales it; the head may even change after the forward (no saved tensor reads it)."""
    gen = torch.Generator().manual_seed(4)
    full = torch.randn(3, 9, 16, generator=gen)
    weight = torch.randn(50, 16, generator=gen) * 0.5
    ids = torch.randint(0, 50, (3, 5), generator=gen)
    h1, h2 = full.clone().requires_grad_(True), full.clone().requires_grad_(True)
    w1 = weight.clone()
    logp, ent = logprobs_from_hidden(h1[:, 2:7], w1, ids, temperature=temperature, chunk_size=chunk_size,
                                     with_entropy=True)
    ref_logp, ref_ent = _logits_path(h2[:, 2:7], weight, ids, temperature)
    assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    w1.zero_()  # a saved head would make the backward fail (version counter) or use zeros
    up = torch.randn(3, 5, generator=gen)
    (logp * up).sum().backward()
    (ref_logp * up).sum().backward()
    assert_close(h1.grad, h2.grad, atol=1e-5, rtol=1e-5)
    assert h1.grad[:, :2].eq(0).all() and h1.grad[:, 7:].eq(0).all()


def test_frozen_head_gradcheck_float64_and_bf16():
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(2, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(6, 4, dtype=torch.float64, generator=gen)
    ids = torch.randint(0, 6, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(
        lambda h: logprobs_from_hidden(h, weight, ids, temperature=0.8, chunk_size=2)[0], (hidden,))
    hb = torch.randn(2, 4, 8, generator=gen).bfloat16().requires_grad_(True)
    wb = torch.randn(30, 8, generator=gen).bfloat16()
    idb = torch.randint(0, 30, (2, 4), generator=gen)
    logp, _ = logprobs_from_hidden(hb, wb, idb, chunk_size=3)
    logp.sum().backward()
    hr = hb.detach().clone().requires_grad_(True)
    logprobs_from_logits(torch.nn.functional.linear(hr, wb), idb).sum().backward()
    assert hb.grad.dtype == torch.bfloat16
    assert_close(hb.grad.float(), hr.grad.float(), atol=2e-2, rtol=2e-2)  # bf16 rounding of the products


def test_gradcheck_float64():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(6, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.randint(0, 6, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(
        lambda h, w: logprobs_from_hidden(h, w, ids, temperature=0.8, chunk_size=2)[0], (hidden, weight))


def test_bf16_head_matches_the_bf16_logits_path():
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 4, 8, generator=gen).bfloat16()
    weight = torch.randn(30, 8, generator=gen).bfloat16().requires_grad_(True)
    ids = torch.randint(0, 30, (2, 4), generator=gen)
    logp, _ = logprobs_from_hidden(hidden, weight, ids, chunk_size=3)
    ref = logprobs_from_logits(torch.nn.functional.linear(hidden, weight), ids)
    assert logp.dtype == torch.float32
    assert_close(logp, ref, atol=1e-5, rtol=1e-5)  # the same bf16 logits, up-cast per chunk
    logp.sum().backward()
    assert weight.grad.dtype == torch.bfloat16


def test_saves_no_vocabulary_sized_tensor():
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 6, 8, generator=gen, requires_grad=True) * 1.0
    weight = torch.randn(400, 8, generator=gen, requires_grad=True)
    ids = torch.randint(0, 400, (2, 6), generator=gen)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logp, _ = logprobs_from_hidden(hidden, weight, ids, chunk_size=4, with_entropy=True)
    # only the inputs (hidden, weight, ids) are kept: nothing of size N * L * V
    assert saved and max(t.numel() for t in saved) <= weight.numel() < 2 * 6 * 400


def test_bad_arguments():
    h, w, ids = torch.zeros(2, 3, 4), torch.zeros(5, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="does not match"):
        logprobs_from_hidden(h, w, ids[:, :2])
    with pytest.raises(ValueError, match="not"):
        logprobs_from_hidden(h, torch.zeros(5, 3), ids)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_hidden(h, w, ids, temperature=0.0)


# ------------------------------------------------------------------------------------ on a real VLM
def _vlm_batch(model, tok, side, G=2, P_text=(5, 9, 11), L=7, seed=0):
    """Two groups of G rows: prompt (text + one image of side x side) + ragged random responses."""
    import numpy as np
    from PIL import Image

    from mmrlvr.models.tiny import make_processor

    cfg = model.config
    ip = make_processor("qwen2_5_vl", tok, cfg, image_size=side).image_processor
    rng = np.random.RandomState(seed)
    imgs = [Image.fromarray(rng.randint(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(2)]
    vis = ip([imgs[0]] * G + [imgs[1]] * G, return_tensors="pt")
    n_img = int(vis["image_grid_thw"][0].prod()) // 4
    prompt = list(P_text) + [cfg.vision_start_token_id] + [cfg.image_token_id] * n_img + [cfg.vision_end_token_id]
    gen = torch.Generator().manual_seed(seed)
    resp = torch.randint(20, 500, (2 * G, L), generator=gen)
    rmask = torch.ones(2 * G, L, dtype=torch.long)
    rmask[1, 4:] = 0
    resp[rmask == 0] = tok.pad_token_id
    ids = torch.cat([torch.tensor([prompt] * (2 * G)), resp], 1)
    attn = torch.cat([torch.ones(2 * G, len(prompt), dtype=torch.long), rmask], 1)
    return {"input_ids": ids, "attention_mask": attn, **vis}, resp


def _today(model, inputs, resp, temperature):
    logits = response_logits(model, inputs, resp.shape[1])
    return (logprobs_from_logits(logits, resp, temperature=temperature),
            entropy_from_logits(logits.detach(), temperature=temperature))


@pytest.fixture(scope="module")
def tiny():
    from mmrlvr.models.tiny import MODEL_CLASSES, build_tokenizer, make_config

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = MODEL_CLASSES["qwen2_5_vl"](make_config("qwen2_5_vl", tok)).eval()
    return model, tok


def test_tiny_vlm_values_and_gradients_equal_todays_path(tiny):
    model, tok = tiny
    inputs, resp = _vlm_batch(model, tok, side=56)
    assert fusable_head(model) is model.lm_head
    logp, ent = token_logprobs(model, inputs, resp, temperature=0.9, with_entropy=True, chunk_size=5)
    grads = torch.autograd.grad(logp.sum(), list(model.parameters()), allow_unused=True)
    ref_logp, ref_ent = _today(model, inputs, resp, 0.9)
    ref_grads = torch.autograd.grad(ref_logp.sum(), list(model.parameters()), allow_unused=True)
    assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        assert (g is None) == (r is None), name
        if g is not None:
            assert_close(g, r, atol=1e-5, rtol=1e-4, msg=name)


def test_tiny_vlm_never_builds_response_logits(tiny):
    model, tok = tiny
    inputs, resp = _vlm_batch(model, tok, side=56)
    V = model.lm_head.out_features
    outputs = []
    handle = model.lm_head.register_forward_hook(lambda m, a, out: outputs.append(out.shape))
    saved = []
    try:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            token_logprobs(model, inputs, resp, with_entropy=True)
    finally:
        handle.remove()
    assert outputs == [torch.Size([resp.shape[0], 0, V])]  # the head ran on an empty slice
    head = model.lm_head.weight.untyped_storage().data_ptr()
    vocab_sized = [t for t in saved if V in t.shape and t.untyped_storage().data_ptr() != head]
    assert saved and not vocab_sized  # nothing vocabulary-sized kept for backward but the head's weight


def test_lora_and_no_grad_reference_pass(tiny):
    peft = pytest.importorskip("peft")
    model, tok = tiny
    import copy

    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                     init_lora_weights="gaussian"))
    with torch.no_grad():  # B starts at 0 (adapted = base); move it so the adapter changes the policy
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(5))
    inputs, resp = _vlm_batch(model, tok, side=56, seed=1)
    assert fusable_head(lora) is not None
    logp, _ = token_logprobs(lora, inputs, resp)
    ref, _ = _today(lora, inputs, resp, 1.0)
    assert_close(logp, ref, atol=1e-5, rtol=1e-5)
    with torch.no_grad(), lora.disable_adapter():
        base, _ = token_logprobs(lora, inputs, resp)
    with torch.no_grad():
        plain, _ = token_logprobs(model, inputs, resp)
    assert_close(base, plain, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(base, logp, atol=1e-4)  # the adapter is really on in the first pass


def _grouped(model, tok, G=3, seed=2):
    inputs, resp = _vlm_batch(model, tok, side=56, G=G, seed=seed)
    P = inputs["input_ids"].shape[1] - resp.shape[1]
    inputs["mm_token_type_ids"] = (inputs["input_ids"] == model.config.image_token_id).int()
    return inputs, resp, P


def test_shared_prefix_reference_pass_equals_the_full_pass(tiny):
    model, tok = tiny
    inputs, resp, P = _grouped(model, tok)
    with torch.no_grad():
        full, _ = token_logprobs(model, inputs, resp, temperature=0.8)
        shared, _ = prefix_shared_logprobs(model, inputs, resp, P, 3, temperature=0.8)
    valid = inputs["attention_mask"][:, P:].bool()
    assert_close(shared[valid], full[valid], atol=1e-5, rtol=1e-5)
    # rows that are not groups of one prompt: no sharing (the caller runs the full pass)
    swapped = {**inputs, "input_ids": inputs["input_ids"].clone()}
    swapped["input_ids"][1, 0] = 7
    assert prefix_shared_logprobs(model, swapped, resp, P, 3) is None


def test_policy_pass_with_a_shared_prefix_has_the_whole_rows_values_and_gradients(tiny):
    """The training pass: the prompt's one encoding gets the G rows' gradient (the repeat's backward sums it),
    so log-probs, entropies and every parameter's gradient equal the whole-row pass's."""
    import copy

    model, tok = tiny
    model = copy.deepcopy(model)
    model.model.visual.requires_grad_(False)  # the trainer's default (model.freeze_vision)
    inputs, resp, P = _grouped(model, tok)
    params = [p for p in model.parameters() if p.requires_grad]
    shared = prefix_shared_logprobs(model, inputs, resp, P, 3, temperature=0.9, with_entropy=True)
    assert shared is not None  # the shared-prefix path ran (not the whole-row fallback)
    logp, ent = shared
    assert logp.requires_grad
    w = torch.linspace(-1, 1, logp.numel()).view_as(logp) * inputs["attention_mask"][:, P:]  # per-token weights
    grads = torch.autograd.grad((logp * w).sum(), params, allow_unused=True)
    ref_logp, ref_ent = token_logprobs(model, inputs, resp, temperature=0.9, with_entropy=True)
    ref_grads = torch.autograd.grad((ref_logp * w).sum(), params, allow_unused=True)
    valid = inputs["attention_mask"][:, P:].bool()
    assert_close(logp[valid], ref_logp[valid], atol=1e-5, rtol=1e-5)
    assert_close(ent[valid], ref_ent[valid], atol=1e-5, rtol=1e-5)
    seen = 0
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name, g, r in zip(names, grads, ref_grads):
        if r is None or not r.abs().sum():
            continue
        assert g is not None, name
        assert_close(g, r, atol=1e-5, rtol=1e-4, msg=name)
        seen += 1
    assert seen > 10  # the language model's layers, embeddings and head all got gradient


def test_shared_prefix_from_the_steps_cached_image_features(tiny):
    """The trainer's passes carry the step's vision features (``mm_encoder_outputs``), not pixels."""
    model, tok = tiny
    inputs, resp, P = _grouped(model, tok)
    vision = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    cache = VisionFeatureCache(model, vision, [1] * 6, 3)
    assert cache.ok
    cached = cache.inputs(inputs["input_ids"], inputs["attention_mask"], slice(0, 6))
    assert "pixel_values" not in cached
    with torch.no_grad():
        full, _ = token_logprobs(model, inputs, resp)
        shared, _ = prefix_shared_logprobs(model, cached, resp, P, 3)
        # a micro-batch of 2 rows inside a group of 3 shares within itself (gcd(3, 2) = 1: no sharing),
        # one of 3 rows (one group) shares once
        assert prefix_shared_logprobs(model, cache.inputs(inputs["input_ids"], inputs["attention_mask"],
                                                          slice(0, 2)), resp[:2], P, 3) is None
        one, _ = prefix_shared_logprobs(model, cache.inputs(inputs["input_ids"], inputs["attention_mask"],
                                                            slice(3, 6)), resp[3:], P, 3)
    valid = inputs["attention_mask"][:, P:].bool()
    assert_close(shared[valid], full[valid], atol=1e-5, rtol=1e-5)
    assert_close(one[valid[3:]], full[3:][valid[3:]], atol=1e-5, rtol=1e-5)


def test_equal_token_ids_with_different_images_are_not_shared(tiny):
    """One template and same-sized images tokenize alike: rows of a 'group' must also carry the same pixels."""
    model, tok = tiny
    inputs, resp, P = _grouped(model, tok)
    # rows 0-2 carry image 0, rows 3-5 image 1: as groups of 2, rows 2 and 3 pair up with different images
    resp6 = resp[:6]
    with torch.no_grad():
        assert prefix_shared_logprobs(model, inputs, resp6, P, 2) is None
        vision = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
        cache = VisionFeatureCache(model, vision, [1] * 6, 3)
        cached = cache.inputs(inputs["input_ids"], inputs["attention_mask"], slice(0, 6))
        assert prefix_shared_logprobs(model, cached, resp6, P, 2) is None
        assert prefix_shared_logprobs(model, cached, resp6, P, 3) is not None


def test_shared_prefix_lora_policy_and_adapter_free_reference(tiny):
    peft = pytest.importorskip("peft")
    import copy

    model, tok = tiny
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                     init_lora_weights="gaussian"))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(5))
    inputs, resp, P = _grouped(model, tok, seed=4)
    valid = inputs["attention_mask"][:, P:].bool()
    trainable = [p for p in lora.parameters() if p.requires_grad]
    logp, _ = prefix_shared_logprobs(lora, inputs, resp, P, 3)
    grads = torch.autograd.grad(logp[valid].sum(), trainable)
    ref, _ = token_logprobs(lora, inputs, resp)
    ref_grads = torch.autograd.grad(ref[valid].sum(), trainable)
    assert_close(logp[valid], ref[valid], atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        assert_close(g, r, atol=1e-5, rtol=1e-4)
    with torch.no_grad(), lora.disable_adapter():
        base, _ = prefix_shared_logprobs(lora, inputs, resp, P, 3)
    with torch.no_grad():
        plain, _ = token_logprobs(model, inputs, resp)
    assert_close(base[valid], plain[valid], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(base[valid], logp.detach()[valid], atol=1e-4)  # the adapter was on in the policy pass


def test_shared_prefix_steps_aside_for_checkpointing_and_a_trainable_tower(tiny):
    import copy

    model, tok = tiny
    inputs, resp, P = _grouped(model, tok)
    ckpt = copy.deepcopy(model).train()
    ckpt.gradient_checkpointing_enable()
    assert prefix_shared_logprobs(ckpt, inputs, resp, P, 3) is None  # training pass: transformers drops the cache
    with torch.no_grad():
        assert prefix_shared_logprobs(ckpt, inputs, resp, P, 3) is not None  # no-grad passes still share
    # a vision tower that trains needs gradient through pixel_values: the whole-row pass
    assert any(p.requires_grad for p in model.model.visual.parameters())
    assert prefix_shared_logprobs(model, inputs, resp, P, 3) is None
    frozen = copy.deepcopy(model)
    frozen.model.visual.requires_grad_(False)
    assert prefix_shared_logprobs(frozen, inputs, resp, P, 3) is not None


def test_unfusable_heads_fall_back_to_the_logits_path(tiny):
    model, tok = tiny
    import copy

    capped = copy.deepcopy(model)
    capped.config.text_config.final_logit_softcapping = 30.0
    assert fusable_head(capped) is None
    biased = copy.deepcopy(model)
    biased.lm_head = torch.nn.Linear(biased.lm_head.in_features, biased.lm_head.out_features, bias=True)
    assert fusable_head(biased) is None
    inputs, resp = _vlm_batch(model, tok, side=56)
    with torch.no_grad():
        logp, _ = token_logprobs(biased, inputs, resp)
        ref, _ = _today(biased, inputs, resp, 1.0)
    assert_close(logp, ref)


@pytest.mark.slow
def test_shape_true_standin_equals_todays_path():
    """Qwen2.5-VL-3B widths (hidden 2048, 151,936 vocabulary, real vision tower, one layer each): values,
    entropies and the gradient reaching the final norm (through the fused backward) within 1e-5."""
    from mmrlvr.models.standin import standin_model
    from mmrlvr.models.tiny import build_tokenizer

    tok = build_tokenizer()
    model = standin_model("qwen2_5_vl_3b", tok)
    for p in model.parameters():
        p.requires_grad_(False)
    norm = model.model.language_model.norm.weight.requires_grad_(True)
    inputs, resp = _vlm_batch(model, tok, side=112, G=2, L=6)
    logp, ent = token_logprobs(model, inputs, resp, with_entropy=True)
    (g,) = torch.autograd.grad(logp.sum(), [norm])
    ref_logp, ref_ent = _today(model, inputs, resp, 1.0)
    (rg,) = torch.autograd.grad(ref_logp.sum(), [norm])
    assert model.lm_head.out_features == 151_936
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight  # tied, as in the 3B checkpoint
    assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert_close(g, rg, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("rows", [64, 66, 128])  # 66: a last block of 2 rows joins the one before; a block under 64 rows may round differently on several threads (measured: 7 rows, 2 threads)
def test_head_gradient_in_vocabulary_blocks_is_bit_identical(monkeypatch, rows):
    """The LM head's gradient is accumulated a block of vocabulary rows at a time (no [V, H] temporary);
    each block must be exactly the rows of the whole product, so results do not move by a bit."""
    import mmrlvr.algos.logits as L

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 9, 32, generator=gen)
    weight = torch.randn(200, 32, generator=gen)
    ids = torch.randint(0, 200, (3, 9), generator=gen)

    def grads(block: int):
        monkeypatch.setattr(L, "W_GRAD_ROWS", block)
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        logp, _ = L.logprobs_from_hidden(h, w, ids, temperature=0.7, chunk_size=8)
        (logp * torch.linspace(-1, 1, 27).view(3, 9)).sum().backward()
        return h.grad, w.grad

    whole, blocked = grads(10_000), grads(rows)
    assert torch.equal(whole[0], blocked[0]) and torch.equal(whole[1], blocked[1])
    blocks = L._row_blocks(200, rows)
    assert blocks[0][0] == 0 and blocks[-1][1] == 200 and all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert blocks[-1][1] - blocks[-1][0] >= min(rows, 64) or len(blocks) == 1 or rows < 64
