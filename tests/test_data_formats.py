"""Datasets as other frameworks store them: each preset read from a file in its layout (written here),
dotted column paths on Parquet and JSONL, image forms, chat prompts, and load-time answer checks.

Expected values are read off the written rows (counts drawn, boxes written), not from the loader.
"""

from __future__ import annotations

import base64
import json

import pytest
from data_layouts import WRITERS, png  # tests/ is on sys.path under pytest
from PIL import Image

from mmrlvr.data import load_samples
from mmrlvr.errors import DataError


def user_text(sample) -> str:
    return "".join(p.get("text", "") for p in sample.messages[-1]["content"] if p["type"] == "text")


def user_parts(sample) -> list[str]:
    return [p["type"] for p in sample.messages[-1]["content"]]


@pytest.mark.parametrize("layout", list(WRITERS))
def test_each_layout_is_detected_and_read(layout, tmp_path):
    path = WRITERS[layout](tmp_path)
    auto, report = load_samples(path)
    assert report.preset == layout and report.detected and report.n_loaded == 4
    explicit, report2 = load_samples(path, preset=layout)
    assert not report2.detected and [s.answer for s in explicit] == [s.answer for s in auto]
    for s in auto:
        assert s.images and all(isinstance(im, Image.Image) for im in s.images)
        assert user_parts(s).count("image") == len(s.images)


def test_verl_fields(tmp_path):
    samples, report = load_samples(WRITERS["verl"](tmp_path))
    assert report.columns["answer"] == "reward_model.ground_truth" and report.columns["id"] == "extra_info.index"
    assert [s.answer for s in samples] == ["1", "2", "3", "1"]  # ground_truth = i % 3 + 1
    assert [s.id for s in samples] == ["100", "101", "102", "103"]
    s = samples[0]
    assert s.meta["task"] == "count_squares"
    # the data's own system turn is kept (the r1 template's would otherwise be used)
    assert s.messages[0] == {"role": "system", "content": [{"type": "text", "text": "You count things."}]}
    assert user_parts(s) == ["image", "text"] and user_text(s) == "How many squares are there?"
    # config system_prompt wins over the data's
    s2, _ = load_samples(WRITERS["verl"](tmp_path), system="Be brief.")
    assert s2[0].messages[0]["content"][0]["text"] == "Be brief."


def test_vlm_r1_solution_tags_and_llava_gpt_answer(tmp_path):
    vlm, _ = load_samples(WRITERS["vlm_r1"](tmp_path))
    assert [s.answer for s in vlm] == ["1", "2", "3", "1"] and vlm[0].id == "vlm-0"  # "<answer> 1 </answer>" -> "1"
    llava, _ = load_samples(WRITERS["llava"](tmp_path))
    assert [s.answer for s in llava] == ["1", "2", "3", "1"]
    assert all(len(s.images) == 2 for s in llava)
    assert user_parts(llava[0]) == ["image", "image", "text"]
    assert llava[0].images[1].getpixel((6, 6)) == (30, 30, 220)  # second image: the blue square


def test_visual_rft_boxes_from_position_dicts(tmp_path):
    samples, report = load_samples(WRITERS["visual_rft"](tmp_path))
    assert report.preset == "visual_rft"
    one, two = samples[0], samples[1]
    assert one.answer_type == "box" and json.loads(one.answer) == [4, 4, 14, 14]  # 56 px: no rescale
    assert json.loads(two.answer) == [[4, 4, 14, 14], [20, 4, 30, 14]]


def test_visual_rft_classification_is_text(tmp_path):
    rows = [{"problem": "<image>Which bird is this?", "solution": "<answer>blue jay</answer>",
             "image": Image.new("RGB", (56, 56))}]
    (s,), report = load_samples(rows, preset="visual_rft")
    assert (s.answer, s.answer_type) == ("blue jay", "text")


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_nested_column_paths(tmp_path, suffix):
    rows = [{"q": {"text": "<image>How many?", "lang": "en"}, "reward_model": {"ground_truth": str(i + 1)},
             "extra": {"ids": [f"a{i}", f"b{i}"]}, "pics": [{"bytes": png(i + 1), "path": None}]} for i in range(3)]
    path = tmp_path / f"nested.{suffix}"
    if suffix == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        for r in rows:
            r["pics"][0]["bytes"] = base64.b64encode(r["pics"][0]["bytes"]).decode()  # JSON: base64 bytes
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    columns = {"problem": "q.text", "answer": "reward_model.ground_truth", "images": "pics", "id": "extra.ids.1"}
    samples, report = load_samples(path, columns=columns)
    assert [s.answer for s in samples] == ["1", "2", "3"] and [s.id for s in samples] == ["b0", "b1", "b2"]
    assert samples[2].images[0].size == (56, 56)
    with pytest.raises(DataError, match=r"path 'reward_model.truth' .* does not resolve in the first row; column "
                                        r"'reward_model' holds an object with keys 'ground_truth'"):
        load_samples(path, columns={**columns, "answer": "reward_model.truth"})


def test_typed_content_parts_with_inline_images(tmp_path):
    (tmp_path / "a.png").write_bytes(png(2))
    data_url = "data:image/png;base64," + base64.b64encode(png(3)).decode()
    rows = [{"prompt": [{"role": "user", "content": [
        {"type": "text", "text": "Left:"}, {"type": "image", "image": str(tmp_path / "a.png")},
        {"type": "text", "text": "Right:"}, {"type": "image_url", "image_url": {"url": data_url}},
        {"type": "text", "text": "How many squares in total?"}]}], "answer": 5}]
    (s,), _ = load_samples(rows, columns={"problem": "prompt", "answer": "answer"}, template="plain")
    assert user_parts(s) == ["text", "image", "text", "image", "text"] and s.answer == "5"
    assert len(s.images) == 2


