"""vLLM request building and weight export: the pure parts, tested without vLLM installed (the engine itself runs in
tests/test_vllm_engine.py, on CPU, where vLLM is installed)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mmrlvr.data import make_rows, rows_to_samples
from mmrlvr.errors import UserError
from mmrlvr.models import apply_lora, build_tiny, load_policy
from mmrlvr.rollout.base import SamplingParams
from mmrlvr.rollout.sampling import row_seed
from mmrlvr.rollout.vllm import (
    VLLMEngine,
    build_requests,
    import_vllm,
    merged_state_dict,
    sampled_logprobs,
    to_vllm_prompt,
    vllm_sampling_kwargs,
)
from mmrlvr.types import Sample

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m", seed=0))


@pytest.fixture(scope="module")
def samples():
    return rows_to_samples(make_rows("count", "train", 3, seed=0))


def test_sampling_kwargs_mapping():
    kw = vllm_sampling_kwargs(SamplingParams(max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=0), seed=11,
                              stop_token_ids=[5, 6])
    assert kw == {"n": 1, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 32, "seed": 11,
                  "logprobs": 0, "skip_special_tokens": True, "stop_token_ids": [5, 6], "ignore_eos": True}
    greedy = vllm_sampling_kwargs(SamplingParams(greedy=True, temperature=0.7, top_k=5), seed=0)
    assert (greedy["temperature"], greedy["top_k"], greedy["top_p"]) == (0.0, -1, 1.0)
    assert vllm_sampling_kwargs(SamplingParams(top_k=5), seed=0)["top_k"] == 5


def test_requests_are_group_contiguous_with_row_seeds(policy, samples):
    _, processor = policy
    reqs = build_requests(processor, samples, 4, SamplingParams(max_new_tokens=16), seed=3, step=7,
                          stop_token_ids=[1])
    assert len(reqs) == 12
    assert [(r.group, r.index) for r in reqs] == [(g, i) for g in range(3) for i in range(4)]
    assert [r.sampling["seed"] for r in reqs] == [row_seed(3, 7, s.id, i) for s in samples for i in range(4)]
    assert len({r.sampling["seed"] for r in reqs}) == 12
    for r, s in zip(reqs, [s for s in samples for _ in range(4)]):
        assert r.sample_id == s.id and r.images == s.images
        assert r.prompt.count("<|image_pad|>") == 1  # one placeholder per image: vLLM expands it
        assert r.prompt.endswith("<|im_start|>assistant\n")
    again = build_requests(processor, samples, 4, SamplingParams(max_new_tokens=16), seed=3, step=7)
    other = build_requests(processor, samples, 4, SamplingParams(max_new_tokens=16), seed=3, step=8)
    assert [r.sampling["seed"] for r in again] == [r.sampling["seed"] for r in reqs]
    assert not {r.sampling["seed"] for r in other} & {r.sampling["seed"] for r in reqs}


def test_prompt_dict_single_and_multi_image(policy, samples):
    _, processor = policy
    one = to_vllm_prompt(build_requests(processor, samples[:1], 1, SamplingParams(), seed=0, step=0)[0])
    assert set(one) == {"prompt", "multi_modal_data"} and one["multi_modal_data"]["image"] is samples[0].images[0]
    img = samples[0].images[0]
    two = Sample(id="t", images=[img, img], answer="1", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "image"}, {"type": "text", "text": "How many?"}]}])
    req = build_requests(processor, [two], 1, SamplingParams(), seed=0, step=0)[0]
    assert req.prompt.count("<|image_pad|>") == 2
    assert to_vllm_prompt(req)["multi_modal_data"]["image"] == [img, img]


def test_image_count_mismatch_names_the_sample(policy, samples):
    _, processor = policy
    bad = Sample(id="row-9", images=[], answer="1", messages=samples[0].messages)
    with pytest.raises(UserError, match="row-9"):
        build_requests(processor, [bad], 1, SamplingParams(), seed=0, step=0)


def test_sampled_logprobs_reads_the_chosen_token():
    class Logprob:  # the shape of vllm's Logprob record (vLLM itself is not installed here)
        def __init__(self, logprob):
            self.logprob = logprob

    assert sampled_logprobs([4, 9], [{4: Logprob(-0.5), 7: Logprob(-1.0)}, {9: Logprob(-2.0)}]) == [-0.5, -2.0]
    with pytest.raises(UserError, match="logprobs=0"):
        sampled_logprobs([4], None)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_missing_vllm_is_a_clear_user_error(policy, tmp_path):
    with pytest.raises(UserError, match=r"mmrlvr\[vllm\]"):
        import_vllm()
    with pytest.raises(UserError, match="rollout.engine=hf"):
        VLLMEngine(tmp_path, policy[1])


def test_merged_state_dict_uses_base_names_and_merges_lora(tmp_path):
    model, processor = load_policy(build_tiny("qwen2_5_vl", tmp_path / "m", seed=1))
    base_keys = set(model.state_dict())
    name = "model.language_model.layers.0.self_attn.q_proj.weight"
    w = model.state_dict()[name].clone()
    peft_model = apply_lora(model, r=2, alpha=4)
    layer = peft_model.base_model.model.model.language_model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.fill_(0.01)
    state = merged_state_dict(peft_model)
    assert set(state) == base_keys
    delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * (4 / 2)  # scale alpha / r
    torch.testing.assert_close(state[name], w + delta)
    assert torch.equal(layer.base_layer.weight, w)  # unmerged again afterwards


def test_video_requests_carry_the_sampled_frames(policy):
    """A video prompt reaches vLLM as the same frames the HF processor sees: [T, H, W, 3] uint8 per clip,
    with (frames, metadata) and vLLM's frame sampling off for models that time frames (Qwen3-VL)."""
    import numpy as np

    from mmrlvr.data.loading import rows_to_samples
    from mmrlvr.data.synth_video import make_video_rows

    _, processor = policy
    from mmrlvr.data.video_processing import ensure_video_processor

    ensure_video_processor(processor)
    sample = rows_to_samples(make_video_rows("video_count", "train", 1))[0]
    video = sample.meta["videos"][0]
    reqs = build_requests(processor, [sample], 2, SamplingParams(max_new_tokens=8), seed=0, step=0)
    assert len(reqs) == 2 and all(r.videos == [video] for r in reqs) and not reqs[0].images
    assert reqs[0].prompt.count("<|video_pad|>") == 1
    plain = to_vllm_prompt(reqs[0])
    clip = plain["multi_modal_data"]["video"]
    assert set(plain) == {"prompt", "multi_modal_data"} and "image" not in plain["multi_modal_data"]
    assert clip.dtype == np.uint8 and clip.shape == (len(video["frames"]), *np.asarray(video["frames"][0]).shape)
    assert np.array_equal(clip[2], np.asarray(video["frames"][2]))
    timed = to_vllm_prompt(reqs[0], video_metadata=True)
    frames, meta = timed["multi_modal_data"]["video"]
    assert np.array_equal(frames, clip) and timed["mm_processor_kwargs"] == {"do_sample_frames": False}
    assert meta["fps"] == video["source_fps"] and meta["frames_indices"] == list(video["indices"])
    assert meta["total_num_frames"] == video["n_source_frames"]


