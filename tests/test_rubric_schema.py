"""Rubric files and instance rubrics: validation with file/line/field errors, defaults, the shipped library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrlvr.errors import UserError
from mmrlvr.rubric import DEFAULT_WEIGHTS, RubricError, load_rubric_file, load_rubric_text, parse_instance_rubric
from mmrlvr.rubric.cli import main as rubric_main

REPO = Path(__file__).resolve().parents[1]

GOOD = """\
name: demo
criteria:
  - id: value
    text: The answer is right.
    category: essential
    check: {type: number, expected: "{answer}", tolerance: 0.5}
  - id: mentions
    text: Mentions the colour.
    category: important
    needs_image: true
  - id: bad
    text: Mentions a colour not in the image.
    category: pitfall
    weight: -0.5
    check: {type: regex, pattern: 'green', target: thinking}
"""


class TestLoading:
    def test_defaults_and_pitfall_sign(self):
        r = load_rubric_text(GOOD, "demo.yaml")
        value, mentions, bad = r.criteria
        assert (value.weight, mentions.weight) == (DEFAULT_WEIGHTS["essential"], DEFAULT_WEIGHTS["important"])
        # "weight: -0.5" on a pitfall (RaR style) is the magnitude 0.5, subtracted because of the category
        assert bad.weight == 0.5 and bad.sign == -1.0 and value.sign == 1.0
        # no check given -> judge; judge defaults filled in
        assert mentions.check.kind == "judge" and mentions.check.params["show_reference"] is False
        assert mentions.needs_image and not value.needs_image
        assert value.check.params["pick"] == "only"  # default for the answer target
        assert value.where == "demo.yaml:3" and r.name == "demo"

    @pytest.mark.parametrize("bad_yaml, where, words", [
        # line 5 holds "category: essentail"
        (GOOD.replace("category: essential", "category: essentail"), "x.yaml:5", ["criteria[0] 'value'", "field 'category'", "essentail"]),
        # line 14 holds "weight: -0.5" under the pitfall; a negative weight elsewhere is refused
        (GOOD.replace("category: pitfall", "category: optional"), "x.yaml:14", ["criteria[2] 'bad'", "field 'weight'", "pitfall"]),
        # line 5: unknown key (a typo of category)
        (GOOD.replace("category: essential", "catagory: essential"), "x.yaml:5", ["field 'catagory'", "unknown key"]),
        # line 15: regex that does not compile
        (GOOD.replace("pattern: 'green'", "pattern: '(green'"), "x.yaml:15", ["field 'check.pattern'", "regular expression"]),
        # line 6: check parameter of the wrong kind
        (GOOD.replace("tolerance: 0.5", "threshold: 0.5"), "x.yaml:6", ["field 'check.threshold'", "number check"]),
        # line 7: duplicate id
        (GOOD.replace("id: mentions", "id: value"), "x.yaml:7", ["criteria[1] 'value'", "duplicate id"]),
        # line 6: missing required parameter
        (GOOD.replace('expected: "{answer}", ', ""), "x.yaml:6", ["field 'check'", "needs 'expected'"]),
    ])
    def test_errors_name_file_line_and_field(self, tmp_path, bad_yaml, where, words):
        f = tmp_path / "x.yaml"
        f.write_text(bad_yaml)
        with pytest.raises(RubricError) as exc:
            load_rubric_file(f)
        msg = str(exc.value)
        assert msg.startswith(str(tmp_path / where)), msg
        for w in words:
            assert w in msg, msg

    def test_yaml_syntax_error_has_line(self, tmp_path):
        f = tmp_path / "broken.yaml"
        f.write_text("criteria:\n  - id: a\n    text: [unclosed\n")
        with pytest.raises(RubricError, match=r"broken.yaml:\d+: not valid YAML"):
            load_rubric_file(f)

    def test_missing_file_and_empty_criteria(self, tmp_path):
        with pytest.raises(RubricError, match="not found"):
            load_rubric_file(tmp_path / "nope.yaml")
        with pytest.raises(RubricError, match="non-empty list"):
            load_rubric_text("criteria: []\n")

    def test_is_a_user_error(self):
        assert issubclass(RubricError, UserError)


class TestInstanceRubrics:
    CRITS = [{"id": "a", "text": "Right count.", "category": "essential",
              "check": {"type": "number", "expected": 3}}]

    @pytest.mark.parametrize("value", [CRITS, json.dumps(CRITS), {"criteria": CRITS}])
    def test_forms(self, value):
        r = parse_instance_rubric(value, source="train.jsonl", row=4)
        assert [c.id for c in r] == ["a"] and r.criteria[0].check.params["expected"] == 3

    def test_error_names_row_criterion_and_field(self):
        bad = [{"id": "a", "text": "x", "category": "essential", "weight": "high"}]
        with pytest.raises(RubricError) as exc:
            parse_instance_rubric(bad, source="train.jsonl", row=4)
        assert str(exc.value).startswith("train.jsonl, row 4, field 'rubric': criteria[0] 'a': field 'weight'")

    def test_bad_json(self):
        with pytest.raises(RubricError, match="row 2, field 'rubric': not valid JSON"):
            parse_instance_rubric("[{", source="d", row=2)


class TestLibrary:
    FILES = sorted((REPO / "rubrics").glob("*.yaml"))

    def test_at_least_five_commented_rubrics(self):
        assert len(self.FILES) >= 5
        for f in self.FILES:
            text = f.read_text()
            assert text.lstrip().startswith("#"), f"{f.name} needs a header comment"

    @pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
    def test_validates(self, path, capsys):
        rubric = load_rubric_file(path)
        cats = {c.category for c in rubric}
        assert "essential" in cats or "pitfall" in cats
        assert rubric_main(["validate", str(path)]) == 0
        assert ": ok - " in capsys.readouterr().out
