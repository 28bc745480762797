"""``text``: normalised exact match for short free-text answers ("red", "left", "cube").

Both sides go through ``normalize_answer`` (case, lead-ins such as "The answer is", articles, trailing
punctuation, ``\\text{}``). ``sample.meta["aliases"]`` may list other accepted spellings ("grey" for
"gray"). A bare number equals itself however it is written: "two" = "2" = "2.0" (``read_bare_number``; counting
questions in VQA-style data are answered both ways). No partial credit and no containment: "red or blue" and
"not red" do not match "red".
"""

from __future__ import annotations

from mmrlvr.rewards.base import REWARDS
from mmrlvr.rewards.common import AnswerReward, require_answer
from mmrlvr.rewards.parsing import extract_boxed, normalize_answer, read_bare_number
from mmrlvr.types import RewardResult, Sample


def accepted_answers(sample: Sample) -> list[str]:
    """The normalised ground truth plus ``meta["aliases"]`` (a string or a list of strings)."""
    gold = [require_answer(sample, "text")]
    aliases = (sample.meta or {}).get("aliases") or []
    gold += [aliases] if isinstance(aliases, str) else [str(a) for a in aliases]
    return [g for g in (normalize_answer(x) for x in gold) if g]


@REWARDS.register("text")
class TextReward(AnswerReward):
    """1.0 when the normalised answer equals the normalised ground truth (or an alias), else 0.0.

    >>> from mmrlvr.types import Sample
    >>> s = Sample(id="t", messages=[], images=[], answer="left", answer_type="text")
    >>> TextReward()("<think>it is on the left</think><answer>Left.</answer>", s).score
    1.0
    >>> TextReward()("<think>?</think><answer>left or right</answer>", s).score
    0.0
    """

    name = "text"
    default_max_answer_chars = 256

    def check(self, answer: str, sample: Sample) -> RewardResult:
        accepted = accepted_answers(sample)
        boxed = extract_boxed(answer)
        pred = normalize_answer(boxed[-1] if len(set(boxed)) == 1 else answer)
        parsed = {"answer": answer, "normalized": pred, "gold": accepted, "problems": [] if pred else ["empty_answer"]}
        right = bool(pred) and pred in accepted
        if not right and pred:
            value = read_bare_number(pred)
            right = value is not None and any(read_bare_number(g) == value for g in accepted)
        return RewardResult(float(right), {}, parsed)
