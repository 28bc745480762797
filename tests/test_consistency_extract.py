"""Conclusion extraction from the thinking: table-driven, with hostile phrasing."""

from __future__ import annotations

import pytest

from mmrlvr.consistency.extract import (
    CONCLUSION_HOOKS,
    conclusion_from_thinking,
    count_conclusion,
    extract_conclusion,
)
from mmrlvr.registry import RegistryError
from mmrlvr.types import Sample

# (thinking, answer_type, expected value, expected text at the span)
CASES = [
    # numbers
    ("2 + 2 = 4, so the answer is 4.", "number", "4", "4"),
    ("I count three.", "number", "3", "three"),
    ("There are twenty-one cubes.", "number", "21", "twenty-one"),  # not "twenty": the compound is one number
    ("So the total is Ninety nine.", "number", "99", "Ninety nine"),
    ("x = 3 + 4 = 7", "number", "7", "7"),  # the last rhs, not "3" (followed by an operator)
    ("So the ratio is 1/2.", "number", "1/2", "1/2"),
    (r"The answer is \frac{1}{2}.", "number", r"\frac{1}{2}", r"\frac{1}{2}"),
    (r"so the answer is \boxed{0.5}", "number", "0.5", "0.5"),
    ("Thus the area of triangle 1 is 12.", "number", "12", "12"),  # "1" is a name, "is 12" concludes
    ("angle ABC is 40 and BCA is 60", "number", "60", "60"),  # weak cues only: the last one
    ("The answer is 3. Side AB is 4.", "number", "3", "3"),  # a conclusion beats a later weak mention
    ("The two lines meet at about 40 degrees.", "number", "40", "40"),  # the geometry task's phrasing
    # several conclusions: the last asserted one
    ("The answer is 3. Wait, let me recount. There are 4.", "number", "4", "4"),
    # a conclusion phrased as a question is not one
    ("Is it 3? No: 2 + 2 = 4.", "number", "4", "4"),
    ("Maybe the answer is 3. Actually the answer is 5", "number", "5", "5"),  # hedged
    ("The answer is not 3. It is 5.", "number", "5", "5"),  # negated
    # options
    ("Could it be (B)? The answer is (C).", "choice", "C", "C"),
    ("(A) is wrong because it is too big. (B) fits. So the answer is B.", "choice", "B", "B"),
    ("Option A says 3, option B says 4. Option B is correct.", "choice", "B", "B"),
    ("A triangle has three sides, so C.", "choice", "C", "C"),  # the article "A" is not an option
    ("Let's see: (A) 3 (B) 4", "choice", "B", "B"),  # bare mentions only: the last one
    # expressions
    ("x^2 = 4, so x = 2.", "math", "2", "2"),
    (r"The area is 12\pi. So the answer is \boxed{12\pi}.", "math", r"12\pi", r"12\pi"),
    ("Then y = 2x + 1, and the answer is y = 2x + 1", "math", "2x + 1", "2x + 1"),
    (r"The area is $\frac{1}{2} \cdot 6 \cdot 4 = 12$ square units.", "math", "12", "12"),
    (r"Using Pythagoras, $c = \sqrt{3^2 + 4^2} = 5$.", "math", "5", "5"),
    ("So x = 180 - 40 - 60 = 80.", "number", "80", "80"),
    ("Therefore, the correct choice is B.", "choice", "B", "B"),
    # boxes
    ("It is at [10, 20, 30, 40]. Actually it is at [12, 22, 30, 40].", "box", "[12, 22, 30, 40]",
     "[12, 22, 30, 40]"),
    # free text
    ("The shape is on the left, so the colour is red.", "text", "red", "red"),
    ("The answer is red", "text", "red", "red"),
]


@pytest.mark.parametrize("thinking,answer_type,value,span_text", CASES)
def test_extract_conclusion(thinking, answer_type, value, span_text):
    c = extract_conclusion(thinking, answer_type)
    assert c.value == value
    assert thinking[c.span[0]:c.span[1]] == span_text


NO_CONCLUSION = [
    ("", "number"),
    (None, "number"),
    ("   ", "text"),
    ("Is it 3?", "number"),  # only a question
    ("Is the answer red?", "text"),
    ("Maybe the answer is 4.", "number"),  # only hedged
    ("Half of it: 1/2", "number"),  # a number but no conclusion cue
    ("Let me look at the picture carefully.", "choice"),
]


