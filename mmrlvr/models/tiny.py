"""Build a tiny, offline, randomly initialised VLM of a *real* Qwen class, saved like a real checkpoint.

Why: tests, the CPU demo and the learning checks need a VLM that loads through the same code paths as
Qwen2-VL / Qwen2.5-VL / Qwen3-VL (``AutoModelForImageTextToText``, the Qwen processor, mRoPE, the vision
tower) but builds in well under a second with no download. Default size (the CPU studies' model): text
hidden 128, MLP 256, 2 layers, 4 heads / 2 KV heads; vision depth 2, hidden 64, output 128; patch 14
(16 for Qwen3-VL); a 112x112 image becomes 16 image tokens.

The tokenizer is a byte-level BPE trained here, in milliseconds, on a built-in corpus that covers the
synthetic tasks' wording (colours, shapes, counts, positions, boxes, angles, R1-style responses), so that
colour and shape words are single tokens and every digit is its own token (Qwen's pre-tokenizer splits
digits). It carries Qwen's special tokens and a Qwen-style chat template.

What this does not do: train anything (see ``mmrlvr.models.warmstart``) or pretend to be a useful model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import AddedToken
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from mmrlvr.errors import UserError
from mmrlvr.models.compat import PROCESSORS, register_image_only_processors

FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# Qwen's special tokens, in Qwen's order (ids follow the BPE vocabulary, as in the real tokenizers).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
# Reasoning tags are added but *not* special (as <think> in Qwen3): decoding with
# skip_special_tokens=True keeps them, which the format rewards need.
TAG_TOKENS: tuple[str, ...] = ("<think>", "</think>", "<answer>", "</answer>")

# Qwen2's pre-tokenizer pattern: letters with one leading non-letter, single digits, punctuation runs.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

# Qwen-style chat template: image parts become <|vision_start|><|image_pad|><|vision_end|> and video parts
# <|vision_start|><|video_pad|><|vision_end|> (the processor expands the pad to one token per merged patch). Unlike
# the real one, no default system message is injected: prompts stay short for a 2-layer model.
#
# Tools, in the format of the real Qwen2.5-VL / Qwen3-VL templates (and Qwen2.5's, which Qwen2-VL's language model
# follows): ``tools=`` adds a system block listing each tool's JSON schema inside <tools></tools> and how to call
# one; an assistant message's ``tool_calls`` render as <tool_call>{"name": ..., "arguments": ...}</tool_call>
# blocks; tool messages render as a user turn of <tool_response> blocks (consecutive tool messages share one turn),
# their image parts as vision placeholders like any other image. A conversation without tools renders exactly as
# before (``TINY_TEMPLATE_HISTORY``; tests/test_tiny_template.py).
_CONTENT = (
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'video' or 'video' in part -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
)
CHAT_TEMPLATE = (
    "{%- set skip_first = false -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set message = messages[0] -%}" + _CONTENT + "{{- '\\n\\n' -}}"
    "{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if tools and loop.first and message['role'] == 'system' -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' -}}" + _CONTENT + "{{- '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}" + _CONTENT +
    "{%- if message['role'] == 'assistant' and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- if call['function'] is defined -%}{%- set call = call['function'] -%}{%- endif -%}"
    "{%- if not loop.first or message['content'] -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' -}}"
    "{%- if call['arguments'] is string -%}{{- call['arguments'] -}}{%- else -%}{{- call['arguments'] | tojson -}}"
    "{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Earlier tiny templates, oldest first: a cached tiny folder built with one of them gets the current template when
# loaded (``upgrade_tiny_template``). Each later one renders every conversation an earlier one could render the same,
# so the weights trained under it stay valid.
TINY_TEMPLATE_HISTORY: tuple[str, ...] = (
    # before video parts
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
    # before tools
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'video' or 'video' in part -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
)


def upgrade_tiny_template(processor: Any) -> Any:
    """Give a processor (and its tokenizer) loaded from a cached tiny folder the current ``CHAT_TEMPLATE`` when it
    carries one of ``TINY_TEMPLATE_HISTORY``; any other template (a real checkpoint's) is left alone. Returns it."""
    for holder in (processor, getattr(processor, "tokenizer", None)):
        if holder is not None and getattr(holder, "chat_template", None) in TINY_TEMPLATE_HISTORY:
            holder.chat_template = CHAT_TEMPLATE
    return processor


COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "black", "white", "gray")
SHAPES = ("circle", "square", "triangle", "star", "rectangle", "shape", "object", "line", "angle")
REGIONS = ("top left", "top centre", "top right", "middle left", "centre", "middle right", "bottom left",
           "bottom centre", "bottom right")
