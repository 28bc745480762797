"""Rule analysis, the ``consistency`` reward's variants, and the step metrics — with hostile rollouts."""

from __future__ import annotations

import pytest

import mmrlvr.consistency  # noqa: F401 - registers the "consistency" reward
from mmrlvr.consistency import (
    CONSISTENCY_JUDGES,
    ConsistencyReward,
    RuleJudge,
    analyse,
    build_judge,
    consistency_metrics,
    group_indices,
)
from mmrlvr.errors import UserError
from mmrlvr.registry import RegistryError
from mmrlvr.rewards import CombinedReward, RewardSpec, build_reward
from mmrlvr.types import Completion, Sample


def count_sample(answer: str = "2", colour: str = "red", sid: str = "c") -> Sample:
    return Sample(id=sid, messages=[{"role": "user", "content": [{"type": "image"}, {
        "type": "text", "text": f"How many {colour} shapes are there?"}]}], images=[], answer=answer,
        answer_type="number", meta={"task": "count", "colour": colour})


MATH = Sample(id="m", messages=[{"role": "user", "content": "What is 1/2?"}], images=[], answer=r"\frac{1}{2}",
              answer_type="math")
NUMBER = Sample(id="n", messages=[{"role": "user", "content": "What is x?"}], images=[], answer="2",
                answer_type="number")
CHOICE = Sample(id="o", messages=[{"role": "user", "content": "Pick one."}], images=[], answer="C",
                answer_type="choice")
TEXT = Sample(id="t", messages=[{"role": "user", "content": "What colour is it?"}], images=[], answer="red",
              answer_type="text")

# (response, sample, verdict, thinking_correct, answer_correct, conclusion)
ANALYSIS_CASES = [
    ("<think>I see 2 red, 1 blue.</think><answer>2</answer>", count_sample(), "consistent", True, True, "2"),
    ("<think>I see 2 red, 1 blue.</think><answer>1</answer>", count_sample(), "inconsistent", True, False, "2"),
    # count phrasing: the asked colour's count (blue = 1), not the first number
    ("<think>I see 2 red, 1 blue.</think><answer>1</answer>", count_sample("1", "blue"), "consistent", True,
     True, "1"),
    # a listing without the asked colour states 0
    ("<think>I see 2 red, 1 blue.</think><answer>0</answer>", count_sample("0", "green"), "consistent", True,
     True, "0"),  # (its span is the listing "I see 2 red, 1 blue")
    # both wrong but consistent
    ("<think>I see 3 red.</think><answer>3</answer>", count_sample(), "consistent", False, False, "3"),
    # a question is not the conclusion; the asserted recount is
    ("<think>2 red? No. I see 1 red, 1 blue.</think><answer>2</answer>", count_sample(), "inconsistent", False,
     True, "1"),
    # no thinking / empty thinking: nothing to compare -> unknown, never consistent
    ("<answer>2</answer>", count_sample(), "unknown", None, True, None),
    ("<think></think><answer>2</answer>", count_sample(), "unknown", None, True, None),
    # the answer hidden inside the thinking only: no answer -> unknown, and not correct
    ("<think>so the answer is 2 <answer>2</answer></think>", NUMBER, "unknown", True, False, "2"),
    # matching numbers in different forms, under the accuracy verifier's normalisation
    ("<think>so the answer is 1/2</think><answer>0.5</answer>", MATH, "consistent", True, True, "1/2"),
    (r"<think>The answer is 0.5.</think><answer>\boxed{\frac{1}{2}}</answer>", MATH, "consistent", True, True,
     "0.5"),
    ("<think>so x = 1/3</think><answer>0.5</answer>", MATH, "inconsistent", False, True, "1/3"),
    ("<think>x = 4/2 = 2.0</think><answer>2</answer>", NUMBER, "consistent", True, True, "2.0"),
    # several conclusions: the last asserted one
    ("<think>The answer is 3. Wait, recount: the answer is 2.</think><answer>2</answer>", NUMBER, "consistent",
     True, True, "2"),
    ("<think>Could it be (B)? The answer is (C).</think><answer>C</answer>", CHOICE, "consistent", True, True,
     "C"),
    ("<think>The answer is (B).</think><answer>(C)</answer>", CHOICE, "inconsistent", False, True, "B"),
    ("<think>So the answer is red.</think><answer>Red</answer>", TEXT, "consistent", True, True, "red"),
]


