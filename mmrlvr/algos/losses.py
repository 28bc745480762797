"""Policy losses per token: PPO-clip (GRPO/DAPO), GSPO, CISPO, NSR, POPO, Clip-Cov and KL-Cov, registered by name.

Every loss has the signature

    fn(logprobs [N, L], old_logprobs [N, L], advantages [N] or [N, L], response_mask [N, L], **params)
        -> (loss_per_token [N, L], LossStats)

and is registered in ``POLICY_LOSSES`` (config key ``algo.loss``). Aggregation over tokens and
sequences is separate (``mmrlvr.algos.aggregation.agg_loss``), so any loss combines with any mode.

``response_mask`` may hold token weights in [0, inf) (credit schemes); a position counts as a response
token when its weight is > 0. Masked positions may hold -inf log-probs (tokens blocked after
end-of-sequence): they are replaced by 0 *before* ``exp(logp - old_logp)``, so the loss and its
gradients stay finite (a -inf left there would turn them NaN), and the loss there is exactly 0.
Log-ratios are clamped to [-20, 20] before ``exp`` (as verl does), which bounds the ratio at
e^20 ~ 4.9e8; a token beyond that gets no gradient.

Not here: KL to the reference (``kl.py``), entropy bonuses, aggregation, the optimizer step.
"""

from __future__ import annotations

import inspect
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple

from mmrlvr.algos.masked import masked_mean, zero_masked
from mmrlvr.lazy_import import lazy_module
from mmrlvr.methods import Param, declare
from mmrlvr.methods import non_negative as _nonneg
from mmrlvr.methods import positive as _pos
from mmrlvr.registry import Registry

torch = lazy_module("torch")  # declarations and config checks read this module without torch

LOG_RATIO_CLAMP = 20.0


class LossStats(NamedTuple):
    """Detached scalars describing the importance ratios of one loss call, over response tokens."""

    clip_fraction: torch.Tensor  # share of tokens whose gradient a clip removed (cispo: weight truncated)
    ratio_mean: torch.Tensor  # mean ratio pi/pi_old (gspo: the sequence ratio at each token)
    ratio_max: torch.Tensor
    ratio_min: torch.Tensor
    approx_kl: torch.Tensor  # mean of r - 1 - log r, the k3 estimate of KL(pi_old || pi)
    recovered_fraction: torch.Tensor  # nsr: share of tokens rescued from the clip (0 for the others)
    #: the loss's own metrics (``mmrlvr.metric.Metric`` values, e.g. ``{"myloss/rescued": Metric.mean(x, n=tokens)}``),
    #: combined over the step's micro-batches and passes into metrics.jsonl
    diagnostics: Mapping[str, Any] = MappingProxyType({})


PolicyLoss = Callable[..., "tuple[torch.Tensor, LossStats]"]

