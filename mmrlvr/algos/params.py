"""The algorithm's built-in methods and their parameters, declared without torch (``mmrlvr.methods``).

This is where a config's ``algo.advantage_params`` and ``algo.clip_params`` are checked against (names, types,
ranges) at load time, in milliseconds (the policy losses declare theirs beside their code, ``mmrlvr.algos.losses``). The implementations take the same keyword
parameters with the same defaults (``tests/test_methods.py`` compares every declaration with its function), and
the docs' parameter tables (``docs/methods.md``) and ``mmrlvr train --help-config`` are read from here.

The clip range ``algo.eps_low`` / ``algo.eps_high`` / ``algo.dual_clip`` stays a top-level ``algo`` key: every
clipped loss reads it and the presets set it, so it is not a parameter of one loss.
"""

from __future__ import annotations

from mmrlvr.methods import Param, declare
from mmrlvr.methods import non_negative as _nonneg
from mmrlvr.methods import positive as _pos


# -------------------------------------------------------------------------------------- advantage estimators
declare("advantage", "grpo", "(R - mean_g R) / (std_g R + eps)",
        Param("eps", 1e-6, "added to the group std", "> 0", _pos),
        Param("unbiased", True, "n-1 sample std (verl, TRL); false: population std"),
        source="arXiv:2402.03300")
declare("advantage", "dr_grpo", "R - mean_g R, no std division (pair with seq-mean-token-sum-norm)",
        source="arXiv:2503.20783")
declare("advantage", "rloo", "R - mean of the other rollouts of the group (leave-one-out)", source="arXiv:2402.14740")
declare("advantage", "reinforce_pp", "group-centred reward whitened over the whole batch",
        Param("baseline", True, "subtract the group mean first (REINFORCE++-baseline); false: whiten raw rewards"),
        Param("eps", 1e-6, "added to the std in the sequence scope", "> 0", _pos),
        Param("whiten_scope", "batch_tokens", "batch_tokens: weighted by response tokens (verl) | sequence: each "
              "rollout once", choices=("batch_tokens", "sequence")),
        source="arXiv:2501.03262")


def smallest_groups(cfg) -> list[tuple[int, str]]:
    """The sizes of the smallest groups a group estimator can be handed under ``cfg``, each with the setting that
    sets it: flat groups (``rollout.group_size``), a tree's sibling groups (``branching`` children per node), a
    budget sampler's smallest group (``g_min``)."""
    out = [(cfg.rollout.group_size, f"rollout.group_size={cfg.rollout.group_size}")]
    if cfg.rollout.strategy == "tree":
        from mmrlvr.train.stages.generate import tree_params

        b = tree_params(cfg)["branching"]
        out.append((b, f"rollout.strategy_params.branching={b} (a tree node's siblings)"))
    from mmrlvr.train.samplers import sampler_class

    if (cls := sampler_class(cfg)).sizes_groups:
        from mmrlvr.methods import configured

        smallest = cls.smallest_group(cfg, configured(cfg, "sampler")[1])
        if smallest is not None:
            out.append(smallest)
    return out


def _pass_at_k_check(cfg, p) -> list[str]:
    """pass@k needs k-subsets that can miss: a group of n members with n <= k has one subset or none, so its
    advantage is 0 whatever its rewards (n = k: the one subset passes or fails as a whole, sigma = 0)."""
    k = p["k"]
    return [f"k={k} needs groups of more than k members, but {what}: every such group would get advantage 0 "
            f"(a group of n <= k has at most one k-subset); lower algo.advantage_params.k below {n}"
            for n, what in smallest_groups(cfg) if n <= k]


def _pass_at_k_notes(cfg, p) -> list[str]:
    """A graded reward term below the threshold is invisible to pass@k: CoCoV's exploration bonus is one."""
    out = []
    for entry in cfg.rewards or []:
        bonus = (entry.params or {}).get("bonus", 0.2)
        if entry.name == "cocov" and bonus:
            out.append(f"the cocov reward's exploration bonus ({bonus}) is inert under algo.advantage: pass_at_k: "
                       f"pass@k counts a rollout correct only at reward >= threshold ({p['threshold']}), so an "
                       "explorer and a wrong row get the same advantage; use the default grpo estimator for the "
                       "bonus to act")
    return out


declare("advantage", "pass_at_k", "the group advantage that maximises pass@k (binary rewards), averaged over every "
        "k-subset of the group in closed form",
        Param("k", 4, "samples whose best counts (1 <= k < every group's size: rollout.group_size, a tree's "
              "branching, a budget sampler's g_min; k = 1 is GRPO with the population std)", ">= 1",
              lambda v: v >= 1),
        Param("threshold", 1.0, "a rollout counts as correct when its reward >= threshold"),
        source="arXiv:2508.10751", config_check=_pass_at_k_check, plan_notes=_pass_at_k_notes)
declare("advantage", "poise", "r - b, b an online probe's prediction from other rollouts' hidden states "
        "(a stage: one no-grad forward per step)",
        Param("lr", 1e-3, "learning rate of the probe (Adam)", "> 0", _pos),
        Param("buffer_steps", 4, "the probe trains on the rollouts of the last N steps", ">= 1", lambda v: v >= 1),
        Param("train_iters", 20, "probe optimisation steps per training step", ">= 1", lambda v: v >= 1),
        source="arXiv:2605.07579")
