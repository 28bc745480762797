"""The RL algorithm as pure tensor functions: advantages, policy losses, KL, aggregation, DAPO extras.

Modelled on verl's ``core_algos``: no config objects, no I/O, shapes in every docstring. Pluggable parts
are chosen by name from four registries (an unknown name errors with the list of known ones):

    ADVANTAGES     grpo, dr_grpo, rloo, reinforce_pp          advantages.py
    POLICY_LOSSES  ppo_clip, gspo, cispo, nsr, popo,          losses.py
                   clip_cov, kl_cov
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

# Names resolve lazily (PEP 562): importing a name imports only its submodule. The modules that declare methods
# (losses, advantages, clipping, kl, aggregation) and presets import without torch, so the config layer reads their
# declarations in milliseconds; torch loads when a function first runs.
_EXPORTS: dict[str, str] = {
    "ADVANTAGES": "advantages",
    "dr_grpo_advantages": "advantages",
    "grpo_advantages": "advantages",
    "reinforce_pp_advantages": "advantages",
    "rloo_advantages": "advantages",
    "split_advantages": "advantages",
    "token_split_advantages": "advantages",
    "AGG_MODES": "aggregation",
    "agg_loss": "aggregation",
    "GroupStats": "groups",
    "group_stats": "groups",
    "zero_std_group_fraction": "groups",
    "KL_ESTIMATORS": "kl",
    "kl_k1": "kl",
    "kl_k2": "kl",
    "kl_k3": "kl",
    "entropy_from_logits": "logits",
    "logprobs_from_logits": "logits",
    "POLICY_LOSSES": "losses",
    "LossStats": "losses",
    "call_policy_loss": "losses",
    "cispo_loss": "losses",
    "clip_cov_loss": "losses",
    "gspo_loss": "losses",
    "kl_cov_loss": "losses",
    "nsr_loss": "losses",
    "ppo_clip_loss": "losses",
    "masked_mean": "masked",
    "masked_sum": "masked",
    "masked_var": "masked",
    "masked_whiten": "masked",
    "zero_masked": "masked",
    "PRESETS": "presets",
    "get_preset": "presets",
    "dynamic_sampling_filter": "sampling",
    "overlong_penalty": "sampling",
    "refill": "sampling",
    "truncation_mask": "sampling",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(f"mmrlvr.algos.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "ADVANTAGES", "AGG_MODES", "KL_ESTIMATORS", "POLICY_LOSSES", "PRESETS",
    "GroupStats", "LossStats",
    "agg_loss", "call_policy_loss", "cispo_loss", "clip_cov_loss", "dr_grpo_advantages", "dynamic_sampling_filter",
    "entropy_from_logits", "get_preset", "group_stats", "grpo_advantages", "gspo_loss", "kl_cov_loss",
    "kl_k1", "kl_k2", "kl_k3", "logprobs_from_logits", "masked_mean", "masked_sum", "masked_var",
    "masked_whiten", "nsr_loss", "overlong_penalty", "ppo_clip_loss", "refill", "reinforce_pp_advantages",
    "rloo_advantages", "split_advantages", "token_split_advantages", "truncation_mask", "zero_masked", "zero_std_group_fraction",
]
