"""Token-credit schemes: which tokens of a response get the policy gradient, and how much.

A scheme turns per-token signals (``signals.TokenSignals``) into a ``CreditResult``:

    token_weights [N, L]  replaces the response mask in the policy loss (numerator and denominator of the
                          aggregation): 0/1 for selection schemes, weights ≥ 0 for the "weight" variants;
                          always 0 where the response mask is 0
    adv_scale     [N]     multiplies the GRPO advantage of each response (ones unless the scheme shapes it)
    extra_loss            None, or a callable ``f(logp [N, L] with grad) -> [N, L]`` per-token loss term that
                          the trainer adds to the per-token policy loss before aggregating it (PAPO)
    selected      [N, L]  bool, the tokens the scheme chose (for the rollout store / inspector)
    stats                 ``credit/...`` metrics for metrics.jsonl
    norm_weights  [N, L]  None, or the tokens counted in the loss *normaliser* when that differs from
                          ``token_weights`` (VPPO's official loss sums over the selected tokens but divides
                          by all response tokens). Contract: the policy-loss numerator uses
                          ``token_weights``; the normaliser (``agg_loss(..., norm_mask=norm_weights)``,
                          ``agg_denominator(norm_weights, mode)``) and the numerator of ``extra_loss`` use
                          ``norm_weights``. None = both are ``token_weights``.

so the loss code never knows which scheme ran. Schemes are small dataclasses whose fields are their
config (``credit.scheme_params`` in a run config). ``CREDIT_SCHEMES.get(name)`` is a default-configured
instance, called as ``scheme(signals, mask, advantages, **params)``; ``build_scheme(name, **params)``
fixes the parameters once. The class attribute ``needs_perturbed`` tells the trainer whether to run the
extra perturbed-image forward at all, ``needs_distribution`` whether that pass must compare full
distributions (VEPO: JSD, ΔH) or only read the sampled token's log-prob (VPPO, PAPO: pass
``distribution=False`` to the signal functions, ~3x cheaper), ``perturbation`` which perturbation the
method's paper uses, ``row_local`` whether each response's credit depends on its own signals only (then
the trainer may compute it micro-batch by micro-batch inside the update, ``mmrlvr.train.deferred_credit``).

Shared rules: min-max normalisation is per response over its valid tokens (a constant row maps to 0);
top-k keeps k = ceil(frac · T_valid) tokens per response, ties broken by entropy (vision schemes), then by
the earlier position.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, ClassVar

from mmrlvr.credit.signals import TokenSignals, perception_k3, vppo_dependency
from mmrlvr.errors import UserError
from mmrlvr.lazy_import import lazy_module
from mmrlvr.metric import Metric
from mmrlvr.registry import Registry

torch = lazy_module("torch")  # config checks read the registry and the schemes' class traits without torch

# ---------------------------------------------------------------------------------------------------
# Pure helpers


def minmax_per_row(x: torch.Tensor, mask: torch.Tensor, atol: float = 1e-6) -> torch.Tensor:
    """Min-max normalise each row to [0, 1] over its valid tokens; masked tokens -> 0.

    A row whose valid values span no more than ``atol`` counts as constant and maps to 0: stretching
    rounding noise (a JSD of 1e-9 vs 3e-9 from two identical passes) to the full [0, 1] range would turn
    noise into a ranking. x, mask: [N, L] -> [N, L]."""
    valid = mask > 0
    big = torch.finfo(x.dtype).max
    lo = torch.where(valid, x, torch.full_like(x, big)).amin(-1, keepdim=True)  # [N, 1]
    hi = torch.where(valid, x, torch.full_like(x, -big)).amax(-1, keepdim=True)
    span = hi - lo
    ok = valid & (span > atol)
    return torch.where(ok, (x - lo) / torch.where(span > atol, span, torch.ones_like(span)), torch.zeros_like(x))


def topk_count(mask: torch.Tensor, frac: float) -> torch.Tensor:
    """k_i = ceil(frac · T_i) per row, T_i = valid tokens: [N, L] -> [N] long.

    A 1e-9 slack keeps float error from rounding up exact products (0.2 · 15 = 3.0000000000000004 -> 3)."""
    t = (mask > 0).sum(-1).to(torch.float64)
    return torch.ceil(t * frac - 1e-9).clamp(min=0).to(torch.long)


def topk_per_row(score: torch.Tensor, mask: torch.Tensor, k: torch.Tensor,
                 tiebreak: torch.Tensor | None = None) -> torch.Tensor:
    """Select the k_i highest-scoring valid tokens of each row. Masked tokens are never selected.

    Ties are broken deterministically: by the higher ``tiebreak`` value when given (the vision schemes
    pass entropy, so with no visual signal at all they fall back to entropy ranking), then by the
    earlier position. score, mask, tiebreak: [N, L]; k: [N] long -> bool [N, L]."""
    valid = mask > 0
    neg_inf = torch.full_like(score, -math.inf, dtype=torch.float32)
    s = torch.where(valid, score.float(), neg_inf)
    order = torch.arange(s.shape[-1], device=s.device).expand_as(s)  # positions, ascending
    if tiebreak is not None:  # two stable sorts = lexicographic order (score, tiebreak, position)
        tb = torch.where(valid, tiebreak.float(), neg_inf)
        order = torch.sort(tb, dim=-1, descending=True, stable=True).indices
    order = order.gather(-1, torch.sort(s.gather(-1, order), dim=-1, descending=True, stable=True).indices)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(s.shape[-1], device=s.device).expand_as(order))
    return (rank < k[:, None]) & valid


def vepo_score(jsd: torch.Tensor, entropy: torch.Tensor, entropy_shift: torch.Tensor, mask: torch.Tensor,
               alpha: float = 0.7) -> torch.Tensor:
    """VEPO score "D": s_t = [1 − (1−j_t)^α (1−g_t)^(1−α)] · h_t (docs/credit.md, [code]).

    j, h, g = min-max normalised JSD, entropy and |ΔH| per response. A soft OR of the two visual
    signals, times entropy. All [N, L]; 0 at masked tokens."""
    j = minmax_per_row(jsd, mask)
    h = minmax_per_row(entropy, mask)
    g = minmax_per_row(entropy_shift.abs(), mask)
    return (1.0 - (1.0 - j) ** alpha * (1.0 - g) ** (1.0 - alpha)) * h


def vppo_advantage_scale(dependency: torch.Tensor, mask: torch.Tensor, beta_min: float = 0.9,
                         reduce: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """VPPO trajectory shaping (docs/credit.md, [code]): [N, L] S_t -> [N] scale_i.

    S̄_i = mean_t S_t over valid tokens; n_i = min-max of S̄ over the mini-batch;
    β_max = β_min + (1 − β_min)/mean(n); scale_i = β_min + n_i (β_max − β_min), so mean(scale) = 1.
    [ours] Rows without valid tokens are left out of the min-max and get 1; when mean(n) = 0 (one row,
    or all S̄ equal) there is no signal and every scale is 1 (the formula would divide by 0).
    ``reduce(t, op)`` (several processes: all-reduce with op sum | min | max): the min, max and mean are
    over the global batch's rows, so each process scales its rows as one process would."""
    valid = mask > 0
    count = valid.sum(-1)  # [N]
    has = count > 0
    scale = torch.ones(dependency.shape[0], device=dependency.device)
    s_bar = torch.where(valid, dependency, torch.zeros_like(dependency)).sum(-1) / count.clamp(min=1)
    sb = s_bar[has]
    if reduce is None:
        if int(has.sum()) == 0:
            return scale
        lo, hi = sb.min(), sb.max()
    else:
        if int(reduce(has.sum().to(s_bar.device))) == 0:
            return scale
        inf = torch.tensor(float("inf"), dtype=s_bar.dtype, device=s_bar.device)
        lo = reduce(sb.min() if sb.numel() else inf, "min")
        hi = reduce(sb.max() if sb.numel() else -inf, "max")
    span = hi - lo
    n = (sb - lo) / span if span > 0 else torch.zeros_like(sb)
    if reduce is None:
        n_mean = n.mean()
    else:
        tot = reduce(torch.stack([n.sum(), torch.tensor(float(n.numel()), dtype=n.dtype, device=n.device)]))
        n_mean = tot[0] / tot[1]
    if float(n_mean) <= 0:
        return scale
    beta_max = beta_min + (1.0 - beta_min) / n_mean
    scale[has] = beta_min + n * (beta_max - beta_min)
    return scale


