"""RL-specific LoRA initialisations (METHODS.md §5, arXiv 2606.31813): rlpo / rlmo / milora.

Hand-worked: for W = diag(3, 2, 1) the right singular vectors are the unit axes (up to sign), so RLPO's
A0 (r = 1) is ±e1, RLMO's ±e3, and MiLoRA (r = 1, scale 2) moves s_min = 1 out of W: W_res = diag(3, 2, 0),
A0 = ±sqrt(1/2) e3, B0 = ±sqrt(1/2) e3.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from mmrlvr.models import apply_lora, load_policy, reference_logits_context
from mmrlvr.models.lora import BASE_PRESERVING_INITS, is_vision_module, svd_lora_factors


def test_factors_hand_worked_on_a_diagonal_weight():
    w = torch.diag(torch.tensor([3.0, 2.0, 1.0]))
    a, b, res = svd_lora_factors(w, 1, "rlpo")
    torch.testing.assert_close(a.abs(), torch.tensor([[1.0, 0.0, 0.0]]))
    assert torch.equal(b, torch.zeros(3, 1)) and res is None
    a, b, res = svd_lora_factors(w, 1, "rlmo")
    torch.testing.assert_close(a.abs(), torch.tensor([[0.0, 0.0, 1.0]]))
    assert torch.equal(b, torch.zeros(3, 1)) and res is None
    a, b, res = svd_lora_factors(w, 1, "milora", scale=2.0)
    half = 0.5 ** 0.5
    torch.testing.assert_close(a.abs(), torch.tensor([[0.0, 0.0, half]]))
    torch.testing.assert_close(b.abs(), torch.tensor([[0.0], [0.0], [half]]))
    torch.testing.assert_close(res, torch.diag(torch.tensor([3.0, 2.0, 0.0])), atol=1e-6, rtol=0)
    torch.testing.assert_close(res + 2.0 * b @ a, w, atol=1e-6, rtol=0)  # nothing lost, only moved


def test_factors_rectangular_low_precision_and_rank_above_min_dim():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 4, generator=g)
    vh = torch.linalg.svd(w, full_matrices=False).Vh
    a, _, _ = svd_lora_factors(w.bfloat16(), 2, "rlpo")  # computed in fp32 whatever the weight dtype
    assert a.dtype == torch.float32
    torch.testing.assert_close((a @ vh.T).abs(), torch.eye(2, 4), atol=2e-2, rtol=0)  # bf16 input rounding
    a, _, _ = svd_lora_factors(w, 6, "rlmo")  # r > min(out, in) = 4: the 4 directions, then zero rows
    assert a.shape == (6, 4) and torch.equal(a[4:], torch.zeros(2, 4))
    torch.testing.assert_close(a[:4] @ a[:4].T, torch.eye(4), atol=1e-5, rtol=0)
    assert {"rlpo", "rlmo"} <= set(BASE_PRESERVING_INITS) and "milora" not in BASE_PRESERVING_INITS


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def _inputs(processor):
    img = Image.new("RGB", (112, 112), (255, 255, 255))
    img.paste((220, 40, 40), (30, 30, 60, 60))
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many red shapes?"}]}]
    text = processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + "<think>1 red</think>"
    return processor(text=[text], images=[[img]], return_tensors="pt")


def _logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("init", ["rlpo", "rlmo"])
def test_base_preserving_svd_inits_start_exactly_at_the_base(tiny_dir, init):
    model, processor = load_policy(tiny_dir)
    inputs = _inputs(processor)
    base = _logits(model, inputs)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    peft_model = apply_lora(model, r=4, alpha=8, init=init, progress=False)
    torch.testing.assert_close(_logits(peft_model, inputs), base, rtol=0, atol=0)  # B0 = 0: exact
    with reference_logits_context(peft_model):
        torch.testing.assert_close(_logits(peft_model, inputs), base, rtol=0, atol=0)
    lora = 0
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            assert not is_vision_module(name)
            w = module.base_layer.weight.detach()
            assert torch.equal(w, before[name.replace("base_model.model.", "") + ".weight"])  # base untouched
            vh = torch.linalg.svd(w.float(), full_matrices=False).Vh
            want = vh[:4] if init == "rlpo" else vh[-4:]
            got = module.lora_A["default"].weight.detach()
            torch.testing.assert_close((got @ want.T).abs(), torch.eye(4), atol=1e-4, rtol=0)
            assert torch.equal(module.lora_B["default"].weight, torch.zeros_like(module.lora_B["default"].weight))
            lora += 1
    assert lora > 0
    for n, p in peft_model.named_parameters():  # the vision tower: untouched and frozen
        key = n.replace("base_model.model.", "")
        if is_vision_module(key):
            assert torch.equal(p, before[key]) and not p.requires_grad


def test_milora_keeps_the_output_but_moves_energy_out_of_the_reference(tiny_dir):
    model, processor = load_policy(tiny_dir)
    inputs = _inputs(processor)
    base = _logits(model, inputs)
    peft_model = apply_lora(model, r=4, alpha=8, init="milora", progress=False)
    torch.testing.assert_close(_logits(peft_model, inputs), base, rtol=0, atol=1e-4)
    with reference_logits_context(peft_model):
        ref = _logits(peft_model, inputs)
    assert (ref - base).abs().max() > 1e-6  # the residual is not the base: not a faithful KL reference
