"""A stateful prompt sampler in one file: draw the prompts the policy solves about half the time.

A prompt the policy always (or never) solves gives a group with no spread, hence no GRPO signal. This sampler
keeps, per prompt, an exponential moving average p̂ of its success rate and draws each step's prompts with
probability proportional to

    weight_i = max(p̂_i * (1 - p̂_i), floor)        (unseen prompts: p̂ = prior; floor keeps p̂ in {0, 1} drawable)

without replacement, from a numpy Generator seeded by (seed, step, round): the draw is a pure function of the
sampler's state and those three numbers, so every process draws the same prompts and a resumed run draws what
an uninterrupted one would (the table of p̂ is in ``state_dict``, saved in checkpoints).

After each step ``observe`` updates the prompts the step drew, with s the share of their G rollouts judged right
(``accuracy``; where the rows have no gold answer, the share with reward > 0):

    p̂_i <- (1 - ema) * p̂_i + ema * s_i              (p̂_i starts at prior)

A refill round (round r > 0, dynamic sampling) draws from the prompts that rounds 0 .. r-1 of the same step did not
draw (all prompts again if too few are left).

Its per-step diagnostics (``step_metrics``, logged with the step): ``sampler/seen_share``, the share of the step's
prompts that were drawn before (their p̂ is an observation, not the prior), and ``sampler/mean_p_hat``, the mean p̂
of the draw. Every process's sampler draws the same, so plain numbers are the same on every process.

Run it (``rollout.sampler_params`` holds its parameters):

    mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/success_rate_sampler.py]" rollout.sampler=success_rate "rollout.sampler_params={ema: 0.5, prior: 0.5}"

Illustrative: a plain curriculum to show the sampler contract (``indices``, ``observe``, ``state_dict``); not a
published method.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmrlvr.methods import describe_params
from mmrlvr.train.samplers import SAMPLERS, Sampler, StepOutcome


@describe_params(ema="weight of the newest step in the success-rate average (0 < ema <= 1)",
                 prior="success rate assumed for a prompt not yet seen (0..1)",
                 floor="smallest draw weight, so solved and hopeless prompts are still drawn now and then (> 0)")
@SAMPLERS.register("success_rate")
class SuccessRateSampler(Sampler):
    """Draws prompts with weight p̂(1 − p̂) of their running success rate p̂ (unseen: prior)."""

    def __init__(self, n: int, batch_size: int, seed: int, *, ema: float = 0.5, prior: float = 0.5,
                 floor: float = 0.01) -> None:
        super().__init__(n, batch_size, seed)
        problems = _problems(ema, prior, floor)
        if problems:
            raise ValueError("; ".join(problems))
        if batch_size > n:
            raise ValueError(f"success_rate: {batch_size} prompts per step from {n} training prompts")
        self.ema, self.prior, self.floor = ema, prior, floor
        self.p_hat: dict[int, float] = {}  # dataset index -> success-rate average, for the prompts seen so far

    @classmethod
    def validate_config(cls, cfg: Any, params: dict[str, Any]) -> list[str]:
        """Checked at config load, before any model loads."""
        return _problems(params["ema"], params["prior"], params["floor"])

    def weights(self) -> np.ndarray:
        """[n] draw weights max(p̂(1 − p̂), floor)."""
        p = np.full(self.n, self.prior, dtype=np.float64)
        for i, v in self.p_hat.items():
            p[i] = v
        return np.maximum(p * (1.0 - p), self.floor)

    def indices(self, step: int, round: int = 0) -> list[int]:
        taken: set[int] = set()
        for r in range(round):  # the earlier rounds of this step (the state does not change within a step)
            taken.update(self._draw(step, r, taken))
        return self._draw(step, round, taken)

    def _draw(self, step: int, round: int, taken: set[int]) -> list[int]:
        pool = np.array([i for i in range(self.n) if i not in taken])
        if len(pool) < self.batch_size:
            pool = np.arange(self.n)
        w = self.weights()[pool]
        rng = np.random.default_rng([self.seed, step, round])
        pick = rng.choice(len(pool), size=self.batch_size, replace=False, p=w / w.sum())
        return [int(pool[j]) for j in pick]

    def observe(self, outcome: StepOutcome) -> None:
        judged = outcome.accuracy
        for j, i in enumerate(outcome.prompts):
            if i < 0:  # a prompt the generate stage could not map to the dataset
                continue
            hits = judged[j] if judged is not None else [1.0 if r > 0 else 0.0 for r in outcome.rewards[j]]
            s = float(np.mean(hits)) if len(hits) else 0.0
            self.p_hat[i] = (1.0 - self.ema) * self.p_hat.get(i, self.prior) + self.ema * s

    def step_metrics(self, step: int, round: int = 0) -> dict[str, float]:
        """The step's draw: the share of its prompts seen before, and their mean p̂ (unseen: the prior)."""
        idx = self.indices(step, round)
        seen = [i for i in idx if i in self.p_hat]
        return {"sampler/seen_share": len(seen) / len(idx),
                "sampler/mean_p_hat": float(np.mean([self.p_hat.get(i, self.prior) for i in idx]))}

    def state_dict(self) -> dict[str, Any]:
        return {"p_hat": dict(self.p_hat)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.p_hat = {int(i): float(v) for i, v in state["p_hat"].items() if 0 <= int(i) < self.n}


def _problems(ema: float, prior: float, floor: float) -> list[str]:
    out = []
    if not 0.0 < ema <= 1.0:
        out.append(f"ema must be in (0, 1], got {ema}")
    if not 0.0 <= prior <= 1.0:
        out.append(f"prior must be in [0, 1], got {prior}")
    if not floor > 0.0:
        out.append(f"floor must be > 0, got {floor}")
    return out
