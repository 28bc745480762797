"""The algorithm's built-in methods and their parameters, declared without torch (``mmrlvr.methods``).

This is where a config's ``algo.loss_params``, ``algo.advantage_params`` and ``algo.clip_params`` are checked
against (names, types, ranges) at load time, in milliseconds. The implementations take the same keyword
parameters with the same defaults (``tests/test_methods.py`` compares every declaration with its function), and
the docs' parameter tables (``docs/methods.md``) and ``mmrlvr train --help-config`` are read from here.

The clip range ``algo.eps_low`` / ``algo.eps_high`` / ``algo.dual_clip`` stays a top-level ``algo`` key: every
clipped loss reads it and the presets set it, so it is not a parameter of one loss.
"""

from __future__ import annotations

from mmrlvr.methods import Param, declare


def _pos(v) -> bool:
    return v > 0


def _nonneg(v) -> bool:
    return v >= 0


# --------------------------------------------------------------------------------------------- policy losses
declare("loss", "ppo_clip", "PPO-clip per token, the GRPO/DAPO loss; reads algo.eps_low/eps_high/dual_clip and "
        "algo.clip", source="arXiv:1707.06347; clip-higher arXiv:2503.14476")
declare("loss", "gspo", "clip the sequence ratio exp(mean log r) (its own range: 3e-4 / 4e-4 by default)",
        source="arXiv:2507.18071")
declare("loss", "cispo", "truncated, detached importance weight times log pi: no token loses its gradient",
        source="arXiv:2506.13585")
declare("loss", "nsr", "PPO-clip whose near-boundary clipped tokens are rescued at random",
        Param("noise", 0.2, "relative noise of the rescue: r' = r(1 -/+ noise*u), u ~ U(0,1) [ours]", "in (0, 1]",
              lambda v: 0 < v <= 1),
        source="ours: the paper's exact rule is not public")
declare("loss", "popo", "positive-only: a weighted NLL on a group's correct rollouts, plus a similarity and an "
        "entropy term (brings its own advantages and update stages)",
        Param("temperature", 1.0, "T of the softmax weights over a group's positives", "> 0", _pos),
        Param("threshold", 1.0, "a rollout is positive when its reward >= this [ours]"),
        Param("sim_coef", 0.1, "weight of the similarity term (predictor vs EMA target features)", ">= 0", _nonneg),
        Param("ent_coef", 0.01, "weight of the entropy bonus on positive tokens", ">= 0", _nonneg),
        Param("ema_tau", 0.995, "EMA rate of the target parameters", "in [0, 1)", lambda v: 0 <= v < 1),
        source="arXiv:2605.06650")


def _fraction(v) -> bool:
    return 0 < v <= 1


def _kl_cov_epochs_note(cfg, p) -> list[str]:
    if cfg.algo.epochs != 1:
        return []
    from mmrlvr.train.stages.reference import recompute_enabled

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
        f"cov_low ({v['cov_low']}) must be < cov_high ({v['cov_high']})")
declare("loss", "kl_cov", "unclipped surrogate -A r plus coef * |log pi - log pi_old| on the top-k tokens by "
        "covariance (log pi - mean) * (A - mean); no PPO clip. Inert at algo.epochs: 1 (on-policy: the penalty "
        "is 0 with zero gradient); use algo.epochs >= 2",
        Param("fraction", 2e-3, "k: share of the micro-batch's response tokens penalised, n = max(1, floor(k * "
              "tokens)), largest covariance first (the authors' 7B value; their 32B run and verl's default: 2e-4)",
              "in (0, 1]", _fraction),
        Param("coef", 1.0, "beta: weight of |log pi - log pi_old| on those tokens (verl ppo_kl_coef; its config "
              "default is 0.1)", ">= 0", _nonneg),
        source="arXiv:2505.22617; verl core_algos compute_policy_loss_kl_cov and the authors' recipes",
        plan_notes=_kl_cov_epochs_note)

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
