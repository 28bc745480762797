"""Named algorithm presets: GRPO, DAPO, Dr.GRPO, GSPO and CISPO as one config choice each.

Each preset fixes what the method's paper fixes: the advantage estimator, the policy loss and its clip
ranges, the aggregation mode, the KL term, DAPO dynamic sampling and overlong handling. Values here
override nothing the user writes: the config layer starts from the preset and applies the user's keys on
top. Keys match the registries (``ADVANTAGES``, ``POLICY_LOSSES``, ``AGG_MODES``, ``KL_ESTIMATORS``).

Sources (the numbers each preset uses):
- grpo:    DeepSeekMath (Shao et al. 2024, arXiv:2402.03300): std-normalised group advantage, per-sequence
           token mean, k3 KL with beta = 0.04; eps = 0.2 is the PPO default (the paper does not state it).
- dapo:    DAPO (Yu et al. 2025, arXiv:2503.14476): clip-higher eps 0.2 / 0.28, token-mean, no KL,
           dynamic sampling, overlong shaping with L_cache = 4,096 of L_max = 20,480 (a fifth).
- dr_grpo: Dr.GRPO (Liu et al. 2025, arXiv:2503.20783): no std division, constant normaliser
           (seq-mean-token-sum-norm), no KL.
- gspo:    GSPO (Zheng et al. 2025, arXiv:2507.18071): sequence ratio clipped at 3e-4 / 4e-4,
           sequence-level mean; no KL term is used in the paper.
- cispo:   MiniMax-M1 (2025, arXiv:2506.13585): truncated detached IS weight, no lower bound
           (eps_low = 1 -> clip(r, 0, 1 + eps_high)), token-level mean, no KL; the upper bound is not
           published, 0.28 is [ours].

Tiny CPU runs need a KL anchor (STACK.md: k3 with beta 0.05 kept a warm-started model stable); the
demo config sets ``kl_coef`` on top of its preset.
"""

from __future__ import annotations

import copy
from typing import Any

from mmrlvr.errors import UserError

_NO_OVERLONG = {"shaping": False, "cache_fraction": 0.0, "penalty": 1.0, "mask_truncated": False}

#: preset name -> settings. ``overlong.cache_fraction`` is L_cache / L_max; the trainer turns it into
#: ``cache_len = round(cache_fraction * max_new_tokens)`` for ``sampling.overlong_penalty``.
PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {
        "advantage": "grpo", "advantage_params": {"unbiased": True, "eps": 1e-6},
        "loss": "ppo_clip", "loss_params": {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None},
        "agg_mode": "seq-mean-token-mean",
        "kl_coef": 0.04, "kl_estimator": "k3",
        "dynamic_sampling": False, "overlong": dict(_NO_OVERLONG),
    },
    "dapo": {
        "advantage": "grpo", "advantage_params": {"unbiased": True, "eps": 1e-6},
        "loss": "ppo_clip", "loss_params": {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": None},
        "agg_mode": "token-mean",
        "kl_coef": 0.0, "kl_estimator": "k3",
        "dynamic_sampling": True,
        "overlong": {"shaping": True, "cache_fraction": 0.2, "penalty": 1.0, "mask_truncated": False},
    },
    "dr_grpo": {
        "advantage": "dr_grpo", "advantage_params": {},
        "loss": "ppo_clip", "loss_params": {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None},
        "agg_mode": "seq-mean-token-sum-norm",
        "kl_coef": 0.0, "kl_estimator": "k3",
        "dynamic_sampling": False, "overlong": dict(_NO_OVERLONG),
    },
    "gspo": {
        "advantage": "grpo", "advantage_params": {"unbiased": True, "eps": 1e-6},
        "loss": "gspo", "loss_params": {"eps_low": 3e-4, "eps_high": 4e-4},
        "agg_mode": "seq-mean-token-mean",
        "kl_coef": 0.0, "kl_estimator": "k3",
        "dynamic_sampling": False, "overlong": dict(_NO_OVERLONG),
    },
    "cispo": {
        "advantage": "grpo", "advantage_params": {"unbiased": True, "eps": 1e-6},
        "loss": "cispo", "loss_params": {"eps_low": 1.0, "eps_high": 0.28},
        "agg_mode": "token-mean",
        "kl_coef": 0.0, "kl_estimator": "k3",
        "dynamic_sampling": False, "overlong": dict(_NO_OVERLONG),
    },
}


def get_preset(name: str) -> dict[str, Any]:
    """A deep copy of preset ``name`` (safe to modify); an unknown name raises UserError listing the known."""
    if name not in PRESETS:
        raise UserError(f"unknown algorithm preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return copy.deepcopy(PRESETS[name])
