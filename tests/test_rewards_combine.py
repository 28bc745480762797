"""CombinedReward (weighted sum, flattened components, batch forms) and the evaluation answer judge."""

from __future__ import annotations

import pytest
from PIL import Image

from mmrlvr.config import RewardSpecConfig
from mmrlvr.errors import UserError
from mmrlvr.rewards import REWARDS, CombinedReward, RewardSpec, answer_judge, make_answer_judge
from mmrlvr.types import Completion, RewardResult, Sample


class BatchProbe:
    """A reward with a batch form (like a model judge) that records how it was called."""

    calls: list[str] = []

    def __init__(self, value: float = 0.5) -> None:
        self.value = value

    def __call__(self, completion, sample):
        BatchProbe.calls.append("single")
        return RewardResult(self.value, {"votes": 3.0}, {"how": "single"})

    def score_batch(self, completions, samples):
        BatchProbe.calls.append(f"batch:{len(completions)}")
        return [RewardResult(self.value, {"votes": 3.0}, {"how": "batch"}) for _ in completions]


if "test_batch_probe" not in REWARDS:
    REWARDS.add("test_batch_probe", BatchProbe)


def count(answer="3"):
    return Sample(id="c", messages=[], images=[], answer=answer, answer_type="number")


def r1(answer):
    return Completion(f"<think>I count them.</think><answer>{answer}</answer>")


class TestCombinedReward:
    def test_weighted_sum_and_unweighted_components(self):
        total = CombinedReward([RewardSpec("format", 0.2), RewardSpec("auto_accuracy", 1.0)])
        right, wrong, broken = r1("3"), r1("2"), Completion("3")
        assert total(right, count()).score == pytest.approx(1.2)  # 0.2*1 + 1.0*1
        assert total(wrong, count()).score == pytest.approx(0.2)  # 0.2*1 + 1.0*0
        assert total(broken, count()).score == 0.0  # 0.2*0 + 1.0*0
        assert total(right, count()).components == {"format": 1.0, "auto_accuracy": 1.0}

    def test_sub_components_are_flattened_and_parsed_kept_per_reward(self):
        s = Sample(id="g", messages=[], images=[Image.new("RGB", (100, 100))], answer="[0, 0, 10, 10]",
                   answer_type="box")
        total = CombinedReward([{"name": "format", "weight": 0.5}, {"name": "grounding", "weight": 2.0}])
        r = total(r1("[5, 0, 15, 10]"), s)
        # IoU = 50 / 150 = 1/3; total = 0.5*1 + 2.0*(1/3)
        assert r.score == pytest.approx(0.5 + 2 / 3)
        assert set(r.components) == {"format", "grounding", "grounding/iou"}
        assert r.components["grounding/iou"] == pytest.approx(1 / 3)
        assert r.parsed["grounding"]["boxes"] == [[5.0, 0.0, 15.0, 10.0]]
        assert r.parsed["format"]["problems"] == []

    def test_score_batch_uses_batch_forms(self):
        BatchProbe.calls.clear()
        total = CombinedReward([RewardSpec("test_batch_probe", 2.0, {"value": 0.25}), RewardSpec("format", 1.0)])
        results = total.score_batch([r1("3"), Completion("no tags")], [count(), count()])
        assert BatchProbe.calls == ["batch:2"]
        # 2.0*0.25 + 1.0*1 and 2.0*0.25 + 1.0*0
        assert [r.score for r in results] == pytest.approx([1.5, 0.5])
        assert results[0].components == {"test_batch_probe": 0.25, "test_batch_probe/votes": 3.0, "format": 1.0}
        assert results[0].parsed["test_batch_probe"] == {"how": "batch"}

    def test_score_batch_equals_single_calls_for_rule_rewards(self):
        total = CombinedReward([RewardSpec("format", 0.3), RewardSpec("numeric", 1.0, {"abs_tol": 0.5})])
        comps = [r1("3"), r1("3.4"), r1("2 or 3"), Completion("")]
        samples = [count()] * 4
        assert [r.score for r in total.score_batch(comps, samples)] == [total(c, s).score for c, s in zip(comps, samples)]

    def test_accepts_config_dataclasses(self):
        total = CombinedReward([RewardSpecConfig("format", 0.2), RewardSpecConfig("numeric", 1.0, {"abs_tol": 1})])
        assert total.weights == {"format": 0.2, "numeric": 1.0}
        assert total(r1("3.9"), count()).score == pytest.approx(1.2)

    def test_labels_allow_the_same_reward_twice(self):
        total = CombinedReward([RewardSpec("numeric", 1.0, label="exact"),
                                RewardSpec("numeric", 0.5, {"abs_tol": 1.0}, label="close")])
        r = total(r1("3.5"), count())
        assert r.components == {"exact": 0.0, "close": 1.0} and r.score == pytest.approx(0.5)

    @pytest.mark.parametrize("specs,message", [
        ([], "at least one"),
        ([RewardSpec("acuracy")], r"rewards\[0\]\.name: unknown reward 'acuracy'; known: .*accuracy"),
        ([RewardSpec("numeric", params={"tolerance": 1})], r"rewards\[0\] \(numeric\): bad params"),
        ([RewardSpec("grounding", params={"coord_format": "xywh"})], "unknown coord_format"),
        ([RewardSpec("format"), RewardSpec("format", 2.0)], "listed twice"),
        ([{"name": "format", "wieght": 1}], "unknown key"),
        ([{"name": "format", "weight": "heavy"}], r"rewards\[0\]\.weight"),
        ([{"name": "format", "weight": float("nan")}], "finite"),
        ([{"weight": 1.0}], r"rewards\[0\]\.name"),
    ])
    def test_bad_specs_are_user_errors(self, specs, message):
        with pytest.raises(UserError, match=message):
            CombinedReward(specs)

    def test_non_finite_scores_are_refused(self):
        BatchProbe.calls.clear()
        total = CombinedReward([RewardSpec("test_batch_probe", 1.0, {"value": float("nan")})])
        r = total(r1("3"), count())  # the guard turns a NaN into a scored failure with its reason
        assert r.score == 0.0 and "non-finite" in r.parsed["test_batch_probe"]["error"]
        assert total.metrics()["reward/errors"] == 1.0


