"""load_samples: every preset from a real file format, and every bad-input case (one test each).

Fixtures are written to tmp_path by the helpers below (small PNGs; Parquet via datasets, JSONL / JSON with
the json module, save_to_disk folders), so nothing binary is committed.
"""

from __future__ import annotations

import base64
import io
import json

import datasets
import numpy as np
import pytest
from PIL import Image

from mmrlvr.data import load_samples, make_rows, rows_to_samples, write_dataset
from mmrlvr.data.loading import PRESETS, LoadReport, detect_preset
from mmrlvr.errors import DataError


def png(colour=(200, 30, 30), size=(56, 56)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def data_url(colour=(200, 30, 30)) -> str:
    return "data:image/png;base64," + base64.b64encode(png(colour)).decode()


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def user_parts(sample) -> list[str]:
    return [p["type"] for p in sample.messages[-1]["content"]]


# ---------------------------------------------------------------------------------------------- presets

def test_easyr1_parquet_with_image_list_feature(tmp_path):
    features = datasets.Features({"problem": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "images": datasets.List(datasets.Image())})
    ds = datasets.Dataset.from_dict({
        "problem": ["<image>Find x. Angle A is 30.", "Two figures <image> and <image>: find y."],
        "answer": ["60", "\\frac{1}{2}"],
        "images": [[{"bytes": png(), "path": None}], [{"bytes": png((0, 0, 255)), "path": None},
                                                      {"bytes": png(size=(100, 200)), "path": None}]],
    }, features=features)
    ds.to_parquet(str(tmp_path / "geo.parquet"))
    samples, report = load_samples(tmp_path / "geo.parquet", preset="easyr1")
    assert (report.n_rows, report.n_loaded, report.n_skipped, report.preset) == (2, 2, 0, "easyr1")
    s0, s1 = samples
    assert s0.answer == "60" and s0.answer_type == "math" and s1.answer == "\\frac{1}{2}"
    assert user_parts(s0) == ["image", "text"]
    assert user_parts(s1) == ["text", "image", "text", "image", "text"]
    assert s1.images[0].getpixel((0, 0)) == (0, 0, 255)
    # 56x56 (a multiple of 28) stays; 100 wide x 200 high -> smart_resize(200, 100) = (196, 112) -> (w, h) (112, 196)
    assert s0.images[0].size == (56, 56) and s1.images[1].size == (112, 196)
    assert s1.meta["original_image_sizes"][1] == [100, 200] and s1.meta["row"] == 1
    assert s0.id == "geo-0"  # no id column: file stem + row


def test_virl_jsonl_with_relative_paths_and_boxed_answers(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "q1.png").write_bytes(png((0, 255, 0)))
    write_jsonl(tmp_path / "virl.jsonl", [
        {"qid": "v-1", "question": "<image>What is shown? Choose.", "answer": "\\boxed{B}", "image": ["images/q1.png"],
         "category": "chart"},
        {"qid": "v-2", "question": "<image>How many?", "answer": 7, "image": "images/q1.png"},
    ])
    samples, report = load_samples(tmp_path / "virl.jsonl")  # preset detected from question/answer
    assert report.preset == "virl" and report.columns["images"] == "image" and report.columns["id"] == "qid"
    assert [s.id for s in samples] == ["v-1", "v-2"]
    assert [s.answer for s in samples] == ["B", "7"]  # \boxed{} removed; int 7 -> "7"
    assert samples[0].images[0].getpixel((5, 5)) == (0, 255, 0)
    assert samples[0].question.startswith("What is shown?")


def test_grounding_save_to_disk_box_rescaled_to_resized_image(tmp_path):
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": png(size=(200, 100)), "path": None}], "problem": ["Give the box of the dog."],
         "solution": [[20, 10, 120, 60]]},
        features=datasets.Features({"image": datasets.Image(), "problem": datasets.Value("string"),
                                    "solution": datasets.List(datasets.Value("int64"))}))
    ds.save_to_disk(str(tmp_path / "refcoco"))
    (s,), report = load_samples(tmp_path / "refcoco")
    assert report.preset == "grounding" and s.answer_type == "box"
    # 200x100 -> smart_resize -> 196x112: sx = 196/200 = 0.98, sy = 112/100 = 1.12
    # [20*0.98, 10*1.12, 120*0.98, 60*1.12] = [19.6, 11.2, 117.6, 67.2] -> [20, 11, 118, 67]
    assert s.images[0].size == (196, 112)
    assert json.loads(s.answer) == [20, 11, 118, 67]
    assert s.meta["answer_original"] == [20, 10, 120, 60]
    assert user_parts(s) == ["image", "text"]  # no placeholder: image first