SYSTEM_PROMPTS = (  # mmrlvr.data.prompts templates, then the common long R1 / EasyR1 prompts
    "Think in <think></think>, then answer in <answer></answer>.",
    "Think step by step, then put the final answer in \\boxed{}.",
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
    "</answer>.",
    "You FIRST think about the reasoning process as an internal monologue and then provide the final "
    "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
    "BE put in \\boxed{}.",
    "You are a helpful assistant.",
)

# Default architecture (the CPU studies' model); any key can be overridden through build_tiny(**overrides).
DEFAULTS: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vision_depth": 2, "vision_hidden_size": 64, "vision_intermediate_size": 128,
    "vision_num_heads": 4, "patch_size": None, "image_size": 112, "max_position_embeddings": 2048,
    "vocab_size": 540,
}


def _plural(word: str) -> str:
    return word + ("es" if word.endswith(("s", "x", "ch", "sh")) else "s")


def tokenizer_corpus(n: int = 1200, seed: int = 0) -> list[str]:
    """Lines of synthetic-task text the BPE is trained on (deterministic; independent of the model seed).

    The phrasing mirrors ``mmrlvr.data.synth`` and ``mmrlvr.data.prompts`` (kept as text here so the
    tokenizer does not change when a task's wording does); the first colours and shapes are weighted up.
    """
    rng = random.Random(seed)
    lines: list[str] = [SYSTEM_PROMPTS[0], SYSTEM_PROMPTS[1]] * 200 + list(SYSTEM_PROMPTS[2:]) * 3
    # bare words (after a tag or at a line start, without the leading space) should be single tokens too
    words = COLOURS + SHAPES + ("left", "right", "above", "below", "yes", "no", "system", "user", "assistant",
                                "What", "Which", "How", "Give", "Is", "The")
    # (one word per line: in training "<answer>red" would be pre-tokenized as "<", "answer", ">red")
    lines += list(words) * 40 + [" ".join(words), " ".join(_plural(s) for s in SHAPES)] * 100
    main_c, main_s = COLOURS[:4], SHAPES[:3]
    for _ in range(n):
        c1, c2 = rng.sample(main_c if rng.random() < 0.8 else COLOURS, 2)
        s1, s2 = rng.sample(main_s if rng.random() < 0.8 else SHAPES, 2)
        k1, k2 = rng.randint(0, 4), rng.randint(0, 9)
        box = [rng.randint(0, 111) for _ in range(4)]
        deg = rng.randint(1, 17) * 10
        x1, x2 = rng.randint(10, 100), rng.randint(10, 100)
        side = rng.choice(["left", "right"])
        region = rng.choice(REGIONS)
        lines += [
            f"<image>How many {c1} shapes are there?",
            f"<think>I see {k1} {c1}, {k2} {c2}.</think><answer>{k1}</answer>",
            "<image>What colour is the largest shape?",
            f"<think>The largest shape is the {c1} {s1}.</think><answer>{c1}</answer>",
            f"<image>Is the {c1} {s1} left or right of the {c2} {s2}?",
            f"<think>The {c1} {s1} is at x {x1}, the {c2} {s2} is at x {x2}.</think><answer>{side}</answer>",
            f"<image>Give the box of the {c1} {s1}.",
            f"<think>The {c1} {s1} is at the {region}.</think><answer>{box}</answer>",
            "<image>What is the angle in degrees?",
            f"<think>The two lines meet at about {deg} degrees.</think><answer>{deg}</answer>",
            f"How many {_plural(s1)} are there? Which colour is the {s1}? The answer is \\boxed{{{k2}}}.",
        ]
    return lines


