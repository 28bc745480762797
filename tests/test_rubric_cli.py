"""``mmrlvr rubric validate|preview|score|agreement`` on real files, a real dataset and a real local server."""

from __future__ import annotations

import json
import math
import re

import pytest
from PIL import Image

from mmrlvr.cli import main as mmrlvr_main
from mmrlvr.rubric.agreement import agreement, cohen_kappa, vote_agreement
from mmrlvr.testing.judge_server import JudgeServer

RUBRIC = """\
# test rubric
name: cli_demo
criteria:
  - id: mentions_red
    text: The reasoning mentions "red".
    category: important
    check: {type: regex, pattern: '\\bred\\b', target: thinking}
  - id: count
    text: The final answer is the right count.
    category: essential
    check: {type: number, expected: "{answer}"}
  - id: sees_blue
    text: The reasoning describes the "blue" shape.
    category: optional
    needs_image: true
    check: {type: judge, target: thinking}
"""
RESPONSES = [
    "<think>red</think><answer>2</answer>",
    "<think>blue</think><answer>3</answer>",
    "<think>red</think><answer>two is my final answer</answer>",
    "<think>red and blue</think><answer>it is 2</answer>",
]


@pytest.fixture(scope="module")
def server():
    with JudgeServer() as srv:
        yield srv


@pytest.fixture()
def files(tmp_path):
    rubric = tmp_path / "r.yaml"
    rubric.write_text(RUBRIC)
    Image.new("RGB", (56, 56), (220, 40, 40)).save(tmp_path / "img.png")
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"problem": "<image>How many red shapes are there?", "answer": "2",
                                          "images": ["img.png"], "solution": RESPONSES[3]}) for _ in range(2)))
    responses = tmp_path / "responses.jsonl"
    responses.write_text("\n".join(json.dumps({"response": r, "row": i % 2}) for i, r in enumerate(RESPONSES)))
    return rubric, data, responses


def judge_args(server, model="rule", flag="--judge"):
    return [flag, "openai", f"{flag}-param", f"base_url={server.base_url}", f"{flag}-param", f"model={model}",
            f"{flag}-param", "max_retries=0"]


class TestValidate:
    def test_ok(self, files, capsys):
        assert mmrlvr_main(["rubric", "validate", str(files[0])]) == 0
        out = capsys.readouterr().out
        assert "3 criteria (1 essential, 1 important, 1 optional); 2 checked by programs, 1 by a judge (1 shown the image)" in out

    def test_error_exit_2_with_file_and_line(self, tmp_path, capsys):
        bad = tmp_path / "bad.yaml"
        bad.write_text(RUBRIC.replace("category: essential", "category: must"))
        assert mmrlvr_main(["rubric", "validate", str(bad)]) == 2
        err = capsys.readouterr().err
        assert f"{bad}:10: criteria[1] 'count': field 'category'" in err and "Traceback" not in err

    def test_every_problem_of_every_file_is_reported(self, tmp_path, files, capsys):
        bad = tmp_path / "many.yaml"
        bad.write_text("""\
name: many
colour: red
criteria:
  - id: a
    text: Uses the colour "red".
    catagory: important
  - id: b
    text: ""
    category: optional
    weight: 0
    check: {type: regex, pattern: "(", min_count: 0}
  - id: a
    text: States the count.
    category: essential
    check: {type: number, expected: three, pick: any}
  - id: c
    text: Boxes.
    category: pitfall
    check: {type: iou}
""")
        assert mmrlvr_main(["rubric", "validate", str(bad), str(files[0])]) == 2
        captured = capsys.readouterr()
        errors = [line for line in captured.err.splitlines() if line.startswith("mmrlvr rubric: error: ")]
        expected = [  # (line, where, key) of each problem, in file order
            ("2", "", "field 'colour': unknown key"),
            ("6", "criteria[0] 'a'", "field 'catagory': unknown key"),
            ("4", "criteria[0] 'a'", "field 'category': must be one of"),
            ("8", "criteria[1] 'b'", "field 'text': required"),
            ("10", "criteria[1] 'b'", "field 'weight': must not be 0"),
            ("11", "criteria[1] 'b'", "field 'check.pattern': not a valid regular expression"),
            ("11", "criteria[1] 'b'", "field 'check.min_count': must be an integer >= 1"),
            ("15", "criteria[2] 'a'", "field 'check.pick': must be only, last or first"),
            ("15", "criteria[2] 'a'", "field 'check.expected': must be a number"),
            ("12", "criteria[2] 'a'", "field 'id': duplicate id (first used by criteria[0])"),
            ("19", "criteria[3] 'c'", "field 'check': a iou check needs 'expected'"),
        ]
        assert len(errors) == len(expected), "\n".join(errors)
        for line, (lineno, where, key) in zip(errors, expected):
            assert line.startswith(f"mmrlvr rubric: error: {bad}:{lineno}: ") and where in line and key in line, line
        # the good file after it is still validated
        assert f"{files[0]}: ok" in captured.out and "1 of 2 files have problems" in captured.err

    def test_bad_arguments(self, capsys):
        assert mmrlvr_main(["rubric", "score"]) == 2
        assert "--responses" in capsys.readouterr().err