class TestAnswerJudge:
    IMG = Image.new("RGB", (100, 100))

    @pytest.mark.parametrize("answer_type,gold,answer,meta,expected", [
        ("number", "3", "3", {}, (True, True)),
        ("number", "3", "4", {}, (False, True)),
        ("choice", "B", "(B)", {"options": ["x", "y"]}, (True, True)),
        ("choice", "B", "A or B", {"options": ["x", "y"]}, (False, True)),
        ("math", "\\frac{1}{2}", "\\frac{2}{4}", {}, (True, True)),
        ("text", "left", "Left.", {}, (True, True)),
        # IoU of [0,0,9,9] with [0,0,10,10] = 81/100 >= 0.5 ; [5,0,15,10] gives 1/3 < 0.5
        ("box", "[0, 0, 10, 10]", "[0, 0, 9, 9]", {}, (True, True)),
        ("box", "[0, 0, 10, 10]", "[5, 0, 15, 10]", {}, (False, True)),
    ])
    def test_dispatch_on_answer_type(self, answer_type, gold, answer, meta, expected):
        s = Sample(id="j", messages=[], images=[self.IMG], answer=gold, answer_type=answer_type, meta=meta)
        assert answer_judge(r1(answer), s) == expected

    def test_correct_but_unformatted(self):
        text = "<answer>3</answer>"  # no thinking block: the answer counts, the format does not
        assert answer_judge(text, count()) == (True, False)

    def test_hostile_outputs_are_neither(self):
        assert answer_judge("<think>3</think><answer>2</answer><answer>3</answer>", count()) == (False, False)
        assert answer_judge("<think><answer>3</answer></think>", count()) == (False, False)

    def test_boxed_template_judge(self):
        judge = make_answer_judge(template="boxed")
        assert judge(r"<think>x</think> so \boxed{3}", count()) == (True, True)
        assert judge("<think>x</think><answer>3</answer>", count()) == (False, False)

    def test_raw_template_judge(self):
        judge = make_answer_judge(template="raw")
        assert judge("<think>x</think> 3", count()) == (True, True)
        assert judge("<think>x", count()) == (False, False)
