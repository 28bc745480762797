"""A custom reward loaded through the config's ``plugins`` key (tests use it on an untrained model).

``distinct_tokens`` = share of distinct token ids in the response: it varies between samples of even a
random policy, so group advantages are non-zero and every update really moves the weights.
"""

from mmrlvr.rewards.base import REWARDS
from mmrlvr.types import Completion, RewardResult, Sample


class DistinctTokens:
    def __init__(self, **_):
        pass

    def __call__(self, completion: Completion, sample: Sample) -> RewardResult:
        ids = completion.token_ids
        score = len(set(ids)) / len(ids) if ids else 0.0
        return RewardResult(score, {"distinct_tokens": score})


if "distinct_tokens" not in REWARDS:
    REWARDS.add("distinct_tokens", DistinctTokens)
