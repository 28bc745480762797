"""Token credit: which response tokens read the image, and how much gradient each one gets.

- ``perturb``: perturbations of the processor's ``pixel_values`` (gaussian, zero, patch_blackout, blur)
- ``signals``: per-token entropy / JSD / entropy shift / log-probs from a clean and a perturbed pass,
  chunked over tokens so full-vocabulary logits of both passes never exist at once
- ``schemes``: the credit schemes by name (none, entropy_topk, vepo, vppo, papo, rsi)

Typical use in a trainer (``logits`` = the policy forward's response logits [N, L, V], with grad)::

    scheme = build_scheme(cfg.credit.scheme, **cfg.credit.scheme_params)
    inputs_pert = None
    if scheme.needs_perturbed:
        name, params = scheme.perturbation                      # or the config's choice
        vision = perturb_vision(batch.vision, name, seed=seed, processor=processor, **params)
        inputs_pert = {**batch.model_inputs(), **vision}
    full = scheme.needs_distribution or not scheme.needs_perturbed
    signals = token_signals_from_model(model, None, inputs_pert, batch.prompt_length, batch.response_ids,
                                       mask, logits_clean=logits.detach() if full else None,
                                       old_logprobs=batch.old_logprobs, distribution=scheme.needs_distribution,
                                       temperature=temperature)
    credit = scheme(signals, mask, advantages)
    # loss: advantages * credit.adv_scale, mask * credit.token_weights as the loss mask,
    #       per-token loss + credit.extra_loss(logp) when it is not None (PAPO)

``benchmarks/credit_overhead.py`` measures what this adds to a training step.
"""

from mmrlvr.credit.perturb import (
    PERTURBATIONS,
    PatchLayout,
    gaussian_blur,
    gaussian_noise,
    patch_blackout,
    patchify,
    perturb_vision,
    unpatchify,
    zero_image,
)
from mmrlvr.credit.schemes import (
    CREDIT_SCHEMES,
    CreditResult,
    CreditScheme,
    build_scheme,
    minmax_per_row,
    selection_stats,
    topk_count,
    topk_per_row,
    vepo_score,
    vppo_advantage_scale,
)
# schemes in their own modules register on import (DelTA reads hidden states); importing any module of this
# package runs this first, so every scheme name is known (the scheme modules never import each other back)
from mmrlvr.credit import delta as _delta  # noqa: E402,F401
from mmrlvr.credit.signals import (
    Hidden,
    TokenSignals,
    final_hidden_states,
    perception_k3,
    response_hidden,
    token_signals,
    token_signals_from_model,
    vppo_dependency,
)

__all__ = [
    "CREDIT_SCHEMES", "CreditResult", "CreditScheme", "Hidden", "PERTURBATIONS", "PatchLayout", "TokenSignals",
    "build_scheme", "final_hidden_states", "gaussian_blur", "gaussian_noise", "minmax_per_row", "patch_blackout",
    "patchify", "perception_k3", "perturb_vision", "response_hidden", "selection_stats", "token_signals",
    "token_signals_from_model", "topk_count", "topk_per_row", "unpatchify", "vepo_score",
    "vppo_advantage_scale", "vppo_dependency", "zero_image",
]
