"""The tiny families' chat template gains Qwen's tool format without changing any tool-free conversation, and a
cached tiny folder built with an earlier template is upgraded when loaded."""

from __future__ import annotations

import json
import shutil

from transformers import AutoTokenizer

from mmrlvr.models.loading import load_policy
from mmrlvr.models.tiny import CHAT_TEMPLATE, TINY_TEMPLATE_HISTORY
from mmrlvr.tools import TOOLS, tool_schema
from mmrlvr.train.model_path import resolve_model_path

IMAGE = {"type": "image"}
CONVERSATIONS = [
    [{"role": "user", "content": "plain"}],
    [{"role": "system", "content": "Think first."}, {"role": "user", "content": [IMAGE, {"type": "text", "text": "How many?"}]}],
    [{"role": "user", "content": [IMAGE, IMAGE, {"type": "text", "text": "two"}]},
     {"role": "assistant", "content": "<think>a</think><answer>1</answer>"}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "clip"}]}],
    [{"role": "system", "content": [{"type": "text", "text": "listed system"}]}, {"role": "user", "content": "q"}],
]


def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model_path("tiny:qwen2_5_vl"))


def test_tool_free_conversations_render_exactly_as_before():
    tok = tokenizer()
    for messages in CONVERSATIONS:
        for gen in (True, False):
            old = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                          chat_template=TINY_TEMPLATE_HISTORY[-1])
            new = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                          chat_template=CHAT_TEMPLATE)
            assert new == old, messages


def test_tools_render_in_qwen_format():
    tok = tokenizer()
    schema = tool_schema(TOOLS.get("zoom"))
    messages = [{"role": "system", "content": "Think first."},
                {"role": "user", "content": [IMAGE, {"type": "text", "text": "How many?"}]},
                {"role": "assistant", "content": "<think>look</think>",
                 "tool_calls": [{"type": "function", "function": {"name": "zoom", "arguments": {"image": 0, "box": [1, 2, 3, 4]}}},
                                {"type": "function", "function": {"name": "rotate", "arguments": '{"image": 0, "degrees": 90}'}}]},
                {"role": "tool", "content": [IMAGE, {"type": "text", "text": "zoomed"}]},
                {"role": "tool", "content": "rotated"}]
    text = tok.apply_chat_template(messages, tools=[schema], tokenize=False, add_generation_prompt=True,
                                   chat_template=CHAT_TEMPLATE)
    assert text.startswith("<|im_start|>system\nThink first.\n\n# Tools\n\n")
    assert "<tools>\n" + json.dumps(schema) + "\n</tools>" in text
    assert text.count("<|im_start|>system") == 1  # the system message joins the tools block
    assert ('<|im_start|>assistant\n<think>look</think>\n<tool_call>\n{"name": "zoom", "arguments": '
            '{"image": 0, "box": [1, 2, 3, 4]}}\n</tool_call>\n<tool_call>\n{"name": "rotate", "arguments": '
            '{"image": 0, "degrees": 90}}\n</tool_call><|im_end|>\n') in text
    assert text.endswith("<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>zoomed\n"
                         "</tool_response>\n<tool_response>\nrotated\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n")


def test_a_cached_folder_with_an_earlier_template_is_upgraded_on_load(tmp_path):
    src = resolve_model_path("tiny:qwen2_5_vl")
    folder = tmp_path / "old"
    shutil.copytree(src, folder)
    for old in TINY_TEMPLATE_HISTORY:
        (folder / "chat_template.jinja").write_text(old)
        _, processor = load_policy(folder)
        assert processor.chat_template == CHAT_TEMPLATE
        assert processor.tokenizer.chat_template == CHAT_TEMPLATE
    custom = "{{ messages[0]['content'] }}"  # anyone else's template is left alone
    (folder / "chat_template.jinja").write_text(custom)
    _, processor = load_policy(folder)
    assert processor.chat_template == custom
