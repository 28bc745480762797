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

**Boxes** (rows with ``answer_type: box``; ours — TTRL votes on final answers of math problems; grounding has no
label-free precedent we know of). The group's answers are read as box sets in the response's own frame (``coords``,
as the ``grounding`` reward's), so two answers need no image to be compared (location tokens excepted: their grid
needs the image's size). Two answers agree when their boxes match one to one with IoU ≥ ``box_iou`` (Hungarian
matching, ``same_answer``); the clusters form as above and the pseudo-label is the largest cluster's *medoid* (the
member with the highest summed overlap with the others — a representative that does not depend on which member
came first). With ``box_score: iou`` (default) every parsable row scores the ``grounding`` reward's mean IoU against
the pseudo-label — matched IoUs summed over max(own boxes, label's boxes), so an answer that hedges with k boxes
earns at most 1/k — and with ``box_score: agree``, 1[in the label's cluster] as for any answer. Hedges are stopped
at the vote itself: a set of several boxes agrees only with the same set (it cannot join every cluster one of its
boxes touches); an answer naming k boxes casts 1/k of a vote (the largest cluster is the one with the most votes, so
identical k-box hedges need k times as many rows as plain answers to win; where every answer names k boxes — a
task with k targets — the weights are equal and the vote is the plain majority); and an answer with a box covering more than ``max_area_fraction`` of the image (default 0.8; None: no
guard) neither votes nor scores (``majority/oversized``, a share of rows), so a group that collapses onto "the whole
image" has no pseudo-label at all instead of rewarding itself. Multiple-choice rows vote through the ``choice``
verifier, which already refuses an answer naming several options.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from mmrlvr.errors import UserError
from mmrlvr.metric import Metric
from mmrlvr.rewards.base import REWARDS
from mmrlvr.rewards.parsing import locate_answer
from mmrlvr.types import Completion, RewardResult, Sample


@REWARDS.register("majority_vote")
class MajorityVote:
    """1.0 for a response whose answer agrees with its group's majority answer (module docstring)."""

    group_aware = True

    def __init__(self, template: str = "r1", think_prefilled: bool = False, votes: int = 0, box_iou: float = 0.5,
                 box_score: str = "iou", max_area_fraction: float | None = 0.8, coords: str = "absolute") -> None:
        from mmrlvr.boxes import COORD_ALIASES

        if isinstance(votes, bool) or not isinstance(votes, int) or votes < 0:
            raise ValueError(f"votes must be 0 (vote over the G rows that train) or an integer > rollout.group_size "
                             f"(samples per prompt the pseudo-label is voted over), got {votes!r}")
        if not 0.0 < float(box_iou) <= 1.0:
            raise ValueError(f"box_iou must be in (0, 1], got {box_iou!r}")
        if box_score not in ("iou", "agree"):
            raise ValueError(f"box_score must be 'iou' or 'agree', got {box_score!r}")
        if max_area_fraction is not None and not 0.0 < float(max_area_fraction) <= 1.0:
            raise ValueError(f"max_area_fraction must be in (0, 1] or null, got {max_area_fraction!r}")
        if coords not in COORD_ALIASES:
            raise ValueError(f"unknown coords {coords!r}; known: {', '.join(COORD_ALIASES)}")
        self.template, self.think_prefilled, self.votes = template, think_prefilled, votes
        self.box_iou, self.box_score, self.coords = float(box_iou), box_score, coords
        self.max_area_fraction = None if max_area_fraction is None else float(max_area_fraction)
        self._overlap: Any = None  # the grounding reward that scores box overlaps, built on first use
        self._counts = {"groups": 0, "tie_groups": 0, "unparsable": 0, "rows": 0, "judged": 0, "pseudo_correct": 0,
                        "oversized": 0, "box_rows": 0}

    def __call__(self, completion: Completion | str, sample: Sample) -> RewardResult:
        return self.score_batch([completion], [sample], group_index=[0])[0]

    def _answer(self, completion: Completion | str) -> str | None:
        text = completion if isinstance(completion, str) else completion.text
        answer = locate_answer(text, self.template, self.think_prefilled)[0]
        return answer.strip() if answer and answer.strip() else None

    def _agree(self, a: str, b: str, sample: Sample) -> bool:
        from mmrlvr.rewards.auto import same_answer

        # the row without its gold answer: equivalence is the verifier's, by answer type, and reads no label
        return same_answer(a, b, dataclasses.replace(sample, answer=None), iou_threshold=self.box_iou)

    def _oversized(self, answer: str, sample: Sample) -> bool:
        """Does a box of ``answer`` cover more than ``max_area_fraction`` of the image the model saw? (False when
        the guard is off or the image's size is unknown for an absolute-pixel answer.)"""
        from mmrlvr.boxes import box_area, to_frame
        from mmrlvr.rewards.grounding import frame_sizes, read_boxes

        if self.max_area_fraction is None:
            return False
        boxes, fmt = read_boxes(answer, self.coords)
        seen = frame_sizes(sample)[0]
        if not boxes or seen is None:
            return False
        try:
            pixels = to_frame(boxes, fmt, seen, seen)
        except ValueError:
            return False
        return any(box_area(b) / (seen[0] * seen[1]) > self.max_area_fraction for b in pixels)

    def _box_overlap(self, answer: str, label: str, sample: Sample) -> float:
        """The ``grounding`` reward's mean IoU of ``answer`` against ``label``, both in the response's frame (matched
        IoUs over max(len(answer's boxes), len(label's boxes))): 0 where ``answer`` holds no box."""
        from mmrlvr.errors import DataError
        from mmrlvr.rewards.grounding import GroundingReward, location_boxes

        probe = dataclasses.replace(sample, answer=label)
        if not (location_boxes(answer) or location_boxes(label)):
            probe = dataclasses.replace(probe, meta={}, images=[])  # one frame: no resizing, no clipping
        if self._overlap is None:  # one verifier for every comparison (its counters are never read)
            self._overlap = GroundingReward(max_area_fraction=None)
        try:
            # IoU does not change when both boxes are scaled alike: the numbers as written are compared
            return self._overlap.check(answer, probe).score
        except DataError:
            return 0.0

    def _weight(self, answer: str | None, sample: Sample) -> float:
        """A row's vote: 1, or for a box answer naming k boxes 1/k (a hedge across k regions is a k-th of a claim)."""
        if answer is None or sample.answer_type != "box":
            return 1.0
        from mmrlvr.rewards.grounding import read_boxes

        return 1.0 / max(1, len(read_boxes(answer, self.coords)[0]))

    def _votes_of(self, completions: Sequence[Completion | str], samples: Sequence[Sample]) -> list[str | None]:
        """Each row's answer, None where it does not vote: unparsable, or (box rows) a box over the area guard."""
        answers = [self._answer(c) for c in completions]
        for i, s in enumerate(samples):
            if s.answer_type == "box":
                self._counts["box_rows"] += 1
                if answers[i] is not None and self._oversized(answers[i], s):
                    self._counts["oversized"] += 1
                    answers[i] = None
        return answers

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
        answers = self._votes_of(completions, samples)
        out: list[RewardResult | None] = [None] * len(answers)
        for g in dict.fromkeys(group_index):
            rows = [i for i, gi in enumerate(group_index) if gi == g]
            if self.votes and len(rows) != self.votes:
                raise UserError(f"{type(self).__name__}: votes={self.votes} but a group of {len(rows)} rows came to "
                                "be scored; votes works on a top-level rewards entry (rewards[i].params.votes), "
                                "whose samples per prompt the generate stage draws (not nested in another reward, "
                                "nor outside the trainer)")
            clusters = self.clusters(answers, rows, samples)
            mass = [sum(self._weight(answers[i], samples[i]) for i in c) for c in clusters]
            top = max(mass, default=0.0)
            majority = next((c for c, m in zip(clusters, mass) if math.isclose(m, top)), [])
            tie = sum(math.isclose(m, top) for m in mass) > 1
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
        """The pseudo-label's cluster (its first member is the label), any row scores other than 1[agrees], and
        extra ``parsed`` fields: the majority, plainly (CoCoV overrides this by confidence); for box rows the
        cluster's medoid leads, and with ``box_score: iou`` every parsable row scores its overlap with it."""
        if not majority or samples[rows[0]].answer_type != "box":
            return majority, {}, {}
        medoid = self._medoid(majority, answers, samples)
        chosen = [medoid] + [i for i in majority if i != medoid]
        if self.box_score == "agree":
            return chosen, {}, {}
        label = answers[medoid]
        scores = {i: self._box_overlap(answers[i], label, samples[i]) for i in rows if answers[i] is not None}
        return chosen, scores, {}

    def _medoid(self, cluster: list[int], answers: list[str | None], samples: Sequence[Sample]) -> int:
        """The member with the highest summed overlap with the others (the first among equals)."""
        if len(cluster) <= 2:
            return cluster[0]
        total = {i: sum(self._box_overlap(answers[i], answers[j], samples[i]) for j in cluster if j != i)
                 for i in cluster}
        return max(cluster, key=lambda i: (total[i], -cluster.index(i)))

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
        """Since the last call, as means over what they are shares of: ``majority/pseudo_label_accuracy`` (groups
        with a gold answer), ``tie_share`` (groups), ``unparsable`` (rows), with ``votes`` ``majority/votes`` (rows
        voted on per group), and for box answers ``majority/oversized`` (rows over the area guard)."""
        c = self._counts
        out: dict[str, Any] = {
            "majority/tie_share": Metric.mean(c["tie_groups"] / c["groups"] if c["groups"] else 0.0, n=c["groups"]),
            "majority/unparsable": Metric.mean(c["unparsable"] / c["rows"] if c["rows"] else 0.0, n=c["rows"])}
        if c["judged"]:
            out["majority/pseudo_label_accuracy"] = Metric.mean(c["pseudo_correct"] / c["judged"], n=c["judged"])
        if self.votes and c["groups"]:
            out["majority/votes"] = Metric.mean(c["rows"] / c["groups"], n=c["groups"])
        if c["box_rows"] and self.max_area_fraction is not None:
            out["majority/oversized"] = Metric.mean(c["oversized"] / c["rows"] if c["rows"] else 0.0, n=c["rows"])
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
    are decided over the V votes, and G of the scored rows train. On box rows the vote is ``majority_vote``'s
    (``box_iou``, ``max_area_fraction``, ``coords``: clusters by IoU, a k-box answer casts 1/k of a vote, a
    whole-image box does not vote) and rows score as above, 1 in the chosen cluster (``box_score: agree``).
    """

    def __init__(self, template: str = "r1", think_prefilled: bool = False, low: float = 0.5, high: float = 0.75,
                 bonus: float = 0.2, verifier: dict[str, Any] | str | None = None, votes: int = 0,
                 box_iou: float = 0.5, max_area_fraction: float | None = 0.8, coords: str = "absolute") -> None:
        super().__init__(template=template, think_prefilled=think_prefilled, votes=votes, box_iou=box_iou,
                         box_score="agree", max_area_fraction=max_area_fraction, coords=coords)
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
            out.update({"cocov/low_share": Metric.mean(m["low"] / groups, n=groups),
                        "cocov/high_share": Metric.mean(m["high"] / groups, n=groups),
                        "cocov/verifier_changed": Metric.mean(m["changed"] / m["low"] if m["low"] else 0.0, n=m["low"])})
        for k in m:
            m[k] = 0
        return out
