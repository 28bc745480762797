"""Per-token signals on pure tensors: hand-worked values, chunked == unchunked, hidden-state path ==
logits path, masking, and VPPO's / PAPO's sampled-token k3."""

from __future__ import annotations

import math

import pytest
import torch

from mmrlvr.credit import Hidden, perception_k3, token_signals, vppo_dependency
from mmrlvr.errors import UserError


def test_hand_worked_two_token_vocabulary():
    # P = softmax([0, 0]) = [.5, .5];  Q = softmax([ln 3, 0]) = [.75, .25];  M = [.625, .375]
    # KL(P||M) = .5 ln(.5/.625) + .5 ln(.5/.375) = .5(-.2231436) + .5(.2876821) = .0322693
    # KL(Q||M) = .75 ln(.75/.625) + .25 ln(.25/.375) = .1367412 - .1013663 = .0353749
    # JSD = (.0322693 + .0353749)/2 = .0338221
    # H(P) = ln 2 = .6931472;  H(Q) = .75(.2876821) + .25(1.3862944) = .5623351;  dH = -.1308121
    # sampled token 0: logp = ln .5 = -.6931472, logq = ln .75 = -.2876821
    lp = torch.tensor([[[0.0, 0.0]]])
    lq = torch.tensor([[[math.log(3.0), 0.0]]])
    s = token_signals(lp, lq, torch.tensor([[0]]), torch.ones(1, 1))
    torch.testing.assert_close(s.jsd, torch.tensor([[0.0338221]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(s.entropy, torch.tensor([[0.6931472]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(s.entropy_shift, torch.tensor([[-0.1308121]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(s.logp, torch.tensor([[-0.6931472]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(s.logq, torch.tensor([[-0.2876821]]), atol=1e-6, rtol=0)


def test_disjoint_supports_give_ln2_and_no_nan():
    # P = [1, 0] and Q = [0, 1] (logits of -inf): JSD is its maximum ln 2, entropies 0, no NaN from 0*log 0
    lp = torch.tensor([[[0.0, -math.inf]]])
    lq = torch.tensor([[[-math.inf, 0.0]]])
    s = token_signals(lp, lq, torch.tensor([[0]]), torch.ones(1, 1))
    torch.testing.assert_close(s.jsd, torch.tensor([[math.log(2.0)]]))
    assert float(s.entropy) == 0.0 and float(s.entropy_shift) == 0.0
    assert float(s.logq) == -math.inf  # the sampled token is impossible under Q


def _reference(lp: torch.Tensor, lq: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor):
    """Unchunked full-tensor formulas, written independently of the module."""
    P, Q = lp.softmax(-1), lq.softmax(-1)
    M = (P + Q) / 2
    kl = lambda A, B: (A * (A.log() - B.log())).sum(-1)  # noqa: E731 (random logits: no zeros)
    H = lambda A: -(A * A.log()).sum(-1)  # noqa: E731
    m = mask
    return dict(jsd=(0.5 * kl(P, M) + 0.5 * kl(Q, M)) * m, entropy=H(P) * m, entropy_shift=(H(Q) - H(P)) * m,
                logp=P.log().gather(-1, ids[..., None]).squeeze(-1) * m,
                logq=Q.log().gather(-1, ids[..., None]).squeeze(-1) * m)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    N, L, V = 3, 7, 50
    lp = torch.randn(N, L, V, generator=g) * 2
    lq = lp + torch.randn(N, L, V, generator=g)
    ids = torch.randint(0, V, (N, L), generator=g)
    mask = torch.ones(N, L)
    mask[0, 5:] = 0
    mask[2, 1:] = 0
    return lp, lq, ids, mask


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_chunked_equals_unchunked(batch, chunk):
    lp, lq, ids, mask = batch
    s = token_signals(lp, lq, ids, mask, chunk_size=chunk)
    ref = _reference(lp, lq, ids, mask)
    for name, expected in ref.items():
        torch.testing.assert_close(getattr(s, name), expected, atol=1e-5, rtol=1e-5, msg=name)


def test_masked_positions_are_zero(batch):
    lp, lq, ids, mask = batch
    s = token_signals(lp, lq, ids, mask, chunk_size=5)
    for name in ("entropy", "jsd", "entropy_shift", "logp", "logq"):
        assert bool((getattr(s, name)[mask == 0] == 0).all()), name


def test_hidden_path_equals_logits_path_and_stays_chunked(batch):
    _, _, ids, mask = batch
    g = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(16, 50, bias=False)
    hp, hq = torch.randn(3, 7, 16, generator=g), torch.randn(3, 7, 16, generator=g)
    rows_seen = []

    def recording_head(x):
        rows_seen.append(x.shape[0])
        return head(x)

    with torch.no_grad():
        full = token_signals(head(hp), head(hq), ids, mask)
    s = token_signals(Hidden(hp, recording_head), Hidden(hq, recording_head), ids, mask, chunk_size=4)
    for name in ("entropy", "jsd", "entropy_shift", "logp", "logq"):
        torch.testing.assert_close(getattr(s, name), getattr(full, name), atol=1e-5, rtol=1e-5)
    # 3 rows x 7 with 5 + 7 + 1 = 13 valid tokens -> chunks of 4, 4, 4, 1 per pass; never [N, L, V]
    assert max(rows_seen) == 4 and sum(rows_seen) == 2 * 13
    # mixed: clean logits + perturbed hidden states (what the trainer has)
    with torch.no_grad():
        mixed = token_signals(head(hp), Hidden(hq, head), ids, mask, chunk_size=3)
    torch.testing.assert_close(mixed.jsd, full.jsd, atol=1e-5, rtol=1e-5)


def test_identical_passes_give_exact_zero_vision_signals(batch):
    lp, _, ids, mask = batch
    s = token_signals(lp, lp.clone(), ids, mask)
    assert bool((s.jsd == 0).all()) and bool((s.entropy_shift == 0).all())
    assert torch.equal(s.logq, s.logp)


def test_without_perturbed_pass_only_entropy_and_logp(batch):
    lp, _, ids, mask = batch
    s = token_signals(lp, None, ids, mask, chunk_size=2)
    assert s.jsd is None and s.entropy_shift is None and s.logq is None
    torch.testing.assert_close(s.entropy, _reference(lp, lp, ids, mask)["entropy"], atol=1e-5, rtol=1e-5)


def test_temperature_divides_logits(batch):
    lp, lq, ids, mask = batch
    a = token_signals(lp, lq, ids, mask, temperature=2.0)
    b = token_signals(lp / 2.0, lq / 2.0, ids, mask)
    torch.testing.assert_close(a.jsd, b.jsd)
    torch.testing.assert_close(a.logp, b.logp)


def test_bad_chunk_size():
    with pytest.raises(UserError):
        token_signals(torch.zeros(1, 1, 2), None, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1),
                      chunk_size=0)


def test_vppo_dependency_hand_worked():
    # d = logq - old:  1 -> e - 1 - 1 = .7182818;  -1 -> e^-1 + 1 - 1 = .3678794;  0 -> 0
    # 30 -> clamped to 20 -> e^20 - 21 = 4.85e8 -> clamped to 10;  masked -> 0
    logq = torch.tensor([[-1.0, -2.0, -3.0, 0.0, -1.0]])
    old = torch.tensor([[-2.0, -1.0, -3.0, -30.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    s = vppo_dependency(logq, old, mask)
    torch.testing.assert_close(s, torch.tensor([[0.7182818, 0.3678794, 0.0, 10.0, 0.0]]), atol=1e-6, rtol=0)


def test_perception_k3_value_and_gradient():
    # logp = -1 (with grad), logq = -2: d = -1, k3 = e^-1 + 1 - 1 = .3678794;
    # d k3 / d logp = 1 - e^d = .6321206 (the masked-image pass carries no gradient)
    logp = torch.tensor([-1.0], requires_grad=True)
    logq = torch.tensor([-2.0], requires_grad=True)
    k3 = perception_k3(logp, logq)
    torch.testing.assert_close(k3.detach(), torch.tensor([0.3678794]), atol=1e-6, rtol=0)
    k3.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.6321206]), atol=1e-6, rtol=0)
    assert logq.grad is None


def test_blocked_vocabulary_entries_match_tiny_probabilities(batch):
    # -inf logits (blocked tokens) must behave like probability 0, not poison the row with NaN
    lp, lq, ids, mask = batch
    blocked_p, blocked_q = lp.clone(), lq.clone()
    blocked_p[0, :, 40:] = -float("inf")
    blocked_q[1, :, 45:] = -float("inf")
    tiny_p, tiny_q = lp.clone(), lq.clone()
    tiny_p[0, :, 40:] = -1e4  # exp underflows to exactly 0
    tiny_q[1, :, 45:] = -1e4
    ids = ids % 40
    a = token_signals(blocked_p, blocked_q, ids, mask, chunk_size=4)
    b = token_signals(tiny_p, tiny_q, ids, mask, chunk_size=4)
    for name in ("entropy", "jsd", "entropy_shift", "logp", "logq"):
        assert not bool(getattr(a, name).isnan().any()), name
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=1e-5, rtol=1e-5, msg=name)


def test_sampled_only_mode_reads_logq_without_distributions(batch):
    lp, lq, ids, mask = batch
    full = token_signals(lp, lq, ids, mask)
    cheap = token_signals(lp, lq, ids, mask, distribution=False)
    assert cheap.jsd is None and cheap.entropy_shift is None
    assert torch.equal(cheap.logq, full.logq) and torch.equal(cheap.entropy, full.entropy)


def test_clean_pass_may_be_skipped_only_for_sampled_only(batch):
    lp, lq, ids, mask = batch
    s = token_signals(None, lq, ids, mask, distribution=False)
    assert s.entropy is None and s.logp is None
    torch.testing.assert_close(s.logq, token_signals(lp, lq, ids, mask).logq)
    with pytest.raises(UserError, match="clean pass"):
        token_signals(None, lq, ids, mask)
