"""Chunked log-probs and entropies: exact against log_softmax, gradients, memory, -inf logits."""

import math

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.algos import agg_loss, call_policy_loss, entropy_from_logits, logprobs_from_logits


def _reference(logits, ids, temperature=1.0):
    logp_all = torch.log_softmax(logits.double() / temperature, dim=-1)
    logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def test_hand_worked_uniform_and_two_way():
    # 4 equal logits: log p = -log 4 = -1.38629, H = log 4
    # logits (log 3, 0): p = (0.75, 0.25); log p(token 1) = log 0.25; H = -(.75 ln .75 + .25 ln .25) = 0.56233
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(3), 0.0, -math.inf, -math.inf]]])
    ids = torch.tensor([[2, 1]])
    assert_close(logprobs_from_logits(logits, ids), torch.tensor([[-math.log(4), math.log(0.25)]]))
    h2 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert_close(entropy_from_logits(logits), torch.tensor([[math.log(4), h2]]))


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 7, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exact_for_any_chunking_of_a_non_contiguous_slice(chunk_size, temperature):
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(3, 9, 11, generator=gen) * 3  # [N, P+L, V]
    logits = full[:, 2:7]  # the trainer's logits[:, P-1:P-1+L] slice: not contiguous
    assert not logits.is_contiguous()
    ids = torch.randint(0, 11, (3, 5), generator=gen)
    ref_logp, ref_h = _reference(logits, ids, temperature)
    got_logp = logprobs_from_logits(logits, ids, temperature=temperature, chunk_size=chunk_size)
    got_h = entropy_from_logits(logits, temperature=temperature, chunk_size=chunk_size)
    assert got_logp.dtype == torch.float32
    assert_close(got_logp.double(), ref_logp, atol=1e-5, rtol=1e-5)
    assert_close(got_h.double(), ref_h, atol=1e-5, rtol=1e-5)


def test_gradcheck_float64():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.randint(0, 5, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(lambda x: logprobs_from_logits(x, ids, temperature=0.8, chunk_size=2), logits)
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, temperature=0.8, chunk_size=4), logits)


def test_bf16_logits_match_float32_reference():
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 4, 50, generator=gen) * 2).bfloat16().requires_grad_(True)
    ids = torch.randint(0, 50, (2, 4), generator=gen)
    ref_logp, ref_h = _reference(logits.detach().float(), ids)
    logp = logprobs_from_logits(logits, ids, chunk_size=3)
    assert logp.dtype == torch.float32
    assert_close(logp.double(), ref_logp, atol=1e-5, rtol=1e-5)  # up-cast per chunk, no bf16 arithmetic
    assert_close(entropy_from_logits(logits).double(), ref_h, atol=1e-5, rtol=1e-5)
    (grad,) = torch.autograd.grad(logp.sum(), logits)
    assert grad.dtype == torch.bfloat16


def test_forward_saves_no_vocabulary_sized_copy():
    # Everything autograd keeps for backward must be the logits themselves (same storage) or small.
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(2, 6, 40, generator=gen, requires_grad=True)
    logits = base * 1.0  # a non-leaf, like a model output
    ids = torch.randint(0, 40, (2, 6), generator=gen)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp = logprobs_from_logits(logits, ids, temperature=0.9, chunk_size=4)
        ent = entropy_from_logits(logits, temperature=0.9, chunk_size=4)
    vocab_sized = [t for t in saved if t.numel() >= logits.numel()]
    assert vocab_sized and all(t.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
                               for t in vocab_sized)
    (grad,) = torch.autograd.grad(logp.sum() + ent.sum(), base)
    base2 = base.detach().clone().requires_grad_(True)
    logp_all = torch.log_softmax(base2 / 0.9, -1)
    (grad_ref,) = torch.autograd.grad(logp_all.gather(-1, ids[..., None]).sum()
                                      - (logp_all.exp() * logp_all).sum(), base2)
    assert_close(grad, grad_ref, atol=1e-5, rtol=1e-5)


def test_blocked_token_end_to_end_gives_finite_gradients():
    # STACK.md: after end-of-sequence, sampling is blocked, so the pad id has logit -inf at those
    # positions and log-prob -inf. Through logprobs_from_logits -> loss -> agg_loss the gradient into the
    # logits must stay finite (and zero at masked positions).
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 4, 6, generator=gen)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    pad = 5
    ids = torch.randint(0, 5, (2, 4), generator=gen).masked_fill(mask == 0, pad)
    logits[..., pad] = torch.where(mask == 0, torch.tensor(-math.inf), logits[..., pad])
    logits.requires_grad_(True)
    logp = logprobs_from_logits(logits, ids)
    assert torch.isinf(logp[mask == 0]).all()
    old = logp.detach() - 0.05
    for name in ("ppo_clip", "gspo", "cispo", "nsr"):
        loss, _ = call_policy_loss(name, logp, old, torch.tensor([1.0, -1.0]), mask)
        (grad,) = torch.autograd.grad(agg_loss(loss, mask, "token-mean"), logits, retain_graph=True)
        assert torch.isfinite(grad).all(), name
        assert grad[mask == 0].eq(0).all(), name


def test_bad_arguments():
    logits, ids = torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs_from_logits(logits, ids, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(logits, temperature=0.0)
    with pytest.raises(ValueError, match="do not match"):
        logprobs_from_logits(logits, ids[:, :2])


def test_entropy_term_in_one_buffer_is_bit_identical_to_the_four_buffer_form():
    """``_Entropy._pz_sum`` (p * z formed in p's storage, p = 0 entries filled in place) gives the very bits
    of sum(where(p > 0, p * z, 0)), blocked (-inf) vocabulary entries and underflowing ones included."""
    from mmrlvr.algos.logits import _Entropy

    g = torch.Generator().manual_seed(3)
    z = torch.randn(37, 1031, generator=g) * 30  # wide logits: many p underflow to exactly 0
    z[:, :5] = float("-inf")
    z[3] = 0.0
    p = torch.softmax(z, dim=-1)
    assert bool((p == 0).any())
    want = torch.where(p > 0, p * z, torch.zeros_like(z)).sum(-1)
    got = _Entropy._pz_sum(z)
    assert torch.equal(got, want)
    assert torch.isfinite(got).all()
