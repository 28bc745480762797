"""Token credit whose clean side is read from the policy update's own forward pass.

Why: schemes that rank tokens by the clean distribution (VEPO's JSD and entropy, entropy top-k, RSI)
need P_t(·|I) of the current policy over the full vocabulary. Before the first optimizer step of a
training step the policy *is* π_old, and the update's first pass computes exactly these logits (with
gradient) anyway. Running a separate no-grad clean forward in the rollout stage would repeat that pass;
deferring the scheme to the update's first pass removes it, leaving one extra no-grad forward (the
perturbed image) for VEPO and none for entropy top-k / RSI. The signals are computed chunk by chunk inside
that pass (``beside``: ``mmrlvr.credit.signals.SignalsBeside``), on the fused head and with prefix sharing like
plain GRPO's pass, so the [n, L, V] logits never exist.

Valid only for schemes that decide each response on its own (``CreditScheme.row_local``) — micro-batches
see a slice of the rows — and that add no loss term of their own (PAPO). The selection per row is the one a
whole-batch call would make, so metrics and records are computed once from the assembled signals at the end
of the first pass (``finish``).

Because the token weights of a micro-batch are only known once its forward has run, the loss normaliser of
the whole batch (e.g. the selected-token count for token-mean) is not known before the first backward: the
trainer backpropagates unnormalised sums and divides the gradients by the global normaliser afterwards,
which gives the same gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mmrlvr.credit.signals import Hidden, SignalsBeside, TokenSignals, token_signals
from mmrlvr.lazy_import import lazy_module

torch = lazy_module("torch")  # stage selection reads can_defer without torch

_PARTS = ("entropy", "jsd", "entropy_shift", "logp", "logq")


def can_defer(scheme: Any) -> bool:
    """True when ``scheme`` reads the clean distribution and decides each row alone (VEPO, entropy top-k,
    RSI; not VPPO, whose advantage scale is min-max normalised over the batch, nor PAPO, which reads only
    the perturbed pass and adds a loss term)."""
    distribution = scheme.needs_distribution or not scheme.needs_perturbed
    return bool(distribution and getattr(scheme, "row_local", False))


@dataclass
class DeferredCredit:
    """State of one step's deferred credit: the perturbed pass (if any) and the signals assembled so far.

    perturbed:      response-aligned hidden states of the perturbed-image pass + lm_head, or None
    base_weights:   [N, L] the loss weights before credit (response mask, truncation / DAPO filters)
    base_advantages:[N] or [N, L] before any credit scaling
    """

    scheme: Any
    perturbed: Hidden | None
    base_weights: torch.Tensor
    base_advantages: torch.Tensor
    chunk_size: int
    temperature: float
    done: bool = False
    parts: dict[str, torch.Tensor] = field(default_factory=dict)

    def _perturbed(self, rows: slice) -> Hidden | None:
        """The perturbed pass's hidden states of rows ``rows`` (None without a perturbed pass)."""
        if self.perturbed is None:
            return None
        return Hidden(states=self.perturbed.states[rows], head=self.perturbed.head)

    def beside(self, rows: slice, response_ids: torch.Tensor, mask: torch.Tensor) -> SignalsBeside:
        """The observer that computes rows ``rows``' signals inside the update's log-prob pass (``token_logprobs(...,
        observe=)``): the clean side from that pass's own chunks of logits, the perturbed side from this step's
        perturbed hidden states at the same positions. Hand it to ``apply_signals`` once the pass has run."""
        return SignalsBeside(self._perturbed(rows), response_ids, mask, temperature=self.temperature)

    def apply(self, rows: slice, logits: torch.Tensor, response_ids: torch.Tensor, mask: torch.Tensor,
              old_logprobs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Credit for rows ``rows`` from their clean logits [n, L, V] (detached here): ``apply_signals`` of
        ``token_signals`` over them. The update runs ``beside`` instead (no [n, L, V] tensor)."""
        sig = token_signals(logits.detach(), self._perturbed(rows), response_ids, mask, chunk_size=self.chunk_size,
                            temperature=self.temperature)
        return self.apply_signals(rows, sig, old_logprobs)

    def apply_signals(self, rows: slice, sig: TokenSignals, old_logprobs: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Credit for rows ``rows`` from their signals. Returns (token_weights [n, L], advantages [n] or [n, L],
        entropy [n, L]) for these rows."""
        base_w = self.base_weights[rows]
        adv = self.base_advantages[rows]
        credit = self.scheme(sig, base_w, adv, old_logprobs=old_logprobs)
        scale = credit.adv_scale if adv.dim() == 1 else credit.adv_scale[:, None]
        for name in _PARTS:
            value = getattr(sig, name)
            if value is not None:
                if name not in self.parts:
                    self.parts[name] = torch.zeros_like(self.base_weights, dtype=torch.float32)
                self.parts[name][rows] = value
        return base_w * credit.token_weights, adv * scale, sig.entropy

    def finish(self, old_logprobs: torch.Tensor | None) -> tuple[TokenSignals, dict[str, float]]:
        """All rows done: the batch's signals and the scheme's metrics, as a whole-batch call gives them."""
        self.done = True
        sig = TokenSignals(entropy=self.parts.get("entropy"), jsd=self.parts.get("jsd"),
                           entropy_shift=self.parts.get("entropy_shift"), logp=self.parts.get("logp"),
                           logq=self.parts.get("logq"), old_logp=old_logprobs)
        credit = self.scheme(sig, self.base_weights, self.base_advantages, old_logprobs=old_logprobs)
        return sig, dict(credit.stats)
