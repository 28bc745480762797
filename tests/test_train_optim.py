"""build_optimizer (fused AdamW, state dtype) and clip_grad_norm_and_check (one pass, non-finite check)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from mmrlvr.errors import UserError
from mmrlvr.train.optim import (AdamWStateDtype, NonFiniteGradient, build_optimizer, clip_grad_norm_and_check,
                                fused_supported)


def _cfg(**kw):
    return SimpleNamespace(**{"lr": 1e-2, "betas": [0.9, 0.999], "weight_decay": 0.1, **kw})


def _params(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=gen).to(dtype)) for shape in [(7, 5), (5,), (3, 2, 4)]]


def _run(opt, params, steps=6, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().float().clone() for p in params]


def test_fused_on_cpu_and_close_to_the_unfused_numerics():
    a, b = _params(), _params()
    fused, plain = build_optimizer(a, _cfg()), build_optimizer(b, _cfg(), fused=False)
    assert fused_supported(a)  # torch 2.13 has the fused AdamW kernel on CPU
    assert fused.defaults["fused"] is True and not plain.defaults["fused"]
    for x, y in zip(_run(fused, a), _run(plain, b)):
        assert_close(x, y, atol=1e-6, rtol=1e-6)


def test_one_hand_worked_adamw_step():
    # step 1: m = (1-b1) g, v = (1-b2) g^2, m_hat = g, v_hat = g^2 -> update = lr * g / (|g| + eps) = lr * sign(g)
    # with decoupled weight decay first: p = p (1 - lr wd) - lr sign(g)
    for opt_fn in (lambda ps: build_optimizer(ps, _cfg()),
                   lambda ps: build_optimizer(ps, _cfg(state_dtype="bfloat16"))):
        p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
        opt = opt_fn([p])
        p.grad = torch.tensor([0.5, -4.0, 0.0])
        opt.step()
        expected = torch.tensor([1.0, -2.0, 3.0]) * (1 - 1e-2 * 0.1) - 1e-2 * torch.tensor([1.0, -1.0, 0.0])
        assert_close(p.detach(), expected, atol=1e-6, rtol=0)


def test_state_dtype_option():
    ref_params, params = _params(), _params()
    ref = torch.optim.AdamW(ref_params, lr=1e-2, weight_decay=0.1, foreach=False)
    ours = build_optimizer(params, _cfg(state_dtype="bfloat16"))
    assert isinstance(ours, AdamWStateDtype)
    got, want = _run(ours, params), _run(ref, ref_params)
    assert all(s["exp_avg"].dtype == torch.bfloat16 and s["exp_avg_sq"].dtype == torch.bfloat16
               for s in ours.state.values())
    for x, y in zip(got, want):
        assert_close(x, y, atol=2e-3, rtol=0)  # bf16 moments: close, not equal
    # float32 moments for bf16 weights; same-dtype state is plain (fused) torch AdamW
    bf = _params(dtype=torch.bfloat16)
    opt = build_optimizer(bf, _cfg(state_dtype="float32"))
    _run(opt, bf, steps=2)
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
    assert isinstance(build_optimizer(_params(), _cfg(state_dtype="float32")), torch.optim.AdamW)
    with pytest.raises(UserError, match="state_dtype"):
        build_optimizer(_params(), _cfg(state_dtype="fp8"))


def test_state_dtype_survives_a_checkpoint_round_trip():
    params = _params()
    opt = build_optimizer(params, _cfg(state_dtype="bfloat16"))
    _run(opt, params, steps=2)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    again = build_optimizer(copies, _cfg(state_dtype="bfloat16"))
    again.load_state_dict(opt.state_dict())
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in again.state.values())
    assert_close(_run(again, copies, steps=1, seed=9), _run(opt, params, steps=1, seed=9))


def test_clip_norm_hand_worked():
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    p.grad, q.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])  # norm 5
    frozen = torch.nn.Parameter(torch.zeros(3))  # no grad: skipped
    assert clip_grad_norm_and_check([p, q, frozen], max_norm=1.0) == pytest.approx(5.0)
    assert_close(p.grad, torch.tensor([0.6, 0.0]), atol=1e-6, rtol=0)
    assert_close(q.grad, torch.tensor([0.8]), atol=1e-6, rtol=0)
    p.grad, q.grad = torch.tensor([0.3, 0.0]), torch.tensor([0.4])  # norm 0.5 < 1: untouched
    assert clip_grad_norm_and_check([p, q], 1.0) == pytest.approx(0.5)
    assert_close(p.grad, torch.tensor([0.3, 0.0]))
    p.grad = torch.tensor([30.0, 40.0])
    assert clip_grad_norm_and_check([p], 0.0) == pytest.approx(50.0)  # max_norm 0: measure only
    assert_close(p.grad, torch.tensor([30.0, 40.0]))
    assert clip_grad_norm_and_check([frozen], 1.0) == 0.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_gradient_raises_before_clipping(bad):
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    p.grad, q.grad = torch.tensor([1.0, bad]), torch.tensor([3.0, 4.0])
    with pytest.raises(NonFiniteGradient):
        clip_grad_norm_and_check([p, q], 1.0)
    assert_close(q.grad, torch.tensor([3.0, 4.0]))  # nothing was scaled


def test_huge_but_finite_gradient_is_clipped_not_rejected():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([3e20, 4e20])  # squares overflow float32; the norm (5e20) does not
    assert clip_grad_norm_and_check([p], 1.0) == pytest.approx(5e20, rel=1e-6)
    assert_close(p.grad, torch.tensor([0.6, 0.8]), atol=1e-5, rtol=0)


def test_same_norm_and_clipping_as_torch():
    a, b = _params(3), _params(3)
    gen = torch.Generator().manual_seed(4)
    for x, y in zip(a, b):
        x.grad = torch.randn(x.shape, generator=gen) * 10
        y.grad = x.grad.clone()
    want = float(torch.nn.utils.clip_grad_norm_(b, 2.0))
    assert clip_grad_norm_and_check(a, 2.0) == pytest.approx(want, rel=1e-6)
    for x, y in zip(a, b):
        assert_close(x.grad, y.grad)
