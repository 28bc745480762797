"""Prompt samplers: which prompts each step draws (``rollout.sampler`` + ``rollout.sampler_params``).

A sampler is a registered class built once per run with ``(n, batch_size, seed, **params)``:

- ``indices(step, round)`` returns the *global* batch of step ``step`` (``batch_size`` dataset indices; round r > 0
  is a dynamic-sampling refill round and should draw other prompts). Every process calls it with the same
  arguments and must get the same answer: each takes its contiguous share.
- ``group_sizes(prompts, budget)``: a sampler that sizes groups (``sizes_groups = True``) gives each of a
  process's prompts its own group size, ``budget`` samples in all (its share of the sampler's ``budget`` per step);
  the default returns None and every prompt gets ``rollout.group_size``. Such a sampler also says, for config
  checks, its per-step budget and smallest group (``step_budget``, ``smallest_group``: class methods reading the
  config, no sampler built).
- ``observe(outcome)`` is called after every step with every group the step generated and their rewards
  (``StepOutcome``: a dynamic-sampling refill step's every round, kept or dropped groups alike; gathered from
  every process, so every rank's sampler sees the same numbers and stays identical). A curriculum or a budget
  allocator learns here.
- ``probe_candidates(step, round)`` (optional) names prompts to probe *before* the step: the generate stage samples
  ``probe_samples`` responses to each (at most ``probe_tokens`` new tokens), judges them with the verifier and
  hands the gathered outcome to ``observe_probe(outcome)`` — how a curriculum acts on prompts it has never drawn.
- ``step_metrics(step, round)`` (optional): ``sampler/...`` metrics of the step's draw, logged with the step.
- ``state_dict()`` / ``load_state_dict(state)`` put what it learned in checkpoints, so a resumed run draws exactly
  what an uninterrupted one would.

The built-in ``uniform`` draws a fresh permutation of the data per
epoch, a pure function of (seed, step): it has no state. ``disagreement`` (SGAC) ranks prompts with a selector
learned over their success rate, reward variance, answer disagreement and difficulty; ``budget`` (TRACE) sizes
groups by p(1 − p). Both probe unseen prompts so they act from step 1. No torch here: the sampler's names and
parameters are checked at config load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import math
import random

from mmrlvr.methods import Param, declare
from mmrlvr.metric import Metric
from mmrlvr.registry import Registry
from mmrlvr.train.data import DataOrder


@dataclass
class StepOutcome:
    """What a step learned about its prompts, over every process (in rank order)."""

    step: int
    prompts: list[int]  # dataset index of each of the step's prompts
    rewards: list[list[float]]  # [prompts][G] total reward of each rollout (after shaping)
    accuracy: list[list[float]] | None = None  # [prompts][G] 1.0 where the verifier judged the answer right
    answers: list[list[str | None]] | None = None  # [prompts][G] each rollout's final answer (None: unparsable)


class Sampler:
    """Base class: a stateless sampler needs only ``indices``."""

    #: True when the sampler sizes each prompt's group itself (``group_sizes``) within ``budget`` samples per step
    sizes_groups: ClassVar[bool] = False

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.budget = 0  # samples per step over every process, for a sampler that sizes groups

    def group_sizes(self, prompts: list[int], budget: int | None = None) -> list[int] | None:
        """The group size of each of ``prompts`` (a process's share of the step, in order) within ``budget``
        samples (default: the whole ``budget``); None: every prompt gets ``rollout.group_size``."""
        return None

    @classmethod
    def step_budget(cls, cfg: Any, params: dict[str, Any]) -> int | None:
        """Samples per step over every process that this sampler would be given by ``cfg`` (None: not sizing)."""
        return None

    @classmethod
    def smallest_group(cls, cfg: Any, params: dict[str, Any]) -> tuple[int, str] | None:
        """The smallest group this sampler can make under ``cfg``, with the setting that fixes it (None: it makes
        ``rollout.group_size`` groups)."""
        return None

    def indices(self, step: int, round: int = 0) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from a finished step (default: nothing)."""

    def probe_candidates(self, step: int, round: int = 0) -> list[int]:
        """Prompts to probe before step ``step`` (a few samples each, judged; ``observe_probe`` gets the outcome):
        the same list on every process (default: none)."""
        return []

    def observe_probe(self, outcome: StepOutcome) -> None:
        """Learn from the probe of ``probe_candidates`` (``outcome.accuracy``: the verifier's 1/0 per sample,
        None without gold answers; ``rewards`` is the same 1/0 — a probe calls no reward)."""

    def step_metrics(self, step: int, round: int = 0) -> dict[str, Any]:
        """``sampler/...`` metrics of the step's draw (after ``indices``; default: none). Every process's sampler
        draws the same, so a plain number is taken as the same on every process; return a
        ``mmrlvr.metric.Metric`` to say otherwise."""
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


#: name -> Sampler subclass (config key ``rollout.sampler``)
SAMPLERS: Registry[type[Sampler]] = Registry("prompt sampler")


@SAMPLERS.register("uniform")
class UniformSampler(Sampler):
    """A fresh permutation of the data per epoch, seeded by (seed, epoch); refill round r > 0 walks an order of its
    own (seeded by seed and r), so its prompts differ from round 0's and every process and a resumed run agree."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        super().__init__(n, batch_size, seed)
        self._orders: dict[int, DataOrder] = {0: DataOrder(n, batch_size, seed)}

    def indices(self, step: int, round: int = 0) -> list[int]:
        if round not in self._orders:
            self._orders[round] = DataOrder(self.n, self.batch_size, self.seed * 1_000_003 + round)
        return self._orders[round].indices(step)


declare("sampler", "uniform", "a fresh permutation of the training data per epoch (stateless; the default)")


def answer_entropy(answers: list[str | None]) -> float:
    """Shannon entropy (nats) of a group's final answers: −Σ_a (c_a/G)·ln(c_a/G) over distinct answers, compared
    after light normalisation (case, spaces, numbers as numbers: ``mmrlvr.evaluation.normalise_answer``); an
    unparsable answer (None) is one more category of its own [ours]. 0 when every answer agrees, ln G at most."""
    from collections import Counter

    from mmrlvr.evaluation import normalise_answer

    if not answers:
        return 0.0
    counts = Counter(None if a is None else normalise_answer(str(a)) for a in answers)
    g = len(answers)
    return 0.0 - sum(c / g * math.log(c / g) for c in counts.values())  # 0.0, never -0.0, when all agree


#: the disagreement sampler's selectors (``rollout.sampler_params.selector``)
SELECTORS = ("learned", "entropy")

#: the learned selector's features, in order (after a constant 1): success probability, reward variance,
#: normalised answer entropy, difficulty
FEATURES = ("p", "var", "entropy", "difficulty")


def group_features(outcomes: list[float], answers: list[str | None] | None) -> tuple[float, float, float]:
    """(p, v, h) of one group: p the mean of its verifiable outcomes (the verifier's 1/0 where the rows have a gold
    answer, else each total reward >= 1 as 1), v their population variance (with a 1/0 verifier p(1 − p)), h the
    entropy of its final answers over ln G (``answer_entropy``; 0 for a group of one, or without answers)."""
    g = len(outcomes)
    if g == 0:
        return 0.0, 0.0, 0.0
    p = sum(outcomes) / g
    v = sum((x - p) ** 2 for x in outcomes) / g
    h = answer_entropy(list(answers)) / math.log(len(answers)) if answers and len(answers) > 1 else 0.0
    return p, v, h


def _level(value: Any) -> float | None:
    """A difficulty level as a number (``3``, ``"3"``, ``"Level 3"``), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        import re

        m = re.search(r"-?\d+(?:\.\d+)?", value)
        return float(m.group()) if m else None
    return None


def prompt_difficulty(samples: list[Any]) -> list[float]:
    """Each prompt's difficulty in [0, 1] (the learned selector's fourth feature, SGAC's "semantic difficulty").

    The dataset's own level when every row carries one (``meta["level"]`` or ``meta["difficulty"]``: ``3``,
    ``"Level 3"``), scaled as (x − min) / (max − min); else [ours] the percentile of the prompt's length in words
    among the data (ties share their mean rank: rank / (n − 1)), a question's length standing in for its
    difficulty. All equal (or one prompt): 0."""
    n = len(samples)
    levels = [_level((getattr(s, "meta", None) or {}).get("level", (getattr(s, "meta", None) or {}).get(
        "difficulty"))) for s in samples]
    if n and all(x is not None for x in levels):
        lo, hi = min(levels), max(levels)
        return [0.0 if hi == lo else (x - lo) / (hi - lo) for x in levels]
    lengths = [len(_prompt_text(s).split()) for s in samples]
    if n < 2 or len(set(lengths)) == 1:
        return [0.0] * n
    order = sorted(range(n), key=lambda i: lengths[i])
    rank = [0.0] * n
    j = 0
    while j < n:  # ties share their mean rank
        k = j
        while k + 1 < n and lengths[order[k + 1]] == lengths[order[j]]:
            k += 1
        for t in range(j, k + 1):
            rank[order[t]] = (j + k) / 2
        j = k + 1
    return [r / (n - 1) for r in rank]


def _prompt_text(sample: Any) -> str:
    out = []
    for msg in getattr(sample, "messages", None) or []:
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"]
    return " ".join(out)


def solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x with a·x = b (Gaussian elimination with partial pivoting; a small symmetric positive definite system)."""
    n = len(b)
    m = [list(map(float, row)) + [float(y)] for row, y in zip(a, b)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[piv] = m[piv], m[c]
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for k in range(c, n + 1):
                m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _outcomes(outcome: StepOutcome, j: int) -> list[float] | None:
    """Group ``j``'s verifiable outcomes: the verifier's 1/0, else each total reward >= 1 as 1 (None: neither)."""
    if outcome.accuracy is not None:
        return [float(x) for x in outcome.accuracy[j]]
    if outcome.rewards is not None and outcome.rewards[j]:
        return [1.0 if x >= 1.0 else 0.0 for x in outcome.rewards[j]]
    return None


@SAMPLERS.register("disagreement")
class DisagreementSampler(Sampler):
    """SGAC (Selector-Guided Autonomous Curriculum, arXiv 2605.01823; no official code is public): a selector over
    four features of each prompt — success probability p, reward variance v, answer disagreement h (the entropy of
    its final answers over ln G) and difficulty d — ranks prompts and the step trains the top ones.

    ``selector: learned`` (the default: the paper's method) — a linear ranker, score = w·[1, p, v, h, d], fitted
    online by ridge regression to each prompt's *later gain*: when a prompt is trained again, its features at the
    earlier visit are one example and the change of its success rate between the two visits (p_now − p_then) the
    target [ours: the paper learns "reasoning gains in subsequent iterations"; a prompt's own next-visit gain is
    the gain a batch curriculum can attribute per prompt without extra evaluations]. w = (Σ x xᵀ + ``l2``·I)⁻¹
    (Σ x y + ``l2``·w₀) with the prior w₀ = entropy alone (0, 0, 0, 1, 0) — the paper's finding that disagreement
    is the strongest single predictor — so before any prompt comes back the ranking is the entropy ranking and the
    data take over as pairs accumulate [ours: ridge, the prior and ``l2`` 1.0; the paper names neither model nor
    fit]. The target regresses to the mean (a prompt measured low tends to measure higher next time), which the
    fit partly reads as gain [ours: a known bias of a per-prompt revisit target]. A step ranks a seeded random
    pool of ``pool`` × prompts_per_step candidates (SGAC's "siphoning candidates from a large pool") and takes the
    best (ties broken by seeded keys).
    ``selector: entropy`` — the draw before the selector: prompts drawn without replacement with probability
    ∝ max(h, ``floor``) (Efraimidis–Spirakis keys) over every known prompt.

    Acting from step 1: with ``probe_samples`` k > 0 (default 2) the step's candidate pool is siphoned *before*
    the step, and the candidates never seen are probed — k samples each (``probe_tokens`` new tokens; 0: the run's
    ``rollout.max_new_tokens``), judged by the verifier alone (no reward call) — so their features are known and
    the selector chooses among the whole pool from step 0. The probe's features rank; they never make a training
    pair (a probe and the step that follows it see the same policy) [ours: the paper measures its features by
    sampling candidates, with no stated count]. With ``probe_samples: 0`` the step first takes prompts never seen
    (in a seeded permutation) and the selector chooses only among seen ones: in a first epoch larger than the run
    it never acts. ``sampler/weighted_draws`` logs the share of the step's prompts the selector chose,
    ``sampler/probe_samples`` the probe's samples, ``sampler/selector_pairs`` the examples fitted.

    Refill rounds of dynamic sampling probe nothing and exclude the step's earlier rounds' prompts [ours]. Every
    process computes the same pool, probes its share and the outcomes are gathered (all ranks learn the same).
    State in checkpoints: each prompt's last features (trained and probed), the fit's sums.
    """

    def __init__(self, n: int, batch_size: int, seed: int, selector: str = "learned", floor: float = 0.05,
                 pool: float = 2.0, probe_samples: int = 2, probe_tokens: int = 0, l2: float = 1.0) -> None:
        super().__init__(n, batch_size, seed)
        if not 0.0 < float(floor) <= 1.0:
            raise ValueError(f"disagreement: floor must be in (0, 1], got {floor}")
        if selector not in SELECTORS:
            raise ValueError(f"disagreement: selector must be one of {', '.join(SELECTORS)}, got {selector!r}")
        self.selector, self.floor, self.pool = selector, float(floor), float(pool)
        self.probe_samples, self.probe_tokens, self.l2 = int(probe_samples), int(probe_tokens), float(l2)
        self.entropy: dict[int, float] = {}  # prompt -> h of its last trained group
        self.features: dict[int, list[float]] = {}  # prompt -> [p, v, h, step] of its last trained group
        self.probed: dict[int, list[float]] = {}  # prompt -> [p, v, h] of its probe
        self.difficulty: list[float] = [0.0] * n  # prompt -> d (set_difficulty; from the data, not state)
        k = 1 + len(FEATURES)
        self.gram = [[0.0] * k for _ in range(k)]  # Σ x xᵀ over the training pairs
        self.moment = [0.0] * k  # Σ x y
        self.pairs = 0
        self._w: list[float] | None = None
        self.last_metrics: dict[str, float] = {}
        order = list(range(n))
        random.Random(seed * 7_919 + 17).shuffle(order)
        self._order = order  # unseen prompts are taken in this order

    # ------------------------------------------------------------------------------------------ features
    def set_difficulty(self, values: list[float]) -> None:
        """Each prompt's difficulty d in [0, 1] (``prompt_difficulty`` of the training data)."""
        if len(values) != self.n:
            raise ValueError(f"disagreement: {len(values)} difficulties for {self.n} prompts")
        self.difficulty = [float(x) for x in values]

    def known(self, i: int) -> bool:
        return i in self.features or i in self.probed or i in self.entropy

    def x(self, i: int) -> list[float]:
        """The selector's input for prompt ``i``: [1, p, v, h, d] from its last trained group, else its probe."""
        f = self.features.get(i) or self.probed.get(i)
        p, v, h = (f[0], f[1], f[2]) if f else (0.0, 0.0, self.entropy.get(i, 0.0))
        return [1.0, p, v, h, self.difficulty[i]]

    def weights(self) -> list[float]:
        """The ranker's w = (Σ x xᵀ + l2·I)⁻¹ (Σ x y + l2·w₀), w₀ = entropy alone."""
        if self._w is None:
            k = len(self.moment)
            prior = [0.0] * k
            prior[1 + FEATURES.index("entropy")] = 1.0
            a = [[self.gram[r][c] + (self.l2 if r == c else 0.0) for c in range(k)] for r in range(k)]
            self._w = solve(a, [m + self.l2 * w0 for m, w0 in zip(self.moment, prior)])
        return self._w

    def score(self, i: int) -> float:
        return sum(w * x for w, x in zip(self.weights(), self.x(i)))

    def weight(self, i: int) -> float:
        """``selector: entropy``'s draw weight, max(h, floor)."""
        return max(self.x(i)[1 + FEATURES.index("entropy")], self.floor)

    # ------------------------------------------------------------------------------------------ the draw
    def probing(self, round: int) -> bool:
        return self.probe_samples > 0 and round == 0

    def candidate_pool(self, step: int, round: int, exclude: set[int] | None = None,
                       among: list[int] | None = None) -> list[int]:
        """A seeded random pool of ``pool`` × prompts_per_step prompts (of ``among``, default all; none of
        ``exclude``), in dataset order."""
        exclude = exclude or set()
        eligible = [i for i in (range(self.n) if among is None else among) if i not in exclude]
        size = min(len(eligible), max(self.batch_size, int(round_half_up(self.pool * self.batch_size))))
        rng = random.Random(((self.seed * 1_000_003 + step) * 101 + round) * 31 + 7)
        return sorted(rng.sample(eligible, size))

    def probe_candidates(self, step: int, round: int = 0) -> list[int]:
        """The prompts to probe before step ``step`` (round 0 with ``probe_samples`` > 0): the pool's unknown."""
        if not self.probing(round):
            return []
        return [i for i in self.candidate_pool(step, round) if not self.known(i)]

    def choose(self, candidates: list[int], k: int, step: int, round: int) -> list[int]:
        """``k`` of ``candidates`` by the selector: the highest scores (learned), or a weighted draw (entropy)."""
        if k <= 0 or not candidates:
            return []
        rng = random.Random((self.seed * 1_000_003 + step) * 101 + round)
        if self.selector == "entropy":
            keys = sorted(((rng.random() ** (1.0 / self.weight(i)), i) for i in candidates), reverse=True)
            return [i for _, i in keys[:k]]
        ranked = sorted(((-self.score(i), rng.random(), i) for i in candidates))
        return [i for _, _, i in ranked[:k]]

    def indices(self, step: int, round: int = 0) -> list[int]:
        exclude: set[int] = set()
        for r in range(round):
            exclude.update(self.indices(step, r))
        k = self.batch_size
        if self.probing(round):  # the pool, probed: the selector chooses among all of it
            pool = self.candidate_pool(step, round, exclude)
            chosen = self.choose([i for i in pool if self.known(i)], k, step, round)
            out = chosen + [i for i in pool if not self.known(i)][:k - len(chosen)]  # not probed (a bare call)
        else:  # unseen prompts first, then the selector among the seen
            out = [i for i in self._order if not self.known(i) and i not in exclude][:k]
            rest = [i for i in range(self.n) if self.known(i) and i not in exclude and i not in out]
            if self.selector == "learned":
                rest = self.candidate_pool(step, round, among=rest)
            chosen = self.choose(rest, k - len(out), step, round)
            out += chosen
        if len(out) < k:  # fewer prompts than a batch: the others not yet taken, then repeats
            taken = set(out)
            out += [i for i in self._order if i not in taken and i not in exclude][:k - len(out)]
        if len(out) < k:
            out += [out[j % len(out)] for j in range(k - len(out))] if out else []
        self.last_metrics = {"sampler/weighted_draws": Metric.same(len(chosen) / k)}
        if self.selector == "learned":
            self.last_metrics["sampler/selector_pairs"] = Metric.same(float(self.pairs))
        return out

    def step_metrics(self, step: int, round: int = 0) -> dict[str, Metric]:
        """What the last ``indices`` call chose: the share the selector chose, the pairs fitted."""
        return dict(self.last_metrics)

    # ------------------------------------------------------------------------------------------ learning
    def observe(self, outcome: StepOutcome) -> None:
        if outcome.answers is None:
            return
        for j, (i, answers) in enumerate(zip(outcome.prompts, outcome.answers)):
            if i < 0 or not answers:
                continue
            values = _outcomes(outcome, j) or [0.0] * len(answers)
            p, v, h = group_features(values, answers)
            prev = self.features.get(i)
            if prev is not None and prev[3] < outcome.step:  # a later visit: one example of the gain
                x = [1.0, prev[0], prev[1], prev[2], self.difficulty[i]]
                y = p - prev[0]
                for r in range(len(x)):
                    self.moment[r] += x[r] * y
                    for c in range(len(x)):
                        self.gram[r][c] += x[r] * x[c]
                self.pairs += 1
                self._w = None
            self.features[i] = [p, v, h, float(outcome.step)]
            self.entropy[i] = h
            self.probed.pop(i, None)  # a trained group's features replace its probe's

    def observe_probe(self, outcome: StepOutcome) -> None:
        """The probe's groups (``probe_candidates``): their features rank, they make no training pair. Without a
        gold answer p and v are 0 (the probe calls no reward) and only h is measured."""
        for j, (i, answers) in enumerate(zip(outcome.prompts, outcome.answers or [])):
            if i < 0 or not answers or i in self.features:
                continue
            values = [float(x) for x in outcome.accuracy[j]] if outcome.accuracy is not None else [0.0] * len(answers)
            self.probed[i] = list(group_features(values, answers))

    def state_dict(self) -> dict[str, Any]:
        return {"entropy": dict(self.entropy), "features": {i: list(f) for i, f in self.features.items()},
                "probed": {i: list(f) for i, f in self.probed.items()},
                "gram": [list(r) for r in self.gram], "moment": list(self.moment), "pairs": self.pairs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = state or {}
        self.entropy = {int(k): float(v) for k, v in state.get("entropy", {}).items()}
        self.features = {int(k): [float(x) for x in v] for k, v in state.get("features", {}).items()}
        self.probed = {int(k): [float(x) for x in v] for k, v in state.get("probed", {}).items()}
        k = 1 + len(FEATURES)
        self.gram = [[float(x) for x in r] for r in state.get("gram", [[0.0] * k for _ in range(k)])]
        self.moment = [float(x) for x in state.get("moment", [0.0] * k)]
        self.pairs = int(state.get("pairs", 0))
        self._w = None


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def _probe_check(cfg: Any, p: dict[str, Any]) -> list[str]:
    out = []
    if p.get("probe_tokens", 0) > cfg.rollout.max_new_tokens:
        out.append(f"rollout.sampler_params.probe_tokens={p['probe_tokens']} exceeds rollout.max_new_tokens="
                   f"{cfg.rollout.max_new_tokens} (a probe sample is never longer than a training one)")
    return out


def _disagreement_notes(cfg: Any, p: dict[str, Any]) -> list[str]:
    given = cfg.rollout.sampler_params or {}
    out = []
    if p["selector"] == "learned" and "floor" in given:
        out.append("rollout.sampler_params.floor is read by selector: entropy only (the learned selector ranks)")
    if p["probe_samples"] == 0 and "probe_tokens" in given:
        out.append("rollout.sampler_params.probe_tokens is inert with probe_samples: 0 (nothing is probed)")
    if p["selector"] == "entropy" and p["probe_samples"] == 0 and "pool" in given:
        out.append("rollout.sampler_params.pool is inert with selector: entropy and probe_samples: 0 (the draw is "
                   "over every seen prompt)")
    return out


declare("sampler", "disagreement", "SGAC: a selector over each prompt's success probability, reward variance, answer "
        "entropy and difficulty ranks a pool of candidates (probed before the step, so it acts from step 1)",
        Param("selector", "learned", "learned: a linear ranker fitted online to each prompt's later gain (the "
              "paper's selector); entropy: draws in proportion to the answer entropy", choices=SELECTORS),
        Param("floor", 0.05, "selector entropy: the smallest weight (of the normalised entropy H / ln G), so every "
              "prompt keeps a chance", "in (0, 1]", lambda v: 0 < v <= 1),
        Param("pool", 2.0, "candidates per step, as a multiple of prompts_per_step: the pool probed and ranked",
              ">= 1", lambda v: v >= 1),
        Param("probe_samples", 2, "samples per unknown candidate, judged before the step (0: no probe; unseen "
              "prompts are then taken first)", ">= 0", lambda v: v >= 0),
        Param("probe_tokens", 0, "new tokens of a probe sample (0: rollout.max_new_tokens)", ">= 0",
              lambda v: v >= 0),
        Param("l2", 1.0, "selector learned: the ridge pull toward the entropy-only prior", "> 0", lambda v: v > 0),
        source="arXiv:2605.01823", config_check=_probe_check, plan_notes=_disagreement_notes)


def allocate_budget(scores: list[float], budget: int, g_min: int, g_max: int) -> list[int]:
    """Integer group sizes G_i ∝ scores within [g_min, g_max] that sum to ``budget`` (TRACE's allocation).

    Water-filling: the λ with Σ clamp(λ·s_i, g_min, g_max) = budget (bisection), then each size rounded down and
    the units left given to the largest remainders among prompts below g_max. All-zero scores split the budget
    evenly. When the caps bind — every prompt with a score at g_max and the rest (score 0) at g_min still short of
    the budget — the units left go round the prompts below g_max (largest remainder, then score, first) [ours: the
    budget is kept exactly]. A budget outside [n·g_min, n·g_max] is clamped to it (the caller logs the total it got)."""
    n = len(scores)
    if n == 0:
        return []
    budget = min(max(int(budget), n * g_min), n * g_max)
    s = [max(float(x), 0.0) for x in scores]
    if sum(s) <= 0:
        s = [1.0] * n

    def total(lam: float) -> float:
        return sum(min(max(lam * x, g_min), g_max) for x in s)

    lo, hi = 0.0, 1.0
    while total(hi) < budget and hi < 1e12:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if total(mid) < budget:
            lo = mid
        else:
            hi = mid
    real = [min(max(hi * x, g_min), g_max) for x in s]
    sizes = [int(math.floor(r + 1e-9)) for r in real]
    left = budget - sum(sizes)
    order = sorted(range(n), key=lambda i: (-(real[i] - sizes[i]), -s[i], i))
    while left > 0:  # largest remainders first; when the caps bind (zero scores at g_min), round after round
        for i in order:
            if left > 0 and sizes[i] < g_max:
                sizes[i] += 1
                left -= 1
    return sizes


@SAMPLERS.register("budget")
class BudgetSampler(UniformSampler):
    """Reward-contrast budget allocation (TRACE, arXiv 2606.11119, its prompt-level part; no official code is
    public): how many responses each prompt gets.

    Prompts are drawn as ``uniform`` draws them. Per prompt an EMA of its pass rate, p̂ ← (1 − ``ema``)·p̂ + ``ema``·
    (the share of its last group the verifier judged right; the first observation sets p̂). A step's group sizes
    G_i ∝ p̂_i(1 − p̂_i) — the variance of a Bernoulli reward, the contrast a group can show — within
    [``g_min``, ``g_max``] and a per-step sample ``budget`` (``allocate_budget``); prompts not seen yet get the
    default G and the seen ones share what is left. ``budget`` defaults to prompts_per_step × G and must lie in
    [B·g_min, B·g_max] (validated). Where the unseen prompts' G each leaves the seen an impossible share (a budget
    far from B·G early in the run), the unseen sizes absorb the difference [ours: the total stays the budget, so
    every step, and every process, has the same number of samples]; ``sampler/samples`` logs each step's total.
    With several processes each allocates its even share of the budget over its own prompts (whole groups per
    rank, equal rows per rank) [ours: the paper allocates over the whole batch]; the budget must divide by the
    number of processes. ``ema`` 0.5, ``g_min`` 2 and ``g_max`` 2·G are ours
    (the paper's values are not public).

    Acting from step 1: TRACE predicts an unseen root's success probability with a shared predictor trained on
    the run's history; here [ours] the step's unseen prompts are *probed* before it — ``probe_samples`` k
    samples each (default 2; ``probe_tokens`` new tokens, 0: ``rollout.max_new_tokens``), judged by the verifier
    alone — and p̂ starts at (right + 1) / (k + 2) (Laplace: two wrong samples say 0.25, not "never solved"), so
    every prompt is sized from step 0. Probe samples are outside the budget (``sampler/samples`` stays the
    budget; ``sampler/probe_samples`` logs them) and only prompts never seen are probed, so the cost ends with
    the first epoch. ``sampler/weighted_draws`` logs the share of the step's prompts sized from a p̂ rather than
    given the default G. Rows without a gold answer are not probed (no reward call). State in checkpoints:
    every seen prompt's p̂.
    """

    sizes_groups = True

    def __init__(self, n: int, batch_size: int, seed: int, group_size: int = 8, budget: int = 0, g_min: int = 2,
                 g_max: int = 0, ema: float = 0.5, probe_samples: int = 2, probe_tokens: int = 0) -> None:
        super().__init__(n, batch_size, seed)
        self.group_size = int(group_size)
        self.g_min, self.g_max = int(g_min), int(g_max) or 2 * int(group_size)
        self.budget = int(budget) or batch_size * int(group_size)
        self.ema = float(ema)
        self.probe_samples, self.probe_tokens = int(probe_samples), int(probe_tokens)
        self.pass_rate: dict[int, float] = {}

    def probe_candidates(self, step: int, round: int = 0) -> list[int]:
        """The step's prompts never seen (round 0 with ``probe_samples`` > 0), once each, in order."""
        if self.probe_samples <= 0 or round != 0:
            return []
        return [i for i in dict.fromkeys(self.indices(step, round)) if i not in self.pass_rate]

    def observe_probe(self, outcome: StepOutcome) -> None:
        """p̂ of each probed prompt not seen yet: (right + 1) / (k + 2) of its k probe samples."""
        if outcome.accuracy is None:
            return
        for i, group in zip(outcome.prompts, outcome.accuracy):
            if i >= 0 and group and i not in self.pass_rate:
                self.pass_rate[i] = (sum(group) + 1.0) / (len(group) + 2.0)

    def step_metrics(self, step: int, round: int = 0) -> dict[str, Metric]:
        """The share of step ``step``'s prompts sized from a p̂ (seen or probed) rather than given G."""
        idx = self.indices(step, round)
        return {"sampler/weighted_draws": Metric.same(sum(1 for i in idx if i in self.pass_rate) / max(len(idx), 1))}

    def group_sizes(self, prompts: list[int], budget: int | None = None) -> list[int]:
        """The group size of each of ``prompts`` (a process's share of the step, in order) within ``budget``
        samples (default: the whole budget). Unseen prompts take G; the seen share what is left in proportion to
        p̂(1 − p̂). When that cannot meet the budget (too many unseen prompts for a budget far from B·G), the
        unseen sizes absorb the difference within [g_min, g_max], so the total always equals the budget — and
        every process, given the same share, holds the same number of rows."""
        budget = self.budget if budget is None else int(budget)
        n = len(prompts)
        budget = min(max(budget, n * self.g_min), n * self.g_max)
        seen = [i for i, p in enumerate(prompts) if p in self.pass_rate]
        unseen = [i for i in range(n) if i not in set(seen)]
        sizes = [self.group_size] * n
        left = budget - self.group_size * len(unseen)
        left_seen = min(max(left, len(seen) * self.g_min), len(seen) * self.g_max)
        if seen:
            scores = [self.pass_rate[prompts[i]] * (1 - self.pass_rate[prompts[i]]) for i in seen]
            for i, g in zip(seen, allocate_budget(scores, left_seen, self.g_min, self.g_max)):
                sizes[i] = g
        if unseen and left_seen != left:  # the unseen absorb what the seen could not take
            for i, g in zip(unseen, allocate_budget([1.0] * len(unseen), budget - left_seen, self.g_min,
                                                    self.g_max)):
                sizes[i] = g
        return sizes

    @classmethod
    def step_budget(cls, cfg: Any, params: dict[str, Any]) -> int | None:
        return int(params.get("budget") or 0) or cfg.rollout.prompts_per_step * cfg.rollout.group_size

    @classmethod
    def smallest_group(cls, cfg: Any, params: dict[str, Any]) -> tuple[int, str] | None:
        g_min = int(params.get("g_min", 2))
        return g_min, f"rollout.sampler_params.g_min={g_min} (the budget sampler's smallest group)"

    def observe(self, outcome: StepOutcome) -> None:
        rates = outcome.accuracy if outcome.accuracy is not None else outcome.rewards
        for i, group in zip(outcome.prompts, rates):
            if i < 0 or not group:
                continue
            rate = sum(1.0 for x in group if x >= 1.0) / len(group) if outcome.accuracy is None else \
                sum(group) / len(group)
            old = self.pass_rate.get(i)
            self.pass_rate[i] = rate if old is None else (1 - self.ema) * old + self.ema * rate

    def state_dict(self) -> dict[str, Any]:
        return {"pass_rate": dict(self.pass_rate)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pass_rate = {int(k): float(v) for k, v in (state or {}).get("pass_rate", {}).items()}


def _budget_check(cfg: Any, p: dict[str, Any]) -> list[str]:
    r = cfg.rollout
    g_max = p["g_max"] or 2 * r.group_size
    budget = p["budget"] or r.prompts_per_step * r.group_size
    out = []
    if p["g_min"] > g_max:
        out.append(f"g_min={p['g_min']} exceeds g_max={g_max}")
    lo, hi = r.prompts_per_step * p["g_min"], r.prompts_per_step * g_max
    if not lo <= budget <= hi:
        out.append(f"budget={budget} is outside [prompts_per_step x g_min, prompts_per_step x g_max] = [{lo}, {hi}]")
    if not p["g_min"] <= r.group_size <= g_max:
        out.append(f"rollout.group_size={r.group_size} (an unseen prompt's size) is outside [g_min, g_max] = "
                   f"[{p['g_min']}, {g_max}]")
    return out + _probe_check(cfg, p)


declare("sampler", "budget", "TRACE: uniform prompts, group sizes proportional to p(1 - p) of each prompt's EMA pass "
        "rate within a per-step sample budget",
        Param("budget", 0, "responses per step (0: prompts_per_step x group_size)", ">= 0", lambda v: v >= 0),
        Param("g_min", 2, "smallest group size", ">= 1", lambda v: v >= 1),
        Param("g_max", 0, "largest group size (0: 2 x group_size)", ">= 0", lambda v: v >= 0),
        Param("ema", 0.5, "weight of the newest pass rate in the EMA", "in (0, 1]", lambda v: 0 < v <= 1),
        Param("probe_samples", 2, "samples per unseen prompt, judged before the step to start its pass rate (0: "
              "no probe; unseen prompts get group_size)", ">= 0", lambda v: v >= 0),
        Param("probe_tokens", 0, "new tokens of a probe sample (0: rollout.max_new_tokens)", ">= 0",
              lambda v: v >= 0),
        source="arXiv:2606.11119", config_check=_budget_check)


def sampler_class(cfg: Any) -> type[Sampler]:
    """The class ``rollout.sampler`` names (the base class for a name not registered: validation reports it)."""
    name = cfg.rollout.sampler
    return SAMPLERS.get(name) if name in SAMPLERS else Sampler


def build_sampler(name: str, n: int, batch_size: int, seed: int, params: dict[str, Any],
                  group_size: int | None = None) -> Sampler:
    """The sampler ``name`` for ``n`` samples, ``batch_size`` prompts per step (and the run's group size, for a
    sampler that sizes groups)."""
    import inspect

    cls = SAMPLERS.get(name)
    extra = {"group_size": group_size} if group_size is not None and "group_size" in inspect.signature(cls).parameters \
        else {}
    return cls(n, batch_size, seed, **extra, **params)
