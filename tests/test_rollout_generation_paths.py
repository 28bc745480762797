"""Generation does each expensive thing once: the vision tower runs once per distinct prompt (not per
row, not per decoding step), decoding reads the KV cache (one new position per step), and the sampler
gets only the last position's logits (the LM head never projects the whole prompt)."""

from __future__ import annotations

import pytest
import torch

from mmrlvr.data import make_rows, rows_to_samples
from mmrlvr.models import build_tiny, load_policy
from mmrlvr.rollout.base import SamplingParams
from mmrlvr.rollout.hf import HFEngine


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m", seed=0))


def test_vision_once_kv_cache_and_last_position_logits(policy):
    model, processor = policy
    samples = rows_to_samples(make_rows("count", "train", 3, seed=0))
    G, new = 4, 6
    vision_calls, head_inputs, layer_inputs = [], [], []
    hooks = [
        model.model.visual.register_forward_pre_hook(lambda m, a, k: vision_calls.append(1), with_kwargs=True),
        model.lm_head.register_forward_pre_hook(lambda m, a: head_inputs.append(tuple(a[0].shape))),
        model.model.language_model.layers[0].register_forward_pre_hook(
            lambda m, a, k: layer_inputs.append(tuple((a[0] if a else k["hidden_states"]).shape)), with_kwargs=True),
    ]
    try:
        batch = HFEngine(model, processor).generate(samples, G, SamplingParams(max_new_tokens=new), seed=0, step=0)
    finally:
        for h in hooks:
            h.remove()
    n, P = len(samples) * G, batch.prompt_length
    assert len(vision_calls) == 1  # the 3 distinct prompts' images in one vision-tower run, reused for 12 rows
    steps = batch.response_ids.shape[1]
    assert layer_inputs[0][:2] == (n, P)  # prefill: the whole prompt once
    assert all(s[:2] == (n, 1) for s in layer_inputs[1:]) and len(layer_inputs) == steps  # then one position
    assert len(head_inputs) == steps and all(s[:2] == (n, 1) for s in head_inputs)  # last position only
    assert torch.isfinite(batch.old_logprobs[batch.response_mask > 0]).all()
