"""Tiny offline VLMs of the real Qwen classes: build, process, generate, train-forward, save, reload; LoRA."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from PIL import Image
from transformers import AutoProcessor
from transformers.processing_utils import ProcessorMixin

from mmrlvr.errors import UserError
from mmrlvr.models import FAMILIES, apply_lora, build_tiny, freeze_vision, load_policy, reference_logits_context
from mmrlvr.models.compat import HAS_TORCHVISION, import_qwen_vl_utils
from mmrlvr.models.lora import is_vision_module
from mmrlvr.models.tiny import COLOURS, SHAPES, build_tokenizer

EXPECTED_CLASS = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {f: build_tiny(f, root / f, seed=0) for f in FAMILIES}


def _image(colour=(220, 40, 40)) -> Image.Image:
    img = Image.new("RGB", (112, 112), (255, 255, 255))
    img.paste(colour, (30, 30, 60, 60))
    return img


def _messages(question: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


# -- tokenizer ----------------------------------------------------------------------------------------

def test_tokenizer_words_and_digits_are_single_tokens():
    tok = build_tokenizer()
    assert 350 <= len(tok) <= 600
    for word in COLOURS + SHAPES + ("left", "right"):
        for text in (word, " " + word):  # after a tag and after a space
            assert len(tok(text, add_special_tokens=False).input_ids) == 1, text
    for d in "0123456789":
        assert len(tok(d, add_special_tokens=False).input_ids) == 1
    # "12" is two tokens: Qwen's pre-tokenizer splits every digit
    assert tok.convert_ids_to_tokens(tok("12", add_special_tokens=False).input_ids) == ["1", "2"]


def test_tokenizer_decode_keeps_tags_and_drops_special_tokens():
    tok = build_tokenizer()
    text = "<think>I see 2 red, 1 blue.</think><answer>2</answer>"
    ids = tok(text + "<|im_end|>", add_special_tokens=False).input_ids
    assert tok.convert_ids_to_tokens(ids)[0] == "<think>"
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.padding_side == "left"


def test_chat_template_renders_image_parts_and_generation_prompt():
    tok = build_tokenizer()
    messages = [{"role": "system", "content": [{"type": "text", "text": "S."}]}] + _messages("How many?")
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nS.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                    "How many?<|im_end|>\n<|im_start|>assistant\n")
    assert not tok.apply_chat_template(messages, tokenize=False).endswith("assistant\n")


# -- build / process / generate / forward / save / reload ---------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_family_end_to_end(tiny_dirs, family, tmp_path):
    model, processor = load_policy(tiny_dirs[family])
    assert type(model).__name__ == EXPECTED_CLASS[family]
    assert isinstance(processor, ProcessorMixin)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    text = processor.apply_chat_template(_messages("How many red shapes are there?"), tokenize=False,
                                         add_generation_prompt=True)
    inputs = processor(text=[text, text], images=[[_image()], [_image((40, 80, 220))]], return_tensors="pt",
                       padding=True)
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (inputs["input_ids"][0] == image_pad).sum() == 16  # 112x112 -> 16 merged patches
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 2 and inputs["input_ids"].shape[1] < out.shape[1] <= inputs["input_ids"].shape[1] + 5
    loss = model(**inputs, labels=inputs["input_ids"]).loss
    assert torch.isfinite(loss)
    with torch.no_grad():
        before = model(**inputs).logits
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    reloaded, _ = load_policy(tmp_path)
    with torch.no_grad():
        after = reloaded(**inputs).logits
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_auto_processor_returns_a_full_processor(tiny_dirs):
    processor = AutoProcessor.from_pretrained(str(tiny_dirs["qwen2_5_vl"]))
    assert isinstance(processor, ProcessorMixin)  # not just the tokenizer
    assert hasattr(processor, "image_processor")
    if not HAS_TORCHVISION:
        assert type(processor).__name__ == "Qwen2_5_VLImageProcessorOnly"


def test_saved_folder_looks_like_a_stock_checkpoint(tiny_dirs):
    """No processor_class and a video processor entry: the stock processor loads it where torchvision exists."""
    for name in ("processor_config.json", "tokenizer_config.json"):
        path = tiny_dirs["qwen2_vl"] / name
        if path.exists():
            assert "processor_class" not in json.loads(path.read_text())
    video = json.loads((tiny_dirs["qwen3_vl"] / "processor_config.json").read_text())["video_processor"]
    assert (video["video_processor_type"], video["patch_size"]) == ("Qwen3VLVideoProcessor", 16)
    config = json.loads((tiny_dirs["qwen3_vl"] / "config.json").read_text())
    assert config["vision_config"]["patch_size"] == 16
    assert config["vision_config"]["out_hidden_size"] == config["text_config"]["hidden_size"]


def test_build_is_deterministic_per_seed(tmp_path):
    a = build_tiny("qwen2_5_vl", tmp_path / "a", seed=3)
    b = build_tiny("qwen2_5_vl", tmp_path / "b", seed=3)
    c = build_tiny("qwen2_5_vl", tmp_path / "c", seed=4)
    ma, mb, mc = (load_policy(p)[0] for p in (a, b, c))
    wa, wb, wc = (m.lm_head.weight for m in (ma, mb, mc))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_build_rejects_unknown_family_and_option(tmp_path):
    with pytest.raises(UserError, match="qwen2_vl"):
        build_tiny("llava", tmp_path)
    with pytest.raises(UserError, match="hidden_sise"):
        build_tiny("qwen2_vl", tmp_path, hidden_sise=64)


def test_load_policy_errors_name_the_folder(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_policy(tmp_path / "missing")
    with pytest.raises(UserError, match="no config.json"):
        load_policy(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match="no weights"):
        load_policy(tmp_path)


def test_load_policy_dtype(tiny_dirs):
    model, _ = load_policy(tiny_dirs["qwen2_vl"], dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(UserError, match="unknown dtype"):
        load_policy(tiny_dirs["qwen2_vl"], dtype="float8")


# -- LoRA ---------------------------------------------------------------------------------------------

def _response_logprobs(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        logits = model(**inputs).logits[:, :-1]
    return torch.log_softmax(logits, -1).gather(-1, inputs["input_ids"][:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_lora_disabled_reproduces_base_and_spares_vision(tiny_dirs, family):
    model, processor = load_policy(tiny_dirs[family])
    text = processor.apply_chat_template(_messages("How many red shapes are there?"), tokenize=False,
                                         add_generation_prompt=True) + "<think>I see 1 red.</think>"
    inputs = processor(text=[text], images=[[_image()]], return_tensors="pt")
    base = _response_logprobs(model, inputs)
    vision_before = {n: p.detach().clone() for n, p in model.named_parameters() if is_vision_module(n)}

    peft_model = apply_lora(model, r=4, alpha=8)
    lora_names = [n for n, _ in peft_model.named_modules() if n.endswith("lora_A")]
    assert lora_names and not any(is_vision_module(n) for n in lora_names)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)

    # make the adapter do something, so "disabled == base" is a real check
    opt = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=0.5)
    loss = peft_model(**inputs, labels=inputs["input_ids"]).loss
    loss.backward()
    opt.step()
    adapted = _response_logprobs(peft_model, inputs)
    assert (adapted - base).abs().max() > 1e-4
    with reference_logits_context(peft_model):
        reference = _response_logprobs(peft_model, inputs)
    torch.testing.assert_close(reference, base, rtol=0, atol=0)
    for n, p in peft_model.named_parameters():
        key = n.replace("base_model.model.", "")
        if key in vision_before:
            assert torch.equal(p, vision_before[key]), n


def test_freeze_vision_and_unknown_init(tiny_dirs):
    model, _ = load_policy(tiny_dirs["qwen2_vl"])
    frozen = freeze_vision(model)
    assert frozen == sum(p.numel() for n, p in model.named_parameters() if is_vision_module(n))
    assert all(not p.requires_grad for n, p in model.named_parameters() if is_vision_module(n))
    with pytest.raises(UserError, match="pissa"):
        apply_lora(model, init="svd")


def test_lora_language_only_lists_language_modules_when_vision_shares_names():
    """A vision tower with q_proj (as CLIP/SigLIP towers have) is excluded by full module names."""

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vision_tower = torch.nn.ModuleDict({"q_proj": torch.nn.Linear(4, 4)})
            self.language_model = torch.nn.ModuleDict({"q_proj": torch.nn.Linear(4, 4)})

        def forward(self, x):
            return self.language_model["q_proj"](self.vision_tower["q_proj"](x))

    peft_model = apply_lora(Toy(), r=2, alpha=4, target_modules=("q_proj",))
    names = [n for n, _ in peft_model.named_modules() if n.endswith("lora_A")]
    assert names == ["base_model.model.language_model.q_proj.lora_A"]


# -- qwen_vl_utils without torchvision -----------------------------------------------------------------

def test_qwen_vl_utils_image_helpers_import():
    qvu = import_qwen_vl_utils()
    assert qvu.smart_resize(112, 112, factor=28) == (112, 112)
    if not HAS_TORCHVISION:
        assert "torchvision" not in sys.modules  # the stand-in is gone after the import


@pytest.mark.skipif(HAS_TORCHVISION, reason="the fallback is for machines without torchvision")
def test_load_policy_handles_a_checkpoint_naming_the_stock_processor(tiny_dirs, tmp_path):
    """Real Qwen checkpoints name ``Qwen2_5_VLProcessor``, whose loading needs a video processor."""
    import shutil

    folder = tmp_path / "realish"
    shutil.copytree(tiny_dirs["qwen2_5_vl"], folder)
    config = json.loads((folder / "processor_config.json").read_text())
    (folder / "processor_config.json").write_text(json.dumps({**config, "processor_class": "Qwen2_5_VLProcessor"}))
    with pytest.raises(Exception):
        AutoProcessor.from_pretrained(str(folder))  # the stock path fails without torchvision
    _, processor = load_policy(folder)
    assert type(processor).__name__ == "Qwen2_5_VLImageProcessorOnly"
    assert processor(text=["<|vision_start|><|image_pad|><|vision_end|>hi"], images=[[_image()]],
                     return_tensors="pt")["image_grid_thw"].tolist() == [[1, 8, 8]]