def test_preview_prints_prompts_as_sent(files, capsys):
    rubric, data, _ = files
    assert mmrlvr_main(["rubric", "preview", str(rubric), "--data", str(data), "--sample", "1",
                        "--response", RESPONSES[3]]) == 0
    out = capsys.readouterr().out
    # programs show what they extracted from the response
    assert "count (essential, weight 1) -> program number: extracted 2.0" in out
    assert "--- system ---" in out and "You are a strict grader" in out
    assert "CRITERION: The reasoning describes the \"blue\" shape." in out
    assert "[image: PNG data URL" in out                                   # needs_image: true
    assert len(re.findall(r"<<<RESPONSE [0-9a-f]{10}>>>\nred and blue\n<<<END RESPONSE [0-9a-f]{10}>>>", out)) == 1
    # the reference answer is not shown to this judge criterion
    assert "Reference answer" not in out


def test_score_table(files, server, tmp_path, capsys):
    rubric, data, responses = files
    out_json = tmp_path / "scores.jsonl"
    code = mmrlvr_main(["rubric", "score", str(rubric), "--responses", str(responses), "--data", str(data),
                        "--json", str(out_json), *judge_args(server)])
    assert code == 0
    out = capsys.readouterr().out
    # response 0: count met (1.0) + mentions_red (0.7), sees_blue not met -> 1.7 / 2.0 = 0.85
    assert "response 0 (sample " in out and "score 0.850 [rar]" in out
    assert "summary over 4 responses" in out and "0 unknown (0.0%" in out
    rows = [json.loads(line) for line in out_json.read_text().splitlines()]
    # r1: only sees_blue, 0.3 / 2 = 0.15; r2: mentions_red, 0.7 / 2 = 0.35; r3: all met
    assert [round(r["score"], 3) for r in rows] == [0.85, 0.15, 0.35, 1.0]
    assert {c["id"]: c["verdict"] for c in rows[3]["criteria"]} == {
        "mentions_red": "met", "count": "met", "sees_blue": "met"}


def test_score_needs_a_judge_for_judge_criteria(files, capsys):
    rubric, data, responses = files
    assert mmrlvr_main(["rubric", "score", str(rubric), "--responses", str(responses), "--data", str(data)]) == 2
    assert "pass --judge" in capsys.readouterr().err


def test_agreement(files, server, capsys):
    rubric, data, responses = files
    code = mmrlvr_main(["rubric", "agreement", str(rubric), "--responses", str(responses), "--data", str(data),
                        *judge_args(server), *judge_args(server, "coin", "--judge2")])
    assert code == 0
    out = capsys.readouterr().out
    # program vs rule judge over 4 responses x 2 programmatic criteria (see test_kappa_hand_worked):
    # agreement 6/8 = 75.0%, kappa 0.467
    assert "judge vs programs (criteria a program decides): agreement 75.0%, Cohen's kappa 0.467 over 8 pairs" in out
    assert "mentions_red  4      100.0%" in out
    assert "judge vs judge2" in out and "over 12 pairs" in out


def test_agreement_between_votes(files, server, capsys):
    rubric, data, responses = files
    code = mmrlvr_main(["rubric", "agreement", str(rubric), "--responses", str(responses), "--data", str(data),
                        *judge_args(server, "coin"), "--votes", "3"])
    assert code == 0
    out = capsys.readouterr().out
    assert "between the 3 votes of the judge: agreement" in out and "over 36 pairs" in out  # 12 items x 3 pairs


class TestKappa:
    def test_kappa_hand_worked(self):
        # the CLI case: program P and rule judge J over (mentions_red, count) for 4 responses
        p = [1, 1, 0, 0, 1, 0, 1, 1]
        j = [1, 0, 0, 0, 1, 1, 1, 1]
        # p_o = 6/8 = 0.75; p_P = p_J = 5/8; p_e = (5/8)^2 + (3/8)^2 = 34/64 = 0.53125
        # kappa = (0.75 - 0.53125) / (1 - 0.53125) = 0.21875 / 0.46875 = 0.46667
        a = agreement([bool(x) for x in p], [bool(x) for x in j])
        assert (a.n, a.skipped, a.percent) == (8, 0, 0.75)
        assert a.kappa == pytest.approx(0.466667, abs=1e-6)

    def test_edge_cases(self):
        assert cohen_kappa([True, False], [True, False]) == 1.0
        assert cohen_kappa([True, False], [False, True]) == -1.0
        assert math.isnan(cohen_kappa([True, True], [True, True]))     # p_e = 1: undefined
        a = agreement([True, None, False], [True, True, None])          # unknowns are left out and counted
        assert (a.n, a.skipped, a.percent) == (1, 2, 1.0)

    def test_votes(self):
        # 3 items x 2 votes: vote pairs agree on items 0 and 2 -> 2/3
        a = vote_agreement([[True, True], [True, False], [False, False]])
        assert a.percent == pytest.approx(2 / 3) and a.n == 3
