"""Per-token log-probabilities and entropies from logits, without a second [N, L, V] tensor.

A VLM's vocabulary is large (Qwen: ~152k), so ``logits.log_softmax(-1)`` on [N, L, V] logits doubles the
largest tensor of a training step, and autograd keeps that copy alive until backward. Both functions
here work in chunks of ``chunk_size`` token positions and are exact: the forward saves only the logits
(a reference, no copy) and the backward recomputes the softmax chunk by chunk. Temperature is applied
inside each chunk, so ``logits / T`` is never materialised either. Results are float32 whatever the
logits' dtype (bf16 logits are up-cast one chunk at a time); float64 logits stay float64.

Not here: masking. Positions after the end of a response still get a value; the caller masks them.
"""

from __future__ import annotations

import math

from typing import Callable

import torch

from mmrlvr.algos.cpu_linear import linear, matmul

#: called by the chunked passes with each chunk's index into the leading dims, its logits divided by the temperature
#: (float32, [..., V]; read-only: the pass reuses the buffer afterwards) and their log-sum-exp — so a caller can
#: compute what else it needs from the full distribution (token credit's entropy and JSD: ``SignalsBeside``) while the
#: chunk's logits exist, instead of forming them again. Runs in the forward only, without gradient.
Observer = Callable[[tuple, torch.Tensor, torch.Tensor], None]