def test_choice_json_with_base64_images(tmp_path):
    rows = [
        {"question": "<image>Which colour?", "options": ["red", "blue"], "answer": "b", "image": data_url()},
        {"question": "<image>Which colour?", "options": ["red", "blue"], "answer": 0, "image": data_url()},
        {"question": "<image>Which colour?", "options": ["red", "blue"], "answer": "Blue", "image": data_url()},
        {"question": "<image>Which?", "options": "[\"x\", \"y\", \"z\"]", "answer": "(C)", "image": data_url()},
    ]
    (tmp_path / "mc.json").write_text(json.dumps(rows))
    samples, report = load_samples(tmp_path / "mc.json", template="plain")
    assert report.preset == "choice"
    assert [s.answer for s in samples] == ["B", "A", "B", "C"]  # letter, 0-based index, option text, "(C)"
    assert samples[0].answer_type == "choice" and samples[0].meta["options"] == ["red", "blue"]
    assert samples[0].question == "Which colour?\nA. red\nB. blue\nAnswer with the option's letter."
    assert samples[0].images[0].getpixel((0, 0)) == (200, 30, 30)


def test_mmrlvr_dataset_round_trip(tmp_path):
    path = write_dataset("grounding", "test", 6, tmp_path / "g", seed=2)
    rows = make_rows("grounding", "test", 6, seed=2)
    samples, report = load_samples(path)
    assert report.preset == "mmrlvr" and report.n_loaded == 6
    direct = rows_to_samples(rows)
    for s, d, r in zip(samples, direct, rows):
        assert (s.id, s.answer, s.answer_type, s.messages) == (d.id, d.answer, d.answer_type, d.messages)
        assert s.meta["solution"] == r["solution"] and s.meta["task"] == "grounding"
        assert s.meta["shapes"] == r["meta"]["shapes"]  # JSON meta column parsed back
        assert np.array_equal(np.asarray(s.images[0]), np.asarray(r["images"][0]))  # PNG is lossless


def test_qwen3_factor_rescales_synthetic_boxes(tmp_path):
    rows = make_rows("grounding", "train", 3)
    samples, _ = load_samples(rows, preset="mmrlvr", factor=32)
    for s, r in zip(samples, rows):
        # 112 -> 128 at factor 32: every coordinate scales by 128/112 = 8/7, rounded
        assert s.images[0].size == (128, 128)
        assert json.loads(s.answer) == [round(v * 8 / 7) for v in json.loads(r["answer"])]


def test_in_memory_rows_with_column_mapping():
    rows = [{"q": "How many dots?", "gt": "2", "pic": Image.new("RGB", (56, 56)), "key": "a"},
            {"q": "How many dots?", "gt": 3.0, "pic": Image.new("RGBA", (56, 56)), "key": "b"}]
    samples, report = load_samples(rows, columns={"problem": "q", "answer": "gt", "images": "pic", "id": "key"},
                                   template="boxed")
    assert report.preset == "custom" and [s.id for s in samples] == ["a", "b"]
    assert [s.answer for s in samples] == ["2", "3"]  # float 3.0 -> "3"
    assert samples[1].images[0].mode == "RGB"
    assert "\\boxed{}" in samples[0].question


