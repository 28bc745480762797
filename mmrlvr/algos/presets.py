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
           (eps_low = 1 -> clip(r, 0, 1 + eps_high)), token-level mean, no KL; MiniMax did not publish
           the upper bound, the reference implementations (ScaleRL arXiv:2510.13786, TRL, SkyRL)
           truncate at 5: eps_high = 4.

Tiny CPU runs need a KL anchor (on the tiny warm-started model, without a KL term lr 3e-4 destroyed the
thinking in under 20 steps; with a k3 KL of beta 0.05 to the warm start, lr 1e-4 trained stably); the
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
        "loss": "cispo", "loss_params": {"eps_low": 1.0, "eps_high": 4.0},
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


# ---------------------------------------------------------------------------------------------------
# Each policy loss owns its defaults

#: the ``algo`` keys of a clip range, in the order notes and tables name them
CLIP_RANGE_KEYS = ("eps_low", "eps_high", "dual_clip")


def loss_clip_keys(loss_name: str) -> list[str]:
    """The clip-range keys (``algo.eps_low`` / ``eps_high`` / ``dual_clip``) the policy loss takes."""
    import inspect

    from mmrlvr.algos.losses import POLICY_LOSSES

    if loss_name not in POLICY_LOSSES:
        return []
    params = inspect.signature(POLICY_LOSSES.get(loss_name)).parameters
    return [k for k in CLIP_RANGE_KEYS if k in params]


def loss_defaults(loss_name: str) -> dict[str, Any] | None:
    """The defaults a declared policy loss owns, in *config* names (``algo.<key>``), or None.

    Read from the loss itself: the clip-range keys its signature takes with its keyword defaults (GSPO's 3e-4 /
    4e-4), then ``agg``, the aggregation its declaration says it is defined with (None: the loss has no opinion,
    the config's value stands). What a run gets when it selects ``algo.loss`` without a preset and without setting
    the key. Only declared losses (``mmrlvr.methods.declare`` beside the code, as the built-ins are) own defaults:
    a plug-in loads after the config is read, so its keyword defaults cannot decide the config's values, and a
    run must not depend on whether the plug-in happened to be imported before."""
    import inspect

    from mmrlvr.algos.losses import POLICY_LOSSES
    from mmrlvr.methods import _declared, method_spec

    if loss_name not in _declared("loss") or loss_name not in POLICY_LOSSES:
        return None
    params = inspect.signature(POLICY_LOSSES.get(loss_name)).parameters
    out: dict[str, Any] = {k: params[k].default for k in loss_clip_keys(loss_name)
                           if params[k].default is not inspect.Parameter.empty}
    out["agg"] = method_spec("loss", loss_name).agg
    return out


def resolve_loss_params(loss_name: str, algo_cfg_values: dict[str, Any],
                        explicitly_set_keys: set[str] | frozenset[str] | list[str]
                        ) -> tuple[dict[str, Any], list[str]]:
    """The loss-owned ``algo`` values for ``algo.loss = loss_name``, and one note per default applied.

    algo_cfg_values: the ``algo`` section's current values by config name (e.g. ``vars(cfg.algo)``);
    explicitly_set_keys: the ``algo`` keys the user wrote *or a preset filled* (a preset's values are a
    choice too: DAPO's eps_high 0.28 must not be replaced by ppo_clip's 0.2).
    Returns ``(params, notes)``: params maps each key the loss owns (``eps_low``, ``eps_high``,
    ``dual_clip``, ``nsr_noise``, ``agg`` as applicable) to the value to use — the user's where set, the
    loss's default otherwise; notes are log lines naming each default that differs from the config's
    generic value, so no run silently trains GSPO with PPO's 0.2. A loss without registered defaults (a
    plugin) returns ``({}, [])``: its function's own keyword defaults apply.
    """
    defaults = loss_defaults(loss_name)
    if defaults is None:
        return {}, []
    explicit = set(explicitly_set_keys)
    params: dict[str, Any] = {}
    applied: list[str] = []
    for key, default in defaults.items():
        if key == "agg" and default is None:  # the loss has no opinion: the config's value stands
            continue
        if key in explicit:
            params[key] = algo_cfg_values.get(key, default)
            continue
        params[key] = default
        if algo_cfg_values.get(key, default) != default:
            applied.append(f"{key}={default}")
    notes = []
    if applied:
        from mmrlvr.methods import method_spec

        why = method_spec("loss", loss_name).why or "the loss's own defaults"
        notes.append(f"algo.loss={loss_name} without these keys set: using {', '.join(applied)} "
                     f"({why}); set them under algo: to override, or pick algo.preset")
    return params, notes


def explicit_algo_keys(user_algo_keys: set[str] | list[str] | dict[str, Any], preset_name: str | None,
                       loss_name: str) -> set[str]:
    """The ``explicitly_set_keys`` for ``resolve_loss_params``: what the user wrote under ``algo:``, plus
    what the preset filled — except the preset's loss parameters and aggregation when the run's loss is
    not the preset's (``preset: grpo`` + ``loss: gspo`` must get GSPO's 3e-4/4e-4, not grpo's 0.2)."""
    keys = set(user_algo_keys)
    p = PRESETS.get(preset_name or "")
    if p is None:
        return keys
    tied = set(p["loss_params"]) | {"agg"}
    filled = {"advantage", "loss", "kl_coef", "kl_estimator", "dynamic_sampling", "mask_truncated",
              "overlong_cache", "overlong_penalty"}
    keys |= filled | (tied if p["loss"] == loss_name else set())
    return keys


