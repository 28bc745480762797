"""Dense supervision from a teacher on the student's own states: forward cross-entropy and the rollout horizon.

Rich-feedback DAgger, forward cross-entropy (arXiv 2606.05152; no official code is public). On the states the
student visits — its own sampled response, teacher-forced through an expert — the student matches the expert's
next-token distribution:

    L_t = − Σ_{a ∈ top-k(π_E(· | s_t))} π_E(a | s_t) · log π_θ(a | s_t)

summed over the expert's top k tokens (k = 20 [ours: the paper's k is not published]); the expert's probabilities
are *not* renormalised over the top k (the truncated sum of the formula, whose dropped mass is what the top k
leaves out) [ours]. The expert is the same model with privileged context in its prompt (the ground truth, a
verifier's trace) or another model with the same tokenizer (``mmrlvr.train.aux_losses``). Both distributions are
at the sampling temperature, as every policy log-prob in the trainer [ours].

On-policy distillation horizon (arXiv 2605.31490; no official code is public): the same signal on a prefix of
each rollout only — a fixed share of its response tokens, or a share that grows over training — so early training
does not pay for (and does not learn from) the teacher's late-position feedback on states far from its own
context, and the teacher scores fewer tokens. ``horizon_share`` gives the share at a step, ``horizon_mask`` the
tokens it keeps.

Pure functions over tensors; no model, no config.
"""

from __future__ import annotations

import torch


def expert_top_k(logits: torch.Tensor, k: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The expert's top-k next tokens and their probabilities under softmax(logits / T).

    logits [n, L, V] -> (ids [n, L, k] long, probs [n, L, k] float32), probabilities of the full distribution."""
    k = min(int(k), logits.shape[-1])
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    top, ids = logp.topk(k, dim=-1)
    return ids, top.exp()


def logprobs_of_ids(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) at the given vocabulary ids, with gradient: logits [n, L, V], ids [n, L, k]
    -> [n, L, k]. Gathers before normalising, so no second [n, L, V] tensor is kept for the forward."""
    z = logits.float() / temperature
    return z.gather(-1, ids) - torch.logsumexp(z, dim=-1, keepdim=True)


def forward_ce(student_logp: torch.Tensor, expert_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token forward cross-entropy −Σ_a π_E(a)·log π_θ(a) over the expert's top k.

    student_logp [n, L, k] (log π_θ at the expert's top-k ids), expert_probs [n, L, k], mask [n, L] (tokens inside
    the horizon) -> [n, L], 0 outside the mask. A position whose expert probabilities are all 0 contributes 0."""
    ce = -(expert_probs * student_logp).sum(dim=-1)
    return torch.where(mask > 0, ce, torch.zeros_like(ce))


def horizon_share(horizon: str | float, step: int, max_steps: int, start: float = 0.25) -> float:
    """The share of each response the teacher scores at ``step`` (0-based) of ``max_steps``.

    ``"full"`` -> 1; a number in (0, 1] -> that share; ``"progressive"`` -> grows linearly from ``start`` at the
    first step to 1 at the last (``start + (1 − start)·step/(max_steps − 1)``) [ours: the paper's schedule shape
    is a growing horizon; linear in steps is our reading]."""
    if horizon == "full":
        return 1.0
    if horizon == "progressive":
        if max_steps <= 1:
            return 1.0
        return min(1.0, start + (1.0 - start) * step / (max_steps - 1))
    share = float(horizon)
    if not 0.0 < share <= 1.0:
        raise ValueError(f"horizon share must be in (0, 1], got {horizon!r}")
    return share


def horizon_mask(response_mask: torch.Tensor, share: float) -> torch.Tensor:
    """The first ceil(share · length) response tokens of each row: response_mask [n, L] -> [n, L] (same dtype).

    A row's length is its count of response tokens (positions with a mask > 0) and the cut counts those tokens,
    not positions: a multi-turn row whose model turns are separated by masked tool turns keeps the first
    ``share`` of its *model* tokens, wherever they sit. A share of 1 keeps the whole mask."""
    if share >= 1.0:
        return response_mask.clone()
    counted = response_mask > 0
    keep = torch.ceil(counted.sum(dim=-1) * share - 1e-9).clamp(min=0)  # [n] tokens kept per row
    rank = counted.long().cumsum(dim=-1)  # [n, L] the 1-based index of each response token in its row
    return response_mask * (counted & (rank <= keep[:, None])).to(response_mask.dtype)


def horizon_columns(mask: torch.Tensor) -> int:
    """How many leading response columns hold a kept token (what the teacher's forward must cover)."""
    cols = (mask > 0).any(dim=0).nonzero()
    return int(cols.max()) + 1 if cols.numel() else 0


__all__ = ["expert_top_k", "logprobs_of_ids", "forward_ce", "horizon_share", "horizon_mask", "horizon_columns"]
