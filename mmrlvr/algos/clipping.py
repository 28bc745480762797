"""Clip rules for the PPO-style losses (``algo.clip``) and the off-policy diagnostics every run logs.

A clip rule turns the fixed range (eps_low, eps_high) into the per-token bounds a loss clips the
importance ratio r = pi/pi_old with. ``fixed`` is PPO/DAPO's constant range; ``acpo`` is ACPO's
variance-adaptive range (arXiv 2606.22570; docs/methods.md):

- bin the response tokens by their current probability p = exp(log pi) into ``bins`` (5) equal-width
  bins on [0, 1];
- per bin b, sigma_b = std of the ratios r of the bin's tokens;
- eps_b = clamp(eps0 + alpha * sigma_b, eps_min, eps_max) with eps0 = 0.2, alpha = 3.0, eps_min = 0,
  eps_max = 3.0, and the clip is symmetric: clamp(r, 1 - eps_b, 1 + eps_b), with the usual PPO min and
  dual clip c = 3 (``ACPO_DUAL_CLIP``, used when ``algo.dual_clip`` is unset).

Ours [ours], where the summary does not decide: sigma_b is the population std (divide by n) over the
bin's valid tokens of the loss call (one micro-batch); a bin with fewer than 2 tokens has sigma_b = 0
(eps_b = eps0 clamped); p = 1.0 falls in the last bin; eps_b is computed without gradient.

The paper's point is that the number of gradient passes per rollout batch (``algo.epochs``) sets the
off-policy degree. ``OffPolicyDiagnostics`` records, per bin of pi_old (the sampler's probability, which
does not move between passes), the ratio mean/std and the share of tokens below 1 - eps_low ("low") and
above 1 + eps_high ("high"), over every pass of a step: at ``epochs = 1`` every ratio is 1 (on-policy);
the spread grows with each further pass (``benchmarks/acpo_offpolicy.py`` plots it).

Each built-in rule declares its parameters (``mmrlvr.methods.declare``) just above its function; the config checks
import this module without torch (``torch = lazy_module("torch")``) to read them.
"""

from __future__ import annotations

from typing import Callable

from mmrlvr.lazy_import import lazy_module
from mmrlvr.methods import Param, declare
from mmrlvr.methods import non_negative as _nonneg
from mmrlvr.metric import Metric
from mmrlvr.registry import Registry

torch = lazy_module("torch")  # declarations and config checks read this module without torch

ACPO_BINS = 5
ACPO_DUAL_CLIP = 3.0
#: config names of the ACPO parameters (``algo.<name>``) -> keyword of ``acpo_bounds``
ACPO_PARAMS = {"acpo_eps0": "eps0", "acpo_alpha": "alpha", "acpo_eps_min": "eps_min", "acpo_eps_max": "eps_max"}

ClipRule = Callable[..., "tuple[torch.Tensor | float, torch.Tensor | float]"]

#: name -> fn(probs [N, L], ratio [N, L], valid [N, L] bool, eps_low, eps_high, **params) -> (low, high)
#: bounds on eps (floats or [N, L] tensors); config key ``algo.clip``
CLIP_RULE_REGISTRY: Registry[ClipRule] = Registry("clip rule")


declare("clip", "fixed", "PPO's constant range algo.eps_low / algo.eps_high")


@CLIP_RULE_REGISTRY.register("fixed")
def fixed_bounds(probs: torch.Tensor, ratio: torch.Tensor, valid: torch.Tensor, eps_low: float,
                 eps_high: float) -> tuple[float, float]:
    """PPO's constant range: (eps_low, eps_high) for every token (Schulman et al. 2017; DAPO clip-higher)."""
    return eps_low, eps_high


def bin_index(probs: torch.Tensor, bins: int = ACPO_BINS) -> torch.Tensor:
    """[N, L] long: equal-width bin of each probability on [0, 1] (p = 1 in the last bin)."""
    return (probs.detach().clamp(0.0, 1.0) * bins).floor().long().clamp_(0, bins - 1)


declare("clip", "acpo", "eps_b = clamp(eps0 + alpha * sigma_b, eps_min, eps_max) per probability bin, symmetric; "
        "dual clip 3 unless algo.dual_clip is set",
        Param("eps0", 0.2, "base clip range", ">= 0", _nonneg),
        Param("alpha", 3.0, "weight of the bin's ratio std sigma_b", ">= 0", _nonneg),
        Param("eps_min", 0.0, "smallest clip range", ">= 0", _nonneg),
        Param("eps_max", 3.0, "largest clip range", ">= eps_min", _nonneg),
        source="arXiv:2606.22570",
        cross=lambda v: None if v["eps_max"] >= v["eps_min"] else
        f"eps_max ({v['eps_max']}) must be >= eps_min ({v['eps_min']})")


