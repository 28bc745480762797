"""Float32 matrix products on the CPU through oneDNN instead of ATen's default BLAS call, where that is faster.

Why: ATen's float32 ``linear`` / ``matmul`` call MKL's sgemm, and on the machines we measure on (2-core AMD EPYC
with AVX-512, torch 2.13's bundled MKL 2024.2) sgemm is slow for the shapes an RL step is made of. Measured
2026-12-04 (``benchmarks/cpu_linear.py``), oneDNN's float32 inner product over ATen's, same inputs, 2 threads:

- decoding (8 rows) through the Qwen2.5-VL-3B head, [8, 2,048] x [151,936, 2,048]^T: 63.9 vs 194.5 ms (0.33);
  ATen's 1-row product reads the same 1.16 GiB weight in 63.6 ms, so sgemm at 8 rows runs at a third of the
  memory bandwidth; the decoder's MLP up-projection at 8 rows 5.5 vs 12.5 ms (0.44), attention projection 0.56;
- the chunked head of the training passes (256 positions): logits 804.8 vs 1,202.3 ms (0.67), dL/dhidden 0.93;
  a 600-token prefill through the MLP 0.83 / 0.91 (docs/performance.md, "CPU products through oneDNN").

Both compute in float32 with float32 accumulation (oneDNN's default "strict" math mode: no implicit bf16 or
tf32), so results agree to float rounding (summation order), not bit for bit. Hence the rules:

- only where ``torch.backends.mkldnn.enabled`` (torch's own switch for oneDNN; the pinned kernels of
  ``mmrlvr.models.kernels`` turn it off, so the stage goldens and warm starts keep their bits) and
  ``MMRLVR_CPU_LINEAR`` is not ``aten`` (the benchmarks' A/B switch);
- only float32 CPU tensors (ATen already takes oneDNN for bf16 / fp16 on CPU), plain tensors or parameters
  (no DTensor or quantised subclass), and weights of at least ``MIN_WEIGHT`` elements: on a toy-sized matrix
  the call's fixed cost (~25 us) exceeds the product;
- never where autograd would have to record the product (``torch.ops.mkldnn._linear_pointwise`` has no
  derivative): under ``torch.no_grad`` (generation, the reference and old-policy passes) and inside our own
  ``autograd.Function`` forward / backward (the fused log-prob head, ``mmrlvr.algos.logits``), which run
  without grad mode. Elsewhere ``torch.nn.functional.linear`` runs, as before.

The op is a private ATen op (inductor's CPU linear); its availability is probed once against ATen's product and
any failure falls back to ATen for the rest of the process, with a warning.
"""

from __future__ import annotations

import contextlib
import os
import types
import warnings
from typing import Iterator

import torch

from mmrlvr.errors import UserError

MIN_WEIGHT = 1 << 18  # elements (1 MiB in float32): below this, ATen's call is cheaper (benchmarks/cpu_linear.py)
ENV = "MMRLVR_CPU_LINEAR"  # "aten" turns the oneDNN path off for this process; "auto" (or unset) is the default
_MODES = ("auto", "aten")

_probe_result: bool | None = None


def _aten_only() -> bool:
    """``MMRLVR_CPU_LINEAR`` is "aten"; any value other than auto / aten is an error naming the variable (a typo
    such as "onednn" or "off" must not silently mean "auto")."""
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise UserError(f"{ENV}={os.environ[ENV]!r}: use one of {', '.join(_MODES)}")
    return mode == "aten"


def _op():
    """oneDNN's float32 linear (x [M, K], weight [O, K], bias [O] or None) -> [M, O]; one place to find it."""
    return torch.ops.mkldnn._linear_pointwise


def _onednn_op_works() -> bool:
    """Whether ``torch.ops.mkldnn._linear_pointwise`` exists here and matches ATen's product (probed once)."""
    global _probe_result
    if _probe_result is None:
        try:
            op = _op()
            g = torch.Generator().manual_seed(0)
            x, w, b = (torch.randn(5, 48, generator=g), torch.randn(40, 48, generator=g),
                       torch.randn(40, generator=g))
            got = op(x, w, b, "none", [], "")
            ok = bool(torch.allclose(got, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5))
            if not ok:
                warnings.warn("oneDNN's float32 linear disagrees with ATen's here; using ATen", stacklevel=3)
            _probe_result = ok
        except Exception as exc:  # an op missing from this torch build, or one that rejects its arguments
            warnings.warn(f"oneDNN's float32 linear is unavailable ({type(exc).__name__}: {exc}); using ATen",
                          stacklevel=3)
            _probe_result = False
    return _probe_result


def _plain(t: torch.Tensor) -> bool:
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided


def onednn_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether ``linear(x, weight, bias)`` takes oneDNN (see the module docstring for each rule)."""
    if _aten_only():
        return False
    if x.device.type != "cpu" or weight.device.type != "cpu":
        return False
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.dim() != 2:
        return False
    if weight.numel() < MIN_WEIGHT or not (_plain(x) and _plain(weight)):
        return False
    if bias is not None and (bias.device.type != "cpu" or bias.dtype != torch.float32 or not _plain(bias)):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return False
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    return _onednn_op_works()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)``: x [..., K], weight [O, K] (any strides), bias [O]."""
    if x.numel() == 0 or not onednn_applies(x, weight, bias):
        return torch.nn.functional.linear(x, weight, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    out = _op()(x2, weight, bias, "none", [], "")
    return out.reshape(*lead, weight.shape[0])


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for a [..., K] and a 2-D b [K, N] (b's transpose is the weight of ``linear``)."""
    if b.dim() != 2:
        return a @ b
    return linear(a, b.t())


def _fast_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias)


@contextlib.contextmanager
def onednn_linears(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, the model's plain ``nn.Linear`` layers compute through ``linear`` above (oneDNN where it
    applies, ATen otherwise: gradient-recording calls fall back by themselves, so the block is safe around
    any pass). Only modules whose type is exactly ``nn.Linear``: subclasses (bitsandbytes' 4-bit layers,
    peft's wrappers) have forwards of their own; peft's frozen ``base_layer`` is a plain ``nn.Linear``.
    Restores every layer's own forward on exit, also on error."""
    if _aten_only() or not torch.backends.mkldnn.is_available():
        yield
        return
    patched = []
    for m in model.modules():
        if type(m) is torch.nn.Linear and "forward" not in m.__dict__ and m.weight.numel() >= MIN_WEIGHT \
                and m.weight.device.type == "cpu":
            m.forward = types.MethodType(_fast_forward, m)
            patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)
