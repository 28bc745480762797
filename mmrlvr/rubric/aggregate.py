"""Turn per-criterion verdicts into one reward: pure functions, no I/O, no state.

Notation: for one response, ``c_j`` ∈ {1 met, 0 not met, None unknown}, ``w_j`` > 0 the (effective) weight,
categories E essential, A additional (important + optional), P pitfall. Unknown verdicts are excluded
from every numerator AND denominator - never counted as a pass, never as a fail. A function returns None
when nothing it needs is known ("undetermined"; the reward decides what that scores and counts it).

``rar`` (Rubrics-as-Rewards, explicit aggregation), pitfalls subtract:
    r = (Σ_{j∈E∪A} w_j c_j − Σ_{j∈P} w_j c_j) / Σ_{j∈E∪A} w_j          r ∈ [−Σ_P w / Σ_{E∪A} w, 1]
    (a rubric of pitfalls only uses Σ_P w as the denominator: r ∈ [−1, 0]).

``hierarchical`` (RLR³-style gating, our concrete form): essentials gate, additional criteria fill in.
    gate = every known essential is met      (unknown essentials do not gate; all unknown → undetermined)
    s_A  = Σ_A w c / Σ_A w                   (1 when the rubric has no known additional criteria)
    base = share + (1 − share)·s_A  if gate  else  fail_score      (share = essential_share, default 0.5)
    base = s_A                      when the rubric has no essential criteria at all
    r    = base − Σ_P w c / Σ_{E∪A} w         (pitfalls on the same scale as rar)
  So a failed essential caps the score at ``fail_score`` (default 0) whatever the additional criteria say,
  and a response meeting every essential scores at least ``share`` before pitfalls.

Group-level options (need the G rollouts of one prompt; ``values`` is [G][J]):

* saturation (RLR³): criterion j is saturated in a group when ≥ 2 rollouts have a known verdict and all
  known verdicts agree - it carries no signal there. ``drop_saturated`` sets its weight to 0 for that group.
  In ``hierarchical`` a saturated essential still gates (a failed essential is never made up for); only its
  weight leaves the pitfall denominator. If every criterion is saturated nothing is dropped (all rollouts
  tie anyway, and the score keeps its usual scale). Note: with std-normalised GRPO advantages, dropping
  under ``rar`` mostly rescales scores (advantages change only where unknowns differ per rollout); it
  matters with Dr.GRPO or when the rubric is summed with other rewards. Under ``hierarchical`` and with
  POW3R it changes the ordering of weights.
* POW3R policy-aware weights [paper; constants not public, ours are config fields]: effective weight
  w̃_j = w_j·α_j. Per group, with p_j the pass rate of known verdicts (≥ ``min_known`` of them) and
  v_j = p_j(1 − p_j), category-normalised u_j = v_j / mean_{k in cat(j)} v_k (1 when that mean is 0),
  target_j = (1 − blend) + blend·u_j (prior 1 blended with the utility), then
  α_j ← clip(ema·α_j + (1 − ema)·target_j, α_min, α_max). Category normalisation keeps each category's
  mean α near 1, so POW3R re-ranks criteria inside a category without undoing the category weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from mmrlvr.registry import Registry

Values = Sequence[float | None]  # [J] 1 met, 0 not met, None unknown

#: name -> fn(values [J], weights [J], categories [J], **options) -> score | None
AGGREGATIONS: Registry[Callable[..., float | None]] = Registry("rubric aggregation")


def _known(values: Values, weights: Sequence[float], categories: Sequence[str], cats: tuple[str, ...]):
    return [(c, w) for c, w, k in zip(values, weights, categories) if k in cats and c is not None]


@AGGREGATIONS.register("rar")
def rar(values: Values, weights: Sequence[float], categories: Sequence[str]) -> float | None:
    """RaR weighted mean with pitfalls subtracted (see module docstring)."""
    pos = _known(values, weights, categories, ("essential", "important", "optional"))
    pit = _known(values, weights, categories, ("pitfall",))
    denom = sum(w for _, w in pos) or sum(w for _, w in pit)
    if denom <= 0:
        return None
    return (sum(w * c for c, w in pos) - sum(w * c for c, w in pit)) / denom


@AGGREGATIONS.register("hierarchical")
def hierarchical(values: Values, weights: Sequence[float], categories: Sequence[str], *,
                 essential_share: float = 0.5, fail_score: float = 0.0) -> float | None:
    """Essentials gate, additional criteria normalised on their own, pitfalls subtract (module docstring)."""
    has_essential = "essential" in categories
    ess = _known(values, weights, categories, ("essential",))
    add = _known(values, weights, categories, ("important", "optional"))
    pit = _known(values, weights, categories, ("pitfall",))
    if has_essential and not ess:
        return None
    if not has_essential and not add and not pit:
        return None
    add_w = sum(w for _, w in add)
    s_add = sum(w * c for c, w in add) / add_w if add_w > 0 else 1.0
    if not has_essential:
        base = s_add
    elif all(c >= 1.0 for c, _ in ess):
        base = essential_share + (1.0 - essential_share) * s_add
    else:
        base = fail_score
    denom = sum(w for _, w in ess) + add_w or sum(w for _, w in pit) or 1.0
    return base - sum(w * c for c, w in pit) / denom


# ------------------------------------------------------------------------------------------ group-level
def saturated(values: Sequence[Values], min_known: int = 2) -> list[bool]:
    """[J] True where ≥ min_known rollouts have a known verdict and all of them agree. values: [G][J]."""
    if not values:
        return []
    out = []
    for j in range(len(values[0])):
        known = [row[j] for row in values if row[j] is not None]
        out.append(len(known) >= min_known and len(set(known)) == 1)
    return out


def pass_rates(values: Sequence[Values], min_known: int = 2) -> list[float | None]:
    """[J] fraction of known verdicts that are met (None with fewer than min_known). values: [G][J]."""
    if not values:
        return []
    out: list[float | None] = []
    for j in range(len(values[0])):
        known = [row[j] for row in values if row[j] is not None]
        out.append(sum(known) / len(known) if len(known) >= min_known else None)
    return out


@dataclass(frozen=True)
class Pow3rConfig:
    """POW3R constants (not public in the paper; these defaults are ours).

    blend: share of the variance utility in the target (0 = static weights, 1 = utility only).
    ema: smoothing of α across updates (α ← ema·α + (1 − ema)·target).
    alpha_min / alpha_max: clip range of α. min_known: known verdicts needed in a group to update.
    """

    blend: float = 0.5
    ema: float = 0.9
    alpha_min: float = 0.25
    alpha_max: float = 2.0
    min_known: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.blend <= 1 or not 0 <= self.ema < 1:
            raise ValueError(f"POW3R blend must be in [0, 1] and ema in [0, 1), got {self.blend}, {self.ema}")
        if not 0 < self.alpha_min <= 1 <= self.alpha_max:
            raise ValueError(f"POW3R needs 0 < alpha_min <= 1 <= alpha_max, got {self.alpha_min}, {self.alpha_max}")


def pow3r_targets(rates: Sequence[float | None], categories: Sequence[str], blend: float) -> list[float | None]:
    """[J] target α from pass rates: (1 − blend) + blend·v_j / mean_{cat} v (None where rate unknown)."""
    var = [None if p is None else p * (1.0 - p) for p in rates]
    out: list[float | None] = []
    for v, cat in zip(var, categories):
        if v is None:
            out.append(None)
            continue
        peers = [u for u, k in zip(var, categories) if k == cat and u is not None]
        mean = sum(peers) / len(peers)
        utility = v / mean if mean > 0 else 1.0
        out.append((1.0 - blend) + blend * utility)
    return out


def pow3r_update(alphas: Sequence[float], targets: Sequence[float | None], cfg: Pow3rConfig) -> list[float]:
    """[J] α after one EMA step toward the targets, clipped; unknown targets leave α unchanged."""
    out = []
    for a, t in zip(alphas, targets):
        new = a if t is None else cfg.ema * a + (1.0 - cfg.ema) * t
        out.append(min(cfg.alpha_max, max(cfg.alpha_min, new)))
    return out


def score_group(values: Sequence[Values], weights: Sequence[float], categories: Sequence[str], *,
                method: str = "rar", drop_saturated: bool = False, alphas: Sequence[float] | None = None,
                **options: float) -> tuple[list[float | None], list[float], list[bool]]:
    """Scores of the G rollouts of one group. values: [G][J]; weights, categories, alphas: [J].

    Returns (scores [G] (None = undetermined), effective weights [J], saturated flags [J]).
    """
    fn = AGGREGATIONS.get(method)
    eff = [w * (alphas[j] if alphas is not None else 1.0) for j, w in enumerate(weights)]
    sat = saturated(values)
    if drop_saturated and sat and not all(sat):
        eff = [0.0 if s else w for w, s in zip(eff, sat)]
    return [fn(row, eff, categories, **options) for row in values], eff, sat
