"""Prompt templates and rows_to_samples."""

from __future__ import annotations

import pytest

from mmrlvr.data import TEMPLATES, build_messages, make_rows, rows_to_samples
from mmrlvr.errors import UserError


def test_placeholder_becomes_image_part_in_position():
    msgs = build_messages("Compare <image> with <image> please", 2, "plain")
    assert msgs == [{"role": "user", "content": [
        {"type": "text", "text": "Compare"}, {"type": "image"},
        {"type": "text", "text": "with"}, {"type": "image"},
        {"type": "text", "text": "please"}]}]


def test_no_placeholder_puts_images_first():
    msgs = build_messages("What is shown?", 2, "plain")
    assert [p["type"] for p in msgs[0]["content"]] == ["image", "image", "text"]


def test_r1_has_short_system_prompt_and_boxed_has_instruction():
    r1 = build_messages("<image>How many red shapes are there?", 1, "r1")
    assert r1[0]["role"] == "system" and "<think>" in r1[0]["content"][0]["text"]
    assert len(r1[0]["content"][0]["text"].split()) <= 12
    boxed = build_messages("<image>Find x.", 1, "boxed")
    assert boxed[0]["role"] == "user"
    assert boxed[0]["content"][-1]["text"].startswith("Find x. ") and "\\boxed{}" in boxed[0]["content"][-1]["text"]
    user = build_messages("<image>", 1, "r1_user")
    assert user[0]["content"] == [{"type": "image"}, {"type": "text", "text": TEMPLATES["r1_user"].instruction}]


def test_system_override():
    assert build_messages("hi", 0, "r1", system="")[0]["role"] == "user"
    assert build_messages("hi", 0, "plain", system="Be brief.")[0] == {
        "role": "system", "content": [{"type": "text", "text": "Be brief."}]}


def test_placeholder_mismatch_and_unknown_template():
    with pytest.raises(ValueError, match="2 <image> placeholder"):
        build_messages("<image><image>", 1)
    with pytest.raises(UserError, match="known: r1"):
        build_messages("x", 0, "r2")


def test_rows_to_samples_from_synthetic_rows():
    rows = make_rows("count", "train", 4)
    samples = rows_to_samples(rows, template="r1")
    s = samples[0]
    assert s.id == rows[0]["id"] and s.answer == rows[0]["answer"] and s.answer_type == "number"
    assert s.images[0] is rows[0]["images"][0]
    assert s.meta["task"] == "count" and s.meta["solution"] == rows[0]["solution"]
    assert s.question.startswith("How many ")
    assert sum(p["type"] == "image" for p in s.messages[-1]["content"]) == 1


# ------------------------------------------------------------------ Jinja prompt templates, answer_format

def test_jinja_prompt_template_string_and_file(tmp_path):
    from mmrlvr.data.prompts import load_prompt_template

    tpl = load_prompt_template("Q: {{ content | trim }}\nAnswer in <answer></answer>.")
    msgs = build_messages("<image> How many? ", 1, "r1", prompt_template=tpl)
    # the template replaces r1's system prompt and instruction; <image> inside content stays a part
    assert msgs == [{"role": "user", "content": [{"type": "text", "text": "Q:"}, {"type": "image"},
                                                 {"type": "text", "text": "How many?\nAnswer in <answer></answer>."}]}]
    f = tmp_path / "math.jinja"
    f.write_text("{{ content }} Put the final answer in \\boxed{}.")
    tpl2 = load_prompt_template(str(f))
    assert tpl2.answer_format == "boxed" and tpl.answer_format == "r1"
    assert build_messages("x", 0, prompt_template=tpl2, system="S")[0]["content"][0]["text"] == "S"


def test_shipped_prompt_templates_declare_their_convention():
    from mmrlvr.data.prompts import PROMPT_TEMPLATES, load_prompt_template

    assert {k: v.answer_format for k, v in PROMPT_TEMPLATES.items()} == {
        "r1_tags": "r1", "boxed_math": "boxed", "grounding_json": "r1"}
    text = load_prompt_template("grounding_json").render("Find the cat.")
    assert text.startswith("Find the cat. ") and '"bbox_2d"' in text and "<answer>" in text
    assert "\\boxed{}" in load_prompt_template("boxed_math").render("1+1?")


def test_bad_prompt_templates_are_user_errors(tmp_path):
    from mmrlvr.data.prompts import load_prompt_template

    with pytest.raises(UserError, match=r"never uses \{\{ content \}\}"):
        load_prompt_template("{{ question }} Answer.")
    with pytest.raises(UserError, match=r"unknown variable\(s\) options"):
        load_prompt_template("{{ content }} {{ options }}")
    with pytest.raises(UserError, match="Jinja syntax error on line 1"):
        load_prompt_template("{{ content ")
    with pytest.raises(UserError, match="is neither a shipped template"):
        load_prompt_template(str(tmp_path / "missing.jinja"))


def test_answer_format_is_one_place():
    from types import SimpleNamespace as NS

    from mmrlvr.config import load_config
    from mmrlvr.data.prompts import answer_format

    assert answer_format(load_config(None, []).data) == "r1"
    assert answer_format(load_config(None, ["data.template=boxed"]).data) == "boxed"
    assert answer_format(load_config(None, ["data.prompt_template=boxed_math"]).data) == "boxed"
    assert answer_format(load_config(None, ["data.template=boxed", "data.prompt_template=r1_tags"]).data) == "r1"
    assert answer_format(load_config(None, ["data.prompt_template={{ content }} Reply briefly."]).data) == "raw"
    assert answer_format(load_config(None, ["data.prompt_template=boxed_math", "data.answer_format=r1"]).data) == "r1"
    with pytest.raises(UserError, match="data.answer_format: unknown 'xml'"):
        answer_format(NS(template="r1", prompt_template=None, answer_format="xml"))
    # every value it returns is a convention the rewards' answer locator knows
    from mmrlvr.rewards.parsing import TEMPLATES as REWARD_TEMPLATES
    from mmrlvr.data.prompts import ANSWER_FORMATS

    assert set(ANSWER_FORMATS) <= set(REWARD_TEMPLATES)


def test_prompt_template_and_system_prompt_reach_loaded_and_synthetic_samples(tmp_path):
    from mmrlvr.config import load_config
    from mmrlvr.train.data import load_split

    cfg = load_config(None, ["data.prompt_template=boxed_math", "data.system_prompt=Count carefully.",
                             "data.train_size=3"])
    samples = load_split("synth:count", cfg.data, "train")
    s = samples[0]
    assert s.messages[0] == {"role": "system", "content": [{"type": "text", "text": "Count carefully."}]}
    assert s.messages[1]["content"][-1]["text"].endswith("put the final answer in \\boxed{}.")
    from mmrlvr.data import load_samples

    (t,), _ = load_samples([{"problem": "<image>How many?", "answer": "2", "images": [s.images[0]]}],
                           prompt_template="r1_tags", system="Count carefully.")
    assert t.messages[0]["content"][0]["text"] == "Count carefully."
    assert "<answer> </answer>" in t.messages[1]["content"][-1]["text"]