@pytest.mark.parametrize("text,sample,verdict,think_ok,answer_ok,conclusion", ANALYSIS_CASES)
def test_analysis_and_rule_verdict(text, sample, verdict, think_ok, answer_ok, conclusion):
    a = analyse(Completion(text), sample)
    assert a.rule_verdict == verdict
    assert a.thinking_correct is think_ok
    assert a.answer_correct is answer_ok
    assert a.conclusion.value == conclusion
    if conclusion is not None:  # the span indexes the response text
        s, e = a.conclusion_span
        assert text[s:e] == ("I see 2 red, 1 blue" if "green" in sample.question else conclusion)


def test_rule_judge_p_and_registry():
    judge = build_judge("rule")
    rows = [Completion("<think>I see 2 red.</think><answer>2</answer>"),
            Completion("<think>I see 2 red.</think><answer>3</answer>"),
            Completion("<answer>2</answer>")]
    assert judge.p_consistent(rows, [count_sample()] * 3) == [1.0, 0.0, None]
    assert isinstance(judge, RuleJudge)
    assert {"rule", "nli", "likelihood"} <= set(CONSISTENCY_JUDGES)
    with pytest.raises(RegistryError, match="known: likelihood, nli, rule"):
        build_judge("oracle")


# the four-way table for count answer "2": (response, plain, accurate_only, follow_correct_thinking)
VARIANT_ROWS = [
    ("<think>I see 2 red, 1 blue.</think><answer>2</answer>", 1.0, 1.0, 1.0),  # think right, answer right
    ("<think>I see 2 red, 1 blue.</think><answer>1</answer>", 0.0, 0.0, 0.5),  # right thinking, not followed
    ("<think>I see 1 red, 1 blue.</think><answer>2</answer>", 0.0, 0.0, 0.0),  # wrong thinking, lucky answer
    ("<think>I see 3 red.</think><answer>3</answer>", 1.0, 0.0, 0.0),  # both wrong but consistent
    ("<answer>2</answer>", 0.0, 0.0, 0.0),  # no thinking: unknown, never credited
]


@pytest.mark.parametrize("text,plain,accurate_only,follow", VARIANT_ROWS)
def test_variants_on_the_four_way_table(text, plain, accurate_only, follow):
    s = count_sample()
    assert ConsistencyReward(variant="plain")(Completion(text), s).score == plain
    assert ConsistencyReward(variant="accurate_only")(Completion(text), s).score == accurate_only
    # follow_correct_thinking = 0.5 * [thinking right] + 0.5 * [thinking right] * [answer follows it]
    assert ConsistencyReward(variant="follow_correct_thinking")(Completion(text), s).score == follow


def test_default_variant_is_the_safe_one_and_registered():
    reward = build_reward("consistency")
    assert reward.variant == "accurate_only"
    both_wrong = "<think>I see 3 red.</think><answer>3</answer>"
    assert reward(both_wrong, count_sample()).score == 0.0  # plain would pay 1.0 here (STACK.md)
    with pytest.raises(UserError, match="unknown variant"):
        ConsistencyReward(variant="always")
    with pytest.raises(UserError, match="think_credit"):
        ConsistencyReward(variant="follow_correct_thinking", think_credit=2.0)


def test_parsed_fields_for_store_and_inspector():
    text = "<think>I see 2 red, 1 blue.</think><answer>1</answer>"
    r = ConsistencyReward()(Completion(text), count_sample())
    p = r.parsed
    assert p["verdict"] == "inconsistent" and p["verdict_source"] == "rule"
    assert p["p_consistent"] == 0.0 and p["conclusion"] == "2"
    s, e = p["conclusion_span"]
    assert text[s:e] == "2" and s == text.index("2 red")
    assert p["thinking_correct"] is True and p["answer_correct"] is False and p["agrees"] is False
    assert [c["value"] for c in p["candidates"]] == ["2"]
    assert p["variant"] == "accurate_only" and p["judge"] == "rule"
    unknown = ConsistencyReward()(Completion("<answer>2</answer>"), count_sample()).parsed
    assert unknown["verdict"] == "unknown" and unknown["p_consistent"] is None


