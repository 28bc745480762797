"""HFEngine on a real tiny Qwen2.5-VL: layout, masking after EOS, log-probs vs teacher forcing, determinism."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from mmrlvr.data import make_rows, rows_to_samples
from mmrlvr.errors import UserError
from mmrlvr.models import build_tiny, load_policy
from mmrlvr.rollout.base import SamplingParams
from mmrlvr.rollout.batch import assemble_batch, pad_rows, response_mask_from
from mmrlvr.rollout.hf import HFEngine, expand_vision
from mmrlvr.rollout.sampling import RowSampler, filter_logits, row_seed
from mmrlvr.types import Sample


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m", seed=0)
    return load_policy(path)


@pytest.fixture(scope="module")
def samples():
    return rows_to_samples(make_rows("count", "train", 6, seed=0))


def _teacher_forced_logprobs(model, batch, temperature: float) -> torch.Tensor:
    """log pi(response token j) from one forward of prompt + response: logits at P-1+j (base.py layout)."""
    with torch.no_grad():
        logits = model(**batch.model_inputs()).logits
    p, length = batch.prompt_length, batch.response_ids.shape[1]
    logp = torch.log_softmax(logits[:, p - 1:p - 1 + length].float() / temperature, dim=-1)
    return logp.gather(-1, batch.response_ids[..., None]).squeeze(-1)


def test_shapes_and_layout(policy, samples):
    model, processor = policy
    engine = HFEngine(model, processor)
    batch = engine.generate(samples[:3], 4, SamplingParams(max_new_tokens=10), seed=0, step=0)
    n, p, length = 12, batch.prompt_length, batch.response_ids.shape[1]
    assert batch.num_rows == n and length <= 10
    assert batch.input_ids.shape == batch.attention_mask.shape == (n, p + length)
    assert batch.old_logprobs.shape == batch.response_mask.shape == (n, length)
    assert batch.group_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert batch.sample_index.tolist() == [0, 1, 2, 3] * 3
    assert [s.id for s in batch.samples] == [s.id for s in samples[:3] for _ in range(4)]
    assert torch.equal(batch.input_ids[:, p:], batch.response_ids)
    # vision expanded to N rows: 16 merged tokens = 64 patches per 112x112 image
    assert batch.vision["pixel_values"].shape[0] == n * 64
    assert batch.vision["image_grid_thw"].tolist() == [[1, 8, 8]] * n
    assert batch.vision["mm_token_type_ids"].shape == (n, p + length)
    assert len(batch.completions) == n and all(c.finish_reason in ("stop", "length") for c in batch.completions)


def test_old_logprobs_match_teacher_forcing_and_mask_after_eos(policy, samples):
    model, processor = policy
    engine = HFEngine(model, processor)
    # 48 rows x 24 tokens: with a 558-token vocabulary and 2 EOS ids, some rows stop early (seeded: fixed)
    batch = engine.generate(samples, 8, SamplingParams(max_new_tokens=24, temperature=0.8), seed=1, step=0)
    mask = batch.response_mask
    stopped = [i for i, c in enumerate(batch.completions) if c.finish_reason == "stop"]
    assert stopped, "precondition: at least one row sampled an EOS"
    for i in stopped:
        end = len(batch.completions[i].token_ids)  # tokens through the EOS
        assert batch.completions[i].token_ids[-1] in engine.eos_ids
        assert mask[i, :end].eq(1).all() and mask[i, end:].eq(0).all()
        assert batch.response_ids[i, end:].eq(engine.pad_id).all()
        assert batch.old_logprobs[i, end:].eq(0).all()  # masked: 0, never -inf
        assert batch.attention_mask[i, batch.prompt_length + end:].eq(0).all()
    assert torch.isfinite(batch.old_logprobs).all()
    expected = _teacher_forced_logprobs(model, batch, temperature=0.8)
    torch.testing.assert_close(batch.old_logprobs, expected * mask, rtol=0, atol=1e-4)


def test_same_seed_and_step_same_batch_other_step_differs(policy, samples):
    model, processor = policy
    engine = HFEngine(model, processor)
    params = SamplingParams(max_new_tokens=12)
    a = engine.generate(samples[:2], 4, params, seed=7, step=3)
    b = engine.generate(samples[:2], 4, params, seed=7, step=3)
    c = engine.generate(samples[:2], 4, params, seed=7, step=4)
    assert torch.equal(a.response_ids, b.response_ids)
    assert not torch.equal(a.response_ids[:, :4], c.response_ids[:, :4])
    assert len({tuple(r) for r in a.response_ids[:4].tolist()}) > 1  # G samples of one prompt differ


def test_row_does_not_depend_on_batch_composition(policy, samples):
    model, processor = policy
    params = SamplingParams(max_new_tokens=12)
    full = HFEngine(model, processor).generate(samples[:3], 4, params, seed=0, step=0)
    alone = HFEngine(model, processor).generate(samples[1:2], 4, params, seed=0, step=0)
    chunked = HFEngine(model, processor, batch_size=5).generate(samples[:3], 4, params, seed=0, step=0)
    length = alone.response_ids.shape[1]
    assert torch.equal(full.response_ids[4:8, :length], alone.response_ids)
    assert torch.equal(full.response_ids, chunked.response_ids)


def test_greedy_ignores_the_seed(policy, samples):
    model, processor = policy
    engine = HFEngine(model, processor)
    params = SamplingParams(max_new_tokens=8, greedy=True)
    a = engine.generate(samples[:2], 2, params, seed=0, step=0)
    b = engine.generate(samples[:2], 2, params, seed=5, step=9)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_ids[0], a.response_ids[1])


def test_multi_image_prompts_expand_and_match(policy):
    """Two prompts with 2 and 1 images: patches per prompt are repeated G times in order."""
    model, processor = policy
    red, blue = Image.new("RGB", (112, 112), (220, 40, 40)), Image.new("RGB", (112, 112), (40, 80, 220))
    two = Sample(id="two", images=[red, blue], answer="1", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "image"}, {"type": "text", "text": "How many red shapes are there?"}]}])
    one = Sample(id="one", images=[blue], answer="0", messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "How many red shapes are there?"}]}])
    engine = HFEngine(model, processor)
    batch = engine.generate([two, one], 2, SamplingParams(max_new_tokens=6), seed=0, step=0)
    assert batch.vision["image_grid_thw"].shape[0] == 2 * 2 + 2 * 1
    pv = batch.vision["pixel_values"]
    assert pv.shape[0] == 6 * 64
    torch.testing.assert_close(pv[0:128], pv[128:256])  # row 0 and row 1 carry prompt "two"'s 2 images
    assert not torch.equal(pv[0:64], pv[64:128])  # red then blue
    torch.testing.assert_close(pv[64:128], pv[256:320])  # "one"'s image = "two"'s second (both blue)
    expected = _teacher_forced_logprobs(model, batch, temperature=1.0)
    torch.testing.assert_close(batch.old_logprobs, expected * batch.response_mask, rtol=0, atol=1e-4)


def test_prompt_length_limit_names_the_sample(policy, samples):
    model, processor = policy
    with pytest.raises(UserError, match=samples[0].id):
        HFEngine(model, processor, max_prompt_tokens=10).generate(samples[:1], 1, SamplingParams(), seed=0, step=0)


# -- pure parts -----------------------------------------------------------------------------------------

def test_response_mask_counts_through_first_eos():
    ids = torch.tensor([[5, 9, 2, 7, 2], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]])
    # row 0: EOS (2) at position 2 -> 1,1,1 then 0s (the second EOS is after the end)
    assert response_mask_from(ids, [2, 0]).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def test_expand_vision_qwen_layout_and_per_prompt_tensors():
    # prompt 0 has 2 images of 4 and 2 patches, prompt 1 one image of 3 patches; G = 2
    pv = torch.arange(9).float()[:, None]  # [9 patches, 1]
    grid = torch.tensor([[1, 2, 2], [1, 1, 2], [1, 1, 3]])
    extra = torch.tensor([[10], [20]])  # a per-prompt tensor [B, 1]
    out = expand_vision({"input_ids": torch.zeros(2, 3), "pixel_values": pv, "image_grid_thw": grid,
                         "extra": extra}, [2, 1], 2)
    # rows: p0 (patches 0-5), p0 again, p1 (6-8), p1 again
    assert out["pixel_values"][:, 0].tolist() == [0, 1, 2, 3, 4, 5] * 2 + [6, 7, 8] * 2
    assert out["image_grid_thw"].tolist() == [[1, 2, 2], [1, 1, 2]] * 2 + [[1, 1, 3]] * 2
    assert out["extra"][:, 0].tolist() == [10, 10, 20, 20]
    assert "input_ids" not in out


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # top_p 0.7: mass before token 2 is 0.8 >= 0.7 -> dropped; token 1 has 0.5 before it -> kept
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert not torch.isinf(filter_logits(logits, top_p=1.0)).any()


def test_row_sampler_draws_from_softmax_at_temperature():
    """Gumbel-max over 4000 seeded rows matches softmax(logits / T) within sampling error."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    t = 0.5
    sampler = RowSampler([row_seed(0, 0, "p", i) for i in range(4000)], SamplingParams(temperature=t))
    sampler(torch.zeros(4000, 1, dtype=torch.long), logits.expand(4000, 4).clone())
    freq = torch.bincount(sampler.tokens[0], minlength=4).float() / 4000
    expected = torch.softmax(logits / t, -1)  # [0.865, 0.117, 0.016, 0.002]
    assert (freq - expected).abs().max() < 0.02
    # recorded log-prob of the chosen token is log softmax(logits / T)[token]
    torch.testing.assert_close(sampler.logprobs[0], torch.log(expected)[sampler.tokens[0]])


