"""Numbers written in words: one reader (``parse_number_words``), read alike by every answer reward.

Expected values are the numbers the English words name, worked by hand; the cross-reward cases check that the
accuracy, numeric, text and auto rewards, the group vote's equivalence and box de-duplication agree.
"""

from __future__ import annotations

import pytest

from mmrlvr.rewards import (AccuracyReward, AutoAccuracyReward, MajorityVote, NumericReward, TextReward,
                            parse_number_words, read_bare_number, same_answer)
from mmrlvr.rewards.parsing import box_key
from mmrlvr.types import Sample


@pytest.mark.parametrize("words,value", [
    ("zero", 0), ("one", 1), ("Seven", 7), ("eleven", 11), ("nineteen.", 19), ("twenty", 20),
    ("twenty-one", 21), ("twenty one", 21), ("Ninety-Nine", 99), ("one hundred", 100), ("a hundred", 100),
    ("one hundred and five", 105), ("one hundred five", 105), ("fifteen hundred", 1500),
    ("two thousand three hundred", 2300), ("a thousand and one", 1001),
    ("one million two hundred thousand", 1_200_000), ("three billion", 3_000_000_000),
    ("minus seven", -7), ("negative twelve", -12),
])
def test_words_name_their_number(words, value):
    assert parse_number_words(words) == value


@pytest.mark.parametrize("words", [
    "", "a", "and", "hundred", "thousand", "three four", "twenty thirty", "one two three", "zero one",
    "one hundred and", "two thousand three thousand", "third", "a half", "three point five", "dozen",
    "none", "no", "minus", "twenty-twenty", "seventeen-seven", "three apples", "tres",
])
def test_what_is_not_one_number_in_words(words):
    assert parse_number_words(words) is None


def test_bare_numbers_read_alike_in_digits_and_words():
    assert read_bare_number("Three.") == read_bare_number("3") == read_bare_number("3.0") == 3.0
    assert read_bare_number("three apples") is None  # a unit is split_number_unit's business
    assert box_key("three") == box_key("3") != box_key("4")


def _s(answer: str, answer_type: str) -> Sample:
    return Sample(id="w", messages=[], images=[], answer=answer, answer_type=answer_type)


def _r1(answer: str) -> str:
    return f"<think>I count them.</think><answer>{answer}</answer>"


@pytest.mark.parametrize("gold,answer,expected", [
    ("3", "three", 1.0), ("3", "Three.", 1.0), ("three", "3", 1.0), ("21", "twenty-one", 1.0),
    ("105", "one hundred and five", 1.0), ("3", "three apples", 1.0), ("0", "zero", 1.0),
    ("3", r"\boxed{three}", 1.0), ("50", "fifty percent", 1.0),
    ("3", "four", 0.0), ("3", "three four", 0.0), ("3", "3 four", 0.0), ("3", "three or four", 0.0),
    ("3", r"\boxed{three} \boxed{four}", 0.0), ("3", "third", 0.0), ("0", "none", 0.0),
])
def test_accuracy_and_auto_read_numbers_in_words(gold, answer, expected):
    for answer_type in ("number", "math"):
        assert AccuracyReward()(_r1(answer), _s(gold, answer_type)).score == expected
        assert AutoAccuracyReward()(_r1(answer), _s(gold, answer_type)).score == expected


def test_a_percentage_in_words_is_its_number_and_its_fraction_to_accuracy():
    assert AccuracyReward()(_r1("fifty percent"), _s("0.5", "math")).score == 1.0  # as "50%" is
    assert NumericReward()(_r1("fifty percent"), _s("0.5", "number")).score == 0.0  # numeric drops units, as for "50%"


def test_numeric_reads_words_within_its_tolerance():
    assert NumericReward()(_r1("twenty-one"), _s("21", "number")).score == 1.0
    assert NumericReward(abs_tol=1)(_r1("twenty"), _s("21", "number")).score == 1.0
    assert NumericReward(abs_tol=1)(_r1("nineteen"), _s("21", "number")).score == 0.0
    assert NumericReward()(_r1("2"), _s("two", "number")).score == 1.0  # a worded ground truth is a number now


@pytest.mark.parametrize("gold,answer,expected", [
    ("two", "2", 1.0), ("2", "Two.", 1.0), ("2", "2.0", 1.0), ("two", "twenty", 0.0), ("2", "two dogs", 0.0),
    ("left", "2", 0.0),
])
def test_text_compares_bare_numbers_as_numbers(gold, answer, expected):
    assert TextReward()(_r1(answer), _s(gold, "text")).score == expected


def test_the_group_vote_counts_a_word_and_its_digits_as_one_answer():
    vote = MajorityVote()
    sample = _s("9", "number")  # the vote reads no gold: a wrong label changes nothing
    texts = [_r1(a) for a in ("three", "3", "Three.", "4", "four")]
    scores = [r.score for r in vote.score_batch(texts, [sample] * 5, group_index=[0] * 5)]
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert same_answer("three", "3", _s("3", "number")) and not same_answer("three", "4", _s("3", "number"))
