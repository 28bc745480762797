"""DelTA: discriminative token credit from the LM-head input states (arXiv 2605.21467 [code]; docs/credit.md).

Each response token gets a coefficient c_t in [0.8, 1.2] that multiplies its advantage (the loss uses
A·c_t), from how much its gradient direction tells correct from incorrect responses apart:

1. token-gradient proxy v_t = (1 − p_t)·h_t, h_t the hidden state fed to the LM head (the final-norm
   output that predicts token t), p_t the sampled token's probability: the gradient of log p_t w.r.t. the
   logits is (onehot − p), whose component along the sampled token is (1 − p_t), so a confident token
   (boilerplate, p ≈ 1) barely moves the weights;
2. advantage-weighted centroids μ₊ = Σ_{A>0} A·v / Σ A and μ₋ = Σ_{A<0} |A|·v / Σ |A| over the batch;
3. d± = ‖v − μ±‖²; margin m = λ_w·d₋ − d₊ for tokens of positive responses, λ_w·d₊ − d₋ for negative ones
   (large when the token sits with its own side); γ = std(m) per side;
4. refine the centroids once with weights σ(m/γ)·|A|, recompute d±, m, γ;
5. c_t = 0.8 + 0.4·σ(m/γ); zero-advantage tokens 0.8; rescaled to mean 1 over valid tokens.

Ours [ours], where the summary does not decide: λ_w = 1; γ is the population std of the side's margins
(a side whose margins are all equal, or a single token, uses γ = 1); when the batch has no positive or no
negative token there is nothing to discriminate and every coefficient is 1 (plain GRPO); the margins
after the refinement are the ones used for c_t; hidden states are read in float32; the normaliser of the
loss counts tokens (``norm_weights`` = the response mask), so only the numerator carries c_t.
What to expect: a decisive token (the answer digit) near 1.2; a token closer to the other side's centroid
near 0.8; a boilerplate token shared by both sides is equidistant from the centroids (m ≈ 0) and sits near
the middle, 1.0 before the rescaling (see docs/methods.md, "DelTA").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from mmrlvr.credit.schemes import CreditResult, CreditScheme, _register
from mmrlvr.errors import UserError
from mmrlvr.lazy_import import lazy_module
from mmrlvr.metric import Metric

torch = lazy_module("torch")  # config checks read the scheme's class traits without torch

LOW, SPAN = 0.8, 0.4  # c_t = LOW + SPAN·σ(m/γ)


Reduce = Callable[[Any], Any]  # a tensor summed over processes (identity in one process)


def _centroid(v: torch.Tensor, weight: torch.Tensor, reduce: Reduce | None = None) -> torch.Tensor:
    """Σ w v / Σ w over tokens: v [T, H], weight [T] -> [H] (sums over every process's tokens with ``reduce``)."""
    num, den = (weight[:, None] * v).sum(0), weight.sum()
    if reduce is not None:
        num, den = reduce(num), reduce(den)
    return num / den.clamp_min(1e-12)


def _side_std(m: torch.Tensor, reduce: Reduce) -> float:
    """Population std of ``m`` over every process's tokens (from summed count, sum and sum of squares)."""
    stats = reduce(torch.stack([torch.tensor(float(m.numel()), dtype=torch.float64, device=m.device),
                                m.double().sum(), (m.double() ** 2).sum()]))
    n, s, s2 = (float(x) for x in stats)
    return max(s2 / n - (s / n) ** 2, 0.0) ** 0.5 if n > 1 else 0.0


def _margins(v: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, mu_p: torch.Tensor, mu_n: torch.Tensor,
             lam: float, reduce: Reduce | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(m [T], m/γ [T]) for tokens v [T, H]; pos/neg [T] bool sides; γ = population std per side."""
    d_p = ((v - mu_p) ** 2).sum(-1)
    d_n = ((v - mu_n) ** 2).sum(-1)
    m = torch.where(pos, lam * d_n - d_p, lam * d_p - d_n)
    z = torch.zeros_like(m)
    for side in (pos, neg):
        if reduce is not None:  # every process takes part, with or without tokens on this side
            gamma = _side_std(m[side], reduce)
        elif side.any():
            gamma = float(m[side].std(unbiased=False)) if int(side.sum()) > 1 else 0.0
        else:
            continue
        z[side] = m[side] / (gamma if gamma > 1e-12 else 1.0)
    return m, z


def delta_coefficients(hidden: torch.Tensor, logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                       *, lambda_w: float = 1.0, reduce: Reduce | None = None) -> torch.Tensor:
    """DelTA token coefficients c [N, L] (0 at masked tokens, mean 1 over valid ones).

    hidden: [N, L, H] LM-head input states predicting each response token; logp: [N, L] log-prob of the
    sampled token (p_t = exp); advantages: [N] or [N, L]; mask: [N, L] (> 0 counts).
    ``reduce`` (several processes): sums a tensor over processes, so the centroids, the per-side spreads and the
    final mean are those of the global batch — the coefficients then equal one process's on the same batch."""
    with torch.no_grad():
        valid = mask > 0
        adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        adv = adv.float()
        p = torch.exp(logp.detach().float().masked_fill(~valid, 0.0)).clamp(0.0, 1.0)
        v_all = (1.0 - p)[..., None] * hidden.detach().float()  # [N, L, H]
        c = torch.zeros_like(p)
        c[valid] = LOW
        pos, neg = valid & (adv > 0), valid & (adv < 0)
        sides = torch.stack([pos.sum(), neg.sum()]).to(p.device)
        if reduce is not None:
            sides = reduce(sides)
        if int(sides[0]) == 0 or int(sides[1]) == 0:
            return valid.to(p.dtype)
        sel = pos | neg
        v, a = v_all[sel], adv[sel]  # [T, H], [T]
        side_p, side_n = a > 0, a < 0
        w_p, w_n = torch.where(side_p, a, 0.0), torch.where(side_n, a.abs(), 0.0)
        mu_p, mu_n = _centroid(v, w_p, reduce), _centroid(v, w_n, reduce)
        _, z = _margins(v, side_p, side_n, mu_p, mu_n, lambda_w, reduce)
        s = torch.sigmoid(z)
        mu_p, mu_n = _centroid(v, s * w_p, reduce), _centroid(v, s * w_n, reduce)  # one refinement
        _, z = _margins(v, side_p, side_n, mu_p, mu_n, lambda_w, reduce)
        c[sel] = LOW + SPAN * torch.sigmoid(z)
        if reduce is None:
            mean = c[valid].mean()
        else:
            tot = reduce(torch.stack([c[valid].double().sum(), valid.sum().double()]).to(c.device))
            mean = (tot[0] / tot[1].clamp_min(1)).to(c.dtype)
        return torch.where(valid, c / mean, torch.zeros_like(c))


@_register("delta")
@dataclass
class DelTA(CreditScheme):
    """DelTA discriminative token credit (arXiv 2605.21467): the loss uses A·c_t, c_t in [0.8, 1.2]·(1/mean)
    from the LM-head input states (``mmrlvr.credit.delta``). Needs the hidden states of the response
    positions (``needs_hidden``): the credit stage passes ``hidden=`` ([N, L, H], e.g.
    ``mmrlvr.credit.signals.response_hidden(...).states``). Cost: one no-grad forward that returns hidden
    states (no vocabulary projection), N·L·H floats; batch-wide centroids, so not row-local."""

    needs_hidden: ClassVar[bool] = True

    lambda_w: float = 1.0  # weight of the distance to the other side's centroid in the margin [ours]

    def __post_init__(self) -> None:
        if self.lambda_w <= 0:
            raise UserError(f"credit.lambda_w must be > 0, got {self.lambda_w}")

    def __call__(self, signals, mask, advantages, *, old_logprobs=None, hidden=None, reduce=None,
                 **params) -> CreditResult:
        """``reduce``: sums a tensor over processes (the credit stage passes it with several processes)."""
        scheme = self.with_params(**params) if params else self
        return scheme._apply_hidden(signals, mask, advantages, old_logprobs, hidden, reduce)

    def _apply(self, signals, mask, advantages, old_logprobs) -> CreditResult:
        return self._apply_hidden(signals, mask, advantages, old_logprobs, None)

    def _apply_hidden(self, signals, mask, advantages, old_logprobs, hidden, reduce=None) -> CreditResult:
        if hidden is None:
            raise UserError("credit scheme delta needs the LM-head input states of the response tokens "
                            "(hidden=[N, L, H]); the credit stage computes them when the scheme says needs_hidden")
        hidden = getattr(hidden, "states", hidden)
        logp = next((x for x in (signals.logp if signals is not None else None, old_logprobs,
                                 signals.old_logp if signals is not None else None) if x is not None), None)
        if logp is None:
            raise UserError("credit scheme delta needs the sampled tokens' log-probs (old_logprobs)")
        c = delta_coefficients(hidden, logp, advantages, mask, lambda_w=self.lambda_w, reduce=reduce)
        valid = mask > 0
        vals = c[valid]
        from mmrlvr.credit.signals import TokenSignals

        sig = signals if signals is not None else TokenSignals(None, None, None, logp, None)
        return self._result(valid, c, sig, mask, norm_weights=valid.float(), **{
            "credit/delta_coef_mean": Metric.mean(float(vals.mean()) if vals.numel() else 0.0, n=vals.numel()),
            "credit/delta_coef_min": Metric.min(float(vals.min()) if vals.numel() else 0.0),
            "credit/delta_coef_max": Metric.max(float(vals.max()) if vals.numel() else 0.0),
        })