def test_row_seed_is_stable_and_distinct():
    assert row_seed(0, 1, "a", 2) == row_seed(0, 1, "a", 2)
    assert len({row_seed(0, 1, "a", g) for g in range(8)} | {row_seed(0, 2, "a", 0), row_seed(1, 1, "a", 0)}) == 10
    assert 0 <= row_seed(123, 4, "x", 5) < 2 ** 63


def test_assemble_batch_from_token_lists(policy, samples):
    """The vLLM path gives token lists; assembling them gives the same layout as HFEngine's."""
    model, processor = policy
    engine = HFEngine(model, processor)
    hf = engine.generate(samples[:2], 2, SamplingParams(max_new_tokens=8), seed=0, step=0)
    inputs = engine.encode_prompts(samples[:2])
    vision = expand_vision(inputs, [1, 1], 2)
    rows = [c.token_ids for c in hf.completions]
    lps = [c.meta["logprobs"] for c in hf.completions]
    eos = engine.eos_ids
    rebuilt = assemble_batch(samples[:2], 2, inputs, vision, pad_rows(rows, engine.pad_id, torch.long),
                             pad_rows(lps, 0.0, torch.float), eos_ids=eos, pad_id=engine.pad_id,
                             tokenizer=processor.tokenizer)
    length = rebuilt.response_ids.shape[1]
    assert torch.equal(rebuilt.response_ids, hf.response_ids[:, :length])
    torch.testing.assert_close(rebuilt.old_logprobs, hf.old_logprobs[:, :length])
    assert [c.text for c in rebuilt.completions] == [c.text for c in hf.completions]