def _chunk_index(lead: tuple[int, ...], chunk_size: int) -> list[tuple]:
    """Indices into the leading dims so that each ``x[idx]`` is a view of at most ``chunk_size`` positions.

    Whole rows of dim 0 are grouped while a row fits in a chunk; otherwise we recurse into the row. No
    reshape is needed, so a non-contiguous slice such as ``logits[:, P-1:P-1+L]`` is never copied.
    """
    if not lead:
        return [()]
    per_row = math.prod(lead[1:])
    if per_row <= chunk_size:
        step = max(1, chunk_size // max(per_row, 1))
        return [(slice(i, min(i + step, lead[0])),) for i in range(0, lead[0], step)]
    return [(i, *rest) for i in range(lead[0]) for rest in _chunk_index(lead[1:], chunk_size)]


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """float32 for half/bf16/float32 logits, float64 for float64 ones (gradient checks)."""
    return torch.promote_types(logits.dtype, torch.float32)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    z = logits.to(_compute_dtype(logits))
    return z / temperature if temperature != 1.0 else z


class _TokenLogProb(torch.autograd.Function):
    """log softmax(logits / T)[ids], chunked; backward: (onehot(ids) - softmax) * grad / T."""

    @staticmethod
    def forward(ctx, logits, ids, temperature, chunk_size, observe=None):  # type: ignore[override]
        out = torch.empty(ids.shape, dtype=_compute_dtype(logits), device=logits.device)
        for idx in _chunk_index(tuple(ids.shape), chunk_size):
            z = _scaled(logits[idx], temperature)  # [c, V]
            picked = z.gather(-1, ids[idx].unsqueeze(-1)).squeeze(-1)
            lse = torch.logsumexp(z, dim=-1)
            out[idx] = picked - lse
            if observe is not None:
                observe(idx, z, lse)
        ctx.save_for_backward(logits, ids)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        logits, ids = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for idx in _chunk_index(tuple(ids.shape), ctx.chunk_size):
            go = grad_out[idx].unsqueeze(-1).to(_compute_dtype(logits))  # [c, 1]
            g = torch.softmax(_scaled(logits[idx], ctx.temperature), dim=-1).mul_(-go)
            g.scatter_add_(-1, ids[idx].unsqueeze(-1), go)
            grad[idx] = (g / ctx.temperature).to(grad.dtype)
        return grad, None, None, None, None


class _Entropy(torch.autograd.Function):
    """H(softmax(logits / T)), chunked; backward: dH/dz_j = -p_j (z_j - sum_k p_k z_k), divided by T."""

    @staticmethod
    def _p_and_pz(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = torch.softmax(z, dim=-1)
        # -inf logits (blocked vocabulary entries) have p = 0; 0 * -inf must count as 0, not NaN.
        return p, torch.where(p > 0, p * z, torch.zeros_like(z))

    @staticmethod
    def _pz_sum(z: torch.Tensor) -> torch.Tensor:
        """sum_v p_v z_v per position, the same numbers as ``_p_and_pz(z)[1].sum(-1)`` with one [c, V] float
        buffer instead of four: ``p * z`` is formed in p's own storage and the p = 0 entries are filled
        in place. At a 151,936 vocabulary a 256-position chunk's buffer is 148 MiB (plus two bool masks)."""
        p = torch.softmax(z, dim=-1)
        blocked = ~(p > 0)
        return p.mul_(z).masked_fill_(blocked, 0.0).sum(-1)

    @staticmethod
    def forward(ctx, logits, temperature, chunk_size):  # type: ignore[override]
        lead = tuple(logits.shape[:-1])
        out = torch.empty(lead, dtype=_compute_dtype(logits), device=logits.device)
        for idx in _chunk_index(lead, chunk_size):
            z = _scaled(logits[idx], temperature)
            out[idx] = torch.logsumexp(z, dim=-1) - _Entropy._pz_sum(z)
        ctx.save_for_backward(logits)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        (logits,) = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for idx in _chunk_index(tuple(logits.shape[:-1]), ctx.chunk_size):
            z = _scaled(logits[idx], ctx.temperature)
            p, pz = _Entropy._p_and_pz(z)
            mean_z = pz.sum(-1, keepdim=True)
            g = torch.where(p > 0, p * (z - mean_z), torch.zeros_like(z))
            grad[idx] = (g * (-grad_out[idx].unsqueeze(-1).to(g.dtype) / ctx.temperature)).to(grad.dtype)
        return grad, None, None


def _check(chunk_size: int, temperature: float) -> None:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def logprobs_from_logits(logits: torch.Tensor, ids: torch.Tensor, *, temperature: float = 1.0,
                         chunk_size: int = 512, observe: Observer | None = None) -> torch.Tensor:
    """log softmax(logits / temperature) at the given token ids, exact and chunked over positions.

    logits: [N, L, V] (any leading dims; may be a non-contiguous slice); ids: [N, L] long, each in
    [0, V) (pad ids are fine, mask their results afterwards). Returns [N, L] float32 (float64 for
    float64 logits), differentiable w.r.t. logits. ``temperature`` must match the one used for
    sampling so that log-ratios against the sampler's log-probs are meaningful; passing it here
    instead of dividing the logits first avoids an [N, L, V] copy. Peak extra memory: a few
    [chunk_size, V] float32 buffers (measured on CPU, V = 151,936, 512 positions: +155 MiB in the
    forward at chunk_size 256 against +297 MiB for log_softmax). ``observe``: see ``Observer``.
    """
    _check(chunk_size, temperature)
    if logits.shape[:-1] != ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match ids {tuple(ids.shape)} "
                         "(want [..., V] and [...])")
    return _TokenLogProb.apply(logits, ids.long(), float(temperature), int(chunk_size), observe)


def entropy_from_logits(logits: torch.Tensor, *, temperature: float = 1.0,
                        chunk_size: int = 512) -> torch.Tensor:
    """Entropy H = logsumexp(z) - sum_v p_v z_v of softmax(z), z = logits / temperature, in nats.

    logits: [..., V] -> [...] float32 (float64 for float64 logits); exact, differentiable (for entropy
    bonuses), chunked over positions like ``logprobs_from_logits``. Used for entropy metrics and
    entropy-based token credit.
    """
    _check(chunk_size, temperature)
    return _Entropy.apply(logits, float(temperature), int(chunk_size))


def head_logits(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The LM head on one chunk; outside autocast the hidden states are cast to the head's dtype (as
    an ``nn.Linear`` of that dtype would require), inside it autocast picks the dtype like the model's."""
    if h.dtype != weight.dtype and not torch.is_autocast_enabled(h.device.type):
        h = h.to(weight.dtype)
    return linear(h, weight)


W_GRAD_ROWS = 8192  # vocabulary rows per block of the LM head's gradient product (see the backward)

_DIRECT_GRAD = "_mmrlvr_write_grad_directly"  # attribute marking a weight for ``write_grad_directly``


def write_grad_directly(weight: torch.Tensor) -> None:
    """Have ``logprobs_from_hidden``'s backward add its [V, H] gradient for this leaf into ``weight.grad`` in place
    instead of returning it to autograd.

    Why: a tied head's weight is also the input embedding, whose lookup gives a second gradient for the same leaf
    (sparse, ``mmrlvr.models.tied_embedding``). Autograd sums the two gradients of one leaf in the leaf's input
    buffer before accumulating, and a dense gradient returned from a Python ``autograd.Function`` is not summed
    in place there: the sum is a new [V, H] tensor (1.16 GiB at 3B) at the end of every backward (measured: the
    backward's peak with a sparse tied lookup equals the dense one's, 481 vs 480 MiB at V 60,000, H 1,024, where
    ``nn.Linear``'s own gradient drops it to 411). Written into ``.grad`` directly, the lookup's sparse gradient is
    then added to it in place by ``AccumulateGrad``. Same sum in one backward (dense + sparse, one addition per
    element); over several micro-batches the additions associate differently. Only for ``loss.backward()`` in one
    process: DDP / FSDP2 reduce gradients from autograd's accumulation hooks, which this bypasses, and
    ``torch.autograd.grad`` would not see the head's share (it lands in ``.grad``)."""
    if not weight.is_leaf or not weight.requires_grad:
        raise ValueError("write_grad_directly: the weight must be a leaf that requires grad")
    setattr(weight, _DIRECT_GRAD, True)


def _row_blocks(rows: int, block: int | None = None) -> list[tuple[int, int]]:
    """[start, stop) blocks of ``block`` rows covering ``rows``; a last block under 64 rows joins the one
    before (a matmul of very few rows may take another kernel and round differently)."""
    block = block or W_GRAD_ROWS
    starts = list(range(0, rows, block))
    if len(starts) > 1 and rows - starts[-1] < 64:
        starts.pop()
    return [(a, b) for a, b in zip(starts, starts[1:] + [rows])]


def _softmax_(z: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(z, -1)`` written over ``z`` on the CPU (the same numbers, bit for bit: tested), so the fused
    head's backward holds one [chunk, V] buffer where it held two (148 MiB at 256 positions and a 151,936
    vocabulary). ATen's CPU softmax reads each row before it writes it, which is what makes ``out=z`` safe; other
    devices take the out-of-place op."""
    if z.device.type == "cpu" and z.is_contiguous() and not z.requires_grad:
        return torch._softmax(z, -1, False, out=z)
    return torch.softmax(z, dim=-1)


CHUNK_BUFFER_BYTES = 96 << 20  # the most one float32 [chunk, V] buffer of the fused head may take


def fit_chunk(chunk_size: int, vocab: int) -> int:
    """``chunk_size`` positions, or fewer (a power of two, at least 16) when a float32 [chunk, V] buffer would
    exceed ``CHUNK_BUFFER_BYTES``. Why: the fused head's forward and backward each hold two or three such
    buffers at once, so at a 151,936-token vocabulary 256 positions are ~450 MiB of transient on top of the
    step's gradients (measured 490 -> 260 MiB in the backward at 128 positions, 3B stand-in widths); below
    ~100 positions the products lose speed. A small vocabulary keeps ``chunk_size`` (the toy: 256)."""
    fit = CHUNK_BUFFER_BYTES // (4 * max(1, vocab))
    if fit >= chunk_size:
        return chunk_size
    return max(16, 1 << max(0, fit.bit_length() - 1))


class _LinearTokenLogProb(torch.autograd.Function):
    """log softmax((hidden @ W^T) / T)[ids] chunked over positions; logits exist one chunk at a time.

    The fused linear + log-softmax + gather of Liger-Kernel's ``LigerFusedLinearCrossEntropy`` (Hsu et
    al. 2024, arXiv:2410.10989), in pure torch: the forward saves only ``hidden`` and ``weight`` (no
    [N, L, V] tensor), the backward recomputes each chunk's logits and turns dL/dlogits =
    (onehot(ids) - softmax) * grad / T into dL/dhidden (chunk @ W) and dL/dW (accumulated chunk^T @ h).
    The entropy (optional second output, no gradient) comes from the same chunk's logits.

    A frozen head (LoRA, or any run that does not train the LM head) needs no dL/dW, and then dL/dhidden
    factors through the upstream gradient: d log p(y) / d h = (W[y] - softmax(z) @ W) / T, the chosen
    token's row minus the softmax-expected row. The forward computes that [c, H] direction while the
    chunk's softmax is at hand (one extra [c, V] x [V, H] product) and saves it in place of ``hidden``;
    the backward is then one multiply by the upstream gradient, without recomputing the logits: two
    head-sized products in all instead of three (a TRL-style path that keeps the logits also needs two).
    """

    @staticmethod
    def forward(ctx, hidden, weight, ids, temperature, chunk_size, with_entropy, observe=None):  # type: ignore[override]
        chunk_size = fit_chunk(chunk_size, weight.shape[0])
        cdtype = torch.promote_types(hidden.dtype, torch.float32)
        out = torch.empty(ids.shape, dtype=cdtype, device=hidden.device)
        ent = torch.empty(ids.shape, dtype=cdtype, device=hidden.device) if with_entropy else None
        # frozen head, hidden needs grad: dL/dhidden = grad * direction, direction computed here (see above)
        direction = (torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
                     if ctx.needs_input_grad[0] and not ctx.needs_input_grad[1] else None)
        for idx in _chunk_index(tuple(ids.shape), chunk_size):
            z = _scaled(head_logits(hidden[idx], weight), temperature)  # [c, V]
            lse = torch.logsumexp(z, dim=-1)
            out[idx] = z.gather(-1, ids[idx].unsqueeze(-1)).squeeze(-1) - lse
            if observe is not None:
                observe(idx, z, lse)
            if ent is not None:
                ent[idx] = lse - _Entropy._pz_sum(z)
            if direction is not None:
                expected = matmul(torch.exp(z.sub_(lse.unsqueeze(-1))).to(weight.dtype), weight)  # softmax @ W: [c, H]
                d = weight[ids[idx]].to(cdtype) - expected.to(cdtype)
                direction[idx] = (d / temperature if temperature != 1.0 else d).to(direction.dtype)
            del z
        if direction is not None:
            ctx.save_for_backward(direction)
        else:
            ctx.save_for_backward(hidden, weight, ids)
        ctx.frozen_head = direction is not None
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.direct = weight if getattr(weight, _DIRECT_GRAD, False) else None  # write_grad_directly
        if ent is None:
            return out, torch.empty(0, dtype=cdtype, device=hidden.device)
        ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, grad_out, _grad_ent):  # type: ignore[override]
        if ctx.frozen_head:
            (direction,) = ctx.saved_tensors
            grad_h = grad_out.unsqueeze(-1) * direction  # promoted to the wider dtype, then back to hidden's
            return grad_h.to(direction.dtype), None, None, None, None, None, None
        hidden, weight, ids = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        # dL/dW accumulates over chunks: keep it in float32 (or float64) even for half weights
        grad_w = torch.zeros(weight.shape, dtype=_compute_dtype(weight), device=weight.device) if need_w else None
        for idx in _chunk_index(tuple(ids.shape), ctx.chunk_size):
            h = hidden[idx].to(weight.dtype)  # autocast may have left hidden in another dtype
            z = _scaled(linear(h, weight), ctx.temperature)
            go = grad_out[idx].unsqueeze(-1).to(z.dtype)
            g = _softmax_(z).mul_(-go)
            g.scatter_add_(-1, ids[idx].unsqueeze(-1), go)
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            g = g.to(weight.dtype)  # dL/dlogits of this chunk, in the head's dtype (as autograd would)
            del z
            if grad_h is not None:
                grad_h[idx] = matmul(g, weight).to(grad_h.dtype)
            if grad_w is not None:
                # dW += g^T h a block of W_GRAD_ROWS vocabulary rows at a time: the product's temporary is
                # [rows, H] (64 MiB at H = 2,048), not [V, H] (1.16 GiB at 3B). Row blocks of a matmul
                # are the rows of the whole product, bit for bit (tested; a one-row block would take the
                # matrix-vector path, so a short last block joins the one before), so results do not
                # change; ``addmm_`` would also avoid the temporary but rounds differently.
                g2, h2 = g.reshape(-1, g.shape[-1]).t(), h.reshape(-1, h.shape[-1])
                for v0, v1 in _row_blocks(g2.shape[0]):
                    grad_w[v0:v1] += matmul(g2[v0:v1], h2).to(grad_w.dtype)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
            if ctx.direct is not None:  # write_grad_directly: into .grad in place, nothing returned to autograd
                leaf = ctx.direct
                if leaf.grad is None:
                    leaf.grad = grad_w
                else:
                    leaf.grad.add_(grad_w)
                grad_w = None
        return grad_h, grad_w, None, None, None, None, None


def logprobs_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, *,
                         temperature: float = 1.0, chunk_size: int = 256, with_entropy: bool = False,
                         observe: Observer | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ weight^T / T)[ids] (and the entropy) without materialising the logits.

    hidden: [N, L, H] (any leading dims, the LM head's *input*: the final normed hidden states; may be a
    non-contiguous slice); weight: [V, H] the LM head (a bias-free linear layer; models with logit
    soft-capping or scaling need the logits path); ids: [N, L]. Returns (log-probs [N, L] float32, or
    float64 for float64 inputs, differentiable w.r.t. hidden and weight; entropy [N, L] without gradient
    when ``with_entropy``, else None). Equal to ``logprobs_from_logits(lm_head(hidden), ids)`` up to
    float rounding, but the largest buffers are a few [chunk_size, V] ones in the forward and in the
    backward, against [N, L, V] logits kept alive from the forward until the backward. ``observe``: see
    ``Observer`` (its chunks are ``fit_chunk``'s, at most ``chunk_size`` positions).
    """
    _check(chunk_size, temperature)
    if hidden.shape[:-1] != ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} does not match ids {tuple(ids.shape)} "
                         "(want [..., H] and [...])")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight {tuple(weight.shape)} is not [V, {hidden.shape[-1]}]")
    logp, ent = _LinearTokenLogProb.apply(hidden, weight, ids.long(), float(temperature), int(chunk_size),
                                          bool(with_entropy), observe)
    return logp, (ent if with_entropy else None)
