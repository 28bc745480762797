"""The RL algorithm as pure tensor functions: advantages, policy losses, KL, aggregation, DAPO extras.

Modelled on verl's ``core_algos``: no config objects, no I/O, shapes in every docstring. Pluggable parts
are chosen by name from four registries (an unknown name errors with the list of known ones):

    ADVANTAGES     grpo, dr_grpo, rloo, reinforce_pp          advantages.py
    POLICY_LOSSES  ppo_clip, gspo, cispo, nsr                 losses.py
    KL_ESTIMATORS  k1, k2, k3                                 kl.py
    AGG_MODES      token-mean, seq-mean-token-mean,           aggregation.py
                   seq-mean-token-sum, seq-mean-token-sum-norm

A training step, in the trainer's words (N = B*G rollouts, L response tokens)::

    adv = ADVANTAGES.get(cfg.advantage)(rewards, group_index, **cfg.advantage_params)       # [N]
    logp = logprobs_from_logits(logits[:, P-1:P-1+L], response_ids, temperature=T)         # [N, L]
    loss_tok, stats = call_policy_loss(cfg.loss, logp, old_logp, adv, mask, **cfg.loss_params)
    loss = agg_loss(loss_tok, mask, cfg.agg_mode)
    loss = loss + cfg.kl_coef * agg_loss(KL_ESTIMATORS.get("k3")(logp, ref_logp, mask=mask), mask, cfg.agg_mode)

``PRESETS`` (presets.py) bundles these choices for GRPO, DAPO, Dr.GRPO, GSPO and CISPO.
"""

from mmrlvr.algos.advantages import (
    ADVANTAGES,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    split_advantages,
    token_split_advantages,
)
from mmrlvr.algos.aggregation import AGG_MODES, agg_loss
from mmrlvr.algos.groups import GroupStats, group_stats, zero_std_group_fraction
from mmrlvr.algos.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3
from mmrlvr.algos.logits import entropy_from_logits, logprobs_from_logits
from mmrlvr.algos.losses import (
    POLICY_LOSSES,
    LossStats,
    call_policy_loss,
    cispo_loss,
    gspo_loss,
    nsr_loss,
    ppo_clip_loss,
)
from mmrlvr.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten, zero_masked
from mmrlvr.algos.presets import PRESETS, get_preset
from mmrlvr.algos.sampling import dynamic_sampling_filter, overlong_penalty, refill, truncation_mask

__all__ = [
    "ADVANTAGES", "AGG_MODES", "KL_ESTIMATORS", "POLICY_LOSSES", "PRESETS",
    "GroupStats", "LossStats",
    "agg_loss", "call_policy_loss", "cispo_loss", "dr_grpo_advantages", "dynamic_sampling_filter",
    "entropy_from_logits", "get_preset", "group_stats", "grpo_advantages", "gspo_loss",
    "kl_k1", "kl_k2", "kl_k3", "logprobs_from_logits", "masked_mean", "masked_sum", "masked_var",
    "masked_whiten", "nsr_loss", "overlong_penalty", "ppo_clip_loss", "refill", "reinforce_pp_advantages",
    "rloo_advantages", "split_advantages", "token_split_advantages", "truncation_mask", "zero_masked", "zero_std_group_fraction",
]
