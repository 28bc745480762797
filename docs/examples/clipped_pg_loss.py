"""A policy loss with a parameter in one file: PPO-clip whose negative-advantage tokens weigh ``neg_weight``.

Per response token t of rollout i, with the importance ratio r = π(o_t) / π_old(o_t) and advantage A_i:

    surrogate = max(-r * A, -clip(r, 1 - eps_low, 1 + eps_high) * A)          (PPO-clip, as ``ppo_clip``)
    loss      = surrogate                  if A >= 0
    loss      = neg_weight * surrogate     if A < 0

``neg_weight`` < 1 pushes down wrong answers more gently than it pulls up right ones; ``neg_weight = 1`` is
``ppo_clip`` exactly. ``eps_low`` / ``eps_high`` are the run's ``algo.eps_low`` / ``algo.eps_high``: a loss gets
them because its signature takes them. Aggregation over tokens (``algo.agg``) and the KL term stay the
trainer's. Positions with ``response_mask`` 0 may hold -inf log-probs: they are zeroed before ``exp`` and their
loss is 0; log-ratios are clamped to [-20, 20] before ``exp``.

LossStats (logged as ``clip_fraction``, ``ratio/mean``, ``ratio/max``): the share of response tokens whose
gradient the clip removed (A > 0 and r > 1 + eps_high, or A < 0 and r < 1 - eps_low), the ratio's mean, max and
min, the k3 estimate mean(r - 1 - log r) of KL(π_old || π); ``recovered_fraction`` is 0.

Its own diagnostics (``LossStats.diagnostics``, logged with the step's metrics): ``neg_weighted/negative_share``,
the share of response tokens whose advantage is negative (the tokens ``neg_weight`` scales) — a mean over those
tokens, declared as one (``Metric.mean(x, n=tokens)``), so several processes and micro-batches combine it into the
share over the whole batch.

Run it (``algo.loss_params`` holds its parameter):

    mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/clipped_pg_loss.py]" algo.loss=neg_weighted_ppo_clip "algo.loss_params={neg_weight: 0.5}"

Illustrative: an asymmetric weighting to show the loss contract, not a published method.
"""

from __future__ import annotations

import torch

from mmrlvr.algos import POLICY_LOSSES, LossStats, masked_mean, zero_masked
from mmrlvr.methods import describe_params
from mmrlvr.metric import Metric


@describe_params(neg_weight="weight of the tokens of rollouts with a negative advantage (1 = ppo_clip)")
@POLICY_LOSSES.register("neg_weighted_ppo_clip")
def neg_weighted_ppo_clip(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                          response_mask: torch.Tensor, *, eps_low: float = 0.2, eps_high: float = 0.2,
                          neg_weight: float = 0.5) -> tuple[torch.Tensor, LossStats]:
    """logprobs [N, L] (with grad), old_logprobs [N, L], advantages [N] or [N, L], response_mask [N, L]
    -> (loss [N, L], LossStats)."""
    if neg_weight < 0:
        raise ValueError(f"neg_weight must be >= 0, got {neg_weight}")
    valid = response_mask > 0
    logp = zero_masked(logprobs, valid)
    old = zero_masked(old_logprobs.detach(), valid)
    ratio = torch.exp((logp - old).clamp(-20.0, 20.0))  # [N, L]
    adv = advantages.detach()
    adv = (adv[:, None] if adv.dim() == 1 else adv).expand_as(ratio).to(ratio.dtype)
    surrogate = torch.maximum(-ratio * adv, -ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    loss = torch.where(adv < 0, neg_weight * surrogate, surrogate)
    with torch.no_grad():
        r, w = ratio.detach(), valid.to(ratio.dtype)
        clipped = ((adv > 0) & (r > 1 + eps_high)) | ((adv < 0) & (r < 1 - eps_low))
        if bool(valid.any()):
            r_max, r_min = r[valid].max(), r[valid].min()
        else:
            r_max = r_min = r.new_tensor(0.0)
        tokens = int(valid.sum())
        negative = int((valid & (adv < 0)).sum())
        stats = LossStats(clip_fraction=masked_mean(clipped.to(r.dtype), w), ratio_mean=masked_mean(r, w),
                          ratio_max=r_max, ratio_min=r_min, approx_kl=masked_mean(r - 1 - r.log(), w),
                          recovered_fraction=r.new_tensor(0.0),
                          diagnostics={"neg_weighted/negative_share": Metric.mean(negative / tokens if tokens else 0.0,
                                                                                  n=tokens)})
    return zero_masked(loss, valid), stats


def _validate(cfg, params) -> list[str]:
    return [] if params["neg_weight"] >= 0 else [f"neg_weight must be >= 0, got {params['neg_weight']}"]


neg_weighted_ppo_clip.validate_config = _validate