@CLIP_RULE_REGISTRY.register("acpo")
def acpo_bounds(probs: torch.Tensor, ratio: torch.Tensor, valid: torch.Tensor, eps_low: float, eps_high: float,
                *, eps0: float = 0.2, alpha: float = 3.0, eps_min: float = 0.0, eps_max: float = 3.0,
                bins: int = ACPO_BINS) -> tuple[torch.Tensor, torch.Tensor]:
    """ACPO's per-token symmetric bound eps_b = clamp(eps0 + alpha sigma_b, eps_min, eps_max) (arXiv 2606.22570).

    probs: [N, L] current probabilities exp(log pi) (binning); ratio: [N, L] pi/pi_old; valid: [N, L]
    bool. eps_low/eps_high are ignored (the adaptive range replaces them). Returns (eps, eps), [N, L], computed
    without gradient.
    """
    if eps_min < 0 or eps_max < eps_min:
        raise ValueError(f"ACPO needs 0 <= eps_min <= eps_max, got eps_min={eps_min}, eps_max={eps_max}")
    if alpha < 0:
        raise ValueError(f"ACPO alpha must be >= 0, got {alpha}")
    with torch.no_grad():
        idx = bin_index(probs, bins)
        r = ratio.detach().to(torch.float64)
        eps = torch.full(ratio.shape, 0.0, dtype=ratio.dtype, device=ratio.device)
        for b in range(bins):
            sel = valid & (idx == b)
            n = int(sel.sum())
            sigma = float(r[sel].std(unbiased=False)) if n >= 2 else 0.0
            eps_b = min(max(eps0 + alpha * sigma, eps_min), eps_max)
            eps = torch.where(sel, torch.full_like(eps, eps_b), eps)
    return eps, eps


def clip_bounds(rule: str, logprobs: torch.Tensor, ratio: torch.Tensor, valid: torch.Tensor, eps_low: float,
                eps_high: float, **params: float) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """Look up clip rule ``rule`` and return its (eps_low, eps_high) bounds; ACPO params by config name
    (``acpo_eps0`` ...) or by keyword (``eps0`` ...). Unknown names raise (``RegistryError``)."""
    fn = CLIP_RULE_REGISTRY.get(rule)
    if rule == "fixed":
        return fn(logprobs, ratio, valid, eps_low, eps_high)
    kwargs = {ACPO_PARAMS.get(k, k): v for k, v in params.items()}
    return fn(torch.exp(logprobs.detach()), ratio, valid, eps_low, eps_high, **kwargs)


class OffPolicyDiagnostics:
    """Per pi_old-probability bin: ratio mean/std and low/high clip shares, accumulated over a step.

    ``add`` once per loss call (every micro-batch of every pass); ``metrics`` gives
    ``offpolicy/bin{b}/{ratio_mean,ratio_std,clip_low,clip_high,tokens}`` (bin b covers
    [b/bins, (b+1)/bins) of pi_old) plus ``offpolicy/ratio_std`` over all tokens. "low": r < 1 - eps_low,
    "high": r > 1 + eps_high, with the bounds the loss used (ACPO's per-token ones included), whatever the
    advantage's sign: it measures how far the policy moved, not which gradients were dropped.
    """

    def __init__(self, bins: int = ACPO_BINS) -> None:
        self.bins = bins
        self.sums = torch.zeros(bins, 5, dtype=torch.float64)  # n, sum r, sum r^2, n low, n high

    def add(self, ratio: torch.Tensor, old_logprobs: torch.Tensor, valid: torch.Tensor,
            eps_low: torch.Tensor | float = 0.2, eps_high: torch.Tensor | float = 0.2) -> None:
        with torch.no_grad():
            r = ratio.detach().double().cpu()
            v = valid.detach().cpu().bool()
            idx = bin_index(torch.exp(old_logprobs.detach().double().cpu().masked_fill(~v, 0.0)), self.bins)
            lo = 1 - (eps_low.detach().double().cpu() if torch.is_tensor(eps_low) else torch.full_like(r, eps_low))
            hi = 1 + (eps_high.detach().double().cpu() if torch.is_tensor(eps_high)
                      else torch.full_like(r, eps_high))
            for b in range(self.bins):
                sel = v & (idx == b)
                rb = r[sel]
                self.sums[b] += torch.tensor([float(sel.sum()), float(rb.sum()), float((rb * rb).sum()),
                                              float((r < lo)[sel].sum()), float((r > hi)[sel].sum())],
                                             dtype=torch.float64)

    def metrics(self) -> dict[str, Metric]:
        """Per probability bin with tokens: their count, the ratio's mean and (population) spread, the clipped
        shares — means over the bin's tokens; and the ratio's spread over every bin's tokens."""
        out: dict[str, Metric] = {}
        for b in range(self.bins):
            n, s, s2, low, high = self.sums[b].tolist()
            if n == 0:
                continue
            mean = s / n
            key = f"offpolicy/bin{b}"
            out[f"{key}/tokens"] = Metric.sum(n)
            out[f"{key}/ratio_mean"] = Metric.mean(mean, n=n)
            out[f"{key}/ratio_std"] = Metric.std(max(s2 / n - mean * mean, 0.0) ** 0.5, n=n, mean=mean)
            out[f"{key}/clip_low"] = Metric.mean(low / n, n=n)
            out[f"{key}/clip_high"] = Metric.mean(high / n, n=n)
        n, s, s2 = (float(self.sums[:, i].sum()) for i in range(3))
        if n:
            out["offpolicy/ratio_std"] = Metric.std(max(s2 / n - (s / n) ** 2, 0.0) ** 0.5, n=n, mean=s / n)
        return out


def loss_bounds(loss_kwargs: dict, logprobs: torch.Tensor, ratio: torch.Tensor, valid: torch.Tensor
                ) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """The (eps_low, eps_high) bounds a loss called with ``loss_kwargs`` clips with, for the diagnostics:
    the clip rule's (ACPO: per token) where the loss takes one, else its eps_low/eps_high (0.2 default)."""
    low, high = float(loss_kwargs.get("eps_low", 0.2)), float(loss_kwargs.get("eps_high", 0.2))
    rule = loss_kwargs.get("clip", "fixed")
    if rule == "fixed":
        return low, high
    return clip_bounds(rule, logprobs, ratio, valid, low, high, **(loss_kwargs.get("clip_params") or {}))