def takes_reduce(scheme: Any) -> bool:
    """Whether a credit scheme's call accepts ``reduce=`` (batch-wide statistics over processes)."""
    import inspect

    return "reduce" in inspect.signature(scheme.__call__).parameters


def _below_row_median(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """bool [N, L]: valid tokens strictly below their row's median (torch's lower median) of x."""
    valid = mask > 0
    med = torch.where(valid, x, torch.full_like(x, math.nan)).nanmedian(-1, keepdim=True).values
    return valid & (x < med)


def _token_mean(x: torch.Tensor, valid: torch.Tensor) -> Metric:
    """The mean of ``x`` over the ``valid`` tokens (0 when there are none), as a metric over those tokens."""
    n = int(valid.sum())
    return Metric.mean(float(x[valid].mean()) if n else 0.0, n=n)


def selection_stats(selected: torch.Tensor, signals: TokenSignals, mask: torch.Tensor,
                    reference_rho: float = 0.2) -> dict[str, Metric]:
    """Metrics every scheme reports, each a mean over the tokens it is a share of (the ``credit/*`` names of
    docs/credit.md, "What is logged"):

    credit/selected_fraction          selected valid tokens / valid tokens
    credit/vision_sensitivity_mean    mean JSD over valid tokens (when the perturbed pass ran)
    credit/selected_low_entropy_share share of selected tokens whose entropy is below their response's median
    credit/entropy_topk_jaccard       Jaccard overlap of the selection with entropy top-ρ (ρ = 0.2)
    """
    valid = mask > 0
    n_valid = int(valid.sum())
    n_sel = int((selected & valid).sum())
    stats: dict[str, Metric] = {"credit/selected_fraction": Metric.mean(n_sel / n_valid if n_valid else 0.0, n=n_valid)}
    if signals.jsd is not None:
        stats["credit/vision_sensitivity_mean"] = Metric.mean(float(signals.jsd[valid].mean()) if n_valid else 0.0,
                                                              n=n_valid)
    if signals.entropy is None:  # sampled-only signals: no clean distribution, no entropy diagnostics
        return stats
    low = _below_row_median(signals.entropy, mask)
    stats["credit/selected_low_entropy_share"] = Metric.mean(int((selected & low).sum()) / n_sel if n_sel else 0.0,
                                                             n=n_sel)
    ent_top = topk_per_row(signals.entropy, mask, topk_count(mask, reference_rho))
    union = int((ent_top | selected).sum())
    stats["credit/entropy_topk_jaccard"] = Metric.mean(int((ent_top & selected).sum()) / union if union else 1.0,
                                                       n=union)
    return stats


# ---------------------------------------------------------------------------------------------------
# The result and the schemes


@dataclass
class CreditResult:
    """What a scheme hands the loss (see the module docstring for how each part is used)."""

    token_weights: torch.Tensor  # [N, L]
    adv_scale: torch.Tensor  # [N]
    extra_loss: Callable[[torch.Tensor], torch.Tensor] | None
    selected: torch.Tensor  # [N, L] bool
    stats: dict[str, Metric] = field(default_factory=dict)
    norm_weights: torch.Tensor | None = None  # [N, L] tokens counted in the loss normaliser (None: token_weights)


class CreditScheme(abc.ABC):
    """Base of every scheme: a dataclass of parameters, called on one rollout batch."""

    needs_perturbed: ClassVar[bool] = False  # run the extra perturbed-image forward at all
    needs_distribution: ClassVar[bool] = False  # ... and compare full distributions (JSD, ΔH), not only logq
    perturbation: ClassVar[tuple[str, dict[str, Any]] | None] = None  # default (name, params) when needed
    # each response's credit depends on that response's signals alone (then the trainer may compute it
    # micro-batch by micro-batch inside the update); False is always safe, so plugins start there
    row_local: ClassVar[bool] = False

    def __call__(self, signals: TokenSignals, mask: torch.Tensor, advantages: torch.Tensor, *,
                 old_logprobs: torch.Tensor | None = None, **params: Any) -> CreditResult:
        """Credit for one rollout batch.

        signals: per-token signals; mask: [N, L] response mask (> 0 counts); advantages: [N];
        old_logprobs: [N, L] log π_old(o_t|I) (only VPPO reads it; else signals.old_logp, else signals.logp);
        params: overrides of this scheme's fields for this call (e.g. ``alpha=0.5``), validated."""
        scheme = self.with_params(**params) if params else self
        return scheme._apply(signals, mask, advantages, old_logprobs)

    def with_params(self, **params: Any) -> "CreditScheme":
        """A copy with some fields replaced; unknown names are a UserError listing the known ones."""
        known = [f.name for f in fields(self)]
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise UserError(f"credit scheme {type(self).__name__} has no parameter(s) {unknown}; "
                            f"known: {known or 'none'}")
        return replace(self, **params)

    @abc.abstractmethod
    def _apply(self, signals: TokenSignals, mask: torch.Tensor, advantages: torch.Tensor,
               old_logprobs: torch.Tensor | None) -> CreditResult:
        """The scheme itself (see ``__call__`` for the arguments)."""

    def _require_entropy(self, signals: TokenSignals) -> None:
        if signals.entropy is None or signals.logp is None:
            raise UserError(f"credit scheme {type(self).__name__} needs the clean pass's entropy and log-probs; "
                            "compute the signals with clean logits or inputs")

    def _require_perturbed(self, signals: TokenSignals) -> None:
        missing = signals.logq is None
        if self.needs_distribution:
            self._require_entropy(signals)
            missing = missing or signals.jsd is None or signals.entropy_shift is None
        if missing:
            what = "with distribution=True" if self.needs_distribution else ""
            raise UserError(f"credit scheme {type(self).__name__} needs the perturbed-image pass; compute the "
                            f"signals with a perturbed input {what}".rstrip())

    def _result(self, selected: torch.Tensor, weights: torch.Tensor, signals: TokenSignals, mask: torch.Tensor,
                adv_scale: torch.Tensor | None = None, extra_loss=None, norm_weights: torch.Tensor | None = None,
                **more: Metric) -> CreditResult:
        n = mask.shape[0]
        dtype = mask.dtype if mask.is_floating_point() else torch.float32
        weights = weights.to(dtype) * (mask > 0)  # never any weight on a masked token
        stats = selection_stats(selected, signals, mask)
        stats.update(more)
        scale = adv_scale if adv_scale is not None else torch.ones(n, device=mask.device)
        if norm_weights is not None:
            norm_weights = norm_weights.to(dtype) * (mask > 0)
        return CreditResult(token_weights=weights, adv_scale=scale, extra_loss=extra_loss, selected=selected,
                            stats=stats, norm_weights=norm_weights)


CREDIT_SCHEMES: Registry[CreditScheme] = Registry("credit scheme")


def _register(name: str):
    """Register a default-configured instance of the scheme class under ``name``."""

    def deco(cls):
        CREDIT_SCHEMES.add(name, cls())
        return cls

    return deco


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise UserError(f"credit.{name} must be in (0, 1], got {value}")


@_register("none")
@dataclass
class NoCredit(CreditScheme):
    """Every valid token counts equally: plain GRPO / DAPO."""

    row_local: ClassVar[bool] = True

    def _apply(self, signals, mask, advantages, old_logprobs) -> CreditResult:
        valid = mask > 0
        return self._result(valid, valid.float(), signals, mask)


@_register("entropy_topk")
@dataclass
class EntropyTopK(CreditScheme):
    """The 80/20 rule: keep the top ceil(ρ·T) highest-entropy tokens of each response (the baseline VEPO
    argues against; kept for comparisons)."""

    row_local: ClassVar[bool] = True

    rho: float = 0.2  # fraction of each response's valid tokens that keep a gradient

    def __post_init__(self) -> None:
        _check_fraction("rho", self.rho)

    def _apply(self, signals, mask, advantages, old_logprobs) -> CreditResult:
        self._require_entropy(signals)
        sel = topk_per_row(signals.entropy, mask, topk_count(mask, self.rho))
        return self._result(sel, sel.float(), signals, mask)


@_register("vepo")
@dataclass
class VEPO(CreditScheme):
    """Vision-entropy token selection (docs/credit.md, [code]): score "D" = soft-OR(JSD, |ΔH|) × entropy,
    keep the top ceil(ρ·T) per response. mode="mask" drops the rest from the loss; mode="weight" keeps all
    tokens with w = 1 + bonus·selected. The advantage is unchanged."""

    row_local: ClassVar[bool] = True

    needs_perturbed: ClassVar[bool] = True
    needs_distribution: ClassVar[bool] = True
    # VEPO's official noise: N(0, 2.0^2) on the normalised pixels (credit.perturbation_params overrides)
    perturbation: ClassVar[tuple[str, dict[str, Any]] | None] = ("gaussian", {"std": 2.0})

    alpha: float = 0.7  # weight of JSD vs |ΔH| in the soft OR
    rho: float = 0.2  # fraction of tokens kept
    mode: str = "mask"  # "mask" (0/1) or "weight" (1 + bonus on selected tokens)
    bonus: float = 0.5  # extra weight of selected tokens in "weight" mode

    def __post_init__(self) -> None:
        _check_fraction("rho", self.rho)
        if not 0.0 <= self.alpha <= 1.0:
            raise UserError(f"credit.alpha must be in [0, 1], got {self.alpha}")
        if self.mode not in ("mask", "weight"):
            raise UserError(f"credit.mode must be 'mask' or 'weight', got {self.mode!r}")

    def _apply(self, signals, mask, advantages, old_logprobs) -> CreditResult:
        self._require_perturbed(signals)
        score = vepo_score(signals.jsd, signals.entropy, signals.entropy_shift, mask, self.alpha)
        sel = topk_per_row(score, mask, topk_count(mask, self.rho), tiebreak=signals.entropy)
        w = sel.float() if self.mode == "mask" else 1.0 + self.bonus * sel.float()
        return self._result(sel, w, signals, mask)


VPPO_NORMALIZERS = ("all", "selected")


@_register("vppo")
@dataclass
class VPPO(CreditScheme):
    """Visually-perceptive policy optimisation ([code]; Huang et al. 2025, arXiv:2510.09285,
    github.com/huaixuheqing/VPPO-RL): S_t = k3 of the sampled token between the perturbed pass and π_old;
    keep the top ceil(k·T) tokens by S_t and scale each response's advantage by its mean dependency
    (mean scale 1, minimum β_min).

    Two options follow the official code (``dp_actor.update_policy`` / ``core_algos.compute_policy_loss``),
    where the paper's text does not say:

    - ``normalizer="all"`` (default, official): the policy loss sums over the *selected* tokens but
      divides by *all* response tokens (the official code multiplies the per-token loss by the top-k
      mask, then averages it over ``response_mask``). ``"selected"`` divides by the selected tokens
      only, which rescales the gradient by T/k-ish (x2.5 at k = 0.4) and makes the step size depend on
      the selection ratio. Carried to the loss as ``CreditResult.norm_weights`` (the response mask).
    - ``entropy_coef=0.06`` (default, official ``entropy_penalty_coef``): the loss gains
      ``entropy_coef · mean_t(−log π(o_t))`` over all response tokens, the sampled-token estimate of the
      entropy, added with a *plus* sign as the official code does — a penalty that lowers entropy. It is
      returned as ``extra_loss`` (per token, ``entropy_coef · (−log π)`` on valid tokens) and normalised
      like the policy loss. 0 turns it off.

    Not changed: β_min = 0.9, kept as our default; the official ActorConfig's default is 0.8
    (``credit.scheme_params: {beta_min: 0.8}`` matches it)."""

    needs_perturbed: ClassVar[bool] = True
    perturbation: ClassVar[tuple[str, dict[str, Any]] | None] = ("patch_blackout", {"p": 0.5})
    row_local: ClassVar[bool] = False  # the advantage scale is min-max normalised over the whole batch

    k: float = 0.4  # fraction of tokens kept
    beta_min: float = 0.9  # smallest advantage scale
    normalizer: str = "all"  # "all" response tokens (official) | "selected" tokens in the loss normaliser
    entropy_coef: float = 0.06  # official entropy_penalty_coef: + coef * mean(-log pi) over response tokens

    def __post_init__(self) -> None:
        _check_fraction("k", self.k)
        if not 0.0 <= self.beta_min <= 1.0:
            raise UserError(f"credit.beta_min must be in [0, 1], got {self.beta_min}")
        if self.normalizer not in VPPO_NORMALIZERS:
            raise UserError(f"credit.normalizer must be one of {VPPO_NORMALIZERS}, got {self.normalizer!r}")
        if self.entropy_coef < 0:
            raise UserError(f"credit.entropy_coef must be >= 0, got {self.entropy_coef}")

    def __call__(self, signals, mask, advantages, *, old_logprobs=None, reduce=None, **params) -> CreditResult:
        """``reduce(t, op)``: all-reduce over processes (the credit stage passes it with several processes), so
        the advantage scale's min-max runs over the global batch."""
        scheme = self.with_params(**params) if params else self
        return scheme._apply(signals, mask, advantages, old_logprobs, reduce)

    def _apply(self, signals, mask, advantages, old_logprobs, reduce=None) -> CreditResult:
        self._require_perturbed(signals)
        old = next((x for x in (old_logprobs, signals.old_logp, signals.logp) if x is not None), None)
        if old is None:
            raise UserError("credit scheme VPPO needs log pi_old: pass old_logprobs or clean signals")
        dep = vppo_dependency(signals.logq, old, mask)  # [N, L]
        sel = topk_per_row(dep, mask, topk_count(mask, self.k), tiebreak=signals.entropy)
        scale = vppo_advantage_scale(dep, mask, self.beta_min, reduce)
        valid = mask > 0
        extra_loss = None
        if self.entropy_coef > 0:
            coef = self.entropy_coef

            def extra_loss(logp: torch.Tensor) -> torch.Tensor:
                term = -coef * logp  # [N, L]: + coef * (-log pi), the sampled-token entropy estimate
                return torch.where(valid, term, torch.zeros_like(term))

        norm = mask.clone() if self.normalizer == "all" else None
        return self._result(sel, sel.float(), signals, mask, adv_scale=scale, extra_loss=extra_loss,
                            norm_weights=norm,
                            **{"credit/dependency_mean": _token_mean(dep, valid),
                               "credit/adv_scale_min": Metric.min(float(scale.min())),
                               "credit/adv_scale_max": Metric.max(float(scale.max()))})


@_register("papo")
@dataclass
class PAPO(CreditScheme):
    """Perception-aware policy optimisation (docs/credit.md, [code]): every token keeps its gradient, and
    the loss gains −γ·KL_prcp per token, KL_prcp = k3 between π(·|I) and π(·|I_mask) on the sampled token.

    ``extra_loss(logp)`` returns that per-token term [N, L] (0 at masked tokens) for the current policy's
    log-probs ``logp`` (with gradient); the trainer adds it to the per-token policy loss and aggregates
    the sum with the usual mode. Deviation [ours]: the masked-image pass runs without gradient (PAPO also
    backpropagates through it), which halves the extra cost; PAPO's double-entropy regulariser is not
    included — ``max_kl`` caps k3 instead."""

    row_local: ClassVar[bool] = True

    needs_perturbed: ClassVar[bool] = True
    perturbation: ClassVar[tuple[str, dict[str, Any]] | None] = ("patch_blackout", {"p": 0.6})

    gamma: float = 0.02  # weight of the perception KL (maximised)
    max_kl: float = 10.0  # [ours] cap on each token's k3

    def _apply(self, signals, mask, advantages, old_logprobs) -> CreditResult:
        self._require_perturbed(signals)
        valid = mask > 0
        logq, gamma, max_kl = signals.logq.detach(), self.gamma, self.max_kl

        def extra_loss(logp: torch.Tensor) -> torch.Tensor:
            term = -gamma * perception_k3(logp, logq, max_kl=max_kl)  # [N, L]
            return torch.where(valid, term, torch.zeros_like(term))

        ref = next((x for x in (signals.logp, old_logprobs, signals.old_logp) if x is not None), None)
        kl = perception_k3(ref, logq, max_kl=max_kl) if ref is not None else torch.zeros_like(logq)
        return self._result(valid, valid.float(), signals, mask, extra_loss=extra_loss,
                            **{"credit/perception_kl": _token_mean(kl, valid)})


@_register("rsi")
@dataclass
class RSI(CreditScheme):
    """Relative-surprisal selection (seed "RSI-S", [paper], constants not public — all defaults [ours]).

    RSI_t = −log π(o_t) / H_t: ≈ 1 for a token as surprising as the policy's own uncertainty, ≫ 1 for an
    unlikely draw, ≪ 1 for the confident pick among uncertain options. Keep tokens with
    low_t ≤ RSI_t ≤ high_t, where the band widens for low-entropy tokens (whose ratio is unstable, both
    parts being near 0): with h̃_t = per-response min-max entropy,
    low_t = low · (1 − adapt·(1 − h̃_t)), high_t = high · (1 + adapt·(1 − h̃_t)).
    Needs no perturbed pass."""

    row_local: ClassVar[bool] = True

    low: float = 0.5  # RSI lower bound at the response's highest-entropy token
    high: float = 2.0  # RSI upper bound at the response's highest-entropy token
    adapt: float = 1.0  # how much the band widens at the lowest-entropy token (0 = fixed band)
    eps: float = 1e-6  # entropy floor in the ratio

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high:
            raise UserError(f"credit.low/high must satisfy 0 <= low <= high, got {self.low}, {self.high}")
        if not 0.0 <= self.adapt <= 1.0:
            raise UserError(f"credit.adapt must be in [0, 1], got {self.adapt}")

    def _apply(self, signals, mask, advantages, old_logprobs) -> CreditResult:
        self._require_entropy(signals)
        rsi = -signals.logp / signals.entropy.clamp(min=self.eps)  # [N, L]
        widen = self.adapt * (1.0 - minmax_per_row(signals.entropy, mask))
        sel = (rsi >= self.low * (1.0 - widen)) & (rsi <= self.high * (1.0 + widen)) & (mask > 0)
        valid = mask > 0
        return self._result(sel, sel.float(), signals, mask,
                            **{"credit/rsi_mean": _token_mean(rsi, valid)})


def build_scheme(name: str, **params: Any) -> CreditScheme:
    """The scheme registered as ``name`` with its parameters set (validated; unknown names are a UserError)."""
    return CREDIT_SCHEMES.get(name).with_params(**params)


