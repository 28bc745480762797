"""Per-token estimators of KL(pi || pi_ref) from log-probs of the sampled tokens, registered by name.

Every estimator: ``fn(logp [N, L], ref_logp [N, L], *, mask=None) -> [N, L]``, registered in
``KL_ESTIMATORS`` (config key ``algo.kl_estimator``). With d = log pi - log pi_ref at the sampled token
(sampled from pi), Schulman's estimators (http://joschu.net/blog/kl-approx.html) are

    k1 = d             unbiased, high variance, can be negative
    k2 = d^2 / 2       biased, low variance, >= 0
    k3 = e^-d + d - 1  unbiased, low variance, >= 0 (GRPO's choice, DeepSeekMath arXiv:2402.03300)

Pass ``mask`` (response_mask, may be weights) when padding positions may hold -inf: they are zeroed
before the subtraction, so neither the value nor the gradient turns NaN. The trainer aggregates the
result with the same ``agg_loss`` mode as the policy loss and scales it by ``algo.kl_coef``.
With LoRA, ref_logp comes from the same model with the adapter disabled (no second copy in memory).

Each estimator is declared (``mmrlvr.methods.declare``: name and help line) just above its function; the config
checks import this module without torch (``torch = lazy_module("torch")``) to read them.
"""

from __future__ import annotations

from typing import Callable

from mmrlvr.algos.masked import zero_masked
from mmrlvr.lazy_import import lazy_module
from mmrlvr.methods import declare
from mmrlvr.registry import Registry

torch = lazy_module("torch")  # declarations and config checks read this module without torch

#: name -> fn(logp [N, L], ref_logp [N, L], *, mask=None) -> [N, L]
KL_ESTIMATORS: Registry[Callable[..., torch.Tensor]] = Registry("KL estimator")

K3_LOG_RATIO_CLAMP = 20.0
K3_MAX = 10.0


def _log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """d = logp - ref_logp, [N, L]; 0 where ``mask == 0`` (inputs zeroed first). ref_logp is detached."""
    if logp.shape != ref_logp.shape or (mask is not None and mask.shape != logp.shape):
        raise ValueError(f"logp {tuple(logp.shape)}, ref_logp {tuple(ref_logp.shape)} and mask "
                         f"{None if mask is None else tuple(mask.shape)} must have the same shape")
    ref_logp = ref_logp.detach()
    if mask is None:
        return logp - ref_logp
    return zero_masked(logp, mask) - zero_masked(ref_logp, mask)


declare("kl", "k1", "log(pi/pi_ref)")


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k1 = log pi - log pi_ref. logp, ref_logp, mask: [N, L] -> [N, L]."""
    return _log_ratio(logp, ref_logp, mask)


declare("kl", "k2", "(log(pi/pi_ref))^2 / 2")


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k2 = (log pi - log pi_ref)^2 / 2. logp, ref_logp, mask: [N, L] -> [N, L].

    As a loss on on-policy samples its gradient d * grad log pi is an unbiased estimate of
    grad KL(pi || pi_ref), which k1 and k3 used as losses are not.
    """
    return 0.5 * _log_ratio(logp, ref_logp, mask) ** 2


declare("kl", "k3", "pi_ref/pi - log(pi_ref/pi) - 1 (unbiased, >= 0; GRPO's)")


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k3 = exp(-d) + d - 1 with d = log pi - log pi_ref. logp, ref_logp, mask: [N, L] -> [N, L].

    Clamped as common practice does (verl's "low_var_kl", VPPO): d to [-20, 20] so exp cannot overflow,
    and the result to at most 10 so one token whose reference probability collapsed cannot dominate
    the batch. Both clamps cut the gradient of the tokens they touch.
    """
    d = _log_ratio(logp, ref_logp, mask).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(-d) + d - 1).clamp(max=K3_MAX)