def test_split_selection_in_parquet_folder_and_dataset_dict(tmp_path):
    folder = tmp_path / "hub" / "data"
    folder.mkdir(parents=True)
    for split, answer in (("train", "1"), ("test", "2")):
        datasets.Dataset.from_dict({"problem": ["<image>q"], "answer": [answer],
                                    "images": [[{"bytes": png(), "path": None}]]},
                                   features=datasets.Features({"problem": datasets.Value("string"),
                                                               "answer": datasets.Value("string"),
                                                               "images": datasets.List(datasets.Image())})
                                   ).to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))
    (s,), _ = load_samples(tmp_path / "hub", split="test")
    assert s.answer == "2"
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"problem": ["a"], "answer": ["1"]}),
                               "test": datasets.Dataset.from_dict({"problem": ["b"], "answer": ["2"]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    (s,), _ = load_samples(tmp_path / "dd", split="train")
    assert s.answer == "1" and s.images == []
    with pytest.raises(DataError, match="has splits train, test; pass split="):
        load_samples(tmp_path / "dd")
    with pytest.raises(DataError, match="has no split 'valid'"):
        load_samples(tmp_path / "dd", split="valid")


def test_rubric_row_without_answer_and_limit():
    rubric = [{"id": "c1", "text": "mentions the red circle", "category": "essential"}]
    rows = [{"problem": "Describe.", "answer": None, "rubric": json.dumps(rubric)}] * 3
    samples, report = load_samples(rows, preset="easyr1", limit=2)
    assert report.n_rows == 2 and len(samples) == 2
    assert samples[0].answer is None and samples[0].rubric == rubric


def test_detect_preset():
    assert detect_preset(["problem", "answer", "images"]) == "easyr1"
    assert detect_preset(["question", "answer", "image", "qid"]) == "virl"
    assert detect_preset(["problem", "solution", "image"]) == "grounding"
    assert detect_preset(["question", "options", "answer", "image"]) == "choice"
    assert detect_preset(["id", "problem", "answer", "images", "answer_type", "task", "meta"]) == "mmrlvr"
    assert detect_preset(["text", "label"]) is None
    assert detect_preset(["data_source", "prompt", "images", "ability", "reward_model", "extra_info"]) == "verl"
    assert detect_preset(["id", "image", "conversations"]) == "llava"
    assert detect_preset(["id", "image", "conversations", "solution"]) == "vlm_r1"
    assert detect_preset(["problem", "solution", "image"], {"solution": "<answer>[1, 2, 3, 4]</answer>"}) == "visual_rft"
    assert set(PRESETS) == {"verl", "easyr1", "vlm_r1", "llava", "visual_rft", "virl", "grounding", "choice", "mmrlvr"}


# ---------------------------------------------------------------------------------------------- bad input

def bad_rows(tmp_path):
    """Three good rows around one bad one (row 1), as a JSONL file."""
    (tmp_path / "ok.png").write_bytes(png())
    return [{"problem": "<image>q0", "answer": "1", "images": ["ok.png"]},
            None,  # replaced by each test
            {"problem": "<image>q2", "answer": "3", "images": ["ok.png"]}]


def check_bad_row(tmp_path, bad_row, field, message, **kwargs):
    """Row 1 raises a DataError naming source, row and field; with on_error="skip" it is counted."""
    rows = bad_rows(tmp_path)
    rows[1] = bad_row
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, rows)
    with pytest.raises(DataError, match=message) as info:
        load_samples(path, preset="easyr1", **kwargs)
    err = info.value
    assert (err.source, err.row, err.field) == (str(path), 1, field)
    assert str(err).startswith(f"{path}, row 1" + (f", field {field!r}" if field else ""))
    samples, report = load_samples(path, preset="easyr1", on_error="skip", **kwargs)
    assert [s.answer for s in samples] == ["1", "3"]
    assert (report.n_rows, report.n_loaded, report.n_skipped) == (3, 2, 1)
    assert report.skipped[0].row == 1 and report.skipped[0].field == field
    assert "1 skipped" in report.summary()


def test_bad_missing_image_file(tmp_path):
    check_bad_row(tmp_path, {"problem": "<image>q1", "answer": "2", "images": ["nope.png"]}, "images",
                  "image 0: image file not found: .*nope.png")


def test_bad_corrupt_image_bytes(tmp_path):
    corrupt = "data:image/png;base64," + base64.b64encode(png()[:50]).decode()  # truncated PNG
    check_bad_row(tmp_path, {"problem": "<image>q1", "answer": "2", "images": [corrupt]}, "images",
                  "could not be decoded as an image")


def test_bad_corrupt_bytes_in_parquet(tmp_path):
    features = datasets.Features({"problem": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "images": datasets.List(datasets.Image(decode=False))})
    datasets.Dataset.from_dict({"problem": ["<image>a", "<image>b"], "answer": ["1", "2"],
                                "images": [[{"bytes": png(), "path": None}], [{"bytes": b"\x89PNGjunk", "path": None}]]},
                               features=features).to_parquet(str(tmp_path / "x.parquet"))
    with pytest.raises(DataError, match=r"row 1, field 'images': image 0: image bytes could not be decoded"):
        load_samples(tmp_path / "x.parquet")
    samples, report = load_samples(tmp_path / "x.parquet", on_error="skip")
    assert len(samples) == 1 and report.n_skipped == 1


def test_bad_image_over_pixel_limit(tmp_path):
    big = "data:image/png;base64," + base64.b64encode(png(size=(2000, 2000))).decode()
    check_bad_row(tmp_path, {"problem": "<image>q1", "answer": "2", "images": [big]}, "images",
                  "2000x2000 = 4,000,000 pixels, over the limit of 1,000,000", max_image_pixels=1_000_000)


def test_bad_missing_answer_in_row(tmp_path):
    check_bad_row(tmp_path, {"problem": "<image>q1", "images": ["ok.png"]}, "answer", "answer is missing")


def test_bad_missing_answer_column(tmp_path):
    rows = [{"problem": "q", "images": []}]
    with pytest.raises(DataError, match="missing column for field 'answer'.*columns: images, problem") as info:
        load_samples(rows, preset="easyr1")
    assert info.value.field == "answer" and info.value.source == "<rows>"


def test_bad_non_string_answer(tmp_path):
    check_bad_row(tmp_path, {"problem": "<image>q1", "answer": {"value": 2}, "images": ["ok.png"]}, "answer",
                  "answer must be a string or a number, got dict")


def test_bad_boolean_answer(tmp_path):
    check_bad_row(tmp_path, {"problem": "<image>q1", "answer": True, "images": ["ok.png"]}, "answer", "got a boolean")


def test_bad_unknown_preset(tmp_path):
    with pytest.raises(DataError, match="unknown preset 'geo3k'; known presets: verl, easyr1, vlm_r1, llava, visual_rft, virl, grounding, choice, mmrlvr"):
        load_samples([{"problem": "q", "answer": "1"}], preset="geo3k")


def test_bad_column_mapping(tmp_path):
    with pytest.raises(DataError, match="column 'question' \\(mapped from field 'problem'\\) is not in the data") as info:
        load_samples([{"problem": "q", "answer": "1"}], columns={"problem": "question"})
    assert info.value.field == "problem"
    with pytest.raises(DataError, match="unknown field in columns mapping"):
        load_samples([{"problem": "q", "answer": "1"}], columns={"prompt": "problem"})


def test_bad_undetectable_layout():
    with pytest.raises(DataError, match="cannot tell the layout from columns \\['label', 'text'\\]"):
        load_samples([{"text": "q", "label": "1"}])


def test_bad_json_line(tmp_path):
    (tmp_path / "ok.png").write_bytes(png())
    path = tmp_path / "rows.jsonl"
    path.write_text('{"problem": "<image>a", "answer": "1", "images": ["ok.png"]}\n{"problem": "b", "answ\n')
    with pytest.raises(DataError, match="row 1: rows.jsonl line 2 is not valid JSON"):
        load_samples(path, preset="easyr1")
    samples, report = load_samples(path, preset="easyr1", on_error="skip")
    assert len(samples) == 1 and report.skipped[0].field is None


def test_bad_placeholder_count(tmp_path):
    check_bad_row(tmp_path, {"problem": "<image>q1<image>", "answer": "2", "images": ["ok.png"]}, "images",
                  "2 <image> placeholder\\(s\\) but the row has 1 image")


def test_bad_problem(tmp_path):
    check_bad_row(tmp_path, {"problem": ["not", "text"], "answer": "2", "images": ["ok.png"]}, "problem",
                  "problem text must be a non-empty string or a chat \\(message list\\), got a list")


def test_bad_choice_answer_and_options():
    rows = [{"question": "q", "options": ["a", "b"], "answer": "E"}]
    with pytest.raises(DataError, match="field 'answer': choice answer 'E' is neither an option letter \\(A-B\\)"):
        load_samples(rows)
    with pytest.raises(DataError, match="field 'options': options must be a non-empty list"):
        load_samples([{"question": "q", "options": [], "answer": "A"}])
    with pytest.raises(DataError, match="answer index 5 is out of range for 2 options"):
        load_samples([{"question": "q", "options": ["a", "b"], "answer": 5}])


def test_bad_box_answer():
    rows = [{"problem": "box?", "solution": [1, 2, 3], "image": Image.new("RGB", (56, 56))}]
    with pytest.raises(DataError, match="field 'answer': box answer must have 4 numbers"):
        load_samples(rows)
    rows = [{"problem": "box?", "solution": "[30, 2, 10, 40]", "image": Image.new("RGB", (56, 56))}]
    with pytest.raises(DataError, match="x2 > x1"):
        load_samples(rows)


def test_bad_answer_type_and_rubric():
    with pytest.raises(DataError, match="field 'answer_type': unknown answer_type 'float'"):
        load_samples([{"problem": "q", "answer": "1", "answer_type": "float"}])
    with pytest.raises(DataError, match="field 'rubric': rubric is not valid JSON"):
        load_samples([{"problem": "q", "answer": "1", "rubric": "{oops"}])


def test_bad_sources(tmp_path):
    with pytest.raises(DataError, match="nowhere.parquet: not found"):
        load_samples(tmp_path / "nowhere.parquet")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type '.csv'"):
        load_samples(tmp_path / "x.csv")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="is not a readable Parquet file"):
        load_samples(tmp_path / "broken.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no save_to_disk dataset"):
        load_samples(tmp_path / "empty")
    with pytest.raises(DataError, match="on_error must be 'raise' or 'skip'"):
        load_samples([], on_error="ignore")
    with pytest.raises(DataError, match="unknown prompt template 'r2'"):
        load_samples([], template="r2")


def test_report_summary_when_clean():
    _, report = load_samples([{"problem": "q", "answer": "1"}])
    assert isinstance(report, LoadReport)
    assert report.summary() == "<rows>: 1 of 1 rows loaded (preset easyr1, detected)"
    _, report = load_samples([{"problem": "q", "answer": "1"}], preset="easyr1")
    assert report.summary() == "<rows>: 1 of 1 rows loaded (preset easyr1)"
