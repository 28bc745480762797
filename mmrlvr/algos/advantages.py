"""Group-relative advantage estimators: rewards of G rollouts per prompt in, one advantage per rollout out.

Every estimator has the signature ``fn(rewards [N] float, group_index [N] int, **params) -> [N]`` and
is registered in ``ADVANTAGES`` by name (config key ``algo.advantage``). The trainer broadcasts the
per-sequence advantage over the response tokens. Groups need not have equal sizes.

One rule holds for every estimator: a group whose rewards are all equal carries no learning signal and
gets advantage exactly 0 (its rows still count in the loss normaliser unless DAPO dynamic sampling
removes them; see ``mmrlvr.algos.sampling``).

Not here: reward computation, KL-in-reward shaping, per-token (GAE) returns. Formulas: each estimator's
docstring, with its paper; defaults against verl and TRL: docs/training.md; split advantages: docs/consistency.md.

Each built-in estimator declares its parameters (``mmrlvr.methods.declare``) just above its function, and so do the
estimators that are stages rather than functions (``poise``, ``opd``, served by ``mmrlvr.train.stages.advantages``):
the config checks import this module without torch (``torch = lazy_module("torch")``) to read them.
"""

from __future__ import annotations

from typing import Callable

from mmrlvr.algos.groups import group_stats
from mmrlvr.lazy_import import lazy_module
from mmrlvr.methods import Param, declare
from mmrlvr.methods import non_negative as _nonneg
from mmrlvr.methods import positive as _pos
from mmrlvr.registry import Registry

torch = lazy_module("torch")  # declarations and config checks read this module without torch

#: name -> fn(rewards [N], group_index [N], **params) -> advantages [N]
ADVANTAGES: Registry[Callable[..., torch.Tensor]] = Registry("advantage estimator")


declare("advantage", "grpo", "(R - mean_g R) / (std_g R + eps)",
        Param("eps", 1e-6, "added to the group std", "> 0", _pos),
        Param("unbiased", True, "n-1 sample std (verl, TRL); false: population std"),
        source="arXiv:2402.03300")


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, eps: float = 1e-6,
                    unbiased: bool = True) -> torch.Tensor:
    """GRPO: A_i = (R_i - mean_g R) / (std_g R + eps) (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    rewards: [N] float; group_index: [N] int. Returns [N].
    ``unbiased=True`` (default) uses the n-1 sample std, as verl's and TRL's GRPO do (``torch.std``);
    ``False`` uses the population std. The choice rescales a group of G by sqrt(G/(G-1)), nothing else.
    """
    stats = group_stats(rewards, group_index, unbiased=unbiased)
    adv = (rewards - stats.mean) / (stats.std + eps)
    return torch.where(stats.has_spread, adv, torch.zeros_like(adv))


