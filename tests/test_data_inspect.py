"""``mmrlvr data inspect`` through the real dispatcher: layout, rendered rows, every problem, no traceback."""

from __future__ import annotations

import json

from data_layouts import write_llava, write_verl  # tests/ is on sys.path under pytest

from mmrlvr.cli import main


def test_inspect_shows_layout_rendered_rows_and_tokens(tmp_path, capsys):
    path = write_verl(tmp_path)
    assert main(["data", "inspect", str(path), "--rows", "2"]) == 0
    out = capsys.readouterr().out
    assert "layout: verl (detected from the columns)" in out
    assert "answer       <- reward_model.ground_truth" in out
    assert "rows: 4 read, 4 usable, 0 with problems" in out
    # 56x56 image at factor 28: 2 x 2 = 4 image tokens; the rendered chat keeps the data's system turn
    assert "<|im_start|>user\n[image 1: 56x56, 4 tokens]How many squares are there?<|im_end|>" in out
    assert "<|im_start|>system\nYou count things.<|im_end|>" in out
    assert out.count("--- row ") == 2 and "(id '100')" in out and "answer '1' (math)" in out
    assert out.rstrip().endswith("problems: none")


def test_inspect_broken_file_names_row_and_field_of_each_problem(tmp_path, capsys):
    path = write_llava(tmp_path)
    rows = json.loads(path.read_text())
    rows[1]["conversations"][0]["value"] = "<image>only one placeholder for two images"
    rows[2]["image"] = ["imgs/missing.png", "imgs/l2b.png"]
    rows[3] = "not an object"
    path.write_text(json.dumps(rows))
    assert main(["data", "inspect", str(path), "--rows", "1", "--max-prompt-length", "20"]) == 1
    captured = capsys.readouterr()
    out = captured.out
    assert "rows: 4 read, 1 usable, 3 with problems" in out
    assert "problems: 4" in out
    assert ("row 1, field 'images': the problem has 1 <image> placeholder(s) but the row has 2 image(s)") in out
    assert "row 2, field 'images': image 0: image file not found: " in out and "missing.png" in out
    assert "row 3: row must be an object, got str" in out
    assert "row 0 (id 'llava-0'): prompt is " in out and "over --max-prompt-length 20 (it would be dropped)" in out
    assert "Traceback" not in captured.err + out


def test_inspect_unusable_source_is_one_paragraph(tmp_path, capsys):
    (tmp_path / "x.jsonl").write_text(json.dumps({"text": "a", "label": 1}) + "\n")
    assert main(["data", "inspect", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "cannot tell the layout from columns ['label', 'text']" in err and "Traceback" not in err
    assert main(["data", "inspect", str(tmp_path / "x.jsonl"), "--format", "nope"]) == 2
    assert "unknown layout 'nope'" in capsys.readouterr().err
    assert main(["data", "inspect", str(tmp_path / "x.jsonl"), "--columns", "problem=text", "answer=label",
                 "--rows", "0"]) == 0


def test_inspect_nested_answer_path_with_format(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"q": "How many?", "gt": {"value": 3}}) + "\n")
    assert main(["data", "inspect", str(path), "--columns", "problem=q", "answer=gt.value", "--rows", "1",
                 "--template", "plain"]) == 0
    out = capsys.readouterr().out
    assert "answer       <- gt.value" in out and "answer '3' (math)" in out


def test_docs_data_python_example_runs(capsys):
    """The Python example of docs/data.md runs as written and prints what its comments say."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    exec(compile(code, "docs/data.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("1 of 1 rows loaded (preset llava, detected)")
    assert out[1].startswith("1 How many squares? Think step by step") and out[1].endswith("\\boxed{}.")