#: name -> fn(logprobs, old_logprobs, advantages, response_mask, **params) -> (loss [N, L], LossStats)
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def _prepare(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
             response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check shapes; return (valid [N, L] bool, safe logprobs [N, L], log r [N, L], advantages [N, L])."""
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape or response_mask.shape != logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
                         f"response_mask {tuple(response_mask.shape)} must all be [N, L]")
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [N] or [N, L] for logprobs "
                         f"{tuple(logprobs.shape)}")
    valid = response_mask > 0
    logp = zero_masked(logprobs, valid)  # -inf at padding must never reach exp or a product
    log_ratio = (logp - zero_masked(old_logprobs.detach(), valid)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    adv = advantages.detach().unsqueeze(-1) if advantages.dim() == 1 else advantages.detach()
    adv = zero_masked(adv.expand_as(logprobs).to(logprobs.dtype), valid)
    return valid, logp, log_ratio, adv


def _stats(ratio: torch.Tensor, valid: torch.Tensor, clipped: torch.Tensor,
           recovered: torch.Tensor | None = None) -> LossStats:
    """ratio, valid, clipped, recovered: [N, L]. Means count tokens (valid), not token weights."""
    with torch.no_grad():
        return _stats_of(ratio, valid, clipped, recovered)


def _stats_of(ratio: torch.Tensor, valid: torch.Tensor, clipped: torch.Tensor,
              recovered: torch.Tensor | None) -> LossStats:
    ratio, w = ratio.detach(), valid.to(ratio.dtype)
    big, small = torch.finfo(ratio.dtype).max, torch.finfo(ratio.dtype).min
    any_valid = bool(valid.any())
    r_max = torch.where(valid, ratio, small).max() if any_valid else ratio.new_tensor(0.0)
    r_min = torch.where(valid, ratio, big).min() if any_valid else ratio.new_tensor(0.0)
    kl = masked_mean(ratio - 1 - ratio.log(), w)
    rec = masked_mean(recovered.to(ratio.dtype), w) if recovered is not None else ratio.new_tensor(0.0)
    return LossStats(masked_mean(clipped.to(ratio.dtype), w), masked_mean(ratio, w), r_max, r_min, kl, rec)


def _bounds(clip: str, clip_params: dict[str, Any] | None, logp: torch.Tensor, ratio: torch.Tensor,
            valid: torch.Tensor, eps_low: float, eps_high: float, dual_clip: float | None
            ) -> tuple[Any, Any, float | None]:
    """(eps_low, eps_high, dual_clip) after the clip rule ``clip`` (``mmrlvr.algos.clipping.CLIP_RULE_REGISTRY``).

    ``fixed`` returns the floats unchanged; ``acpo`` per-token [N, L] bounds and dual clip 3 when unset."""
    if clip == "fixed" and not clip_params:
        return eps_low, eps_high, dual_clip
    from mmrlvr.algos.clipping import ACPO_DUAL_CLIP, clip_bounds

    low, high = clip_bounds(clip, logp, ratio, valid, eps_low, eps_high, **(clip_params or {}))
    if clip == "acpo" and dual_clip is None:
        dual_clip = ACPO_DUAL_CLIP
    return low, high, dual_clip


def _check_eps(eps_low: float, eps_high: float) -> None:
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")


def _clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float | torch.Tensor,
                       eps_high: float | torch.Tensor, dual_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate per token and where a clip zeroes its gradient. All [N, L]; the bounds
    are floats or [N, L] tensors (ACPO)."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    r = ratio.detach()
    zeroed = ((adv > 0) & (r > 1 + eps_high)) | ((adv < 0) & (r < 1 - eps_low))
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (the DAPO/verl value is 3), got {dual_clip}")
        # For A < 0 a huge ratio would give an unbounded loss; cap it at -A * c (Ye et al. 2020).
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
        zeroed = zeroed | ((adv < 0) & (r > dual_clip))
    return loss, zeroed


declare("loss", "ppo_clip", "PPO-clip per token, the GRPO/DAPO loss; reads algo.eps_low/eps_high/dual_clip and "
        "algo.clip", source="arXiv:1707.06347; clip-higher arXiv:2503.14476",
        why="PPO's clip range")
@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  response_mask: torch.Tensor, *, eps_low: float = 0.2, eps_high: float = 0.2,
                  dual_clip: float | None = None, clip: str = "fixed",
                  clip_params: dict[str, Any] | None = None) -> tuple[torch.Tensor, LossStats]:
    """PPO-clip per token, the GRPO/DAPO policy loss: -min(r A, clip(r, 1-eps_low, 1+eps_high) A).

    logprobs: [N, L] (with grad); old_logprobs: [N, L]; advantages: [N] or [N, L];
    response_mask: [N, L] weights. Returns loss [N, L] (0 where masked) and LossStats.
    Schulman et al. 2017 (arXiv:1707.06347); separate eps_low/eps_high is DAPO's "clip-higher"
    (Yu et al. 2025, arXiv:2503.14476, eps_high = 0.28); ``dual_clip=c`` (c = 3 is common) bounds
    the loss of A < 0 tokens at -c A (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729).
    A clipped token has zero gradient; ``clip_fraction`` counts them.
    ``clip``: the clip rule (``algo.clip``, ``mmrlvr.algos.clipping``): "fixed" (the range above) or "acpo"
    (variance-adaptive per-probability-bin range, arXiv 2606.22570; ``clip_params`` acpo_eps0/acpo_alpha/
    acpo_eps_min/acpo_eps_max; dual clip 3 unless ``dual_clip`` is given).
    """
    _check_eps(eps_low, eps_high)
    valid, logp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    ratio = torch.exp(log_ratio)  # [N, L]
    low, high, dual_clip = _bounds(clip, clip_params, logp, ratio, valid, eps_low, eps_high, dual_clip)
    loss, zeroed = _clipped_surrogate(ratio, adv, low, high, dual_clip)
    return zero_masked(loss, valid), _stats(ratio, valid, zeroed & valid)


declare("loss", "gspo", "clip the sequence ratio exp(mean log r) (its own range: 3e-4 / 4e-4 by default)",
        source="arXiv:2507.18071",
        agg='seq-mean-token-mean', why="GSPO's sequence-ratio clip range and sequence mean (arXiv:2507.18071)")
@POLICY_LOSSES.register("gspo")
def gspo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              response_mask: torch.Tensor, *, eps_low: float = 3e-4,
              eps_high: float = 4e-4) -> tuple[torch.Tensor, LossStats]:
    """GSPO: clip the *sequence* ratio s_i = exp(mean_t log r_t) (Zheng et al. 2025, arXiv:2507.18071).

    logprobs, old_logprobs: [N, L]; advantages: [N] (or [N, L], the paper's GSPO-token variant);
    response_mask: [N, L]. Returns loss [N, L] and LossStats (ratios are the sequence ratios).
    Token form of the paper's §4.3: s_it = sg(s_i) * pi(y_t) / sg(pi(y_t)) equals s_i in value, so each
    sequence is clipped as a whole, while its gradient s_i * grad log pi(y_t) reaches every token;
    aggregated with ``seq-mean-token-mean`` this is exactly grad of the sequence objective
    min(s_i A_i, clip(s_i) A_i). The mean over t counts response tokens (mask > 0), not token weights.
    Defaults are the paper's clip ranges (3e-4, 4e-4): s_i is a geometric mean, so it moves little.
    """
    _check_eps(eps_low, eps_high)
    valid, logp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    seq_log_ratio = masked_mean(log_ratio, valid.to(log_ratio.dtype), dim=-1)  # [N]
    token_log_ratio = logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [N, L], value log s_i
    ratio = torch.exp(token_log_ratio)
    loss, zeroed = _clipped_surrogate(ratio, adv, eps_low, eps_high, None)
    return zero_masked(loss, valid), _stats(ratio, valid, zeroed & valid)


declare("loss", "cispo", "truncated, detached importance weight times log pi: no token loses its gradient",
        source="arXiv:2506.13585",
        agg='token-mean', why="CISPO's weight truncation: no lower bound, upper 5 (ScaleRL/TRL/SkyRL reference code)")
@POLICY_LOSSES.register("cispo")
def cispo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
               response_mask: torch.Tensor, *, eps_high: float = 4.0,
               eps_low: float = 1.0) -> tuple[torch.Tensor, LossStats]:
    """CISPO: L = -sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi (MiniMax-M1, arXiv:2506.13585).

    logprobs, old_logprobs: [N, L]; advantages: [N] or [N, L]; response_mask: [N, L].
    Returns loss [N, L] and LossStats. The importance weight is truncated and detached instead of the
    token being dropped, so every token keeps a gradient (-w A grad log pi), including the rare
    "fork" tokens PPO clips away. ``eps_low=1`` (default) makes the lower bound 0, i.e. none, as in
    MiniMax-M1 (weight clip(r, 0, 1+eps_high)), which tuned only the upper bound and did not publish
    it. ``eps_high=4`` (default) truncates the weight at 5, the value of the reference implementations:
    ScaleRL's CISPO recipe (Khatri et al. 2025, arXiv:2510.13786, eps_max = 5), TRL's
    ``loss_type="cispo"`` (``clamp(ratio, max=epsilon_high)``, 5.0 recommended) and SkyRL (lower 0,
    upper 1 + 4). Why not PPO's 0.2/0.28: CISPO never drops a token, so a tight bound would only flatten
    the weights of the tokens that moved most, which is what CISPO exists to keep.
    The loss *value* is in units of log pi and is not comparable with ppo_clip's; its gradient is.
    ``clip_fraction`` counts tokens whose weight was truncated (they still get a gradient).
    """
    _check_eps(eps_low, eps_high)
    valid, logp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    ratio = torch.exp(log_ratio)
    low = max(0.0, 1 - eps_low)
    weight = ratio.detach().clamp(low, 1 + eps_high)  # [N, L], sg(clip(r))
    loss = -weight * adv * logp
    truncated = valid & ((ratio.detach() > 1 + eps_high) | (ratio.detach() < low))
    return zero_masked(loss, valid), _stats(ratio, valid, truncated)


declare("loss", "nsr", "PPO-clip whose near-boundary clipped tokens are rescued at random",
        Param("noise", 0.2, "relative noise of the rescue: r' = r(1 -/+ noise*u), u ~ U(0,1) [ours]", "in (0, 1]",
              lambda v: 0 < v <= 1),
        source="ours: the paper's exact rule is not public",
        why="NSR on DAPO's clip-higher range")
@POLICY_LOSSES.register("nsr")
def nsr_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
             response_mask: torch.Tensor, *, eps_low: float = 0.2, eps_high: float = 0.28,
             noise: float = 0.2, dual_clip: float | None = None,
             generator: torch.Generator | None = None, clip: str = "fixed",
             clip_params: dict[str, Any] | None = None) -> tuple[torch.Tensor, LossStats]:
    """NSR: PPO-clip where tokens just outside the clip range are rescued at random (docs/methods.md, "NSR").

    logprobs, old_logprobs: [N, L]; advantages: [N] or [N, L]; response_mask: [N, L];
    generator: for the noise (pass a seeded one for reproducible steps). Returns loss [N, L], LossStats.
    The paper's exact rule is not public; ours [ours]: a token PPO would clip (A > 0, r > b = 1+eps_high,
    or A < 0, r < a = 1-eps_low) gets a noisy ratio r' = r(1 - noise*u) resp. r(1 + noise*u), u ~ U(0,1).
    If r' falls back inside the range, the token is rescued with the gradient of the surrogate at r',
    -A r' grad log pi, so a rescued gradient is never larger than that of a token inside the range.
    On the upper side P(rescue) = 1 - (1 - b/r)/noise: 1 at r = b (continuous with PPO), 0 from
    r = b/(1-noise) on: a soft clip confined to a band near the boundary. ``noise=1`` gives P = b/r and
    an expected coefficient A b^2/(2r) on grad log pi, i.e. A b^2/(2r^2) per unit of ratio: the
    O(1/r^2) gradient decay the NSR paper describes. ``clip``/``clip_params``: as for ``ppo_clip`` (the rescue band
    then sits at ACPO's per-token bounds).
    """
    _check_eps(eps_low, eps_high)
    if not 0 < noise <= 1:
        raise ValueError(f"noise must be in (0, 1], got {noise}")
    valid, logp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    ratio = torch.exp(log_ratio)
    eps_low, eps_high, dual_clip = _bounds(clip, clip_params, logp, ratio, valid, eps_low, eps_high, dual_clip)
    loss, zeroed = _clipped_surrogate(ratio, adv, eps_low, eps_high, dual_clip)
    u = torch.rand(ratio.shape, generator=generator, dtype=ratio.dtype, device=ratio.device)
    r = ratio.detach()
    above, below = valid & (adv > 0) & (r > 1 + eps_high), valid & (adv < 0) & (r < 1 - eps_low)
    scale = torch.where(above, 1 - noise * u, 1 + noise * u)  # r' / r
    rescued = (above & (r * scale <= 1 + eps_high)) | (below & (r * scale >= 1 - eps_low))
    loss = torch.where(rescued, -adv * ratio * scale, loss)
    return zero_masked(loss, valid), _stats(ratio, valid, zeroed & valid & ~rescued, rescued)


declare("loss", "popo", "positive-only: a weighted NLL on a group's correct rollouts, plus a similarity and an "
        "entropy term (brings its own advantages and update stages)",
        Param("temperature", 1.0, "T of the softmax weights over a group's positives", "> 0", _pos),
        Param("threshold", 1.0, "a rollout is positive when its reward >= this [ours]"),
        Param("sim_coef", 0.1, "weight of the similarity term (predictor vs EMA target features)", ">= 0", _nonneg),
        Param("ent_coef", 0.01, "weight of the entropy bonus on positive tokens", ">= 0", _nonneg),
        Param("ema_tau", 0.995, "EMA rate of the target parameters", "in [0, 1)", lambda v: 0 <= v < 1),
        source="arXiv:2605.06650",
        agg='token-mean', why="POPO's weighted NLL over positive tokens, normalised by their count (arXiv:2605.06650)")
@POLICY_LOSSES.register("popo")
def popo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              response_mask: torch.Tensor) -> tuple[torch.Tensor, LossStats]:
    """POPO's weighted NLL on positive rollouts (arXiv 2605.06650; ``mmrlvr.algos.popo``): −a_i·log π(o_t).

    logprobs: [N, L] (with grad); advantages: [N] or [N, L] — here POPO's weights a_i = w_i·P_g ≥ 0
    (``popo_weights``), 0 for rows without a positive reward (negative values count as 0); response_mask: [N, L] (the stage zeroes the
    rows that are not positive, so token-mean divides by the positive token count). No importance ratio
    and no clip: ``clip_fraction`` is 0; the ratio statistics still describe pi/pi_old.
    """
    valid, logp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    loss = -adv.clamp_min(0.0) * logp  # positive only: a negative value (e.g. a GRPO advantage) carries nothing
    ratio = torch.exp(log_ratio)
    return zero_masked(loss, valid), _stats(ratio, valid, torch.zeros_like(valid))


# ------------------------------------------------------------------------------ covariance entropy control
#
# Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
# (arXiv:2505.22617): the entropy of a softmax policy falls, under a policy-gradient step, by the covariance
# between a token's log-probability and its advantage. A few tokens with a large positive covariance drive the
# collapse; Clip-Cov and KL-Cov restrain exactly those. Read against the authors' code (the PRIME-RL
# Entropy-Mechanism-of-RL repository, commit 8850579, ``verl/trainer/ppo/core_algos.py`` and the recipes
# ``recipe/dapo/{7b,32b}_{clip,kl}_cov.sh``) and verl's port (``compute_policy_loss_clip_cov`` /
# ``compute_policy_loss_kl_cov`` in ``verl/trainer/ppo/core_algos.py``, commit b178a3c).


def _centred_cov(logp: torch.Tensor, adv: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Cov_i = (log pi_i - mean log pi) * (A_i - mean A) per token [N, L], detached, 0 where not valid.

    The means are plain means over the valid tokens of these [N, L] tensors (tokens, not token weights, as
    ``_stats``); in float32 whatever the log-probs' dtype."""
    with torch.no_grad():
        lp, a = logp.detach().float(), adv.detach().float()
        if not bool(valid.any()):
            return torch.zeros_like(lp)
        cov = (lp - lp[valid].mean()) * (a - a[valid].mean())
        return torch.where(valid, cov, torch.zeros_like(cov))


def _cov_count(fraction: float, valid: torch.Tensor) -> int:
    """How many tokens a cov method selects: max(1, floor(fraction * valid tokens)), 0 without valid tokens
    (the reference's ``max(1, int(ratio * n))``)."""
    n_valid = int(valid.sum())
    return max(1, int(fraction * n_valid)) if n_valid else 0


def _check_fraction(fraction: float) -> None:
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1] (a share of the response tokens), got {fraction}")


def _fraction(v) -> bool:
    return 0 < v <= 1


def _kl_cov_epochs_note(cfg, p) -> list[str]:
    if cfg.algo.epochs != 1:
        return []
    from mmrlvr.run_settings import recompute_enabled

    if recompute_enabled(cfg):
        what = ("|log pi - log pi_old| is exactly 0 (pi_old is recomputed by the training model) with zero gradient, "
                "and the loss is the plain unclipped policy gradient")
    else:
        what = ("|log pi - log pi_old| is only the engine's numerical mismatch (pi_old is the sampler's own log-probs; "
                "~1e-6 on the tiny demo): the penalty is ~0, yet its gradient on the selected tokens is "
                f"coef={p['coef']} times the mismatch's sign, noise rather than a restraint")
    return [f"algo.loss: kl_cov with algo.epochs: 1 - every token is on-policy at its first pass (one optimizer step "
            f"per pass over the batch, no off-policy mini-batches), so the KL-Cov penalty restrains nothing: {what}. "
            "Set algo.epochs >= 2 for the penalty to act"]



declare("loss", "clip_cov", "PPO-clip (range 1 / 1 by default) where a few random tokens of high covariance "
        "(log pi - mean) * (A - mean) lose their gradient; reads algo.eps_low/eps_high/dual_clip",
        Param("fraction", 2e-4, "r: share of the micro-batch's response tokens detached, n = max(1, floor(r * "
              "tokens)), drawn among the candidates (verl clip_cov_ratio)", "in (0, 1]", _fraction),
        Param("cov_low", 1.0, "omega_low: a candidate's covariance is > this (verl clip_cov_lb)"),
        Param("cov_high", 5.0, "omega_high: a candidate's covariance is < this (verl clip_cov_ub)"),
        source="arXiv:2505.22617; verl core_algos compute_policy_loss_clip_cov and the authors' recipes",
        cross=lambda v: None if v["cov_low"] < v["cov_high"] else
        f"cov_low ({v['cov_low']}) must be < cov_high ({v['cov_high']})",
        why="Clip-Cov's clip range [0, 2] of the authors' recipes (arXiv:2505.22617)")
@POLICY_LOSSES.register("clip_cov")
def clip_cov_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  response_mask: torch.Tensor, *, eps_low: float = 1.0, eps_high: float = 1.0,
                  dual_clip: float | None = None, fraction: float = 2e-4, cov_low: float = 1.0,
                  cov_high: float = 5.0,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, LossStats]:
    """Clip-Cov: PPO-clip, plus a few high-covariance tokens picked at random lose their gradient (arXiv:2505.22617).

    logprobs, old_logprobs: [N, L]; advantages: [N] or [N, L]; response_mask: [N, L]; generator: for the
    draw (the update stage passes one seeded by ``seed`` and the step, so a rerun or a resume draws the same
    tokens). Returns loss [N, L] and LossStats.

    Per valid token Cov_i = (log pi_i - mean log pi) * (A_i - mean A) (current log-probs, detached; means over
    the valid tokens). Candidates: valid tokens with ``cov_low < Cov_i < cov_high`` (strict, as the code) that
    the PPO clip has not already silenced. n = max(1, floor(``fraction`` * valid tokens)) of them, drawn
    uniformly without replacement (all of them when there are fewer), keep their surrogate's value but lose
    its gradient; every other token is PPO-clip's (``ppo_clip_loss`` with the same range, dual clip included).
    ``clip_fraction`` counts the tokens whose gradient is gone: the PPO-clipped and the Cov-detached.

    Defaults, from the authors' recipes (``recipe/dapo/*_clip_cov.sh``) and both codes: ``fraction`` r = 2e-4,
    ``cov_low`` omega_low = 1, ``cov_high`` omega_high = 5, and the clip range ``eps_low = eps_high = 1``
    (ratio clipped to [0, 2]): the recipes set clip_ratio_low = clip_ratio_high = 1 for Clip-Cov (0.2 for their
    baselines), so Clip-Cov replaces most of PPO's clipping rather than adding to it. verl's port reads the
    actor's clip range instead (0.2 unless set). Neither code applies a dual clip (verl's recipe sets
    clip_ratio_c = 10, which this loss does not read); ours is ``algo.dual_clip`` as for ppo_clip, off by default.

    "The batch" is what the loss is called with: one micro-batch of one process (``algo.micro_batch_size``
    rows), as in both codes, where the policy loss runs per micro-batch per GPU (verl's recipes: dynamic
    micro-batches of up to 20k-30k tokens). The means, the candidate set and n are the micro-batch's, so they
    depend on ``algo.micro_batch_size`` and the number of processes; with fewer than 1/fraction = 5000 tokens a
    micro-batch still detaches one token when it has a candidate (the reference's max(1, ...)).

    Where we differ: (1) a selected token's loss keeps its value, detached (the paper's wording, "detach");
    the codes multiply it by 0, which gives the same gradient but a logged loss without those tokens' share.
    (2) The means count valid tokens whatever their weight (``response_mask`` may hold credit weights; the
    codes' mask is 0/1). (3) The draw uses the step's seeded generator rather than the global RNG.
    """
    _check_eps(eps_low, eps_high)
    _check_fraction(fraction)
    if not cov_low < cov_high:
        raise ValueError(f"cov_low ({cov_low}) must be < cov_high ({cov_high})")
    valid, logp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    ratio = torch.exp(log_ratio)
    loss, zeroed = _clipped_surrogate(ratio, adv, eps_low, eps_high, dual_clip)
    cov = _centred_cov(logp, adv, valid)
    candidates = (valid & ~zeroed & (cov > cov_low) & (cov < cov_high)).flatten().nonzero().squeeze(1)
    n = _cov_count(fraction, valid)
    if candidates.numel() > n:
        pick = torch.randperm(candidates.numel(), generator=generator)[:n]
        candidates = candidates[pick.to(candidates.device)]
    detached = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    detached[candidates] = True
    detached = detached.view_as(valid)
    loss = torch.where(detached, loss.detach(), loss)
    return zero_masked(loss, valid), _stats(ratio, valid, (zeroed | detached) & valid)


