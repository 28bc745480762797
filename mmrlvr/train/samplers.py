"""Prompt samplers: which prompts each step draws (``rollout.sampler`` + ``rollout.sampler_params``).

A sampler is a registered class built once per run with ``(n, batch_size, seed, **params)``:

- ``indices(step, round)`` returns the *global* batch of step ``step`` (``batch_size`` dataset indices; round r > 0
  is a dynamic-sampling refill round and should draw other prompts). Every process calls it with the same
  arguments and must get the same answer: each takes its contiguous share.
- ``group_sizes(prompts)`` (optional) gives each of the step's prompts its own group size (the whole global
  batch, in order; every process gets the same answer); without it every prompt gets ``rollout.group_size``.
- ``observe(outcome)`` is called after every step with every group the step generated and their rewards
  (``StepOutcome``: a dynamic-sampling refill step's every round, kept or dropped groups alike; gathered from
  every process, so every rank's sampler sees the same numbers and stays identical). A curriculum or a budget
  allocator learns here.
- ``state_dict()`` / ``load_state_dict(state)`` put what it learned in checkpoints, so a resumed run draws exactly
  what an uninterrupted one would.

The built-in ``uniform`` (also registered as ``shuffle``, its old name) draws a fresh permutation of the data per
epoch, a pure function of (seed, step): it has no state. ``disagreement`` (SGAC) learns which prompts' answers
disagree. No torch here: the sampler's names and parameters are checked at config load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import math
import random

from mmrlvr.methods import Param, declare
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

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed

    def indices(self, step: int, round: int = 0) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from a finished step (default: nothing)."""

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


#: name -> Sampler subclass (config key ``rollout.sampler``)
SAMPLERS: Registry[type[Sampler]] = Registry("prompt sampler")


@SAMPLERS.register("uniform")
@SAMPLERS.register("shuffle")
class ShuffleSampler(Sampler):
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
declare("sampler", "shuffle", "the old name of uniform")


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


@SAMPLERS.register("disagreement")
class DisagreementSampler(Sampler):
    """SGAC-style disagreement curriculum (arXiv 2605.01823; no official code is public): prompts whose last G
    final answers disagree most are drawn most.

    Per prompt the entropy H of its last group's final answers (``answer_entropy``; the paper's strongest predictor
    of later gains); a prompt's weight is max(H / ln G, ``floor``), so every prompt keeps a chance (``floor``
    0.05 [ours: the paper gives no floor value]). Each step first takes prompts never seen (in a seeded
    permutation, so the curriculum starts from the whole set), then draws the rest without replacement with
    probability proportional to the weights (Efraimidis–Spirakis keys from a generator seeded by seed, step and
    round: every process and a resumed run draw the same). Refill rounds exclude the step's earlier rounds'
    prompts. State in checkpoints: each seen prompt's entropy.
    """

    def __init__(self, n: int, batch_size: int, seed: int, floor: float = 0.05) -> None:
        super().__init__(n, batch_size, seed)
        if not 0.0 < float(floor) <= 1.0:
            raise ValueError(f"disagreement: floor must be in (0, 1], got {floor}")
        self.floor = float(floor)
        self.entropy: dict[int, float] = {}  # prompt index -> entropy of its last group's answers (normalised)
        order = list(range(n))
        random.Random(seed * 7_919 + 17).shuffle(order)
        self._order = order  # unseen prompts are taken in this order

    def weight(self, i: int) -> float:
        return max(self.entropy.get(i, 0.0), self.floor)

    def indices(self, step: int, round: int = 0) -> list[int]:
        exclude: set[int] = set()
        for r in range(round):
            exclude.update(self.indices(step, r))
        k = self.batch_size
        out = [i for i in self._order if i not in self.entropy and i not in exclude][:k]
        rest = [i for i in range(self.n) if i in self.entropy and i not in exclude and i not in out]
        rng = random.Random((self.seed * 1_000_003 + step) * 101 + round)
        keys = sorted(((rng.random() ** (1.0 / self.weight(i)), i) for i in rest), reverse=True)
        out += [i for _, i in keys[:k - len(out)]]
        if len(out) < self.batch_size:  # fewer prompts than a batch: repeat, as the uniform sampler's epochs do
            out += [out[j % len(out)] for j in range(self.batch_size - len(out))] if out else []
        return out

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.answers is None:
            return
        for i, answers in zip(outcome.prompts, outcome.answers):
            if i >= 0 and answers:
                g = len(answers)
                self.entropy[i] = answer_entropy(answers) / math.log(g) if g > 1 else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"entropy": dict(self.entropy)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entropy = {int(k): float(v) for k, v in (state or {}).get("entropy", {}).items()}


declare("sampler", "disagreement", "SGAC: unseen prompts first, then prompts drawn in proportion to the entropy of "
        "their last group's final answers",
        Param("floor", 0.05, "the smallest weight (of the normalised entropy H / ln G), so every prompt keeps a "
              "chance", "in (0, 1]", lambda v: 0 < v <= 1),
        source="arXiv:2605.01823")


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
class BudgetSampler(ShuffleSampler):
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
    (the paper's values are not public). State in checkpoints: every seen prompt's p̂.
    """

    def __init__(self, n: int, batch_size: int, seed: int, group_size: int = 8, budget: int = 0, g_min: int = 2,
                 g_max: int = 0, ema: float = 0.5) -> None:
        super().__init__(n, batch_size, seed)
        self.group_size = int(group_size)
        self.g_min, self.g_max = int(g_min), int(g_max) or 2 * int(group_size)
        self.budget = int(budget) or batch_size * int(group_size)
        self.ema = float(ema)
        self.pass_rate: dict[int, float] = {}

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
    return out


declare("sampler", "budget", "TRACE: uniform prompts, group sizes proportional to p(1 - p) of each prompt's EMA pass "
        "rate within a per-step sample budget",
        Param("budget", 0, "responses per step (0: prompts_per_step x group_size)", ">= 0", lambda v: v >= 0),
        Param("g_min", 2, "smallest group size", ">= 1", lambda v: v >= 1),
        Param("g_max", 0, "largest group size (0: 2 x group_size)", ">= 0", lambda v: v >= 0),
        Param("ema", 0.5, "weight of the newest pass rate in the EMA", "in (0, 1]", lambda v: 0 < v <= 1),
        source="arXiv:2606.11119", config_check=_budget_check)


def build_sampler(name: str, n: int, batch_size: int, seed: int, params: dict[str, Any],
                  group_size: int | None = None) -> Sampler:
    """The sampler ``name`` for ``n`` samples, ``batch_size`` prompts per step (and the run's group size, for a
    sampler that sizes groups)."""
    import inspect

    cls = SAMPLERS.get(name)
    extra = {"group_size": group_size} if group_size is not None and "group_size" in inspect.signature(cls).parameters \
        else {}
    return cls(n, batch_size, seed, **extra, **params)