def test_video_count_mismatch_names_the_sample(policy):
    from mmrlvr.data.loading import rows_to_samples
    from mmrlvr.data.synth_video import make_video_rows

    _, processor = policy
    sample = rows_to_samples(make_video_rows("video_count", "train", 1))[0]
    sample.meta["videos"] = sample.meta["videos"] * 2
    with pytest.raises(UserError, match=f"{sample.id}.*1 video parts in the messages but 2 videos"):
        build_requests(processor, [sample], 1, SamplingParams(), seed=0, step=0)


def test_version_note_names_both_versions_outside_the_tested_range():
    from mmrlvr.rollout.vllm import version_note

    assert version_note("0.32.0", "5.19.0") is None
    assert version_note("0.32.0+cpu", "5.19.2") is None
    note = version_note("0.34.1", "5.22.0")
    assert "0.34.1" in note and "5.22.0" in note and "\n" not in note


def test_a_prompt_vllm_ran_differently_stops_the_run_naming_the_sample(samples):
    from mmrlvr.rollout.vllm import check_prompt_tokens

    inputs = {"input_ids": torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]]),
              "attention_mask": torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])}
    check_prompt_tokens(samples[:2], inputs, [[5, 6, 7], [8, 9, 10, 11]])  # padding removed: the same
    with pytest.raises(UserError, match=f"sample {samples[1].id!r}.*from token 2 on"):
        check_prompt_tokens(samples[:2], inputs, [[5, 6, 7], [8, 9, 99, 11]])


@pytest.mark.parametrize("overrides,expected", [
    ({"vllm_sync": "lora"}, "rollout.vllm_sync: 'lora' needs model.lora.enabled"),
    ({"vllm_sync": "adapter"}, "rollout.vllm_sync: unknown value 'adapter'"),
    ({"vllm_kv_cache_gib": 0}, "rollout.vllm_kv_cache_gib: must be > 0"),
    ({"vllm_max_model_len": -1}, "rollout.vllm_max_model_len: must be >= 0"),
    ({"vllm_dtype": "fp8"}, "rollout.vllm_dtype: unknown value 'fp8'"),
])
def test_vllm_settings_are_checked_at_load(overrides, expected):
    from mmrlvr.config import load_config

    with pytest.raises(UserError) as info:
        load_config(data={"rollout": {"engine": "vllm", **overrides}})
    assert expected in str(info.value)
