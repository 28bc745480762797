"""Advantage estimators and DAPO's batch extras against their papers' formulas (expected values computed
here with the statistics module, never with mmrlvr's code)."""

from __future__ import annotations

import statistics

import pytest
import torch

from mmrlvr.algos.advantages import ADVANTAGES, call_advantage, reinforce_pp_advantages
from mmrlvr.algos.sampling import dynamic_sampling_filter, overlong_penalty, refill

R = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 1.0, 0.0, 1.0]
G = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]  # group 1 has no spread
LENGTHS = [3, 10, 4, 7, 5, 5, 2, 9, 1, 6]


def _groups():
    out: dict[int, list[int]] = {}
    for i, g in enumerate(G):
        out.setdefault(g, []).append(i)
    return out


def _run(name, **kw):
    return ADVANTAGES.get(name)(torch.tensor(R), torch.tensor(G), **kw).tolist()


def test_grpo_dr_grpo_rloo_formulas():
    grpo, dr, rloo = _run("grpo"), _run("dr_grpo"), _run("rloo")
    for idx in _groups().values():
        rs = [R[i] for i in idx]
        m, s = statistics.mean(rs), statistics.stdev(rs)  # DeepSeekMath eq. 3 with the sample std
        for i in idx:
            flat = s == 0
            assert grpo[i] == pytest.approx(0.0 if flat else (R[i] - m) / (s + 1e-6), abs=1e-5)
            assert dr[i] == pytest.approx(0.0 if flat else R[i] - m, abs=1e-6)  # Dr.GRPO: no std
            loo = statistics.mean([R[j] for j in idx if j != i])  # RLOO: mean of the others
            assert rloo[i] == pytest.approx(0.0 if flat else R[i] - loo, abs=1e-6)


def _token_whitened(centred, lengths):
    """verl's REINFORCE++-baseline: broadcast c_i over its tokens, whiten over every token of the batch
    (masked_whiten: unbiased variance, rsqrt(var + 1e-8))."""
    tokens = [c for c, n in zip(centred, lengths) for _ in range(n)]
    mu, var = statistics.mean(tokens), statistics.variance(tokens)
    return [(c - mu) / (var + 1e-8) ** 0.5 for c in centred]


def test_reinforce_pp_whitens_over_the_batch_tokens_as_verl():
    groups = _groups()
    centred = [R[i] - statistics.mean(R[j] for j in groups[G[i]]) for i in range(len(R))]
    want = _token_whitened(centred, LENGTHS)
    got = call_advantage("reinforce_pp", torch.tensor(R), torch.tensor(G), token_counts=torch.tensor(LENGTHS))
    for i, g in enumerate(G):
        assert float(got[i]) == pytest.approx(0.0 if g == 1 else want[i], abs=1e-5)  # flat group -> 0
    # a long response counts once per token: lengths change the answer (per-sequence whitening differs)
    seq = reinforce_pp_advantages(torch.tensor(R), torch.tensor(G), whiten_scope="sequence").tolist()
    pop = statistics.pstdev(centred)
    for i, g in enumerate(G):
        assert seq[i] == pytest.approx(0.0 if g == 1 else (centred[i] - statistics.mean(centred)) / (pop + 1e-6),
                                       abs=1e-5)
    assert max(abs(a - b) for a, b in zip(got.tolist(), seq)) > 0.05
    with pytest.raises(ValueError, match="whiten_scope"):
        reinforce_pp_advantages(torch.tensor(R), torch.tensor(G), whiten_scope="batch")


def test_call_advantage_hands_token_counts_only_to_who_takes_them():
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):  # the rewards-only estimators
        call_advantage(name, torch.tensor(R), torch.tensor(G), token_counts=torch.tensor(LENGTHS))


def test_dynamic_sampling_reads_accuracy_as_dapo():
    # group 0: all correct, but a format term makes the totals differ; group 1: accuracy varies
    acc = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    total = torch.tensor([1.2, 1.0, 1.1, 0.2, 1.0, 0.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    assert dynamic_sampling_filter(total, g, accuracy=acc).tolist() == [False, True]  # DAPO §3.2
    assert dynamic_sampling_filter(total, g, accuracy=acc, metric="reward").tolist() == [True, True]
    with pytest.raises(ValueError, match="accuracy"):
        dynamic_sampling_filter(total, g)  # never falls back to the total reward silently
    with pytest.raises(ValueError, match="metric"):
        dynamic_sampling_filter(total, g, accuracy=acc, metric="acc")


def test_refill_collects_groups_across_rounds():
    batch, buf = refill([], ["a"], target=3)
    assert batch is None and buf == ["a"]
    batch, buf = refill(buf, ["b", "c", "d"], target=3)
    assert batch == ["a", "b", "c"] and buf == []


def test_overlong_penalty_dapo_eq13():
    L_max, L_cache = 20, 4
    lengths = [10, 16, 17, 20, 21]

    def r(n):  # DAPO eq. (13)
        if n <= L_max - L_cache:
            return 0.0
        if n <= L_max:
            return ((L_max - L_cache) - n) / L_cache
        return -1.0

    got = overlong_penalty(torch.tensor(lengths), L_max, L_cache).tolist()
    assert got == pytest.approx([r(n) for n in lengths])