def test_care_variant_needs_the_group():
    s = count_sample()
    rows = [  # acc (1, 0, 1, 0); rule p (1, 0, 0, 1)
        "<think>I see 2 red, 1 blue.</think><answer>2</answer>",
        "<think>I see 2 red, 1 blue.</think><answer>1</answer>",
        "<think>I see 1 red, 1 blue.</think><answer>2</answer>",
        "<think>I see 3 red.</think><answer>3</answer>",
    ]
    reward = ConsistencyReward(variant="care", judge="rule", group_size=4)
    # mean acc 0.5 -> accurate rows 0 and 2; their mean p = 0.5, bar 0.49: row 0 (p 1) earns 0.5 * 1, row 2
    # (p 0) nothing; rows 1 and 3 are wrong, so the consistent-but-wrong row 3 earns nothing either
    scores = [r.score for r in reward.score_batch([Completion(t) for t in rows], [s] * 4)]
    assert scores == [0.5, 0.0, 0.0, 0.0]
    with pytest.raises(UserError, match="score_batch"):
        reward(Completion(rows[0]), s)


def test_group_indices_sources():
    a, b = count_sample(sid="a"), count_sample(sid="b")
    plain = [Completion("x")] * 4
    assert group_indices(plain, [a, a, b, b]) == [0, 0, 1, 1]  # runs of equal sample id
    assert group_indices(plain, [a, a, a, a], group_size=2) == [0, 0, 1, 1]
    tagged = [Completion("x", meta={"group_index": g}) for g in (5, 6, 5, 6)]
    assert group_indices(tagged, [a] * 4, group_size=2) == [5, 6, 5, 6]  # explicit labels win
    with pytest.raises(UserError, match="whole groups"):
        group_indices(plain[:3], [a] * 3, group_size=2)


def test_combined_with_accuracy_and_metrics():
    """The trainer's path: CombinedReward.score_batch -> components/parsed -> consistency_metrics."""
    total = CombinedReward([RewardSpec("auto_accuracy", 1.0),
                            RewardSpec("consistency", 0.5, {"variant": "care", "judge": "rule", "group_size": 4})])
    rows = [t for t, *_ in VARIANT_ROWS[:4]]
    results = total.score_batch([Completion(t) for t in rows], [count_sample()] * 4)
    assert [r.components["consistency"] for r in results] == [0.5, 0.0, 0.0, 0.0]
    assert [r.score for r in results] == [1.25, 0.0, 1.0, 0.0]  # accuracy + 0.5 * bonus
    m = consistency_metrics([r.parsed["consistency"] for r in results])
    # verdicts: consistent, inconsistent, inconsistent, consistent -> IR 2/4
    assert m["inconsistency_rate"] == 0.5
    assert m["consistency/both_wrong_consistent"] == 0.25


def test_consistency_metrics_hand_worked():
    rows = [
        {"verdict": "consistent", "thinking_correct": True, "answer_correct": True, "agrees": True},
        {"verdict": "inconsistent", "thinking_correct": True, "answer_correct": False, "agrees": False},
        {"verdict": "inconsistent", "thinking_correct": False, "answer_correct": True, "agrees": False},
        {"verdict": "consistent", "thinking_correct": False, "answer_correct": False, "agrees": True},
        {"verdict": "inconsistent", "thinking_correct": False, "answer_correct": False, "agrees": False},
        {"verdict": "unknown", "thinking_correct": None, "answer_correct": True, "agrees": None},
    ]
    m = consistency_metrics(rows)
    assert m == pytest.approx({
        "inconsistency_rate": 3 / 5,               # 3 inconsistent of 5 with a verdict
        "consistency/unknown_rate": 1 / 6,
        "consistency/think_right_answer_right": 1 / 5,  # over the 5 rows where both can be checked
        "consistency/think_right_answer_wrong": 1 / 5,
        "consistency/think_wrong_answer_right": 1 / 5,
        "consistency/think_wrong_answer_wrong": 2 / 5,
        "consistency/both_wrong_consistent": 1 / 5,
        "consistency/thinking_accuracy": 2 / 5,
        "consistency/verifiable_fraction": 5 / 6,
    })
    assert consistency_metrics([]) == {}  # no data is not 0
    only_unknown = consistency_metrics([{"verdict": "unknown"}])
    assert only_unknown == {"consistency/unknown_rate": 1.0, "consistency/verifiable_fraction": 0.0}