declare("advantage", "dr_grpo", "R - mean_g R, no std division (pair with seq-mean-token-sum-norm)",
        source="arXiv:2503.20783")


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO: A_i = R_i - mean_g R, no division by the group std, which favours groups that are
    nearly all right or all wrong (Liu et al. 2025, "Understanding R1-Zero-Like Training",
    arXiv:2503.20783). Pair with the ``seq-mean-token-sum-norm`` aggregation.

    rewards: [N] float; group_index: [N] int. Returns [N].
    """
    stats = group_stats(rewards, group_index)
    adv = rewards - stats.mean
    return torch.where(stats.has_spread, adv, torch.zeros_like(adv))


declare("advantage", "rloo", "R - mean of the other rollouts of the group (leave-one-out)", source="arXiv:2402.14740")


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """RLOO: A_i = R_i - mean_{j != i} R_j, the leave-one-out baseline, unbiased for any group size
    (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740; Kool et al. 2019).

    rewards: [N] float; group_index: [N] int. Returns [N]. Since mean_{j!=i} = (n*mean - R_i)/(n-1),
    A_i = n/(n-1) * (R_i - mean_g); a group of one has no baseline and gets 0.
    """
    stats = group_stats(rewards, group_index)
    adv = (rewards - stats.mean) * stats.size / (stats.size - 1).clamp_min(1)
    return torch.where(stats.has_spread, adv, torch.zeros_like(adv))


WHITEN_SCOPES = ("batch_tokens", "sequence")

declare("advantage", "reinforce_pp", "group-centred reward whitened over the whole batch",
        Param("baseline", True, "subtract the group mean first (REINFORCE++-baseline); false: whiten raw rewards"),
        Param("eps", 1e-6, "added to the std in the sequence scope", "> 0", _pos),
        Param("whiten_scope", "batch_tokens", "batch_tokens: weighted by response tokens (verl) | sequence: each "
              "rollout once", choices=WHITEN_SCOPES),
        source="arXiv:2501.03262")


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, baseline: bool = True,
                            eps: float = 1e-6, whiten_scope: str = "batch_tokens",
                            token_counts: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262): normalise with *batch* statistics, not group ones.

    rewards: [N] float; group_index: [N] int; token_counts: [N] response lengths (tokens with
    mask > 0) for ``whiten_scope="batch_tokens"`` (None: all equal — exact when responses have equal
    length; the trainer passes them through ``call_advantage``). Returns [N] (one value per sequence;
    it is constant over the sequence's tokens in both scopes).
    ``baseline=True`` (default, "REINFORCE++-baseline", the variant the paper recommends for reasoning
    with several samples per prompt): subtract the group mean, c = R - mean_g R, then whiten c over the
    batch. ``baseline=False``: whiten the raw rewards.

    ``whiten_scope`` — where the two implementations differ:
    - ``"batch_tokens"`` (default, verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage``):
      c is broadcast to every response token and whitened over all tokens of the batch,
      A = (c - mu) / sqrt(var + 1e-8), mu and var (Bessel-corrected) weighted by ``token_counts``: a
      long response counts once per token, as its tokens do in a token-mean loss.
    - ``"sequence"``: every sequence counts once, A = (c - mean c) / (std c + eps), population std.
    One rule of this module differs from verl in both scopes: a group whose rewards are all equal gets
    exactly 0 (verl leaves such rows at -mu/sigma, a signal from a group that carries none).
    """
    if whiten_scope not in WHITEN_SCOPES:
        raise ValueError(f"whiten_scope must be one of {WHITEN_SCOPES}, got {whiten_scope!r}")
    stats = group_stats(rewards, group_index)
    centred = rewards - stats.mean if baseline else rewards
    if centred.numel() == 0:
        return centred
    if whiten_scope == "sequence":
        adv = (centred - centred.mean()) / (centred.std(correction=0) + eps)
    else:
        w = torch.ones_like(centred) if token_counts is None else token_counts.to(centred.dtype)
        if w.shape != centred.shape:
            raise ValueError(f"token_counts {tuple(w.shape)} must be [N] like rewards {tuple(centred.shape)}")
        n = w.sum()
        mu = (w * centred).sum() / n.clamp_min(1)
        var = (w * (centred - mu) ** 2).sum() / n.clamp_min(1) * n / (n - 1).clamp_min(1)
        adv = (centred - mu) * torch.rsqrt(var + 1e-8)
    return torch.where(stats.has_spread, adv, torch.zeros_like(adv))


def smallest_groups(cfg) -> list[tuple[int, str]]:
    """The sizes of the smallest groups a group estimator can be handed under ``cfg``, each with the setting that
    sets it: flat groups (``rollout.group_size``), a tree's sibling groups (``branching`` children per node), a
    budget sampler's smallest group (``g_min``)."""
    out = [(cfg.rollout.group_size, f"rollout.group_size={cfg.rollout.group_size}")]
    if cfg.rollout.strategy == "tree":
        from mmrlvr.run_settings import tree_params

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


