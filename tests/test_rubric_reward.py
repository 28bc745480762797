"""The ``rubric`` reward: registry, groups, components/parsed, undetermined rollouts, POW3R state, synth task."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrlvr.errors import DataError, UserError
from mmrlvr.rewards.base import REWARDS, build_reward, score_batch
from mmrlvr.rubric import RubricReward
from mmrlvr.rubric.synth import count_rubric, reference_response, rubric_rows, rubric_samples
from mmrlvr.testing.judge_server import JudgeServer
from mmrlvr.types import Completion, Sample

REPO = Path(__file__).resolve().parents[1]

RUBRIC = [
    {"id": "count", "text": "Right count.", "category": "essential", "check": {"type": "number", "expected": "{answer}"}},
    {"id": "red", "text": "Names red.", "category": "important",
     "check": {"type": "regex", "pattern": r"\bred\b", "target": "thinking"}},
    {"id": "green", "text": "Mentions green, which is absent.", "category": "pitfall",
     "check": {"type": "regex", "pattern": r"\bgreen\b", "target": "thinking"}},
]


def s(sid="a", rubric=RUBRIC, answer="2", **meta) -> Sample:
    return Sample(id=sid, messages=[{"role": "user", "content": "How many red?"}], images=[], answer=answer,
                  rubric=rubric, meta=meta)


def test_registered_and_usable_through_the_reward_contract():
    assert "rubric" in REWARDS
    fn = build_reward("rubric", group_size=1)
    out = score_batch(fn, [Completion("<think>2 red</think><answer>2</answer>")], [s()])
    assert out[0].score == pytest.approx(1.0)
    assert fn(Completion("<think>green</think><answer>3</answer>"), s()).score == pytest.approx(-0.9 / 1.7)


def test_components_and_parsed():
    r = RubricReward(group_size=1)
    res = r.score_batch(["<think>2 red, 1 green</think><answer>2</answer>"], [s()])[0]
    # (1.0 + 0.7 - 0.9) / 1.7 = 0.470588
    assert res.score == pytest.approx(0.8 / 1.7)
    assert res.components == pytest.approx({"rubric": 0.8 / 1.7, "crit/count": 1.0, "crit/red": 1.0, "crit/green": 1.0})
    rows = {c["id"]: c for c in res.parsed["rubric"]}
    assert rows["green"]["verdict"] == "met" and rows["green"]["score"] == -1.0 and rows["green"]["weight"] == 0.9
    assert rows["count"]["judge"] == "program:number" and rows["count"]["route"] == "program"
    assert set(rows["count"]) >= {"id", "text", "category", "verdict", "score", "weight", "rationale", "judge"}
    assert res.parsed["undetermined"] is False and res.parsed["judge_unknown"] == 0


def test_rubric_file_param_and_missing_rubric(tmp_path):
    r = RubricReward(rubric_file=str(REPO / "rubrics" / "grounding_constraints.yaml"), group_size=1)
    # programs only for this response: box IoU 1 -> box_iou_50 and _75 met; label present; no pitfall;
    # the judge criterion needs a judge -> clear error
    with pytest.raises(UserError, match="has no `judge`"):
        r.score_batch(['<think>the red square</think><answer>{"bbox_2d": [10, 10, 40, 40], "label": "sq"}</answer>'],
                      [s(rubric=None, answer="[10, 10, 40, 40]")])
    with pytest.raises(DataError, match="no rubric"):
        RubricReward(group_size=1).score_batch(["x"], [s(rubric=None)])


class TestGroups:
    def test_sources_of_group_size(self):
        r = RubricReward()
        assert r.groups([s("a"), s("a"), s("b"), s("b"), s("b")]) == [[0, 1], [2, 3, 4]]   # runs of ids
        assert r.groups([s("a", group_size=2)] * 4) == [[0, 1], [2, 3]]                  # meta
        assert RubricReward(group_size=3).groups([s()] * 6) == [[0, 1, 2], [3, 4, 5]]     # param
        with pytest.raises(DataError, match="does not split into groups of 4"):
            RubricReward(group_size=4).groups([s()] * 6)

    def test_saturation_is_per_group(self):
        r = RubricReward(drop_saturated=True, group_size=2)
        texts = ["<think>red</think><answer>2</answer>", "<think>red</think><answer>3</answer>",   # group 1: red saturated
                 "<think>red</think><answer>2</answer>", "<think>blue</think><answer>2</answer>"]  # group 2: count saturated
        out = r.score_batch(texts, [s("a")] * 2 + [s("b")] * 2)
        # group 1: red met by both and green by neither are saturated -> only count keeps weight: 1, 0
        # group 2: count and green saturated -> only red keeps weight: 1, 0
        assert [o.score for o in out] == pytest.approx([1.0, 0.0, 1.0, 0.0])
        assert out[0].parsed["rubric_static"] == pytest.approx(1.0)          # 1.7 / 1.7
        assert out[1].parsed["rubric_static"] == pytest.approx(0.7 / 1.7)
        assert r.metrics()["rubric/saturated_fraction"] == pytest.approx(4 / 6)  # 2 of 3 criteria in each group


@pytest.fixture(scope="module")
def server():
    # like a real server, it refuses prompts over its context length with HTTP 400
    with JudgeServer(max_prompt_chars=4000) as srv:
        yield srv


class TestUndetermined:
    def judge(self, server):
        return {"name": "openai", "model": "mixed", "base_url": server.base_url, "max_retries": 0,
                "max_response_chars": 100_000}

    RUBRIC = [{"id": "j", "text": 'The reasoning mentions "red".', "category": "essential",
               "check": {"type": "judge", "target": "thinking"}}]
    TEXTS = ["<think>red</think>", "<think>blue</think>", "<think>red " + "x" * 5000 + "</think>"]

    def test_group_mean_of_determined_rollouts(self, server):
        r = RubricReward(judge=self.judge(server), group_size=3)
        out = r.score_batch(self.TEXTS, [s(rubric=self.RUBRIC)] * 3)
        # the long one's judge call fails (400) -> its only criterion is unknown -> undetermined ->
        # mean of the determined rollouts (1.0 + 0.0) / 2 = 0.5: zero advantage for it
        assert [o.score for o in out] == pytest.approx([1.0, 0.0, 0.5])
        assert [o.parsed["undetermined"] for o in out] == [False, False, True]
        m = r.metrics()
        assert m["rubric/undetermined_rate"] == pytest.approx(1 / 3) and m["judge/errors"] == 1
        assert m["judge/unknown_rate"] == pytest.approx(1 / 3)

    def test_zero_mode_and_whole_group_undetermined(self, server):
        r = RubricReward(judge=self.judge(server), group_size=3, undetermined="zero", undetermined_score=-0.25)
        out = r.score_batch(self.TEXTS, [s(rubric=self.RUBRIC)] * 3)
        assert [o.score for o in out] == pytest.approx([1.0, 0.0, -0.25])
        broken = [{"id": "j", "text": 'Mentions "red" (mode: error500)', "category": "essential", "check": "judge"}]
        r = RubricReward(judge=self.judge(server), group_size=3, aggregation="hierarchical")
        out = r.score_batch(self.TEXTS, [s(rubric=broken)] * 3)
        assert [o.score for o in out] == [0.0, 0.0, 0.0] and all(o.parsed["undetermined"] for o in out)
        assert r.metrics()["rubric/undetermined_rate"] == 1.0

    def test_bad_mode(self):
        with pytest.raises(UserError, match="undetermined must be one of"):
            RubricReward(undetermined="skip")


class TestPow3rState:
    def test_alphas_persist_and_round_trip(self):
        r = RubricReward(pow3r={"blend": 1.0, "ema": 0.5}, group_size=4)
        texts = ["<think>red</think><answer>2</answer>", "<think>red</think><answer>1</answer>",
                 "<think>x</think><answer>2</answer>", "<think>x</think><answer>1</answer>"]
        r.score_batch(texts, [s()] * 4)
        # count p = 0.5, red p = 0.5: each alone in its category -> u = 1 -> alpha stays 1;
        # green never met: category mean 0 -> u = 1
        assert sorted(r.alphas.values()) == pytest.approx([1.0, 1.0, 1.0])
        state = r.state_dict()
        r2 = RubricReward(pow3r=True, group_size=4)
        r2.load_state_dict(state)
        assert r2.alphas == r.alphas

    def test_within_category_reweighting(self):
        rubric = [{"id": "a", "text": "A.", "category": "important", "check": {"type": "regex", "pattern": "a"}},
                  {"id": "b", "text": "B.", "category": "important", "check": {"type": "regex", "pattern": "b"}}]
        r = RubricReward(pow3r={"blend": 1.0, "ema": 0.5}, group_size=4)
        # a: met 2/4 (v 0.25); b: met 4/4 (v 0) -> mean v 0.125 -> u = 2, 0 -> alpha = 0.5 + 0.5 u = 1.5, 0.5
        out = r.score_batch(["ab", "ab", "b", "b"], [s(rubric=rubric)] * 4)
        assert sorted(r.alphas.values()) == pytest.approx([0.5, 1.5])
        # effective weights 0.7 * 1.5 = 1.05 and 0.35: "ab" -> 1.4 / 1.4 = 1; "b" -> 0.35 / 1.4 = 0.25
        assert [o.score for o in out] == pytest.approx([1.0, 1.0, 0.25, 0.25])
        assert r.metrics()["rubric/pow3r_alpha_max"] == pytest.approx(1.5)


class TestSynthTask:
    def test_rows_and_reference_scores(self):
        rows = rubric_rows(12, "train", seed=3)
        assert all("rubric" in r and r["task"] == "count" for r in rows)
        samples = rubric_samples(12, "train", seed=3)
        r = RubricReward(group_size=1)
        refs = r.score_batch([x.meta["solution"] for x in samples], samples)
        assert [o.score for o in refs] == pytest.approx([1.0] * 12)
        for o in refs:  # every criterion is a program: no judge needed
            assert all(c["route"] == "program" for c in o.parsed["rubric"])

    def test_criteria_mean_what_they_say(self):
        counts = {"red": 2, "blue": 1}
        rub = count_rubric("red", counts)
        assert [c["id"] for c in rub] == ["count", "asked_colour", "asked_count", "colour_counts", "absent_colour"]
        sample = s(rubric=rub, answer="2")
        r = RubricReward(group_size=1)

        def crit(text):
            return {c["id"]: c["verdict"] for c in r.score_batch([text], [sample])[0].parsed["rubric"]}

        assert crit(reference_response("red", counts, "2")) == {
            "count": "met", "asked_colour": "met", "asked_count": "met", "colour_counts": "met",
            "absent_colour": "not_met"}
        # a wrong count for blue, plus a second count for red, plus an absent colour
        assert crit("<think>I see 2 red, 3 red, 2 blue, 1 green.</think><answer>2</answer>") == {
            "count": "met", "asked_colour": "met", "asked_count": "met", "colour_counts": "not_met",
            "absent_colour": "met"}
        # "12 red" is not "2 red"
        assert crit("<think>I see 12 red, 1 blue.</think><answer>2</answer>")["colour_counts"] == "not_met"

    def test_absent_colour_omitted_when_all_present(self):
        rub = count_rubric("red", {"red": 1, "green": 1, "blue": 1, "yellow": 1})
        assert [c["id"] for c in rub] == ["count", "asked_colour", "asked_count", "colour_counts"]
        assert reference_response("green", {"red": 1}, "0") == "<think>I see 0 green, 1 red.</think><answer>0</answer>"
