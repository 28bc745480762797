"""Nothing a policy writes can stop a rubric reward: program checks are bounded, guarded and counted.

Issue 23 ("the policy can crash training"): ~1,000 nested ``[`` made the ``json_field`` check of
``rubrics/grounding_constraints.yaml`` raise ``RecursionError`` out of ``RubricReward.score_batch`` (and
``mmrlvr rubric score``). Here every program check kind is fed degenerate responses - deep nesting,
unclosed brackets, huge inputs, catastrophic-backtracking bait - through the shipped rubric, the CLI and
a real two-step training run; each must end as a scored failure with a reason (the worst outcome for the
response: not met, or met for a pitfall), counted in ``rubric/check_errors``, never an exception.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from PIL import Image

from mmrlvr.cli import main as mmrlvr_main
from mmrlvr.rubric import RubricReward, load_rubric_file, load_rubric_text
from mmrlvr.rubric.routing import run_program
from mmrlvr.rubric.verifiers import CheckLimitError, CheckLimits, first_json
from mmrlvr.types import Sample

ROOT = Path(__file__).resolve().parents[1]
GROUNDING = ROOT / "rubrics" / "grounding_constraints.yaml"

NESTED = "<think>the red square</think><answer>" + "[" * 1000 + "</answer>"
DEGENERATE = {
    "nested_open": NESTED,
    "nested_closed": "<think>t</think><answer>" + "[" * 3000 + "1" + "]" * 3000 + "</answer>",
    "nested_objects": "<think>t</think><answer>" + '{"label": ' * 2000 + "</answer>",
    "nested_boxed": "<think>t</think>" + "\\boxed{" * 2000 + "1" + "}" * 2000,
    "unclosed_many": "<think>t</think><answer>" + "[1}" * 5000 + "</answer>",
    "huge": "<think>" + "x" * 200_000 + "</think><answer>[1, 2, 3, 4]</answer>",
}


def grounding_sample(sid: str = "g0") -> Sample:
    return Sample(id=sid, messages=[{"role": "user", "content": "Give the box of the red square."}],
                  images=[Image.new("RGB", (64, 64), "white")], answer="[10, 10, 30, 30]")


def program_part(path: Path) -> Path:
    """The shipped grounding rubric without its judge criterion (these tests need no judge)."""
    data = yaml.safe_load(GROUNDING.read_text())
    data["criteria"] = [c for c in data["criteria"] if c.get("check", "judge") != "judge"
                        and c["check"].get("type") != "judge"]
    path.write_text(yaml.safe_dump(data))
    return path


class TestShippedGroundingRubric:
    def test_the_issue_case_is_a_scored_failure_not_a_recursion_error(self, tmp_path):
        reward = RubricReward(rubric_file=str(program_part(tmp_path / "g.yaml")), group_size=1)
        good = '<think>the red square</think><answer>{"bbox_2d": [10, 10, 30, 30], "label": "red square"}</answer>'
        results = reward.score_batch([good, NESTED], [grounding_sample()] * 2)
        rows = {c["id"]: c for c in results[1].parsed["rubric"]}
        assert rows["has_label"]["verdict"] == "not_met" and rows["has_label"]["status"] == "check_error"
        assert "nested deeper than 64 levels" in rows["has_label"]["rationale"]
        assert results[0].score == pytest.approx(1.0)       # the honest answer is untouched
        assert results[1].score < results[0].score
        assert reward.metrics()["rubric/check_errors"] >= 1

    @pytest.mark.parametrize("name", list(DEGENERATE))
    def test_every_degenerate_response_scores_without_raising(self, tmp_path, name):
        reward = RubricReward(rubric_file=str(program_part(tmp_path / "g.yaml")), group_size=1)
        t0 = time.perf_counter()
        (res,) = reward.score_batch([DEGENERATE[name]], [grounding_sample()])
        assert time.perf_counter() - t0 < 5.0   # loose: bounded, never the seconds-to-minutes of a blow-up
        # no degenerate response earns the positive criteria; a check that failed says why
        rows = {c["id"]: c for c in res.parsed["rubric"]}
        assert rows["box_iou_50"]["verdict"] == "not_met" and rows["has_label"]["verdict"] == "not_met"
        assert res.score <= 0.0
        for c in res.parsed["rubric"]:
            if c["status"] == "check_error":
                assert c["rationale"].startswith("check failed on this response (")

    def test_rubric_score_cli_survives_and_reports(self, tmp_path, capsys):
        rubric = program_part(tmp_path / "g.yaml")
        lines = [{"response": r, "problem": "Give the box of the red square.", "answer": "[10, 10, 30, 30]"}
                 for r in DEGENERATE.values()]
        (tmp_path / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        rc = mmrlvr_main(["rubric", "score", str(rubric), "--responses", str(tmp_path / "r.jsonl"),
                          "--json", str(tmp_path / "out.jsonl")])
        out = capsys.readouterr().out
        assert rc == 0 and f"summary over {len(lines)} responses" in out
        rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert len(rows) == len(lines)
        assert any(c["status"] == "check_error" for r in rows for c in r["criteria"])


class TestScoredFailureIsTheWorstOutcome:
    RUBRIC = load_rubric_text(r"""
