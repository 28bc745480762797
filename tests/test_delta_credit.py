"""DelTA discriminative token credit (arXiv 2605.21467, METHODS.md §5), worked by hand on a built batch.

Batch: two responses to one prompt, A = +1 and A = -1, each "b b b digit". The boilerplate b is sampled
with p = 0.99 and has the same hidden state in both; the digits differ ("3" right, "5" wrong), p = 0.3,
orthonormal hidden states e3, e5. v = (1-p) h: v_b = 0.01 e_b, v_3 = 0.7 e3, v_5 = 0.7 e5.
"""

from __future__ import annotations

import math

import pytest
import torch

from mmrlvr.credit import CREDIT_SCHEMES, build_scheme
from mmrlvr.credit.delta import delta_coefficients
from mmrlvr.errors import UserError


def _batch():
    h = torch.zeros(2, 4, 3)
    h[:, :3, 0] = 1.0  # boilerplate: e_b in both responses
    h[0, 3, 1] = 1.0  # "3" (correct)
    h[1, 3, 2] = 1.0  # "5" (wrong)
    p = torch.tensor([[0.99, 0.99, 0.99, 0.3], [0.99, 0.99, 0.99, 0.3]])
    return h, p.log(), torch.tensor([1.0, -1.0]), torch.ones(2, 4)


def _sig(x):
    return 1 / (1 + math.exp(-x))


def _by_hand(lam=1.0):
    # one pass of the formula, in plain floats over the 3 coordinates (e_b, e3, e5)
    vb, v3, v5 = (0.01, 0, 0), (0, 0.7, 0), (0, 0, 0.7)
    pos, neg = [vb, vb, vb, v3], [vb, vb, vb, v5]

    def cen(vs, ws):
        return tuple(sum(w * v[i] for v, w in zip(vs, ws)) / sum(ws) for i in range(3))

    def d(a, b):
        return sum((x - y) ** 2 for x, y in zip(a, b))

    def zs(mp, mn):
        mpos = [lam * d(v, mn) - d(v, mp) for v in pos]
        mneg = [lam * d(v, mp) - d(v, mn) for v in neg]
        out = []
        for ms in (mpos, mneg):
            mean = sum(ms) / 4
            g = math.sqrt(sum((m - mean) ** 2 for m in ms) / 4)
            out.append([m / g for m in ms])
        return out

    mp, mn = cen(pos, [1] * 4), cen(neg, [1] * 4)
    zp, zn = zs(mp, mn)
    mp, mn = cen(pos, [_sig(z) for z in zp]), cen(neg, [_sig(z) for z in zn])
    zp, zn = zs(mp, mn)
    c = [0.8 + 0.4 * _sig(z) for z in zp + zn]
    mean = sum(c) / len(c)
    return [x / mean for x in c[:4]], [x / mean for x in c[4:]]


def test_coefficients_equal_the_formula_worked_by_hand():
    h, logp, adv, mask = _batch()
    c = delta_coefficients(h, logp, adv, mask)
    want_pos, want_neg = _by_hand()
    torch.testing.assert_close(c, torch.tensor([want_pos, want_neg]), atol=1e-5, rtol=0)
    # the answer digit near the top of [0.8, 1.2], the shared boilerplate at the middle (equidistant)
    assert c[0, 3] > 1.1 and c[1, 3] > 1.1
    assert abs(float(c[0, 0]) - float(c[1, 0])) < 1e-6 and float(c[0, 0]) < float(c[0, 3]) - 0.1
    assert float(c[mask > 0].mean()) == pytest.approx(1.0)
    # a wrong constant shows: lambda_w = 2 moves every margin
    c2 = delta_coefficients(h, logp, adv, mask, lambda_w=2.0)
    torch.testing.assert_close(c2, torch.tensor(list(_by_hand(2.0))), atol=1e-5, rtol=0)
    assert (c2 - c).abs().max() > 1e-3


