"""oneDNN float32 products on the CPU (mmrlvr.algos.cpu_linear): where they apply, that they agree with ATen's to
float rounding, that they never stand where autograd must record, and that the model context restores layers."""

from __future__ import annotations

import pytest
import torch

from mmrlvr.algos import cpu_linear
from mmrlvr.algos.cpu_linear import MIN_WEIGHT, linear, matmul, onednn_applies, onednn_linears

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture
def calls(monkeypatch):
    """Counts oneDNN calls (the premise of each 'it took oneDNN' assertion)."""
    seen = []
    real = cpu_linear._op()
    assert cpu_linear._onednn_op_works()  # probed now, so the probe's own call is not counted

    def counting(*args):
        seen.append(tuple(args[0].shape))
        return real(*args)

    monkeypatch.setattr(cpu_linear, "_op", lambda: counting)
    monkeypatch.delenv(cpu_linear.ENV, raising=False)
    return seen


def _w(out_features=1024, in_features=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=g) / in_features ** 0.5


def _close_to_float64(got, x, w, b=None):
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    err, scale = (got.double() - want).abs().max().item(), max(1.0, want.abs().max().item())
    # float32 rounding of a 512-term dot product in any summation order (~1e-6..1e-5 here); a reduced-precision
    # kernel (bf16: ~4e-3 relative) or a wrong product would be far outside
    assert err <= 5e-5 * scale, (err, scale)


@pytest.mark.parametrize("lead", [(8,), (1,), (3, 5), (2, 3, 4)])
def test_linear_takes_onednn_and_matches(calls, lead):
    gen = torch.Generator().manual_seed(len(lead))
    w, b = _w(), torch.randn(1024, generator=gen)
    x = torch.randn(*lead, 512, generator=gen)
    for bias in (None, b):
        got = linear(x, w, bias)
        assert got.shape == (*lead, 1024)
        _close_to_float64(got, x, w, bias)
    assert len(calls) == 2


def test_strided_inputs_and_matmul(calls):
    w = _w()
    x = torch.randn(512, 6).t()  # non-contiguous input
    _close_to_float64(linear(x, w), x.contiguous(), w)
    a = torch.randn(7, 1024)
    got = matmul(a, w)  # [7, 1024] @ [1024, 512]: the weight is w^T, a strided view
    want = a.double() @ w.double()
    assert (got.double() - want).abs().max().item() < 1e-4
    assert len(calls) == 2


def test_rules_that_keep_aten(calls, monkeypatch):
    w, x = _w(), torch.randn(4, 512)
    assert onednn_applies(x, w)
    small = torch.randn(16, 16)
    assert MIN_WEIGHT > small.numel() and not onednn_applies(torch.randn(2, 16), small)
    assert not onednn_applies(x.double(), w.double())
    assert not onednn_applies(x.bfloat16(), w.bfloat16())
    assert not onednn_applies(x, w, torch.zeros(1024, dtype=torch.float64))
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)  # the pinned kernels' switch
    assert not onednn_applies(x, w)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    monkeypatch.setenv(cpu_linear.ENV, "aten")
    assert not onednn_applies(x, w)
    torch.testing.assert_close(linear(x, w), torch.nn.functional.linear(x, w), rtol=0, atol=0)
    assert calls == []


def test_gradient_recording_calls_stay_on_aten(calls):
    w = _w().requires_grad_()
    x = torch.randn(3, 512, requires_grad=True)
    y = linear(x, w)
    assert y.grad_fn is not None and calls == []
    y.square().sum().backward()
    ref_w, ref_x = w.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    torch.nn.functional.linear(ref_x, ref_w).square().sum().backward()
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=0, atol=0)
    with torch.no_grad():
        linear(x, w)
    assert len(calls) == 1  # the same tensors under no_grad do take oneDNN


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(512, 1024)
        self.down = torch.nn.Linear(1024, 512, bias=False)
        self.tiny = torch.nn.Linear(512, 8)  # under MIN_WEIGHT: left alone

    def forward(self, x):
        return self.tiny(self.down(torch.relu(self.up(x))))