def build_tokenizer(vocab_size: int = DEFAULTS["vocab_size"]) -> PreTrainedTokenizerFast:
    """A byte-level BPE with Qwen's pre-tokenizer, special tokens and chat template (trained offline)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",  # must be passed here: setting it afterwards is not saved
        chat_template=CHAT_TEMPLATE,
        model_max_length=DEFAULTS["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|endoftext|>", "<|im_end|>")],
    )


def _token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return {
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
    }


def _text_config(o: dict[str, Any], vocab: int, tokenizer: PreTrainedTokenizerFast,
                 mrope_section: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": vocab, "hidden_size": o["hidden_size"], "intermediate_size": o["intermediate_size"],
        "num_hidden_layers": o["num_hidden_layers"], "num_attention_heads": o["num_attention_heads"],
        "num_key_value_heads": o["num_key_value_heads"], "max_position_embeddings": o["max_position_embeddings"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope_section,
                            **extra.pop("rope_extra", {})},
        "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
        **extra,
    }


def _mrope_section(head_dim: int, family: str) -> list[int]:
    """Split head_dim/2 rotary frequencies into (temporal, height, width) like the real models' ratios."""
    half = head_dim // 2
    if family == "qwen3_vl":  # real: [24, 20, 20] of 64
        t = half * 24 // 64
    else:  # real: [16, 24, 24] of 64
        t = half * 16 // 64
    h = (half - t) // 2
    return [t, h, half - t - h]


def make_config(family: str, tokenizer: PreTrainedTokenizerFast, **overrides: Any):
    """The family's real config class with tiny sizes. Vision output width = text hidden size (its output
    replaces the image tokens' embeddings)."""
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise UserError(f"unknown tiny-model option(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    o = {**DEFAULTS, **overrides}
    vocab = len(tokenizer)
    head_dim = o["hidden_size"] // o["num_attention_heads"]
    ids = _token_ids(tokenizer)
    mrope = _mrope_section(head_dim, family)
    if family == "qwen2_vl":
        vision = {"depth": o["vision_depth"], "embed_dim": o["vision_hidden_size"], "hidden_size": o["hidden_size"],
                  "mlp_ratio": o["vision_intermediate_size"] // o["vision_hidden_size"],
                  "num_heads": o["vision_num_heads"], "patch_size": o["patch_size"] or 14}
        return Qwen2VLConfig(text_config=_text_config(o, vocab, tokenizer, mrope), vision_config=vision, **ids)
    if family == "qwen2_5_vl":
        vision = {"depth": o["vision_depth"], "hidden_size": o["vision_hidden_size"],
                  "intermediate_size": o["vision_intermediate_size"], "num_heads": o["vision_num_heads"],
                  "out_hidden_size": o["hidden_size"], "patch_size": o["patch_size"] or 14,
                  "fullatt_block_indexes": [o["vision_depth"] - 1], "window_size": 112}
        return Qwen2_5_VLConfig(text_config=_text_config(o, vocab, tokenizer, mrope), vision_config=vision, **ids)
    if family == "qwen3_vl":
        patch = o["patch_size"] or 16
        side = max(2, o["image_size"] // patch)  # position-embedding grid side: a perfect square in total
        vision = {"depth": o["vision_depth"], "hidden_size": o["vision_hidden_size"],
                  "intermediate_size": o["vision_intermediate_size"], "num_heads": o["vision_num_heads"],
                  "out_hidden_size": o["hidden_size"], "patch_size": patch,
                  "num_position_embeddings": side * side, "deepstack_visual_indexes": [0]}
        text = _text_config(o, vocab, tokenizer, mrope, head_dim=head_dim,
                            rope_extra={"mrope_interleaved": True})
        return Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
    raise UserError(f"unknown tiny-model family {family!r}; known: {', '.join(FAMILIES)}")


IMAGE_ONLY_PROCESSORS = {family: classes[2] for family, classes in PROCESSORS.items()}

MODEL_CLASSES = {
    "qwen2_vl": Qwen2VLForConditionalGeneration,
    "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
    "qwen3_vl": Qwen3VLForConditionalGeneration,
}


def make_processor(family: str, tokenizer: PreTrainedTokenizerFast, config, image_size: int = 112):
    """Qwen processor (image-only without torchvision) sized so an ``image_size`` square gives 16 tokens."""
    patch = config.vision_config.patch_size
    merge = config.vision_config.spatial_merge_size
    factor = patch * merge
    # Qwen3-VL normalises with mean = std = 0.5; Qwen2/2.5-VL keep the image processor's CLIP defaults
    norm = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]} if family == "qwen3_vl" else {}
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=patch, merge_size=merge, temporal_patch_size=config.vision_config.temporal_patch_size,
        min_pixels=factor * factor, max_pixels=4 * image_size * image_size, **norm,
    )
    # the image-only class builds with or without torchvision; the saved files are the same as the stock
    # processor's once ``_finish_processor_files`` adds the video processor's config
    return IMAGE_ONLY_PROCESSORS[family](image_processor, tokenizer, chat_template=tokenizer.chat_template)


