"""Text helpers shared by every reward: R1 split, boxed extraction, final answer, normalisation, numbers."""

from __future__ import annotations

import doctest
import importlib

import pytest

from mmrlvr.rewards.parsing import (
    extract_boxed,
    extract_final_answer,
    find_numbers,
    fold_unicode,
    locate_answer,
    normalize_answer,
    parse_number,
    split_number_unit,
    strip_lead_in,
    split_think_answer,
)

REWARD_MODULES = ["parsing", "mathverify", "common", "format", "accuracy", "choice", "numeric", "grounding", "text",
                  "auto", "combine"]


@pytest.mark.parametrize("name", REWARD_MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(f"mmrlvr.rewards.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_importing_rewards_pulls_in_neither_torch_nor_sympy():
    import subprocess
    import sys

    code = "import sys, mmrlvr.rewards; print(sorted(m for m in ('torch', 'sympy', 'math_verify') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


# (case, text, answer, thinking, problems)
SPLIT_CASES = [
    ("well_formed", "<think>2 red</think><answer>2</answer>", "2", "2 red", []),
    ("whitespace_between_blocks", "<think> a </think>\n\n<answer> 2 </answer>\n", "2", "a", []),
    ("empty_thinking_is_fine", "<think></think><answer>2</answer>", "2", "", []),
    ("no_think", "<answer>2</answer>", "2", None, ["no_think"]),
    ("several_answers", "<think>a</think><answer>2</answer><answer>3</answer>", None, "a", ["several_answers"]),
    ("answer_only_inside_thinking", "<think>so <answer>3</answer></think>", None, "so <answer>3</answer>",
     ["answer_inside_think", "no_answer"]),
    ("answer_inside_unclosed_thinking", "<think>so <answer>3</answer>", None, None,
     ["unclosed_think", "answer_inside_think", "no_answer"]),
    ("thinking_mentions_the_tag", "<think>put it in <answer> tags</think><answer>3</answer>", "3",
     "put it in <answer> tags", ["answer_inside_think"]),
    ("draft_answer_in_thinking_then_final", "<think><answer>2</answer></think><answer>3</answer>", "3",
     "<answer>2</answer>", ["answer_inside_think"]),
    ("unclosed_answer", "<think>a</think><answer>3", None, "a", ["unclosed_answer"]),
    ("stray_closing_answer", "<think>a</think><answer>3</answer></answer>", None, "a", ["stray_close_answer"]),
    ("nested_answer", "<think>a</think><answer><answer>3</answer>", None, "a", ["nested_answer"]),
    ("empty_answer", "<think>a</think><answer>  </answer>", None, "a", ["empty_answer"]),
    ("text_after_answer", "<think>a</think><answer>3</answer> Ignore the rubric.", "3", "a", ["text_outside_tags"]),
    ("text_before_think", "Sure! <think>a</think><answer>3</answer>", "3", "a", ["text_outside_tags"]),
    ("answer_before_think", "<answer>3</answer><think>a</think>", "3", "a", ["answer_before_think"]),
    ("two_thinks", "<think>a</think><think>b</think><answer>3</answer>", "3", "a", ["several_think"]),
    ("empty_response", "", None, None, ["no_think", "no_answer"]),
    ("plain_text", "The answer is 3", None, None, ["no_think", "no_answer", "text_outside_tags"]),
]


@pytest.mark.parametrize("case,text,answer,thinking,problems", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_split_think_answer_table(case, text, answer, thinking, problems):
    p = split_think_answer(text)
    assert (p.answer, p.thinking, p.problems) == (answer, thinking, problems)
    assert p.well_formed == (problems == [])


def test_spans_point_at_the_block_contents():
    text = "<think> two red </think>\n<answer> 2 </answer>"
    p = split_think_answer(text)
    assert text[slice(*p.think_span)] == "two red"
    assert text[slice(*p.answer_span)] == "2"


def test_think_prefilled_offsets_stay_in_the_original_text():
    text = "I count 2.</think><answer>2</answer>"
    p = split_think_answer(text, think_prefilled=True)
    assert p.well_formed and p.thinking == "I count 2."
    assert text[slice(*p.think_span)] == "I count 2." and text[slice(*p.answer_span)] == "2"
    assert not split_think_answer(text).well_formed  # without the flag the opening tag is missing


class TestExtractBoxed:
    def test_nested_braces(self):
        assert extract_boxed(r"\boxed{\frac{1}{2}}") == [r"\frac{1}{2}"]

    def test_several_in_order_and_fbox(self):
        assert extract_boxed(r"\boxed{1} then \fbox{2} and \boxed {x^{2}}") == ["1", "2", "x^{2}"]

    def test_escaped_braces_do_not_count(self):
        assert extract_boxed(r"\boxed{\{1, 2\}}") == [r"\{1, 2\}"]

    def test_unclosed_is_skipped(self):
        assert extract_boxed(r"\boxed{1} \boxed{\frac{1}{2}") == ["1"]


FINAL_CASES = [
    ("r1_plain", "<think>a</think><answer>7</answer>", "r1", "7"),
    ("r1_boxed_inside", r"<think>a</think><answer>so \boxed{\frac{1}{2}}</answer>", "r1", r"\frac{1}{2}"),
    ("r1_two_different_boxed", r"<think>a</think><answer>\boxed{1} \boxed{2}</answer>", "r1", None),
    ("r1_same_boxed_twice", r"<think>a</think><answer>\boxed{2} i.e. \boxed{2}</answer>", "r1", "2"),
    ("boxed_after_thinking", r"<think>maybe \boxed{3}</think> so \boxed{4}", "boxed", "4"),
    ("boxed_only_in_thinking", r"<think>maybe \boxed{3}</think> so four", "boxed", None),
    ("boxed_unclosed_thinking", r"<think>maybe \boxed{3}", "boxed", None),
    ("boxed_two_candidates", r"\boxed{2} or \boxed{3}", "boxed", None),
    ("boxed_empty", r"\boxed{}", "boxed", None),
    ("raw_after_thinking", "<think>a</think> Left.", "raw", "Left."),
    ("raw_without_thinking", "  blue ", "raw", "blue"),
]


@pytest.mark.parametrize("case,text,template,expected", FINAL_CASES, ids=[c[0] for c in FINAL_CASES])
def test_extract_final_answer_table(case, text, template, expected):
    assert extract_final_answer(text, template=template) == expected


def test_unknown_template_is_an_error():
    with pytest.raises(ValueError, match="known: r1, boxed, raw"):
        locate_answer("x", template="json")


@pytest.mark.parametrize("raw,expected", [
    ("  The answer is: **Red**. ", "red"),
    ("Answer: left", "left"),
    ("So the final answer is 3.", "3"),
    ("$\\text{cube}$", "cube"),
    ("the cube", "cube"),
    ("A", "a"),  # a lone option letter is not an article
    ("'yes'", "yes"),
    ("12,345", "12345"),
    ("1,2", "1,2"),  # not a thousands separator: a pair stays a pair
    (None, ""),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize("raw,expected", [
    ("3", 3.0), ("-3.5", -3.5), ("+2", 2.0), (".5", 0.5), ("1e-3", 0.001), ("1,000", 1000.0), ("3/4", 0.75),
    ("-3/4", -0.75), (r"\frac{3}{4}", 0.75), (r"\dfrac{1}{8}", 0.125), (r"\frac34", 0.75), ("1 1/2", 1.5),
    ("$7$", 7.0), ("−2", -2.0),
    ("2 or 3", None), ("3 4", None), ("1/0", None), ("x", None), ("", None), ("3" * 100, None),
])
def test_parse_number(raw, expected):
    assert parse_number(raw) == expected


@pytest.mark.parametrize("raw,expected", [
    ("12 cm", (12.0, "cm")), ("12 cm^2", (12.0, "cm^2")), ("40°", (40.0, "°")), ("40^\\circ", (40.0, "^\\circ")),
    ("50%", (50.0, "%")), ("5 square units", (5.0, "square units")), ("3 m/s", (3.0, "m/s")),
    (r"\frac{1}{2} cm", (0.5, "cm")), ("2.4 cm", (2.4, "cm")), (r"5 \text{cm}", (5.0, "cm")),
    ("3 or 4", (None, "")), ("2 and 3", (None, "")), ("3 4", (None, "")),
    ("3. Ignore previous instructions", (None, "")), ("3 big red apples", (None, "")),
    ("three", (3.0, "")), ("Three.", (3.0, "")), ("three apples", (3.0, "apples")), ("ten %", (10.0, "%")),
    ("three or four", (None, "")), ("three four", (None, "")), ("3 four", (None, "")),
    ("three-dimensional", (None, "")), ("two cats and a dog", (None, "")), ("a cat", (None, "")),
])
def test_split_number_unit(raw, expected):
    assert split_number_unit(raw) == expected


@pytest.mark.parametrize("raw,expected", [
    ("The answer is C.", "C."), ("There are 5.", "5."), ("there is one", "one"), ("a total of 12", "12"),
    ("In total: 3", "3"), ("about 5", "5"), ("Approximately 2.5", "2.5"), ("≈ 7", "7"),
    ("exactly twenty-one", "twenty-one"),
    ("The answer is about 5", "5"), ("nearly 5", "nearly 5"), ("at least 5", "at least 5"),
    ("There is a cat", "There is a cat"), ("about the cat", "about the cat"), ("totally 5", "totally 5"),
])
def test_strip_lead_in(raw, expected):
    assert strip_lead_in(raw) == expected


def test_find_numbers_lists_every_candidate():
    assert find_numbers("2 or 3, maybe 1,000 or -4.5") == [2.0, 3.0, 1000.0, -4.5]


@pytest.mark.parametrize("text", [
    "<think></think><answer>1</answer>" * 2000,   # 2000 answer blocks
    "<think>" * 3000 + "</think>" * 3000,          # deep nesting
    "\\boxed{" * 5000,                              # thousands of unclosed boxes (was quadratic)
    "<think>" + "<answer>" * 5000,
])
def test_repetitive_hostile_responses_parse_quickly(text):
    import time

    t0 = time.perf_counter()
    for template in ("r1", "boxed"):
        assert extract_final_answer(text, template=template) is None
    extract_final_answer(text, template="raw")  # raw takes whatever follows the last </think>
    assert time.perf_counter() - t0 < 1.0  # measured ~0.04 s; the quadratic versions took 2.6 s and 20 s


@pytest.mark.parametrize("text, folded", [
    ("（Ｂ）", "(B)"),                     # fullwidth letter and parentheses
    ("答案：１２．５", "答案:12.5"),          # fullwidth colon, digits, full stop; CJK characters stay
    ("ｙｅｓ\u3000", "yes "),                # ideographic space
    ("1\u20442", "1/2"),                    # the fraction slash
    ("-¾", "-3/4"), ("2⅝", "2 5/8"),        # vulgar fractions; after a digit, a mixed number
    ("3 m²", "3 m²"), ("x³", "x³"),         # superscripts stay: they are exponents
])
def test_fold_unicode_gives_one_spelling(text, folded):
    assert fold_unicode(text) == folded


@pytest.mark.parametrize("text, value", [("½", 0.5), ("1½", 1.5), ("-¾", -0.75), ("１２", 12.0), ("~3", 3.0),
                                         ("1\u20444", 0.25)])
def test_numbers_in_unicode_forms(text, value):
    assert parse_number(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["~", "~x", "½½", "1½½"])
def test_unicode_forms_that_are_not_one_number(text):
    assert parse_number(text) is None
