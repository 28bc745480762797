"""Rollout correction: importance weights pi_old / pi_rollout on the policy loss, for the gap between the engine
that sampled the responses and the trainer that scores them (``algo.rollout_correction`` +
``algo.rollout_correction_params``).

A rollout engine (vLLM, or the trainer's own sampling kernels) assigns a sampled token a log-prob that differs
from the training model's recomputed pi_old (different kernels, precision, batching). Truncated importance sampling
(TIS, Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training", fengyao.notion.site;
TRL ``vllm_importance_sampling_correction``, verl rollout IS) weighs each token's policy-loss term by
w = pi_old / pi_rollout, truncated at ``cap``; masked importance sampling (MIS, verl's ``mask`` mode, TRL's
``*_mask``) drops the tokens whose w exceeds ``cap`` instead. ``level: sequence`` uses the product of the ratios
over the response, broadcast to its tokens. Defaults: cap 3.0 (TRL's; verl's is 2.0), token level.

Each correction is registered in ``ROLLOUT_CORRECTIONS`` as
``fn(train_logp [N, L], rollout_logp [N, L], mask [N, L], *, cap, level) -> weights [N, L]`` (0 outside ``mask``),
or None for ``none``. Imports without torch (declarations beside the code are read by config checks).
"""

from __future__ import annotations

from typing import Any, Callable

from mmrlvr.lazy_import import lazy_module
from mmrlvr.methods import Param, declare
from mmrlvr.registry import Registry

torch = lazy_module("torch")

#: name -> fn(train_logp, rollout_logp, mask, **params) -> weights [N, L] or None
ROLLOUT_CORRECTIONS: Registry[Callable[..., Any]] = Registry("rollout correction")

LEVELS = ("token", "sequence")


def _params(source: str) -> tuple[Param, ...]:
    return (Param("cap", 3.0, "the largest weight pi_old / pi_rollout kept (TRL's default 3.0; verl's 2.0)", "> 0",
                  lambda v: v > 0),
            Param("level", "token", f"ratio per token, or the product over the response ({source})",
                  choices=LEVELS))


def ratios(train_logp: Any, rollout_logp: Any, mask: Any, level: str = "token") -> Any:
    """w = pi_train_old / pi_rollout per token [N, L] (``level: sequence``: the response's product, per token)."""
    diff = (train_logp - rollout_logp) * mask
    if level == "sequence":
        diff = diff.sum(dim=1, keepdim=True).expand_as(mask)
    return diff.clamp(-20, 20).exp()


declare("rollout_correction", "none", "no correction: the policy loss as the trainer computes it")


@ROLLOUT_CORRECTIONS.register("none")
def no_correction(train_logp: Any, rollout_logp: Any, mask: Any) -> None:
    return None


declare("rollout_correction", "tis", "truncated importance sampling: w = min(pi_old / pi_rollout, cap)",
        *_params("TRL *_truncate, verl rollout IS truncate"), source="fengyao.notion.site off-policy RL; TRL; verl")


@ROLLOUT_CORRECTIONS.register("tis")
def truncated(train_logp: Any, rollout_logp: Any, mask: Any, *, cap: float = 3.0, level: str = "token") -> Any:
    """[N, L] min(w, cap), 0 outside ``mask``."""
    return ratios(train_logp, rollout_logp, mask, level).clamp(max=cap) * mask


declare("rollout_correction", "mis", "masked importance sampling: w = pi_old / pi_rollout, 0 where it exceeds cap",
        *_params("TRL *_mask, verl rollout IS mask"), source="verl rollout IS (mask); TRL")


@ROLLOUT_CORRECTIONS.register("mis")
def masked(train_logp: Any, rollout_logp: Any, mask: Any, *, cap: float = 3.0, level: str = "token") -> Any:
    """[N, L] w where w <= cap, else 0; 0 outside ``mask``."""
    w = ratios(train_logp, rollout_logp, mask, level)
    return torch.where(w > cap, torch.zeros_like(w), w) * mask