def _finish_processor_files(out: Path, family: str, config) -> None:
    """Make the saved processor files those of a stock Qwen checkpoint.

    - no ``processor_class``: ``AutoProcessor`` then picks the processor by config type, i.e. the stock Qwen
      processor where torchvision is installed (e.g. a GPU box running vLLM) and the registered image-only
      one where it is not;
    - a ``video_processor`` entry (written as JSON: building one needs torchvision), which the stock
      processor loads; it shares the vision tower's patch / merge sizes.
    """
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        path = out / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        data.pop("processor_class", None)
        if name == "processor_config.json":
            image = data.get("image_processor", {})
            data.setdefault("video_processor", {
                "video_processor_type": "Qwen3VLVideoProcessor" if family == "qwen3_vl" else "Qwen2VLVideoProcessor",
                "patch_size": config.vision_config.patch_size, "merge_size": config.vision_config.spatial_merge_size,
                "temporal_patch_size": config.vision_config.temporal_patch_size,
                **{k: image[k] for k in ("image_mean", "image_std") if k in image},
            })
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build_tiny(family: str, out_dir: str | Path, *, seed: int = 0, **overrides: Any) -> Path:
    """Build and save a tiny random ``family`` VLM (model, tokenizer, processor) into ``out_dir``.

    ``overrides`` change the sizes in ``DEFAULTS`` (e.g. ``hidden_size=64``). Returns the folder, which
    loads with ``AutoModelForImageTextToText.from_pretrained`` / ``mmrlvr.models.load_policy``.
    """
    if family not in MODEL_CLASSES:
        raise UserError(f"unknown tiny-model family {family!r}; known: {', '.join(FAMILIES)}")
    register_image_only_processors()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = overrides.pop("vocab_size", DEFAULTS["vocab_size"])
    tokenizer = build_tokenizer(vocab_size)
    config = make_config(family, tokenizer, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MODEL_CLASSES[family](config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id, do_sample=False,
    )
    model.save_pretrained(out)
    processor = make_processor(family, tokenizer, config, overrides.get("image_size", DEFAULTS["image_size"]))
    processor.save_pretrained(out)
    _finish_processor_files(out, family, config)
    return out
