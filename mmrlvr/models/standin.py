"""Shape-true stand-ins: real Qwen2.5-VL widths, vocabulary and vision tower, 1-2 layers, random weights.

Why: speed and memory at real model shapes are dominated by the 151,936-token vocabulary projection,
the hidden width and the image-token count, not by depth, so a model with the real widths and one
decoder layer shows where time and memory go without downloading a checkpoint. Built offline with the
real ``Qwen2_5_VLForConditionalGeneration`` class and the tiny tokenizer/processor machinery of
``mmrlvr.models.tiny`` (a small BPE: ids past the tokenizer's length exist in the model but decode to
nothing). Widths from the published configs of Qwen/Qwen2.5-VL-3B-Instruct and -7B-Instruct.

The end-of-sequence rows of the output embedding are zeroed, so their logit is exactly 0 while the
others are random with std ~0.9: the chance of stopping is ~1/V per token and generations run to
``max_new_tokens`` (fixed-length, as a speed benchmark needs).

Not here: anything learned. ``toy`` is ``build_tiny("qwen2_5_vl")`` itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from mmrlvr.errors import UserError

# text / vision widths of the real checkpoints (config.json of each), vocabulary 151,936
SHAPES: dict[str, dict[str, Any] | None] = {
    "toy": None,
    "qwen2_5_vl_3b": {"hidden_size": 2048, "intermediate_size": 11008, "num_attention_heads": 16,
                      "num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen2_5_vl_7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                      "num_key_value_heads": 4, "tie_word_embeddings": False},
}
VOCAB = 151_936
#: the benchmarks' default point per shape: (prompts per step B, group size G, image tokens, new tokens)
BENCH_POINTS: dict[str, tuple[int, int, int, int]] = {
    "toy": (16, 8, 16, 32), "qwen2_5_vl_3b": (2, 4, 256, 128), "qwen2_5_vl_7b": (2, 4, 256, 128)}
VISION = {"hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "patch_size": 14,
          "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112}


def standin_config(shape: str, tokenizer, *, layers: int = 1, vision_depth: int = 1,
                   vocab_size: int = VOCAB) -> Qwen2_5_VLConfig:
    """The Qwen2.5-VL config of ``shape`` with ``layers`` decoder layers and ``vision_depth`` vision blocks."""
    from mmrlvr.models.tiny import _token_ids

    spec = SHAPES.get(shape)
    if spec is None:
        raise UserError(f"unknown stand-in shape {shape!r}; known: {', '.join(k for k in SHAPES if SHAPES[k])}")
    if layers < 1 or vision_depth < 1:
        raise UserError("stand-in layers and vision_depth must be >= 1")
    spec = dict(spec)
    tie = spec.pop("tie_word_embeddings")
    text = {**spec, "vocab_size": vocab_size, "num_hidden_layers": layers, "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": tie,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]},
            "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    vision = {**VISION, "depth": vision_depth, "out_hidden_size": spec["hidden_size"],
              "fullatt_block_indexes": [vision_depth - 1]}
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie,
                            **_token_ids(tokenizer))


def standin_model(shape: str, tokenizer, *, layers: int = 1, vision_depth: int = 1, seed: int = 0,
                  vocab_size: int = VOCAB) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised stand-in (float32), end-of-sequence output rows zeroed (module docstring)."""
    from transformers.initialization import no_init_weights

    config = standin_config(shape, tokenizer, layers=layers, vision_depth=vision_depth, vocab_size=vocab_size)
    with no_init_weights():
        model = Qwen2_5_VLForConditionalGeneration(config)
    if config.tie_word_embeddings:
        model.tie_weights()  # skipped with the initialisation; the 3B checkpoint ties lm_head to the embedding
    fill_random(model, seed)
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
    with torch.no_grad():
        model.get_output_embeddings().weight[eos] = 0.0
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                                               do_sample=False)
    return model.eval()


def fill_random(model: torch.nn.Module, seed: int = 0, std: float = 0.02, period: int = 1_000_003) -> None:
    """transformers' Qwen initialisation (matrices N(0, std), norm weights 1, biases 0), fast.

    Drawing 450 M normal numbers takes ~15 s on a busy CPU core; instead one block of ``period`` (a
    prime, so rows of any width do not line up with it) numbers is drawn and tiled through each matrix,
    starting at a different offset per parameter. Weights are random-looking, not independent: fine for
    speed, memory and exactness checks, which is all a stand-in is for."""
    gen = torch.Generator().manual_seed(seed)
    block = torch.randn(period, generator=gen) * std
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            if p.dim() == 1:
                p.fill_(1.0 if "norm" in name or name.endswith("ln_q.weight") else 0.0)
                continue
            flat = p.view(-1)
            start = (i * 7_919) % period
            pos = 0
            while pos < flat.numel():
                k = min(period - start, flat.numel() - pos)
                flat[pos:pos + k].copy_(block[start:start + k])
                pos, start = pos + k, 0


def build_standin(shape: str, out_dir: str | Path, *, image_tokens: int = 256, layers: int = 1,
                  vision_depth: int = 1, seed: int = 0) -> Path:
    """Save a stand-in (model, tokenizer, processor) to ``out_dir``; ``toy`` builds the tiny Qwen2.5-VL.

    The processor's pixel limits let a square image of ``image_tokens`` merged tokens (a perfect square:
    256 = 16x16 tokens = 448x448 pixels) through unresized. Returns the folder (``load_policy`` loads it).
    """
    from mmrlvr.models.tiny import _finish_processor_files, build_tiny, build_tokenizer, make_processor

    side = image_side(image_tokens)
    if shape == "toy":
        return build_tiny("qwen2_5_vl", out_dir, seed=seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = standin_model(shape, tokenizer, layers=layers, vision_depth=vision_depth, seed=seed)
    model.save_pretrained(out)
    processor = make_processor("qwen2_5_vl", tokenizer, model.config, image_size=side)
    processor.save_pretrained(out)
    _finish_processor_files(out, "qwen2_5_vl", model.config)
    return out


def image_side(image_tokens: int) -> int:
    """Side in pixels of a square image that becomes ``image_tokens`` merged tokens (28 px per token)."""
    k = round(image_tokens ** 0.5)
    if k * k != image_tokens or k < 1:
        raise UserError(f"image tokens must be a perfect square (e.g. 256, 1024), got {image_tokens}")
    return 28 * k