@ADVANTAGES.register("pass_at_k")
def pass_at_k_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, k: int = 4,
                         threshold: float = 1.0) -> torch.Tensor:
    """Pass@k training's analytic group advantage (Chen et al. 2025, "Pass@k Training for Adaptively Balancing
    Exploration and Exploitation of Large Reasoning Models", arXiv:2508.10751; official code: the authors'
    ``passk_adv.py``).

    rewards: [N] (binarised at ``threshold``: correct when ``reward >= threshold``); group_index: [N]. Returns [N].
    Per group of N rollouts with N_pos correct and N_neg = N − N_pos wrong, the reward of a k-subset is 1 when it
    holds a correct rollout; averaged over all C(N, k) subsets in closed form:

        ρ = 1 − C(N_neg, k) / C(N, k)            mean subset reward,  σ = sqrt(ρ (1 − ρ))
        A_pos = (1 − ρ) / σ                      every subset with a correct rollout passes
        A_neg = (1 − ρ − C(N_neg − 1, k − 1) / C(N − 1, k − 1)) / σ

    (a rollout's advantage is the mean normalised advantage of the subsets it belongs to). k = 1 is GRPO with the
    population std. Deviation, as every estimator here: a group with no spread (ρ ∈ {0, 1}, e.g. fewer than k
    wrong rollouts) gets exactly 0 — the official code divides by σ + 1e-6, which gives 0 there too and differs by
    that 1e-6 elsewhere. A group smaller than k (rows dropped) has no k-subset: 0.
    """
    from math import comb, sqrt

    adv = torch.zeros_like(rewards, dtype=torch.float32)
    correct = rewards >= threshold
    for g in group_index.unique():
        rows = group_index == g
        n, n_pos = int(rows.sum()), int(correct[rows].sum())
        n_neg = n - n_pos
        if n < k:
            continue
        rho = 1.0 - comb(n_neg, k) / comb(n, k)
        sigma = sqrt(rho * (1.0 - rho))
        if sigma == 0.0:
            continue
        a_pos = (1.0 - rho) / sigma
        a_neg = (1.0 - rho - comb(n_neg - 1, k - 1) / comb(n - 1, k - 1)) / sigma if n_neg else 0.0
        adv[rows] = torch.where(correct[rows], torch.tensor(a_pos), torch.tensor(a_neg))
    return adv.to(rewards.dtype)


# Estimators served by a stage (``Stage.serves``, ``mmrlvr.train.stages.advantages``), not by a function in
# ``ADVANTAGES``: their parameters are declared here with the others, so one torch-free import declares them all.
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


def call_advantage(name: str, rewards: torch.Tensor, group_index: torch.Tensor, *,
                   token_counts: torch.Tensor | None = None, **params) -> torch.Tensor:
    """``ADVANTAGES.get(name)(rewards, group_index, **params)``, passing ``token_counts`` ([N] response
    lengths) only to estimators that take it (REINFORCE++'s token-level whitening), so the trainer can
    always hand it over."""
    import inspect

    fn = ADVANTAGES.get(name)
    if token_counts is not None and "token_counts" in inspect.signature(fn).parameters:
        params["token_counts"] = token_counts
    return fn(rewards, group_index, **params)


def split_advantages(task_rewards: torch.Tensor, cons_rewards: torch.Tensor, group_index: torch.Tensor,
                     alpha: float = 1.0, beta: float = 1.0, *, eps: float = 1e-6,
                     unbiased: bool = True) -> torch.Tensor:
    """CORA-style advantage splitting (docs/consistency.md): A = alpha * A_task + beta * A_cons.

    task_rewards, cons_rewards: [N] float; group_index: [N] int. Returns [N].
    Each reward is GRPO-normalised within its group separately, so a consistency reward with a small
    spread is not drowned by the task reward's scale (and a group where only one of the two varies
    still gets that one's signal). The warm-up/decay schedule of beta lives with the consistency code;
    this is the pure combination.
    """
    if task_rewards.shape != cons_rewards.shape:
        raise ValueError(f"task_rewards {tuple(task_rewards.shape)} and cons_rewards "
                         f"{tuple(cons_rewards.shape)} differ in shape")
    a_task = grpo_advantages(task_rewards, group_index, eps=eps, unbiased=unbiased)
    a_cons = grpo_advantages(cons_rewards, group_index, eps=eps, unbiased=unbiased)
    return alpha * a_task + beta * a_cons


def token_split_advantages(task_rewards: torch.Tensor, cons_rewards: torch.Tensor, group_index: torch.Tensor,
                           cons_token_mask: torch.Tensor, alpha: float = 1.0, beta: float = 1.0, *,
                           eps: float = 1e-6, unbiased: bool = True) -> torch.Tensor:
    """Split advantages whose consistency term reaches only some tokens: [N, L].

    A_{i,t} = alpha * A_task_i + beta * A_cons_i * m_{i,t}, with A_task, A_cons group-normalised
    separately (as ``split_advantages``) and m = ``cons_token_mask`` [N, L] (e.g. the answer span). Why:
    a consistency advantage on the thinking tokens can be earned by rewriting correct thinking to match a
    wrong answer; confined to the answer it can only be earned by the answer following the thinking."""
    a_task = grpo_advantages(task_rewards, group_index, eps=eps, unbiased=unbiased)
    a_cons = grpo_advantages(cons_rewards, group_index, eps=eps, unbiased=unbiased)
    return alpha * a_task[:, None] + beta * a_cons[:, None] * cons_token_mask.to(a_task.dtype)