declare("loss", "kl_cov", "unclipped surrogate -A r plus coef * |log pi - log pi_old| on the top-k tokens by "
        "covariance (log pi - mean) * (A - mean); no PPO clip. Inert at algo.epochs: 1 (on-policy: the penalty "
        "is 0 with zero gradient); use algo.epochs >= 2",
        Param("fraction", 2e-3, "k: share of the micro-batch's response tokens penalised, n = max(1, floor(k * "
              "tokens)), largest covariance first (the authors' 7B value; their 32B run and verl's default: 2e-4)",
              "in (0, 1]", _fraction),
        Param("coef", 1.0, "beta: weight of |log pi - log pi_old| on those tokens (verl ppo_kl_coef; its config "
              "default is 0.1)", ">= 0", _nonneg),
        source="arXiv:2505.22617; verl core_algos compute_policy_loss_kl_cov and the authors' recipes",
        plan_notes=_kl_cov_epochs_note,
        why='KL-Cov: no clip, a penalty on the top-covariance tokens instead (arXiv:2505.22617)')
@POLICY_LOSSES.register("kl_cov")
def kl_cov_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, *, fraction: float = 2e-3,
                coef: float = 1.0) -> tuple[torch.Tensor, LossStats]:
    """KL-Cov: the unclipped surrogate, plus coef * |log pi - log pi_old| on the top-Cov tokens (arXiv:2505.22617).

    logprobs, old_logprobs: [N, L]; advantages: [N] or [N, L]; response_mask: [N, L]. Returns loss [N, L] and
    LossStats (``clip_fraction`` 0: no token loses its gradient).

    Per valid token Cov_i = (log pi_i - mean log pi) * (A_i - mean A) (current log-probs, detached; means over
    the valid tokens). The n = max(1, floor(``fraction`` * valid tokens)) tokens with the largest Cov_i get
    loss -A r + coef * |log r|; every other token -A r. As in both codes there is **no PPO clip at all** (on
    any token): the penalty replaces it, so ``algo.eps_low``/``eps_high``/``dual_clip`` are not read.

    The penalty needs pi != pi_old. At the first pass over a batch pi = pi_old, so |log r| = 0 and its
    gradient is 0 (d|x|/dx = 0 at 0): with ``algo.epochs: 1`` every pass is a first pass here (one optimizer
    step per pass over the batch, no mini-batches) and KL-Cov is the plain unclipped policy gradient. The
    authors' runs split each batch into 8 mini-batches (256 prompts, mini-batch 32), so 7 of 8 updates were
    off-policy; here use ``algo.epochs >= 2``. Where pi_old is the sampler's own log-probs (the HF engine
    without ``algo.recompute_old_logprobs``), log r at the first pass is the engine's numerical mismatch, not
    0: the penalty's gradient on the selected tokens is then coef * sign(mismatch), a push of fixed size and
    arbitrary sign.

    Defaults: ``fraction`` k = 2e-3 and ``coef`` beta = 1, the authors' code (k_percent 0.2, in percent) and
    their 7B recipe; their 32B recipe uses k = 2e-4. verl's port defaults to kl_cov_ratio 2e-4 and (in its
    config) ppo_kl_coef 0.1. "The batch" is one micro-batch of one process, as for Clip-Cov (see there).
    Where we differ: ties in Cov go to the earlier token (a stable sort; the codes' topk leaves the order of
    ties unspecified); the means count valid tokens whatever their weight; log r is clamped to [-20, 20] as
    everywhere here.
    """
    _check_fraction(fraction)
    if coef < 0:
        raise ValueError(f"coef must be >= 0, got {coef}")
    valid, logp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    ratio = torch.exp(log_ratio)
    loss = -adv * ratio
    n = _cov_count(fraction, valid)
    selected = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    if n:
        flat_valid = valid.flatten().nonzero().squeeze(1)
        cov = _centred_cov(logp, adv, valid).flatten()[flat_valid]
        order = torch.sort(cov, descending=True, stable=True).indices[:n]
        selected[flat_valid[order]] = True
    selected = selected.view_as(valid)
    loss = torch.where(selected, loss + coef * log_ratio.abs(), loss)
    return zero_masked(loss, valid), _stats(ratio, valid, torch.zeros_like(valid))


def call_policy_loss(name: str, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                     advantages: torch.Tensor, response_mask: torch.Tensor, *,
                     generator: torch.Generator | None = None,
                     **params: Any) -> tuple[torch.Tensor, LossStats]:
    """Look up a loss by name and call it; ``generator`` is passed only to losses that take one (nsr, clip_cov).

    Shapes as for every loss: [N, L] tensors, advantages [N] or [N, L]. Unknown ``params`` raise
    TypeError naming the loss, so a typo in a config never passes silently.
    """
    fn = POLICY_LOSSES.get(name)
    accepted = inspect.signature(fn).parameters
    if "generator" in accepted:
        params["generator"] = generator
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        known = sorted(k for k, p in accepted.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)
        raise TypeError(f"policy loss {name!r} got unknown parameter(s) {unknown}; it takes {known}")
    return fn(logprobs, old_logprobs, advantages, response_mask, **params)