def loss_kwargs(loss_name: str, algo_cfg_values: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for the policy loss ``loss_name`` from resolved ``algo`` values (config names).

    The clip range keys the loss owns (``loss_defaults``; ``agg`` is not a loss argument), then the loss's own
    parameters in force (``algo.loss_params`` over the declared defaults, ``mmrlvr.methods``), then the clip rule
    for losses that take one."""
    from mmrlvr.methods import resolve_method

    keys = loss_clip_keys(loss_name)
    out = {k: algo_cfg_values[k] for k in keys if k in algo_cfg_values}
    params, problems = resolve_method("loss", loss_name, algo_cfg_values.get("loss_params") or {})
    if problems:
        raise UserError("; ".join(problems))
    out.update(params)
    out.update(clip_kwargs(loss_name, algo_cfg_values))
    return out


def clip_kwargs(loss_name: str, algo_cfg_values: dict[str, Any]) -> dict[str, Any]:
    """``clip``/``clip_params`` for a loss that takes a clip rule (``algo.clip``: fixed | acpo), else {}.

    A loss that cannot take the rule (gspo, cispo, a plugin without a ``clip`` keyword) with
    ``algo.clip`` other than fixed raises UserError: the rule would otherwise be silently ignored.
    ``clip_params`` are the rule's parameters in force (``algo.clip_params`` over its declared defaults)."""
    import inspect

    from mmrlvr.algos.losses import POLICY_LOSSES
    from mmrlvr.methods import resolve_method

    rule = algo_cfg_values.get("clip", "fixed") or "fixed"
    fn = POLICY_LOSSES.get(loss_name) if loss_name in POLICY_LOSSES else None
    takes = fn is not None and "clip" in inspect.signature(fn).parameters
    if not takes:
        if rule != "fixed":
            raise UserError(f"algo.clip={rule}: the policy loss {loss_name!r} has no clip rule "
                            f"(use algo.loss ppo_clip or nsr)")
        return {}
    if rule == "fixed":
        return {"clip": "fixed"}
    params, problems = resolve_method("clip", rule, algo_cfg_values.get("clip_params") or {})
    if problems:
        raise UserError("; ".join(problems))
    return {"clip": rule, "clip_params": params}


# ---------------------------------------------------------------------------------------------------
# Documentation tables, generated from the dicts above (docs/training.md embeds them; a test compares)

def _num(x: Any) -> str:
    return "none" if x is None else (f"{x:g}" if isinstance(x, float) else str(x))


def preset_table_markdown() -> str:
    """The ``algo.preset`` table of docs/training.md, from ``PRESETS`` (what the code applies)."""
    rows = ["| preset (`algo.preset`) | advantage | loss | ε low / high | aggregation | KL | dynamic sampling "
            "| overlong |", "|---|---|---|---|---|---|---|---|"]
    for name, p in PRESETS.items():
        lp, ov = p["loss_params"], p["overlong"]
        eps = f"{_num(lp.get('eps_low'))} / {_num(lp.get('eps_high'))}"
        kl = f"{p['kl_estimator']}, β {_num(p['kl_coef'])}" if p["kl_coef"] else "none"
        over = []
        if ov.get("shaping"):
            over.append(f"shaping, L_cache = {_num(ov['cache_fraction'])}·max_new_tokens")
        if ov.get("mask_truncated"):
            over.append("mask truncated")
        rows.append(f"| `{name}` | `{p['advantage']}` | `{p['loss']}` | {eps} | `{p['agg_mode']}` | {kl} | "
                    f"{'yes' if p['dynamic_sampling'] else 'no'} | {', '.join(over) or 'no'} |")
    return "\n".join(rows)


def loss_defaults_table_markdown() -> str:
    """The per-loss defaults table of docs/training.md, from each built-in loss's signature and declaration."""
    from mmrlvr.methods import _declared, method_spec

    rows = ["| `algo.loss` | ε low / high | other | aggregation it applies | why |", "|---|---|---|---|---|"]
    for name in _declared("loss"):
        d = loss_defaults(name) or {}
        other = ", ".join([f"`{k}` {_num(v)}" for k, v in d.items() if k not in ("eps_low", "eps_high", "agg")]
                          + [f"`loss_params.{p.name}` {_num(p.default)}" for p in method_spec("loss", name).params])
        agg = f"`{d['agg']}`" if d.get("agg") else "(config's `algo.agg`)"
        eps = f"{_num(d['eps_low'])} / {_num(d['eps_high'])}" if "eps_low" in d else "— (no clip)"
        rows.append(f"| `{name}` | {eps} | {other or '—'} | {agg} | {method_spec('loss', name).why} |")
    return "\n".join(rows)