criteria:
  - {id: label, text: Has a label., category: important, check: {type: json_field, field: label}}
  - {id: shotgun, text: Gives several boxes., category: pitfall,
     check: {type: json_field, field: boxes.1, target: response}}
  - {id: slow, text: Matches a pathological pattern., category: pitfall,
     check: {type: regex, pattern: '(a|aa)+$', target: response}}
  - {id: slow_good, text: Matches a pathological pattern., category: optional,
     check: {type: regex, pattern: '(a|aa)+$', target: response}}
""")

    def test_positive_criteria_fail_and_pitfalls_count_as_made(self):
        crits = {c.id: c for c in self.RUBRIC}
        nested = "[" * 500
        assert run_program(crits["label"], nested, None).met is False
        assert run_program(crits["shotgun"], nested, None).met is True        # a pitfall: counted as made
        bait = "a" * 40 + "!"                          # exponential backtracking (~minutes unbounded)
        limits = CheckLimits(regex_timeout_s=0.2)
        for cid, met in (("slow", True), ("slow_good", False)):
            v = run_program(crits[cid], bait, None, limits)
            assert (v.met, v.status) == (met, "check_error") and "0.2 s budget" in v.rationale

    def test_over_the_length_limit_nothing_is_parsed(self):
        crits = {c.id: c for c in self.RUBRIC}
        v = run_program(crits["label"], '{"label": "x"}' + " " * 100, None, CheckLimits(max_chars=50))
        assert v.met is False and v.status == "check_error" and "over the 50-character limit" in v.rationale


class TestLinearTime:
    """The JSON scanner's cost grows at most linearly with the input (token steps, not timings), whatever
    the nesting: deep values stop at the depth limit, many unclosed candidates at the work budget."""

    @staticmethod
    def scanned(text: str) -> int:
        import mmrlvr.rubric.jsonscan as js

        count = 0
        original = js._TOKEN_RE

        class Counting:
            def match(self, s, pos):
                nonlocal count
                count += 1
                return original.match(s, pos)

        js._TOKEN_RE = Counting()
        try:
            first_json(text)
        except CheckLimitError:  # too deep / over budget: the scan stopped, which is the point
            pass
        finally:
            js._TOKEN_RE = original
        return count

    @pytest.mark.parametrize("unit", ["[", '{"a": ', "[1}", "[1,", '["a', "[" * 60 + "1,"])
    def test_token_steps_grow_linearly_with_depth(self, unit):
        steps = [self.scanned(unit * n) for n in (1000, 2000, 4000)]
        # doubling the depth at most doubles the work (+ a constant), never quadruples it
        assert steps[1] <= 2.2 * steps[0] + 50 and steps[2] <= 2.2 * steps[1] + 50, steps

    def test_depth_and_budget_outcomes(self):
        with pytest.raises(CheckLimitError, match="nested deeper than 64 levels"):
            first_json("[" * 100 + "1" + "]" * 100)
        with pytest.raises(CheckLimitError, match="search budget"):
            first_json('["' + "a" * 100 + "[1}" * 2000, CheckLimits(json_work_factor=1))
        assert first_json("[" * 10 + "1" + "]" * 10)[0] == [[[[[[[[[[1]]]]]]]]]]
        assert first_json('see [fig 1] then {"label": "red", "box": [1, 2, 3, 4]}')[0] == \
            {"label": "red", "box": [1, 2, 3, 4]}
        assert first_json('```json\n{"a": 1}\n```\n{"b": 2}')[0] == {"a": 1}


def test_a_real_training_run_keeps_training_on_degenerate_output(tmp_path):
    """Two steps of the real trainer on the tiny VLM, half of every group's responses replaced by
    degenerate nested output: the run finishes and logs the check errors."""
    from mmrlvr.config import load_config
    from mmrlvr.models.tiny import build_tiny
    from mmrlvr.train.metrics import read_metrics
    from mmrlvr.train.trainer import Trainer

    rubric = tmp_path / "count.yaml"
    rubric.write_text(yaml.safe_dump({"criteria": [
        {"id": "count", "text": "The answer is the right count.", "category": "essential",
         "check": {"type": "number", "expected": "{answer}"}},
        {"id": "json", "text": "The answer holds a JSON list.", "category": "optional",
         "check": {"type": "json_field", "field": "0"}},
        {"id": "boxed", "text": "The answer is a boxed count.", "category": "optional",
         "check": {"type": "math", "expected": "{answer}", "target": "response"}},
    ]}))
    model = build_tiny("qwen2_5_vl", tmp_path / "m")
    cfg = load_config(data={
        "output_dir": str(tmp_path / "run"), "seed": 0, "max_steps": 2, "save_every": 0, "progress": False,
        "tensorboard": False, "model": {"path": str(model)},
        "data": {"train": "synth:count", "eval": "synth:count", "train_size": 16, "eval_size": 4},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 8},
        "algo": {"micro_batch_size": 8}, "optim": {"lr": 1e-3},
        "eval": {"at_start": False, "at_end": False},
        "rewards": [{"name": "rubric", "weight": 1.0, "params": {"rubric_file": str(rubric)}}],
    })
    trainer = Trainer(cfg)
    generate = trainer.engine.generate

    def hostile(samples, group_size, params, **kw):
        batch = generate(samples, group_size, params, **kw)
        for k, c in enumerate(batch.completions):
            if k % 2:
                c.text = ["<answer>" + "[" * 1000 + "</answer>", "\\boxed{" * 3000,
                          "<answer>" + '{"a": ' * 1000 + "</answer>"][k % 3]
        return batch

    trainer.engine.generate = hostile
    summary = trainer.train()
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and summary["skipped_steps"] == 0
    assert all(r.get("rubric/check_errors", 0) >= 1 for r in rows), rows


def test_rubric_preview_shows_the_failed_check_instead_of_crashing(tmp_path, capsys):
    rubric = program_part(tmp_path / "g.yaml")
    (tmp_path / "d.jsonl").write_text(json.dumps({"problem": "Give the box of the red square.",
                                                  "answer": "[10, 10, 30, 30]"}) + "\n")
    rc = mmrlvr_main(["rubric", "preview", str(rubric), "--data", str(tmp_path / "d.jsonl"), "--response", NESTED])
    out = capsys.readouterr().out
    assert rc == 0
    assert "has_label (optional, weight 0.3) -> program json_field: the check failed on this response; not met: " \
           "check failed on this response (JSON nested deeper than 64 levels)" in out


def test_judge_summaries_of_a_combined_reward():
    from mmrlvr.rewards.combine import CombinedReward
    from mmrlvr.rubric.reward import judge_summaries

    combined = CombinedReward([{"name": "rubric", "weight": 1.0, "params": {"rubric_file": str(GROUNDING)}},
                               {"name": "format", "weight": 0.1}])
    assert judge_summaries(combined) == []          # no judge was asked: nothing to summarise