@pytest.mark.parametrize("thinking,answer_type", NO_CONCLUSION)
def test_no_conclusion(thinking, answer_type):
    c = extract_conclusion(thinking, answer_type)
    assert c.value is None and c.span is None


def test_all_candidates_recorded_with_assertedness():
    thinking = "Is it 3? The answer is 4. Hmm, maybe the answer is 5."
    c = extract_conclusion(thinking, "number")
    assert c.value == "4"
    got = [(x.value, x.cue, x.asserted) for x in c.candidates]
    assert got == [("3", "question", False), ("4", "answer_is", True), ("5", "answer_is", False)]


def test_choice_by_option_text():
    c = extract_conclusion("Blue is too dark. So the answer is red.", "choice", ["blue", "red", "green"])
    assert c.value == "B" and c.cue == "option_text"


def _count_sample(colour: str) -> Sample:
    return Sample(id="c", messages=[{"role": "user", "content": [{"type": "image"}, {
        "type": "text", "text": f"How many {colour} shapes are there?"}]}], images=[], answer="2",
        answer_type="number", meta={"task": "count", "colour": colour})


COUNT_CASES = [
    # the synthetic count task's own phrasing: the count of the *asked* colour, not the last number
    ("I see 2 red, 1 blue.", "red", "2", "2"),
    ("I see 2 red, 1 blue.", "blue", "1", "1"),
    ("I see two red and one blue.", "blue", "1", "one"),
    ("red: 2, green: 1", "green", "1", "1"),
    ("There are no green shapes. I see 3 red.", "green", "0", "no"),
    # a complete listing without the asked colour states 0 (span: the listing)
    ("I see 2 red, 1 blue.", "green", "0", "I see 2 red, 1 blue"),
    # a recount: the last asserted one
    ("I see 1 red, 1 blue. Wait, I see 2 red, 1 blue.", "red", "2", "2"),
    # a question about the colour is not a count
    ("3 red? No. I see 2 red.", "red", "2", "2"),
]


@pytest.mark.parametrize("thinking,colour,value,span_text", COUNT_CASES)
def test_count_hook(thinking, colour, value, span_text):
    c = conclusion_from_thinking(thinking, _count_sample(colour))
    assert c.value == value
    assert thinking[c.span[0]:c.span[1]] == span_text


def test_count_hook_colour_from_question_when_meta_lacks_it():
    s = _count_sample("blue")
    s.meta = {}  # no task, no colour: the "How many blue ..." question decides
    assert conclusion_from_thinking("I see 2 red, 1 blue.", s).value == "1"


def test_count_hook_falls_back_to_generic_extraction():
    # no per-colour phrasing at all: the generic number extraction answers
    assert conclusion_from_thinking("There are 3 of them, so the answer is 3.", _count_sample("red")).value == "3"
    assert count_conclusion("nothing to see here", "red") is None


def test_left_right_hook_reads_positions():
    s = Sample(id="l", messages=[], images=[], answer="left", answer_type="text",
               meta={"task": "left_right", "subject": ["red", "circle"], "reference": ["blue", "square"]})
    thinking = "The red circle is at x 30, the blue square is at x 70."
    c = conclusion_from_thinking(thinking, s)
    assert (c.value, c.cue) == ("left", "positions")  # 30 < 70
    assert conclusion_from_thinking("The red circle is at x 80, the blue square is at x 70.", s).value == "right"
    # an explicit statement wins over positions
    assert conclusion_from_thinking(thinking + " So the answer is right.", s).value == "right"


def test_largest_colour_hook():
    s = Sample(id="g", messages=[], images=[], answer="red", answer_type="text", meta={"task": "largest_colour"})
    assert conclusion_from_thinking("The largest shape is the red circle.", s).value == "red"
    assert conclusion_from_thinking("Is the largest shape the red circle?", s).value is None


def test_unknown_hook_name_is_a_loud_error():
    s = _count_sample("red")
    s.meta["conclusion_hook"] = "no_such_hook"
    with pytest.raises(RegistryError, match="known: count"):
        conclusion_from_thinking("I see 2 red.", s)
    assert {"count", "left_right", "largest_colour"} <= set(CONCLUSION_HOOKS)