def test_a_boilerplate_token_that_sits_with_the_other_side_goes_to_the_floor():
    # the wrong response is long chatter (6 boilerplate tokens), the right one short: the negative centroid
    # is boilerplate, so the right response's boilerplate lies with the other side: margin << 0 -> ~0.8
    h = torch.zeros(2, 7, 3)
    h[0, 0, 0] = 1.0
    h[0, 1, 1] = 1.0
    h[1, :6, 0] = 1.0
    h[1, 6, 2] = 1.0
    p = torch.full((2, 7), 0.3)
    mask = torch.tensor([[1.0, 1, 0, 0, 0, 0, 0], [1.0] * 7])
    c = delta_coefficients(h, p.log(), torch.tensor([1.0, -1.0]), mask)
    assert float(c[0, 0]) < 0.9 and float(c[0, 0]) == pytest.approx(float(c[mask > 0].min()))
    assert float(c[0, 1]) > float(c[0, 0]) + 0.1  # the right answer's digit is kept high
    assert c[0, 2:].abs().sum() == 0  # masked: 0


def test_zero_advantage_tokens_get_the_floor_and_one_sided_batches_are_plain_grpo():
    h, logp, _, mask = _batch()
    h3 = torch.cat([h, h[:1]])
    c = delta_coefficients(h3, torch.cat([logp, logp[:1]]), torch.tensor([1.0, -1.0, 0.0]), torch.ones(3, 4))
    mean = float(c.mean())
    assert mean == pytest.approx(1.0)
    # zero-advantage row: 0.8 before the rescale -> all equal, and the smallest values of the batch
    assert torch.allclose(c[2], c[2, 0].expand(4)) and float(c[2, 0]) <= float(c[:2].min()) + 1e-6
    only_pos = delta_coefficients(h, logp, torch.tensor([1.0, 0.5]), mask)
    assert torch.equal(only_pos, torch.ones(2, 4))


def test_scheme_is_registered_and_gives_token_weights_with_a_token_count_normaliser():
    h, logp, adv, mask = _batch()
    scheme = build_scheme("delta")
    assert "delta" in CREDIT_SCHEMES and scheme.needs_hidden and not scheme.row_local
    res = scheme(None, mask, adv, old_logprobs=logp, hidden=h)
    torch.testing.assert_close(res.token_weights, delta_coefficients(h, logp, adv, mask))
    assert torch.equal(res.norm_weights, mask) and torch.equal(res.adv_scale, torch.ones(2))
    assert res.stats["credit/delta_coef_max"] > 1.1
    with pytest.raises(UserError, match="hidden"):
        scheme(None, mask, adv, old_logprobs=logp)
    with pytest.raises(UserError, match="lambda_w"):
        build_scheme("delta", lambda_w=0)


def test_two_shards_with_a_reducer_give_the_global_batch_coefficients():
    """Several processes: DelTA's centroids, spreads and mean are batch-wide; with ``reduce`` summing over
    processes each shard's coefficients equal the rows of the one-batch computation. Two threads stand in
    for two ranks (the reducer sums what both hand in at each call, as all-reduce does)."""
    import threading

    gen = torch.Generator().manual_seed(3)
    N, L, H = 6, 5, 8
    h = torch.randn(N, L, H, generator=gen)
    logp = -torch.rand(N, L, generator=gen)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2, 0.3, -0.1])
    mask = (torch.rand(N, L, generator=gen) > 0.2).float()
    want = delta_coefficients(h, logp, adv, mask)
    shards = [slice(0, 2), slice(2, 6)]  # uneven on purpose: 2 rows and 4 rows
    slots: list = [None, None]
    barrier = threading.Barrier(2)

    def reducer(rank: int):
        def reduce(t: torch.Tensor) -> torch.Tensor:
            slots[rank] = t.clone()
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total
        return reduce

    got: list = [None, None]

    def run(rank: int) -> None:
        r = shards[rank]
        got[rank] = delta_coefficients(h[r], logp[r], adv[r], mask[r], reduce=reducer(rank))

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    torch.testing.assert_close(torch.cat(got), want, rtol=0, atol=1e-5)
    assert not torch.allclose(delta_coefficients(h[2:], logp[2:], adv[2:], mask[2:]), want[2:], atol=1e-4), \
        "the premise: a shard alone gives other coefficients"
