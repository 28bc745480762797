"""POPO, positive-only policy optimisation (arXiv 2605.06650 [code]; docs/methods.md): the pure parts.

Only correct rollouts carry loss. Per group, the positives get weights w = softmax(ℓ̄/T) of their
length-averaged log-probability ℓ̄ = mean_t log π(o_t) (no gradient), and

    L = L_NLL + 0.1·L_sim + 0.01·L_ent
    L_NLL = −Σ_i w_i Σ_t log π(o_it) / (positive token count)          (``popo_loss`` + token-mean)
    L_sim = −Σ_i w_i cos(h_φ(f_θ,i), sg(f_ξ,i + N(0, 0.02²))) / Σ_i w_i (``PopoSimilarity``)
    L_ent = −mean entropy over positive tokens (maximise entropy)          (``popo_entropy_term``)

f = masked mean of the final-norm hidden states over the completion, h_φ a 2-layer MLP predictor
(hidden 1024), f_ξ an EMA target (τ = 0.995); KL 0; G = 8 in the paper.

How the pieces meet the stages: ``popo_weights`` (from rewards, groups and the sampler's log-probs)
gives each row a_i = w_i·P_g (P_g = positives in the group, so uniform weights give 1) and the rows to
keep; the stage zeroes the token weights of the other rows, so ``token-mean`` divides by the positive
token count, and hands a_i as the advantage to the ``popo`` loss, −a_i·log π(o_t). ``PopoSimilarity``
owns h_φ (trained with the policy's optimizer: its parameters must be added) and the EMA target.

Ours [ours], where the summary does not decide: a rollout is positive when its reward ≥ ``threshold``
(1.0: the accuracy reward's full mark); ℓ̄ is read from π_old (the sampler), equal to π at the first
pass; groups without a positive contribute nothing and are counted (``popo/groups_without_positive``);
the EMA target is over the *trainable* parameters (the LoRA adapter, or all weights in full fine-tuning)
and the target features come from a no-grad forward with those parameters swapped in; the noise is
drawn from a generator seeded per step; the loss takes no importance ratio (POPO's NLL is on-policy;
with ``algo.epochs > 1`` later passes reuse the same weights).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

from mmrlvr.algos.masked import zero_masked
from mmrlvr.metric import Metric

POPO_SIM_COEF = 0.1
POPO_ENT_COEF = 0.01
POPO_EMA_TAU = 0.995
POPO_NOISE_STD = 0.02
POPO_PREDICTOR_HIDDEN = 1024


@torch.no_grad()
def popo_weights(rewards: torch.Tensor, group_index: torch.Tensor, seq_logp_mean: torch.Tensor, *,
                 temperature: float = 1.0, threshold: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(a [N], positive [N] bool, stats): a_i = w_i·P_g for positives, 0 otherwise.

    rewards, seq_logp_mean: [N] float; group_index: [N] int. w = softmax(seq_logp_mean / T) over the
    positives of each group. stats: ``popo/groups_without_positive`` (count), ``popo/positive_fraction``."""
    if temperature <= 0:
        raise ValueError(f"POPO temperature must be > 0, got {temperature}")
    positive = rewards >= threshold
    a = torch.zeros_like(rewards, dtype=torch.float32)
    groups = torch.unique(group_index)
    empty = 0
    for g in groups.tolist():
        rows = (group_index == g) & positive
        if not rows.any():
            empty += 1
            continue
        w = torch.softmax(seq_logp_mean[rows].float() / temperature, dim=0)
        a[rows] = w * int(rows.sum())
    stats = {"popo/groups_without_positive": Metric.sum(float(empty)), "popo/groups": Metric.sum(float(len(groups))),
             "popo/positive_fraction": Metric.mean(float(positive.float().mean()) if positive.numel() else 0.0,
                                                   n=positive.numel())}
    return a, positive, stats


def popo_entropy_term(entropy: torch.Tensor, mask: torch.Tensor, coef: float = POPO_ENT_COEF) -> torch.Tensor:
    """Per-token −coef·H_t on tokens with mask > 0 ([N, L]; add to the per-token loss before aggregating:
    minimising it maximises entropy). ``entropy`` must carry the policy's gradient."""
    return zero_masked(-coef * entropy, mask > 0)


def masked_mean_features(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """f = mean of hidden [N, L, H] over the tokens with mask > 0: [N, H] (0 for an empty row)."""
    m = (mask > 0).to(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


class PopoSimilarity(torch.nn.Module):
    """POPO's similarity term: predictor h_φ (2-layer MLP, hidden 1024) and the EMA target parameters.

    ``loss(f_online, f_target, w)`` = −Σ w·cos(h_φ(f_online), sg(f_target + ε)) / Σ w, ε ~ N(0, σ²).
    ``update_target(model)`` moves the EMA copy ξ ← τξ + (1 − τ)θ of ``model``'s trainable parameters;
    ``target(model)`` is a context in which ``model`` runs with ξ (for the target features' forward).
    """

    def __init__(self, hidden_size: int, *, predictor_hidden: int = POPO_PREDICTOR_HIDDEN, tau: float = POPO_EMA_TAU,
                 noise_std: float = POPO_NOISE_STD) -> None:
        super().__init__()
        if not 0.0 <= tau < 1.0:
            raise ValueError(f"POPO EMA tau must be in [0, 1), got {tau}")
        self.predictor = torch.nn.Sequential(torch.nn.Linear(hidden_size, predictor_hidden), torch.nn.GELU(),
                                             torch.nn.Linear(predictor_hidden, hidden_size))
        self.tau, self.noise_std = tau, noise_std
        self._ema: dict[str, torch.Tensor] = {}

    def loss(self, f_online: torch.Tensor, f_target: torch.Tensor, w: torch.Tensor,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """f_online: [N, H] (with grad), f_target: [N, H], w: [N] ≥ 0. A scalar; 0 when Σ w = 0."""
        if float(w.sum()) <= 0:
            return f_online.sum() * 0.0
        noise = torch.randn(f_target.shape, generator=generator, dtype=torch.float32).to(f_target) * self.noise_std
        target = (f_target.detach().float() + noise.float())
        pred = self.predictor(f_online.to(self.predictor[0].weight.dtype)).float()
        cos = F.cosine_similarity(pred, target, dim=-1)
        w = w.detach().float()
        return -(w * cos).sum() / w.sum()

    @torch.no_grad()
    def update_target(self, model: torch.nn.Module) -> None:
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if name not in self._ema:
                self._ema[name] = p.detach().clone()
            else:
                self._ema[name].mul_(self.tau).add_(p.detach(), alpha=1.0 - self.tau)

    @contextlib.contextmanager
    def target(self, model: torch.nn.Module) -> Iterator[None]:
        """Run ``model`` with the EMA parameters (initialised to the current ones on first use)."""
        params = dict(model.named_parameters())
        if not self._ema:
            self.update_target(model)
        saved = {n: params[n].detach().clone() for n in self._ema if n in params}
        try:
            with torch.no_grad():
                for n, v in self._ema.items():
                    if n in params:
                        params[n].copy_(v)
            yield
        finally:
            with torch.no_grad():
                for n, v in saved.items():
                    params[n].copy_(v)