def test_checkpoint_generation_defaults_do_not_leak(policy, samples):
    """A checkpoint's repetition penalty / n-gram ban would change tokens but not the recorded log-probs."""
    model, processor = policy
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    plain = HFEngine(model, processor).generate(samples[:2], 4, params, seed=0, step=0)
    saved = model.generation_config
    model.generation_config = type(saved)(**{**saved.to_dict(), "repetition_penalty": 5.0, "no_repeat_ngram_size": 1,
                                             "do_sample": True, "temperature": 0.1, "top_k": 1})
    try:
        batch = HFEngine(model, processor).generate(samples[:2], 4, params, seed=0, step=0)
    finally:
        model.generation_config = saved
    assert torch.equal(batch.response_ids, plain.response_ids)
    assert model.generation_config is saved


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_every_family_generates_with_reused_vision_features(family, samples, tmp_path):
    """The engine encodes each prompt's images once and hands the features to generate; the trainer's
    VisionFeatureCache reuses them. Both must equal the plain pixel_values path on every family —
    Qwen3-VL included, whose vision tower also feeds per-layer "deepstack" features."""
    from mmrlvr.train.forward import VisionFeatureCache

    model, processor = load_policy(build_tiny(family, tmp_path / "m", seed=0))
    batch = HFEngine(model, processor).generate(samples[:2], 2, SamplingParams(max_new_tokens=8), seed=0, step=0)
    assert batch.image_features is not None and len(batch.image_features) == 4
    # generation's old log-probs are the teacher-forced ones from pixel_values
    tf = _teacher_forced_logprobs(model, batch, 1.0)
    mask = batch.response_mask > 0
    torch.testing.assert_close(batch.old_logprobs[mask], tf[mask], atol=1e-4, rtol=1e-4)
    start = processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    per_row = (batch.input_ids[:, :batch.prompt_length] == start).sum(dim=1).tolist()
    cache = VisionFeatureCache(model, batch.vision, per_row, 2, features=batch.image_features)
    assert cache.ok
    with torch.no_grad():
        plain = model(**batch.model_inputs()).logits
        reused = model(**cache.inputs(batch.input_ids, batch.attention_mask, slice(0, 4))).logits
    torch.testing.assert_close(reused, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("vocab, steps", [(7, 5), (558, 32), (151_936, 4)])
def test_noise_drawn_ahead_is_the_per_position_stream(vocab, steps):
    """CPU rows draw several positions' Gumbel noise in one call; the tokens must be exactly those of one
    ``gumbel_noise`` call per row per position (the stream the goldens and resumed runs rely on)."""
    from mmrlvr.rollout.sampling import gumbel_noise

    seeds = [row_seed(3, 1, "p", g) for g in range(3)]
    sampler = RowSampler(seeds, SamplingParams(max_new_tokens=steps, temperature=0.7))
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    logits = torch.randn(steps, 3, vocab, generator=torch.Generator().manual_seed(0))
    for t in range(steps):
        sampler(torch.zeros(3, 1, dtype=torch.long), logits[t].clone())
        noise = torch.stack([gumbel_noise(g, vocab) for g in gens])
        assert torch.equal(sampler.tokens[t], (logits[t] / 0.7 + noise).argmax(-1)), t
    assert sampler._noise.shape[0] > 1  # the premise: positions were drawn ahead, not one by one


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_generation_computes_each_prompt_rows_positions_once(family, samples, tmp_path, monkeypatch):
    """generate's prefill reads 3D positions for every row (get_rope_index); the engine has them computed once
    per distinct prompt row and kept (mmrlvr.models.positions): G rows of a prompt, and a prompt drawn again,
    cost nothing. The sampled tokens and log-probs equal those of the original (bit for bit)."""
    from mmrlvr.models import positions

    model, processor = load_policy(build_tiny(family, tmp_path / "m", seed=0))
    cls = type(model.model)
    real = cls.get_rope_index
    rows: list[int] = []

    def counting(self, input_ids, *args, **kwargs):
        rows.append(input_ids.shape[0])
        return real(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(cls, "get_rope_index", counting)
    params = SamplingParams(max_new_tokens=6)
    engine = HFEngine(model, processor)
    positions.clear()
    first = engine.generate(samples[:3], 4, params, seed=0, step=0)
    again = engine.generate(samples[:3], 4, params, seed=0, step=1)
    cached_rows = list(rows)
    monkeypatch.setattr(positions, "cached_rope_index", lambda m: __import__("contextlib").nullcontext())
    monkeypatch.setattr("mmrlvr.rollout.hf.cached_rope_index", positions.cached_rope_index)
    rows.clear()
    plain = engine.generate(samples[:3], 4, params, seed=0, step=0)
    plain_again = engine.generate(samples[:3], 4, params, seed=0, step=1)
    assert rows == [12, 12]  # without the cache: every row of every call (the premise)
    prompts = first.input_ids[::4, :first.prompt_length]  # the three prompts (scenes of one size tokenize alike)
    distinct = len({tuple(r) for r in prompts.tolist()})
    assert cached_rows == [distinct] and 1 <= distinct <= 3  # with it: each distinct prompt row once, then nothing
    for got, want in ((first, plain), (again, plain_again)):
        assert torch.equal(got.response_ids, want.response_ids)
        assert torch.equal(got.old_logprobs, want.old_logprobs)
