"""A new advantage estimator in one file: the group *median* as the baseline.

    A_i = r_i - median(r_group)          (no scaling; robust to one outlier reward in a group)

Register it, then select it from a config:

    mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/median_advantage.py]" algo.advantage=group_median

The ``group`` advantage stage looks ``algo.advantage`` up in ``ADVANTAGES``, so nothing else changes.
(Illustrative, not a published method: for groups of even size ``torch.median`` takes the lower middle value.)
"""

import torch

from mmrlvr.algos import ADVANTAGES


@ADVANTAGES.register("group_median")
def group_median_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """rewards [N], group_index [N] (rollout -> prompt group) -> advantages [N]."""
    adv = torch.empty_like(rewards)
    for g in group_index.unique():
        rows = group_index == g
        adv[rows] = rewards[rows] - rewards[rows].median()
    return adv