def test_qwen_markers_become_placeholders():
    rows = [{"problem": "<|vision_start|><|image_pad|><|vision_end|>How many?", "answer": "2",
             "images": [Image.new("RGB", (56, 56))]}]
    (s,), _ = load_samples(rows, template="plain")
    assert user_parts(s) == ["image", "text"] and user_text(s) == "How many?"


def test_image_forms(tmp_path):
    (tmp_path / "p.png").write_bytes(png(1))
    raw = png(2)
    forms = [str(tmp_path / "p.png"), {"bytes": raw, "path": None}, Image.open(tmp_path / "p.png"),
             base64.b64encode(raw).decode(), "data:image/png;base64," + base64.b64encode(raw).decode()]
    rows = [{"problem": "<image>How many?", "answer": "1", "images": [f]} for f in forms]
    samples, report = load_samples(rows)
    assert report.n_loaded == 5 and all(s.images[0].size == (56, 56) for s in samples)
    assert samples[3].images[0].getpixel((22, 8)) == (220, 30, 30)  # base64 of the 2-square image


def test_url_image_is_a_clear_error():
    rows = [{"problem": "<image>How many?", "answer": "1", "images": ["https://example.com/a.png"]}]
    with pytest.raises(DataError, match=r"row 0, field 'images': image 0: image 'https://example.com/a.png' is a URL; "
                                        "nothing is downloaded at run time"):
        load_samples(rows)


def test_placeholder_count_mismatch_names_the_row():
    ok = {"problem": "<image>How many?", "answer": "1", "images": [Image.new("RGB", (56, 56))]}
    bad = {"problem": "<image> and <image>: how many?", "answer": "1", "images": [Image.new("RGB", (56, 56))]}
    with pytest.raises(DataError, match=r"row 1, field 'images': the problem has 2 <image> placeholder\(s\) but "
                                        r"the row has 1 image\(s\)"):
        load_samples([ok, bad])
    chat_bad = {"conversations": [{"from": "human", "value": "<image>What?"}, {"from": "gpt", "value": "cat"}],
                "image": []}
    with pytest.raises(DataError, match=r"row 0, field 'images': the problem has 1 <image> placeholder\(s\) but "
                                        r"the row has 0 image\(s\)"):
        load_samples([chat_bad], preset="llava")


def test_number_answer_in_words_is_caught_at_load():
    """Issue 23: a `number` row with answer `a few` used to load and stop the run at the step that drew it (`three`
    loads: the rewards read numbers in words)."""
    im = Image.new("RGB", (56, 56))
    rows = [{"problem": "How many?", "answer": "2", "answer_type": "number", "images": [im]},
            {"problem": "How many?", "answer": "a few", "answer_type": "number", "images": [im]},
            {"problem": "How many?", "answer": "4", "answer_type": "number", "images": [im],
             "meta": {"tolerance": "a lot"}}]
    with pytest.raises(DataError, match=r"row 1, field 'answer': answer 'a few' is not a number"):
        load_samples(rows, preset="mmrlvr")
    samples, report = load_samples(rows, preset="mmrlvr", on_error="skip")
    assert [s.answer for s in samples] == ["2"]
    worded = [{"problem": "How many?", "answer": "three", "answer_type": "number", "images": [im]}]
    assert [s.answer for s in load_samples(worded, preset="mmrlvr")[0]] == ["three"]
    assert [(r.row, r.field) for r in report.skipped] == [(1, "answer"), (2, "meta.tolerance")]


def test_gold_checks_match_the_rewards():
    """What loads must be what the rewards accept: every loaded row is scored by auto_accuracy without error."""
    from mmrlvr.rewards.auto import AutoAccuracyReward

    im = Image.new("RGB", (56, 56))
    rows = [{"problem": "q", "answer": a, "answer_type": t, "images": [im]}
            for a, t in [("12 cm", "number"), ("3/4", "number"), ("[1, 2, 30, 40]", "box"), ("blue jay", "text"),
                         ("\\frac{1}{2}", "math"), ("a dozen", "number"), ("[5, 5, 1, 1]", "box"), ("  ", "text")]]
    samples, report = load_samples(rows, preset="mmrlvr", on_error="skip")
    assert [r.row for r in report.skipped] == [5, 6, 7]
    reward = AutoAccuracyReward()
    for s in samples:
        reward(f"<think>x</think><answer>{s.answer}</answer>", s)  # must not raise


def test_multi_turn_chat_is_an_error():
    rows = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"},
                               {"from": "human", "value": "and?"}, {"from": "gpt", "value": "2"}]}]
    with pytest.raises(DataError, match=r"row 0, field 'problem': message 2: multi-turn conversations are not supported"):
        load_samples(rows, preset="llava")


@pytest.mark.parametrize("layout", list(WRITERS))
def test_each_layout_trains_two_steps(layout, tmp_path):
    """The acceptance check of issue 16: a dataset in each layout trains 2 steps with the tiny VLM."""
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    path = WRITERS[layout](tmp_path)
    cfg = load_config(None, [
        f"output_dir={tmp_path / 'run'}", "model.path=tiny:qwen2_5_vl", f"data.train={path}", f"data.format={layout}",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "algo.micro_batch_size=4",
        "max_steps=2", "save_every=0", "eval.at_start=false", "eval.at_end=false", "progress=false",
        "tensorboard=false", "log_rollouts=false"])
    trainer = Trainer(cfg)
    assert len(trainer.train_samples) == 4
    summary = trainer.train()
    assert summary["skipped_steps"] == 0 and summary["last"]["loss"] is not None
