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
