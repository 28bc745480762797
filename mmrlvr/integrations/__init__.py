"""mmrlvr's rewards packaged for other trainers: TRL's ``GRPOTrainer`` and verl's custom reward API.

- ``trl``: ``trl_reward(name, ...)`` / ``trl_rewards(specs)`` -> TRL reward functions (dataset columns ->
  ``Sample``), ``reward_callback(rewards)`` for the policy-aware and stateful rewards;
- ``verl``: ``compute_score`` (reward manager ``naive``), ``compute_score_batch`` (``batch``: group-aware),
  ``make_compute_score(name, **params)`` for a reward file of your own;
- ``common``: the shared row -> ``Sample`` conversion and grouping.

Usage and the calling conventions these follow: docs/integrations.md. Importing this package does not import
TRL, verl or torch.
"""

from mmrlvr.integrations.trl import TRLReward, reward_callback, trl_reward, trl_rewards
from mmrlvr.integrations.verl import compute_score, compute_score_batch, make_compute_score

__all__ = ["TRLReward", "trl_reward", "trl_rewards", "reward_callback", "compute_score", "compute_score_batch",
           "make_compute_score"]
