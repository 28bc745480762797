"""The credit study script runs end to end (1 arm x 2 steps on a cold tiny VLM) and writes its table, JSON
and plot; its token classifier and seed statistics are checked on hand-worked values. The study itself
(4 schemes x 3 seeds) is run by hand: ``python benchmarks/credit_study.py`` (docs/credit.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    return load_script(ROOT / "benchmarks" / "credit_study.py")


@pytest.mark.parametrize("token, in_answer, expected", [
    ("Ġ3", False, "think digit"),
    ("Ġred", False, "think colour/shape word"),
    ("Ġcircle", False, "think colour/shape word"),
    ("2", True, "answer token"),
    ("<answer>", False, "tag"),
    ("</answer>", True, "tag"),  # the closing tag is a tag even while inside the answer
    ("<|im_end|>", False, "tag"),
    ("Ġsee", False, "other"),
    ("Ġ", False, "other"),
    ("Ġbox", False, "think filler word"),
    ("Ġthen", False, "think filler word"),
])
def test_token_class(study, token, in_answer, expected):
    assert study.token_class(token, in_answer, {"red", "circle"}, frozenset({"box", "then"})) == expected


def test_mean_std_and_aggregate(study):
    # mean(0.4, 0.5, 0.6) = 0.5; sample std = sqrt((0.01 + 0 + 0.01) / 2) = 0.1
    m, s = study.mean_std([0.4, 0.5, 0.6])
    assert m == pytest.approx(0.5) and s == pytest.approx(0.1)
    assert study.mean_std([0.3]) == (0.3, 0.0)
    results = {f"vepo/seed{i}": {"scheme": "vepo", "seed": i, "after": {"greedy_accuracy": g, "avg@8": g - 0.1},
                                 "train": {"credit/selected_fraction": 0.25}, "train_s": 60.0}
               for i, g in enumerate((0.4, 0.5, 0.6))}
    agg = study.aggregate(results, k=8)["vepo"]
    assert agg["greedy_accuracy"] == pytest.approx((0.5, 0.1))
    assert agg["avg@8"] == pytest.approx((0.4, 0.1))
    assert agg["credit/selected_fraction"] == pytest.approx((0.25, 0.0))
    assert agg["train_min"] == pytest.approx((1.0, 0.0))


def test_study_runs_one_arm_two_steps(study, tmp_path):
    out = tmp_path / "study"
    rc = study.main(["--schemes", "vepo", "--seeds", "0", "--steps", "2", "--eval-size", "4", "--k", "2",
                     "--probe-prompts", "2", "--out", str(out),
                     # a cold tiny model and a small batch keep this a smoke test (seconds, no warm start)
                     "model.path=tiny:qwen2_5_vl", "data.train_size=32", "rollout.prompts_per_step=2",
                     "rollout.group_size=4", "rollout.max_new_tokens=12"])
    assert rc == 0
    payload = json.loads((out / "results.json").read_text())
    res = payload["results"]["vepo/seed0"]
    assert res["steps"] == 2 and res["after"]["n"] == 4 and payload["start"]["n"] == 4
    # VEPO keeps ceil(0.2 T) tokens of each response: between 20% and 100% of them, never all of a 12-token one
    assert 0.2 <= res["train"]["credit/selected_fraction"] < 1.0
    probe = payload["probe"]
    assert probe["rollouts"] == 8  # 2 prompts x G 4
    assert sum(c["share_of_tokens"] for c in probe["classes"].values()) == pytest.approx(1.0)
    assert set(probe["scheme_stats"]) == {"entropy_topk", "vepo", "vppo"}
    lines = (out / "vepo-seed0" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    table = (out / "results.md").read_text()
    assert "| warm start (step 0) |" in table and "| vepo |" in table and "Budget: 2 steps" in table
    assert (out / "credit_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
