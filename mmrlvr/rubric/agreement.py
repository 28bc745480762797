"""Agreement between two raters of the same binary items: percent agreement and Cohen's kappa.

Used by ``mmrlvr rubric agreement`` to compare a judge with the programmatic checks (on criteria a
program can decide), two judges, or the k votes of one judge. Pairs where either rater is unknown (None)
are left out and counted, so a judge that answers "unknown" half the time cannot look reliable.

Cohen's kappa for two binary raters: p_o = observed agreement, p_e = p_a·p_b + (1 − p_a)(1 − p_b) with
p_a, p_b each rater's pass rate; κ = (p_o − p_e) / (1 − p_e). When both raters are constant and equal,
p_e = 1 and κ is undefined (NaN): the sample says nothing about agreement beyond chance.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Agreement:
    """n: pairs with both known; skipped: pairs with an unknown; percent in [0, 1]; kappa (NaN if undefined)."""

    n: int
    skipped: int
    percent: float
    kappa: float

    def __str__(self) -> str:
        kappa = "n/a" if math.isnan(self.kappa) else f"{self.kappa:.3f}"
        pct = "n/a" if self.n == 0 else f"{100 * self.percent:.1f}%"
        return f"agreement {pct}, Cohen's kappa {kappa} over {self.n} pairs ({self.skipped} with an unknown left out)"


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float:
    """κ of two equally long binary label lists (NaN when undefined or empty)."""
    n = len(a)
    if n == 0 or n != len(b):
        return math.nan
    p_o = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(a) / n, sum(b) / n
    p_e = pa * pb + (1 - pa) * (1 - pb)
    if p_e >= 1.0:
        return math.nan
    return (p_o - p_e) / (1 - p_e)


def agreement(a: Sequence[bool | None], b: Sequence[bool | None]) -> Agreement:
    """Percent agreement and κ over the pairs where both raters gave a known verdict."""
    if len(a) != len(b):
        raise ValueError(f"rater lists differ in length: {len(a)} vs {len(b)}")
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    xs, ys = [bool(x) for x, _ in pairs], [bool(y) for _, y in pairs]
    n = len(pairs)
    percent = sum(x == y for x, y in zip(xs, ys)) / n if n else math.nan
    return Agreement(n, len(a) - n, percent, cohen_kappa(xs, ys))


def vote_agreement(votes: Sequence[Sequence[bool | None]]) -> Agreement:
    """Mean pairwise agreement between the k votes of one judge. votes: [items][k].

    n and skipped are summed over vote pairs; percent and κ are means over vote pairs (NaN κ ignored).
    """
    k = min((len(v) for v in votes), default=0)
    results = [agreement([v[i] for v in votes], [v[j] for v in votes]) for i, j in itertools.combinations(range(k), 2)]
    if not results:
        return Agreement(0, 0, math.nan, math.nan)
    kappas = [r.kappa for r in results if not math.isnan(r.kappa)]
    pcts = [r.percent for r in results if not math.isnan(r.percent)]
    return Agreement(sum(r.n for r in results), sum(r.skipped for r in results),
                     sum(pcts) / len(pcts) if pcts else math.nan, sum(kappas) / len(kappas) if kappas else math.nan)
