"""Tree advantages (TreeRPO, arXiv 2506.05183; no official code is public): a node's value is the mean reward of
the leaves below it, and a node's advantage is its value normalised among its siblings (the children of the same
parent; a depth-1 node's siblings are the other depth-1 nodes of its prompt).

    V(n) = mean_{leaves l under n} R(l)
    A(n) = estimator(V(n) | siblings of n)        (the run's algo.advantage: GRPO's (V − mean) / (std + eps))

Every token of a leaf's depth-d segment gets A(node of that leaf at depth d): the per-token advantage [N, L]. A
shared segment is the same tokens in every leaf below its node; each leaf is trained as its own trajectory, so
those tokens count once per leaf [ours: the paper trains the leaves as trajectories]. With depth 1 this is exactly
the group advantage of flat groups. The normalisation is whatever ``algo.advantage`` estimates within a group, given
the node values and sibling groups [ours: GRPO's by default, as the paper's GRPO base].

Pure: tensors in, tensors out.
"""

from __future__ import annotations

from typing import Callable

import torch


def node_values(rewards: torch.Tensor, node: torch.Tensor,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(node ids, mean reward of each node's kept leaves) for one depth: rewards [N], node [N] ids, keep [N] bool
    (None: every leaf) -> ([M], [M]). A node all of whose leaves were dropped is left out (it has no value)."""
    keep = torch.ones_like(rewards, dtype=torch.bool) if keep is None else keep
    ids, inverse = torch.unique(node, return_inverse=True)
    w = keep.to(rewards.dtype)
    total = torch.zeros(len(ids), dtype=rewards.dtype).index_add_(0, inverse, rewards * w)
    count = torch.zeros(len(ids), dtype=rewards.dtype).index_add_(0, inverse, w)
    valued = count > 0
    return ids[valued], total[valued] / count[valued]


def tree_advantages(rewards: torch.Tensor, node: torch.Tensor, parent: list[torch.Tensor], starts: list[int],
                    lengths: list[int], response_length: int,
                    estimator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    keep: torch.Tensor | None = None) -> tuple[torch.Tensor, list[float]]:
    """Per-token advantages [N, L] of the leaves and the mean |A| per depth.

    rewards [N] (leaf rewards), node [N, D] (each leaf's node per depth), parent: D tensors [N] (each leaf's
    depth-d node's parent), starts / lengths: each depth's segment in the response, ``estimator(values [M],
    group_index [M]) -> [M]`` the group advantage over sibling groups. ``keep`` [N] bool: the leaves in the batch
    (None: all). A dropped leaf (a reward that could not score it) counts in no node's value — as the flat
    estimators leave dropped rows out of their baseline — and gets advantage 0; a node whose leaves were all
    dropped takes no part in its siblings' normalisation."""
    n, depth = node.shape
    keep = torch.ones(n, dtype=torch.bool) if keep is None else keep
    adv = torch.zeros(n, response_length, dtype=torch.float32)
    per_depth = []
    for d in range(depth):
        ids, values = node_values(rewards.float(), node[:, d], keep)
        first = {int(i): r for r, i in reversed(list(enumerate(node[:, d].tolist())))}  # a leaf of each node
        parents = torch.stack([parent[d][first[int(i)]] for i in ids]) if len(ids) else torch.zeros(0)
        _, sibling_group = torch.unique(parents, return_inverse=True)
        node_adv = estimator(values, sibling_group) if len(ids) else values
        lookup = dict(zip(ids.tolist(), node_adv.tolist()))
        row_adv = torch.tensor([lookup.get(int(i), 0.0) if bool(k) else 0.0 for i, k in zip(node[:, d], keep)],
                               dtype=torch.float32)
        a, b = starts[d], min(starts[d] + lengths[d], response_length)
        adv[:, a:b] = row_adv[:, None]
        per_depth.append(float(node_adv.abs().mean()) if len(node_adv) else 0.0)
    return adv, per_depth
