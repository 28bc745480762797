"""A group-aware reward in one file: agreement with the group's most common answer.

    r_i = 1  if answer_i is the group's most common answer, else 0

Label-free (the gold answer is never read), in the spirit of test-time RL's majority vote; illustrative — the
framework's own majority-vote reward is a separate, built-in method. Answers are compared after normalising them:
numbers by value (``3``, ``3.0`` and `` 3 `` agree), other text case- and space-insensitively. A response without
an answer scores 0 and does not vote. When two answers tie for the top, the one that appears first in the group
wins, so the reward is deterministic.

``group_aware = True`` is the whole contract: the trainer hands the reward whole groups and their group index
(``score_batch(..., group_index=...)``), and the guard never splits a group — a group whose scoring fails scores 0
on every row with the reason. ``template`` is a parameter, so the run's answer convention (R1 tags or
``\\boxed{}``) reaches it without being written in the config.

    mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/group_agreement.py]" \\
        rewards.1.name=group_agreement max_steps=2
"""

from __future__ import annotations

from collections import Counter

from mmrlvr.rewards.base import REWARDS
from mmrlvr.rewards.parsing import locate_answer
from mmrlvr.types import RewardResult


def normalise(answer: str | None) -> str | None:
    """The form two answers are compared in: a number's value, else lower-case text with single spaces."""
    if answer is None or not answer.strip():
        return None
    text = " ".join(answer.strip().lower().split())
    try:
        return repr(float(text.replace(",", "")))
    except ValueError:
        return text


@REWARDS.register("group_agreement")
class GroupAgreement:
    """1.0 for a response whose answer is its group's most common one (see the module docstring)."""

    group_aware = True

    def __init__(self, template: str = "r1") -> None:
        self.template = template

    def __call__(self, completion, sample):  # a row alone has no group to agree with
        return self.score_batch([completion], [sample], group_index=[0])[0]

    def score_batch(self, completions, samples, *, group_index):
        texts = [c if isinstance(c, str) else c.text for c in completions]
        answers = [normalise(locate_answer(t, self.template)[0]) for t in texts]
        out: list[RewardResult | None] = [None] * len(texts)
        for g in dict.fromkeys(group_index):  # groups in order of appearance
            rows = [i for i, gi in enumerate(group_index) if gi == g]
            votes = Counter(answers[i] for i in rows if answers[i] is not None)
            top = max(votes.values(), default=0)
            # ties: the first of the tied answers in the group wins
            majority = next((answers[i] for i in rows if answers[i] is not None and votes[answers[i]] == top), None)
            share = top / len(rows)
            for i in rows:
                agree = answers[i] is not None and answers[i] == majority
                out[i] = RewardResult(float(agree), {"agrees": float(agree)},
                                      {"answer": answers[i], "majority": majority, "majority_share": share})
        return out
