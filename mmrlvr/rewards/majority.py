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

``votes`` (TTRL's vote/train split): 0 (default) votes over the G rows that train. An integer V > G
(``rollout.group_size``) makes the generate stage sample V responses per prompt (``samples_per_prompt`` in
``mmrlvr.train.reward_setup``); this reward takes the majority over all V and scores every one of them against it,
and the ``vote_split`` shape stage then keeps G rows per prompt for training (``mmrlvr.train.stages.shape``). TTRL's
official code votes over 64 samples and trains on 32 (``n_votes_per_prompt`` / ``n_samples_per_prompt``). The
``majority/*`` metrics are over the V votes; ``majority/votes`` (logged only when ``votes`` is set) is the
samples voted on per prompt. The parameter belongs on a top-level ``rewards`` entry, where the generate stage
reads it: a reward that is handed groups of any other size than V refuses them (a nested ``majority_vote`` with
``votes``, or an integration that is no trainer).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from mmrlvr.errors import UserError
from mmrlvr.rewards.base import REWARDS
from mmrlvr.rewards.parsing import locate_answer
from mmrlvr.types import Completion, RewardResult, Sample


@REWARDS.register("majority_vote")
class MajorityVote:
    """1.0 for a response whose answer agrees with its group's majority answer (module docstring)."""

    group_aware = True

    def __init__(self, template: str = "r1", think_prefilled: bool = False, votes: int = 0) -> None:
        if isinstance(votes, bool) or not isinstance(votes, int) or votes < 0:
            raise ValueError(f"votes must be 0 (vote over the G rows that train) or an integer > rollout.group_size "
                             f"(samples per prompt the pseudo-label is voted over), got {votes!r}")
        self.template, self.think_prefilled, self.votes = template, think_prefilled, votes
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

    def clusters(self, answers: Sequence[str | None], rows: Sequence[int], samples: Sequence[Sample]) -> list[list[int]]:
        """The rows of one group grouped by equivalent answers, in order of first appearance (unparsable rows
        left out): each answer joins the first cluster whose representative it matches."""
        out: list[list[int]] = []
        for i in rows:
            if answers[i] is None:
                continue
            home = next((c for c in out if self._agree(answers[i], answers[c[0]], samples[i])), None)
            if home is None:
                out.append([i])
            else:
                home.append(i)
        return out

    def score_batch(self, completions: Sequence[Completion | str], samples: Sequence[Sample], *,
                    group_index: Sequence[int]) -> list[RewardResult]:
        answers = [self._answer(c) for c in completions]
        out: list[RewardResult | None] = [None] * len(answers)
        for g in dict.fromkeys(group_index):
            rows = [i for i, gi in enumerate(group_index) if gi == g]
            if self.votes and len(rows) != self.votes:
                raise UserError(f"{type(self).__name__}: votes={self.votes} but a group of {len(rows)} rows came to "
                                "be scored; votes works on a top-level rewards entry (rewards[i].params.votes), "
                                "whose samples per prompt the generate stage draws (not nested in another reward, "
                                "nor outside the trainer)")
            clusters = self.clusters(answers, rows, samples)
            top = max((len(c) for c in clusters), default=0)
            majority = next((c for c in clusters if len(c) == top), [])
            tie = sum(len(c) == top for c in clusters) > 1
            share = top / len(rows)
            chosen, scores, extra = self.choose(clusters, majority, share, rows, answers, completions, samples)
            label = answers[chosen[0]] if chosen else None
            correct = self._pseudo_label_correct(label, samples[rows[0]])
            self._count(len(rows), sum(answers[i] is None for i in rows), tie, correct)
            for i in rows:
                agree = i in chosen
                out[i] = RewardResult(scores.get(i, float(agree)), {"agrees": float(agree)},
                                      {"answer": answers[i], "pseudo_label": label, "majority_share": share,
                                       "tie": tie, "pseudo_label_correct": correct, **extra})
        return out  # type: ignore[return-value]

    def choose(self, clusters: list[list[int]], majority: list[int], share: float, rows: list[int],
               answers: list[str | None], completions: Sequence[Completion | str], samples: Sequence[Sample],
               ) -> tuple[list[int], dict[int, float], dict[str, Any]]:
        """The pseudo-label's cluster, any row scores other than 1[agrees], and extra ``parsed`` fields: the
        majority, plainly (CoCoV overrides this by confidence)."""
        return majority, {}, {}

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
        groups), ``unparsable`` (share of rows) — means, so several processes average them — and, with ``votes``,
        ``majority/votes`` (rows per group voted on)."""
        c = self._counts
        out: dict[str, Any] = {"majority/tie_share": c["tie_groups"] / c["groups"] if c["groups"] else 0.0,
               "majority/unparsable": c["unparsable"] / c["rows"] if c["rows"] else 0.0}
        if c["judged"]:
            out["majority/pseudo_label_accuracy"] = c["pseudo_correct"] / c["judged"]
        if self.votes and c["groups"]:  # samples voted on per prompt (only with the vote/train split: today's
            out["majority/votes"] = c["rows"] / c["groups"]  # runs log what they logged)
        for k in c:
            c[k] = 0
        return out


@REWARDS.register("cocov")
class CoCoV(MajorityVote):
    """Confidence-gated label-free reward (CoCoV, arXiv 2606.03608; no official code is public).

    The majority's share s of a group (its largest cluster of equivalent answers over G rows) sets the mode:

    - ``s < low`` — low confidence, the majority is a weak guess: a **verifier pass** chooses the pseudo-label.
      Every parsable row is scored by ``verifier`` (a reward spec; default the label-free thinking–answer
      ``consistency`` reward, ``variant: plain``, on the row without its gold answer) and the cluster with the
      highest mean verifier score wins (ties: the larger, then the first). Rows in it score 1.
    - ``low ≤ s < high`` — majority vote, as ``majority_vote`` (TTRL).
    - ``s ≥ high`` — high confidence: majority vote plus an **exploration bonus** against diversity collapse:
      a parsable answer outside the majority scores ``bonus`` instead of 0, so a confident group does not
      punish its few explorers as hard as a wrong answer (group-normalised advantages still rank the majority
      first).

    The paper publishes neither the thresholds nor the verifier prompt nor the bonus: ``low`` 0.5 (no absolute
    majority), ``high`` 0.75 (6 of 8 agree) and ``bonus`` 0.2 are ours, config parameters, and the verifier is
    any reward the user names (an LLM judge through ``rubric`` fits). The bonus form — a flat reward for
    parsable minority answers — is our reading of "an exploration bonus". Like ``majority_vote``, no score reads
    the gold answer: the verifier receives rows with it stripped; gold is read only for
    ``majority/pseudo_label_accuracy``. Metrics: ``cocov/low_share``, ``cocov/high_share`` (of groups),
    ``cocov/verifier_changed`` (low groups whose verifier chose another cluster than the plain majority).
    Pairs with the ``pass_at_k`` advantage for pass@k-aware label-free training (the paper's setting).
    ``votes`` as for ``majority_vote`` (TTRL's vote/train split): the share, the modes, the verifier and the bonus
    are decided over the V votes, and G of the scored rows train.
    """

    def __init__(self, template: str = "r1", think_prefilled: bool = False, low: float = 0.5, high: float = 0.75,
                 bonus: float = 0.2, verifier: dict[str, Any] | str | None = None, votes: int = 0) -> None:
        super().__init__(template=template, think_prefilled=think_prefilled, votes=votes)
        if not 0.0 <= float(low) <= float(high) <= 1.0:
            raise ValueError(f"cocov: need 0 <= low <= high <= 1, got low={low}, high={high}")
        if not 0.0 <= float(bonus) < 1.0:
            raise ValueError(f"cocov: bonus must be in [0, 1) (below the majority's 1), got {bonus}")
        from mmrlvr.rewards.base import build_nested_reward

        self.low, self.high, self.bonus = float(low), float(high), float(bonus)
        self.verifier = build_nested_reward(verifier or {"name": "consistency", "params": {"variant": "plain"}},
                                            "cocov", "verifier")
        self._modes = {"low": 0, "mid": 0, "high": 0, "none": 0, "changed": 0}

    def choose(self, clusters, majority, share, rows, answers, completions, samples):
        if not clusters:  # no parsable answer: no pseudo-label, every row 0
            self._modes["none"] += 1
            return [], {}, {"cocov_mode": "none"}
        if share < self.low and len(clusters) > 1:
            self._modes["low"] += 1
            chosen, means = self._verified(clusters, rows, answers, completions, samples)
            self._modes["changed"] += int(chosen is not majority)
            return chosen, {}, {"cocov_mode": "verified", "verifier_means": means}
        if share >= self.high:
            self._modes["high"] += 1
            scores = {i: self.bonus for c in clusters if c is not majority for i in c}
            return majority, scores, {"cocov_mode": "explore"}
        self._modes["mid"] += 1
        return majority, {}, {"cocov_mode": "majority"}

    def _verified(self, clusters, rows, answers, completions, samples) -> tuple[list[int], list[float]]:
        from mmrlvr.rewards.base import score_batch

        members = [i for c in clusters for i in c]
        comps = [Completion(completions[i]) if isinstance(completions[i], str) else completions[i] for i in members]
        blind = [dataclasses.replace(samples[i], answer=None) for i in members]  # the verifier reads no label
        scored = dict(zip(members, (r.score for r in score_batch(self.verifier, comps, blind, [0] * len(members)))))
        means = [sum(scored[i] for i in c) / len(c) for c in clusters]
        best = max(range(len(clusters)), key=lambda j: (means[j], len(clusters[j]), -j))
        return clusters[best], means

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        m = self._modes
        groups = m["low"] + m["mid"] + m["high"] + m["none"]
        if groups:
            out.update({"cocov/low_share": m["low"] / groups, "cocov/high_share": m["high"] / groups,
                        "cocov/verifier_changed": m["changed"] / m["low"] if m["low"] else 0.0})
        for k in m:
            m[k] = 0
        return out
