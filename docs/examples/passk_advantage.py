"""An advantage estimator with parameters in one file: the pass@k group advantage for (binarised) rewards.

GRPO rewards each rollout for being right; pass@k training rewards a *group* for containing at least one right
answer among k tries, which keeps exploring once a prompt is usually solved. This estimator follows the analytic
form of Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large
Reasoning Models" (arXiv 2508.10751): instead of sampling k-subsets of the group, it averages over all of them.
The package ships the same estimator built in (``algo.advantage: pass_at_k``); this file, registered as
``my_pass_at_k``, shows how a plug-in with parameters and a config check is written.

Per group of N rollouts, N_pos of them correct (reward >= ``threshold``) and N_neg = N - N_pos wrong:

    rho    = 1 - C(N_neg, k) / C(N, k)                     mean pass@k reward over all k-subsets of the group
    sigma  = sqrt(rho * (1 - rho))                        std of that 0/1 subset reward
    A_pos  = (1 - rho) / sigma                            every subset holding a correct rollout passes
    A_neg  = (1 - rho - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / sigma
                                                          a wrong rollout's subsets fail when its k - 1
                                                          companions are all wrong too

(each rollout's advantage is the mean normalised advantage of the k-subsets it belongs to). A group with no
spread (rho = 0 or 1, e.g. fewer than k wrong rollouts) gets 0, as every estimator of this package does (the
paper's code divides by sigma + 1e-6, which also gives 0 there; elsewhere the two differ by that 1e-6). k = 1 is
GRPO with the population std: rho = N_pos / N, A_pos = (1 - rho)/sigma, A_neg = -rho/sigma.

Run it (``algo.advantage_params`` holds its parameters; ``--help-config`` lists them when the config file names the
plug-in in ``plugins:``):

    mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/passk_advantage.py]" algo.advantage=my_pass_at_k "algo.advantage_params={k: 4}"

``validate_config`` refuses k > ``rollout.group_size`` before the model loads (``--dry-run`` exits 2 naming k).
Illustrative: a readable loop over groups, not a tuned implementation; rewards are binarised at ``threshold``
(demo-tiny's total is 0.2 * format + 1.0 * accuracy, so 1.0 means "the answer is right").
"""

from math import comb, sqrt

import torch

from mmrlvr.algos import ADVANTAGES
from mmrlvr.methods import describe_params


@describe_params(k="rollouts per pass@k subset (1 <= k <= rollout.group_size; 1 = GRPO)",
                 threshold="a rollout counts as correct when its reward >= threshold")
@ADVANTAGES.register("my_pass_at_k")
def pass_at_k_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, k: int = 4,
                         threshold: float = 1.0) -> torch.Tensor:
    """Pass@k group advantages (arXiv 2508.10751, analytic form): rewards [N], group_index [N] -> [N]."""
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    correct = rewards >= threshold
    for g in group_index.unique():
        rows = group_index == g
        n, n_pos = int(rows.sum()), int(correct[rows].sum())
        n_neg = n - n_pos
        if n < k:  # a group smaller than k (dropped rows): no subset of size k, no signal
            continue
        rho = 1.0 - comb(n_neg, k) / comb(n, k)
        sigma = sqrt(rho * (1.0 - rho))
        if sigma == 0.0:  # all right, all wrong, or fewer than k wrong: every subset scores the same
            continue
        a_pos = (1.0 - rho) / sigma
        a_neg = (1.0 - rho - comb(n_neg - 1, k - 1) / comb(n - 1, k - 1)) / sigma if n_neg else 0.0
        adv[rows] = torch.where(correct[rows], torch.tensor(a_pos), torch.tensor(a_neg))
    return adv.to(rewards.dtype)


def _validate(cfg, params) -> list[str]:
    """Checked at config load (``mmrlvr train --dry-run`` too), before any model loads."""
    k, g = params["k"], cfg.rollout.group_size
    if k < 1:
        return [f"k must be >= 1, got {k}"]
    if k > g:
        return [f"k={k} exceeds rollout.group_size={g}: a group of {g} rollouts has no subset of {k}"]
    return []


pass_at_k_advantages.validate_config = _validate