class _Subclass(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 0  # a subclass's own forward must survive


def test_model_context_patches_plain_linears_and_restores(calls):
    torch.manual_seed(0)
    net = _Net()
    net.sub = _Subclass(512, 1024)
    x = torch.randn(5, 512)
    with torch.no_grad():
        want = net(x)
        with onednn_linears(net):
            assert "forward" in net.up.__dict__ and "forward" in net.down.__dict__
            assert "forward" not in net.tiny.__dict__ and "forward" not in net.sub.__dict__
            got = net(x)
            assert not net.sub(x).any()
    assert len(calls) == 2
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert all("forward" not in m.__dict__ for m in net.modules())
    with pytest.raises(RuntimeError, match="boom"):
        with onednn_linears(net):
            raise RuntimeError("boom")
    assert all("forward" not in m.__dict__ for m in net.modules())


def test_model_context_under_grad_trains_as_before(calls):
    torch.manual_seed(0)
    net = _Net()
    x = torch.randn(5, 512)
    with onednn_linears(net):
        net(x).sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net(x).sum().backward()
    for a, b in zip(grads, [p.grad for p in net.parameters()]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert calls == []


def test_peft_base_layer_is_patched_lora_layers_are_not(calls):
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = peft.get_peft_model(_Net(), peft.LoraConfig(r=4, target_modules=["up", "down"]))
    x = torch.randn(2, 512)
    with torch.no_grad():
        want = model(x)
        with onednn_linears(model):
            got = model(x)
            base = model.base_model.model.up
            assert "forward" in base.base_layer.__dict__
            assert "forward" not in base.__dict__  # peft's wrapper keeps its own forward (adds the adapter)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2


def test_broken_op_falls_back_with_a_warning(monkeypatch):
    def broken(*args):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(cpu_linear, "_op", lambda: broken)
    monkeypatch.setattr(cpu_linear, "_probe_result", None)
    monkeypatch.delenv(cpu_linear.ENV, raising=False)
    w, x = _w(), torch.randn(4, 512)
    with pytest.warns(UserWarning, match="unavailable"):
        got = linear(x, w)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, w), rtol=0, atol=0)
    assert not onednn_applies(x, w)


@pytest.mark.parametrize("rows", [64, 96, 8192])
def test_vocabulary_row_blocks_stay_bit_identical_on_onednn(calls, rows):
    """The fused head accumulates dL/dW a block of vocabulary rows at a time (``W_GRAD_ROWS``) on the promise that
    row blocks are the rows of the whole product, bit for bit: it must hold on oneDNN's products too."""
    gen = torch.Generator().manual_seed(0)
    g, h = torch.randn(256, 9000, generator=gen).t(), torch.randn(256, 1024, generator=gen)
    whole = matmul(g, h)
    blocks = torch.cat([matmul(g[a:a + rows], h) for a in range(0, 9000, rows)])
    assert calls and torch.equal(blocks, whole)


def test_in_place_softmax_of_the_fused_backward_is_bit_identical():
    from mmrlvr.algos.logits import _softmax_

    for shape in ((7, 540), (3, 151_936), (2, 3, 1000)):
        z = torch.randn(*shape) * 4
        z[..., 0] = float("-inf")  # blocked entries stay at 0
        want = torch.softmax(z, dim=-1)
        ptr = z.data_ptr()
        got = _softmax_(z)
        assert got.data_ptr() == ptr and torch.equal(got, want)


def test_the_fused_head_takes_onednn_in_forward_and_backward_and_matches_aten(calls, monkeypatch):
    """The trainer's head products (mmrlvr.algos.logits) run under autograd.Function, without grad mode: they
    must take oneDNN there, and give the ATen path's values and gradients to float rounding."""
    from mmrlvr.algos.logits import logprobs_from_hidden

    gen = torch.Generator().manual_seed(0)
    hidden0 = torch.randn(2, 40, 128, generator=gen)
    weight0 = torch.randn(4096, 128, generator=gen) * 0.1
    ids = torch.randint(0, 4096, (2, 40), generator=gen)
    scale = torch.linspace(-1, 1, 80).view(2, 40)

    def run():
        h, w = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        logp, ent = logprobs_from_hidden(h, w, ids, chunk_size=32, with_entropy=True)
        (logp * scale).sum().backward()
        return logp.detach(), ent, h.grad, w.grad

    ours = run()
    n_forward_and_backward = len(calls)
    monkeypatch.setenv(cpu_linear.ENV, "aten")
    aten = run()
    assert n_forward_and_backward >= 3 * 3 and len(calls) == n_forward_and_backward  # 3 chunks x (z, z again, dh, dW)
    for a, b in zip(ours, aten):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value", ["onednn", "off", "ATEN2"])
def test_an_unknown_switch_value_is_an_error_naming_the_variable(monkeypatch, value):
    from mmrlvr.errors import UserError

    monkeypatch.setenv(cpu_linear.ENV, value)
    with pytest.raises(UserError, match=rf"MMRLVR_CPU_LINEAR='{value}'.*auto, aten"):
        linear(torch.randn(2, 512), _w())
    monkeypatch.setenv(cpu_linear.ENV, " Aten ")  # case and spaces forgiven
    assert not onednn_applies(torch.randn(2, 512), _w())