declare("advantage", "opd", "on-policy distillation: per token A_t = -(log pi_old - log pi_teacher) on the "
        "student's own samples (the reverse KL to a frozen teacher, discount 0, no group normalisation), plus "
        "reward_weight * the task reward's GRPO advantage (stages: the teacher's no-grad forward in the reference "
        "kind)",
        Param("teacher", None, "the teacher: a model folder (save_pretrained layout), a RUN_DIR/checkpoints/step-K "
              "or a tiny: spec, with the policy's tokenizer and processor (it may be larger)",
              "a model folder, checkpoint or tiny: spec", lambda v: v.strip() != "", kind=str, required=True),
        Param("reward_weight", 0.0, "weight of the task reward's GRPO group advantage added to every response token "
              "(0: pure distillation)", ">= 0", _nonneg),
        source="arXiv:2505.09388 (Qwen3, on-policy distillation); Thinking Machines, On-Policy Distillation "
        "(Lu et al. 2025)")


# ---------------------------------------------------------------------------------------------- clip rules
declare("clip", "fixed", "PPO's constant range algo.eps_low / algo.eps_high")
declare("clip", "acpo", "eps_b = clamp(eps0 + alpha * sigma_b, eps_min, eps_max) per probability bin, symmetric; "
        "dual clip 3 unless algo.dual_clip is set",
        Param("eps0", 0.2, "base clip range", ">= 0", _nonneg),
        Param("alpha", 3.0, "weight of the bin's ratio std sigma_b", ">= 0", _nonneg),
        Param("eps_min", 0.0, "smallest clip range", ">= 0", _nonneg),
        Param("eps_max", 3.0, "largest clip range", ">= eps_min", _nonneg),
        source="arXiv:2606.22570",
        cross=lambda v: None if v["eps_max"] >= v["eps_min"] else
        f"eps_max ({v['eps_max']}) must be >= eps_min ({v['eps_min']})")

# ------------------------------------------------------------------------------- KL estimators, aggregation
declare("kl", "k1", "log(pi/pi_ref)")
declare("kl", "k2", "(log(pi/pi_ref))^2 / 2")
declare("kl", "k3", "pi_ref/pi - log(pi_ref/pi) - 1 (unbiased, >= 0; GRPO's)")
declare("agg", "token-mean", "mean over every response token of the batch (DAPO)")
declare("agg", "seq-mean-token-mean", "mean over tokens per sequence, then over sequences (GRPO)")
declare("agg", "seq-mean-token-sum", "sum over tokens per sequence, mean over sequences")
declare("agg", "seq-mean-token-sum-norm", "sum over tokens / max_new_tokens, mean over sequences (Dr.GRPO)")

# --------------------------------------------------------------------------------------- auxiliary losses


def _horizon_ok(v) -> bool:
    if v in ("full", "progressive"):
        return True
    return not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v <= 1


def _forward_ce_check(cfg, p) -> list[str]:
    """The privileged expert re-encodes the sample's own prompt with the hint: it cannot see what a multi-turn
    rollout added to the context (a ReSum segment's summary restart, a tool's returned images)."""
    out = []
    if p["rollout"] == "truncated":
        if p["horizon"] == "full":
            out.append("rollout: truncated needs a horizon below full (a share in (0, 1] or progressive): at full "
                       "the rollout is not cut")
        shape = [k for k, v in (("rollout.strategy: tree", cfg.rollout.strategy == "tree"),
                                ("rollout.tools", cfg.rollout.tools), ("rollout.summarize", cfg.rollout.summarize))
                 if v]
        out += [f"rollout: truncated cuts flat groups' responses only; {k} builds its rollouts in segments or "
                "turns of their own" for k in shape]
    if p["expert"] != "privileged":
        return out
    grown = [k for k, v in (("rollout.summarize", cfg.rollout.summarize), ("rollout.tools", cfg.rollout.tools)) if v]
    return out + [f"expert: privileged re-encodes each sample's original prompt, so it would score a response whose "
            f"context {key} changed (a ReSum segment restarts from a summary; a tool turn adds images) against the "
            f"wrong prompt; use a model folder as the expert (it reads the student's own inputs) or unset {key}"
            for key in grown]


declare("aux_loss", "forward_ce", "forward cross-entropy to an expert's top-k next-token distribution on the "
        "student's own responses (rich-feedback DAgger; with a horizon, on-policy distillation)",
        Param("expert", "privileged", "privileged: the policy itself with `context` added to its prompt | a model "
              "folder (or tiny: spec) with the same tokenizer"),
        Param("context", "answer", "privileged context: answer (the row's gold answer) | a dataset column name "
              "kept in the row's metadata (e.g. a verifier's trace)"),
        Param("top_k", 20, "the expert's top-k tokens the cross-entropy sums over", ">= 1", lambda v: v >= 1),
        Param("horizon", "full", "the share of each response the expert scores: full | a share in (0, 1] | "
              "progressive (grows from horizon_start to 1 over horizon_steps)", "full | (0, 1] | progressive",
              _horizon_ok, kind=object),
        Param("horizon_start", 0.25, "the progressive horizon's share at step 0", "in (0, 1]",
              lambda v: 0 < v <= 1),
        Param("horizon_steps", 0, "steps over which the progressive horizon grows to 1 (0: max_steps)", ">= 0",
              lambda v: v >= 0),
        Param("rollout", "full", "full: the student generates whole responses and the horizon masks what the expert "
              "scores | truncated: the student generates only ceil(share x rollout.max_new_tokens) tokens (the "
              "paper's TOPD at a fixed share, POPD with progressive) and the expert scores all of them",
              choices=("full", "truncated")),
        source="arXiv:2606.05152 (forward CE), arXiv:2605.31490 (horizon)", config_check=_forward_ce_check)
