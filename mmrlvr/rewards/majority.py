"""Label-free reward: agreement with the group's majority answer (TTRL, Zuo et al. 2025, arXiv 2504.16084).

    r_i = 1  if answer_i is equivalent to the group's majority answer (the pseudo-label), else 0

Test-time RL needs no gold label: the majority of G sampled answers stands in for it. Answers are compared with
the accuracy reward's own equivalence (``mmrlvr.rewards.auto.same_answer`` under the row's ``answer_type``:
``0.5`` and ``\\frac{1}{2}`` agree, ``3`` and ``3.0`` agree, boxes by IoU), never as strings: equivalent answers
are grouped into one cluster (each new answer joins the first cluster whose representative it matches), and the
largest cluster is the majority. Ours, where TTRL's code decides by string counts after its own normalisation:
the clustering by the verifier's equivalence, and ties — the cluster whose first member appears first in the group
wins, deterministically — counted in ``majority/tie_share``. A response without a parsable answer scores 0 and
does not vote (``majority/unparsable``); a group with no parsable answer has no pseudo-label (all 0).

The gold answer is read in one place only: to log the pseudo-label's accuracy (``majority/pseudo_label_accuracy``
over groups whose rows carry a gold answer). The rewards themselves never read it (a test strips it and checks the
scores do not move). ``group_aware = True``: the trainer hands the reward whole groups and their group index.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from mmrlvr.rewards.base import REWARDS
from mmrlvr.rewards.parsing import locate_answer
from mmrlvr.types import Completion, RewardResult, Sample


@REWARDS.register("majority_vote")
class MajorityVote:
    """1.0 for a response whose answer agrees with its group's majority answer (module docstring)."""

    group_aware = True

    def __init__(self, template: str = "r1", think_prefilled: bool = False) -> None:
        self.template, self.think_prefilled = template, think_prefilled
        self._counts = {"groups": 0, "tie_groups": 0, "unparsable": 0, "rows": 0, "judged": 0, "pseudo_correct": 0}

    def __call__(self, completion: Completion | str, sample: Sample) -> RewardResult:
        return self.score_batch([completion], [sample], group_index=[0])[0]

    def _answer(self, completion: Completion | str) -> str | None:
        text = completion if isinstance(completion, str) else completion.text
        answer = locate_answer(text, self.template, self.think_prefilled)[0]
        return answer.strip() if answer and answer.strip() else None

    @staticmethod
    def _agree(a: str, b: str, sample: Sample) -> bool:
        from mmrlvr.rewards.auto import same_answer

        # the row without its gold answer: equivalence is the verifier's, by answer type, and reads no label
        return same_answer(a, b, dataclasses.replace(sample, answer=None))

    def score_batch(self, completions: Sequence[Completion | str], samples: Sequence[Sample], *,
                    group_index: Sequence[int]) -> list[RewardResult]:
        answers = [self._answer(c) for c in completions]
        out: list[RewardResult | None] = [None] * len(answers)
        for g in dict.fromkeys(group_index):
            rows = [i for i, gi in enumerate(group_index) if gi == g]
            clusters: list[list[int]] = []  # rows of equivalent answers, in order of first appearance
            for i in rows:
                if answers[i] is None:
                    continue
                home = next((c for c in clusters if self._agree(answers[i], answers[c[0]], samples[i])), None)
                if home is None:
                    clusters.append([i])
                else:
                    home.append(i)
            top = max((len(c) for c in clusters), default=0)
            majority = next((c for c in clusters if len(c) == top), [])
            tie = sum(len(c) == top for c in clusters) > 1
            label = answers[majority[0]] if majority else None
            share = top / len(rows)
            correct = self._pseudo_label_correct(label, samples[rows[0]])
            self._count(len(rows), sum(answers[i] is None for i in rows), tie, correct)
            for i in rows:
                agree = i in majority
                out[i] = RewardResult(float(agree), {"agrees": float(agree)},
                                      {"answer": answers[i], "pseudo_label": label, "majority_share": share,
                                       "tie": tie, "pseudo_label_correct": correct})
        return out  # type: ignore[return-value]

    def _pseudo_label_correct(self, label: str | None, sample: Sample) -> bool | None:
        """The one read of the gold answer: is the pseudo-label right? (None when the row has no gold)."""
        if label is None or sample.answer in (None, ""):
            return None
        from mmrlvr.rewards.auto import same_answer

        return same_answer(label, str(sample.answer), sample)

    def _count(self, rows: int, unparsable: int, tie: bool, correct: bool | None) -> None:
        c = self._counts
        c["groups"] += 1
        c["rows"] += rows
        c["unparsable"] += unparsable
        c["tie_groups"] += int(tie)
        if correct is not None:
            c["judged"] += 1
            c["pseudo_correct"] += int(correct)

    def metrics(self) -> dict[str, Any]:
        """Since the last call: ``majority/pseudo_label_accuracy`` (groups with a gold answer), ``tie_share`` (of
        groups), ``unparsable`` (share of rows) — means, so several processes average them."""
        c = self._counts
        out = {"majority/tie_share": c["tie_groups"] / c["groups"] if c["groups"] else 0.0,
               "majority/unparsable": c["unparsable"] / c["rows"] if c["rows"] else 0.0}
        if c["judged"]:
            out["majority/pseudo_label_accuracy"] = c["pseudo_correct"] / c["judged"]
        for k in c:
            c[k] = 0
        return out
