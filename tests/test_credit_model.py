"""Credit signals on a REAL tiny Qwen2.5-VL (random weights, built from a config in ~0.05 s) with pixel
values from the real Qwen2-VL image processor: the chunked hidden-state path equals full logits, the
perturbation reaches the model, and a model whose vision path is cut gives JSD = 0 and VEPO = entropy
ranking."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from mmrlvr.credit import CREDIT_SCHEMES, final_hidden_states, perturb_vision, token_signals, token_signals_from_model

V, PAD, VSTART, VEND, IMG = 64, 0, 58, 59, 60


def _tiny_model(seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    # STACK.md rules: vision out_hidden_size == text hidden_size; mrope_section sums to head_dim/2 (32/4/2 = 4)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
                         bos_token_id=None, eos_token_id=1, pad_token_id=PAD),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                           fullatt_block_indexes=[1]),
        image_token_id=IMG, video_token_id=61, vision_start_token_id=VSTART, vision_end_token_id=VEND)
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(cfg).eval()


@pytest.fixture(scope="module")
def processor():
    return Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 56 * 56})


@pytest.fixture(scope="module")
def batch(processor):
    """4 rows, each with its own 56x56 image (16 patches -> 4 image tokens); P = 10, L = 6."""
    rng = np.random.RandomState(0)
    imgs = [Image.fromarray(rng.randint(0, 256, (56, 56, 3), dtype=np.uint8)) for _ in range(4)]
    vis = processor(imgs, return_tensors="pt")
    prompt = [5, 6, VSTART, IMG, IMG, IMG, IMG, VEND, 7, 8]  # P = 10
    short = [PAD, 6, VSTART, IMG, IMG, IMG, IMG, VEND, 7, 8]  # row 3: left-padded by one
    g = torch.Generator().manual_seed(0)
    resp = torch.randint(2, 50, (4, 6), generator=g)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    resp[mask == 0] = PAD
    ids = torch.cat([torch.tensor([prompt, prompt, prompt, short]), resp], 1)  # [4, 16]
    attn = torch.ones_like(ids)
    attn[3, 0] = 0
    attn[:, 10:] = mask.long()
    inputs = {"input_ids": ids, "attention_mask": attn, "pixel_values": vis["pixel_values"],
              "image_grid_thw": vis["image_grid_thw"]}
    return inputs, resp, mask, 10


def _full_logits(model, inputs, P, L):
    with torch.no_grad():
        return model(**inputs).logits[:, P - 1:P - 1 + L]


def test_hidden_path_equals_full_logits(batch, processor):
    model = _tiny_model()
    inputs, resp, mask, P = batch
    pert = {**inputs, **perturb_vision(inputs, "gaussian", seed=0, processor=processor)}
    s = token_signals_from_model(model, inputs, pert, P, resp, mask, chunk_size=5, old_logprobs=-torch.ones(4, 6))
    full = token_signals(_full_logits(model, inputs, P, 6), _full_logits(model, pert, P, 6), resp, mask)
    for name in ("entropy", "jsd", "entropy_shift", "logp", "logq"):
        torch.testing.assert_close(getattr(s, name), getattr(full, name), atol=1e-5, rtol=1e-4, msg=name)
    assert torch.equal(s.old_logp, -torch.ones(4, 6))
    # the perturbation reaches the model: a random VLM reads the image, so JSD > 0 on valid tokens
    assert float(s.jsd[mask > 0].min()) > 0
    # the trainer's form: clean logits it already has + the perturbed pass run here
    s2 = token_signals_from_model(model, None, pert, P, resp, mask, logits_clean=_full_logits(model, inputs, P, 6))
    torch.testing.assert_close(s2.jsd, full.jsd, atol=1e-5, rtol=1e-4)
    states, head = final_hidden_states(model, inputs)
    assert states.shape == (4, 16, 32) and head is model.lm_head
    # sampled-only (VPPO / PAPO): only the perturbed pass runs; logq is the same, no clean-side signals
    cheap = token_signals_from_model(model, None, pert, P, resp, mask, distribution=False,
                                     old_logprobs=full.logp)
    assert cheap.entropy is None and cheap.logp is None and cheap.jsd is None
    torch.testing.assert_close(cheap.logq, full.logq, atol=1e-5, rtol=1e-4)
    a = CREDIT_SCHEMES.get("vppo")(cheap, mask, torch.ones(4))
    b = CREDIT_SCHEMES.get("vppo")(full, mask, torch.ones(4))
    torch.testing.assert_close(a.adv_scale, b.adv_scale, atol=1e-4, rtol=1e-4)
    assert "credit/entropy_topk_jaccard" not in a.stats


def test_model_that_ignores_the_image(batch, processor):
    model = _tiny_model(seed=1)
    with torch.no_grad():  # cut the vision path: the merger now outputs zeros whatever the pixels
        model.model.visual.merger.mlp[-1].weight.zero_()
        model.model.visual.merger.mlp[-1].bias.zero_()
    inputs, resp, mask, P = batch
    for name in ("gaussian", "zero", "patch_blackout", "blur"):
        pert = {**inputs, **perturb_vision(inputs, name, seed=1, processor=processor)}
        s = token_signals_from_model(model, inputs, pert, P, resp, mask, chunk_size=7)
        assert bool((s.jsd == 0).all()) and bool((s.entropy_shift == 0).all()), name
        assert torch.equal(s.logq, s.logp)
        adv = torch.tensor([1.0, -1.0, 0.5, 0.0])
        vepo = CREDIT_SCHEMES.get("vepo")(s, mask, adv)
        ent = CREDIT_SCHEMES.get("entropy_topk")(s, mask, adv)
        assert torch.equal(vepo.selected, ent.selected)  # VEPO reduces to entropy ranking
        assert vepo.selected.sum() == 2 + 1 + 1 + 2  # ceil(.2*6)=2, ceil(.2*4)=1, ceil(.2*2)=1, 2
        vppo = CREDIT_SCHEMES.get("vppo")(s, mask, adv)
        assert torch.equal(vppo.adv_scale, torch.ones(4))  # no dependency anywhere -> no shaping
        assert vppo.stats["credit/dependency_mean"] == 0.0


def test_peft_wrapped_model_keeps_lora_active(batch):
    peft = pytest.importorskip("peft")
    model = _tiny_model(seed=2)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                      init_lora_weights=False))
    inputs, resp, mask, P = batch
    s = token_signals_from_model(lora, inputs, None, P, resp, mask, chunk_size=4)
    full = token_signals(_full_logits(lora, inputs, P, 6), None, resp, mask)
    torch.testing.assert_close(s.logp, full.logp, atol=1e-5, rtol=1e-4)
    with lora.disable_adapter():
        base = token_signals_from_model(lora, inputs, None, P, resp, mask)
    assert not torch.allclose(base.logp, s.logp, atol=1e-4)  # the adapter really changed the policy


def _family_model_and_images(family: str, image_seed: int):
    """The tiny model of ``family`` (seed 0), its tokenizer, config, image processor and two random images
    of 2x2 merged tokens each."""
    from mmrlvr.models.tiny import MODEL_CLASSES, build_tokenizer, make_config, make_processor

    tok = build_tokenizer()
    config = make_config(family, tok)
    torch.manual_seed(0)
    model = MODEL_CLASSES[family](config).eval()
    ip = make_processor(family, tok, config).image_processor
    rng = np.random.RandomState(image_seed)
    side = 2 * ip.patch_size * 2  # 2x2 merged tokens
    imgs = [Image.fromarray(rng.randint(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(2)]
    return tok, config, model, ip, imgs


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_vision_tower_once_per_distinct_image_is_exact(family):
    """G rows of a prompt share its image: the perturbed pass runs the vision tower once per distinct
    image (mm_encoder_outputs) and must give exactly the hidden states of the plain call."""
    from mmrlvr.credit.perturb import PatchLayout
    from mmrlvr.credit.signals import _distinct_image_inputs

    _, config, model, ip, imgs = _family_model_and_images(family, image_seed=1)
    vis = ip([imgs[0], imgs[0], imgs[1], imgs[1]], return_tensors="pt")  # 2 prompts x G = 2
    prompt = [5, config.vision_start_token_id] + [config.image_token_id] * 4 + [config.vision_end_token_id, 7]
    ids = torch.cat([torch.tensor([prompt] * 4), torch.randint(20, 200, (4, 5))], 1)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "mm_token_type_ids": (ids == config.image_token_id).int(), **vis}  # Qwen2-VL asks for it
    pert = {**inputs, **perturb_vision(inputs, "gaussian", seed=0, processor=ip)}
    # identical images got the identical perturbation; different images different noise
    blocks = torch.split(pert["pixel_values"], vis["image_grid_thw"].prod(-1).tolist())
    assert torch.equal(blocks[0], blocks[1]) and torch.equal(blocks[2], blocks[3])
    assert PatchLayout.from_processor(ip).patch_size == ip.patch_size
    assert _distinct_image_inputs(model.model, pert) is not None  # the fast path is taken
    fast, _ = final_hidden_states(model, pert)
    plain, _ = final_hidden_states(model, pert, dedupe_images=False)
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_prompt_encoded_once_per_group_equals_the_full_pass(family):
    """response_hidden(rows_per_prompt=G) runs each group's prompt once (KV cache repeated G times) and
    must give the response hidden states of the full pass: two groups of 3 with different prompt lengths
    (left padding), different images and ragged right-padded responses."""
    from mmrlvr.credit.signals import response_hidden, shared_prefix_states

    tok, config, model, ip, imgs = _family_model_and_images(family, image_seed=2)
    G, P, L = 3, 11, 6
    vis = ip([imgs[0]] * G + [imgs[1]] * G, return_tensors="pt")
    image = [config.vision_start_token_id] + [config.image_token_id] * 4 + [config.vision_end_token_id]
    long_prompt = [5, 9, 11] + image + [7, 8]  # 11 tokens
    short_prompt = [tok.pad_token_id, tok.pad_token_id, 5] + image + [7, 8]  # 9 tokens, left-padded
    prompts = torch.tensor([long_prompt] * G + [short_prompt] * G)
    g = torch.Generator().manual_seed(0)
    resp = torch.randint(20, 200, (2 * G, L), generator=g)
    rmask = torch.ones(2 * G, L, dtype=torch.long)
    rmask[1, 3:] = 0
    rmask[4, 5:] = 0
    resp[rmask == 0] = tok.pad_token_id
    ids = torch.cat([prompts, resp], 1)
    attn = torch.cat([(prompts != tok.pad_token_id).long(), rmask], 1)
    inputs = {"input_ids": ids, "attention_mask": attn, "mm_token_type_ids": (ids == config.image_token_id).int(),
              **vis}
    full = response_hidden(model, inputs, P, L)  # G = 1: the plain full pass
    shared = shared_prefix_states(model.model, inputs, P, L, G)
    assert shared is not None and shared.shape == full.states.shape
    valid = rmask.bool()  # padded response positions are never read
    torch.testing.assert_close(shared[valid], full.states[valid], atol=1e-4, rtol=1e-4)
    fast = response_hidden(model, inputs, P, L, rows_per_prompt=G)
    torch.testing.assert_close(fast.states[valid], full.states[valid], atol=1e-4, rtol=1e-4)
    # a group whose rows differ in their prompt falls back to the full pass
    other = {**inputs, "input_ids": ids.clone()}
    other["input_ids"][1, 0] = 6
    assert shared_prefix_states(model.model, other, P, L, G) is None
