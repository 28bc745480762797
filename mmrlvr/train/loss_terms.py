"""The update's parts: one policy pass per micro-batch, and the loss terms added over it.

``policy_pass`` runs the policy being trained over a micro-batch: the sampled tokens' log-probs (with gradient),
their entropy (without), and, when a distribution term needs them, the logits; deferred credit
(``mmrlvr.train.deferred_credit``) observes the clean distribution inside this pass and rewrites the micro-batch's
token weights and advantages.

Each loss term turns a pass into a per-token loss [n, L] with the normaliser it is averaged by and the sums it
adds to the step's statistics (``TermOutput``). The update stage sums the terms in list order and aggregates them
(``algo.agg``): terms normalised by the policy loss's token weights first, then those normalised by a credit
scheme's normaliser tokens (``batch.norm_weights``, e.g. VPPO's entropy term over every response token), which
join the first group when no scheme sets one. The built-in list, in order: the policy loss (``algo.loss``, with
the rollout-correction weights), the KL penalty (``algo.kl_coef``), distribution terms (distillation over chosen
vocabulary ids) and plain auxiliary terms (a credit scheme's or PAPO's, over the whole batch's log-probs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from mmrlvr.lazy_import import lazy_module

if TYPE_CHECKING:
    from mmrlvr.train.batch import StepBatch

torch = lazy_module("torch")

#: the normalisers a term can be averaged by (module docstring)
WEIGHTS, NORM = "weights", "norm"


@dataclass
class PolicyPass:
    """One micro-batch under the policy being trained (rows ``rows`` of the batch)."""

    rows: slice
    logp: Any  # [n, L] the sampled tokens' log-probs, with gradient
    entropy: Any  # [n, L] the policy's entropy per token, without gradient, or None
    mask: Any  # [n, L] the response mask
    logits: Any = None  # [n, L, V] only when a distribution term reads chosen vocabulary ids; freed after the terms
    tokens: float = 0.0  # response tokens in the micro-batch (the statistics' weight), read once


@dataclass
class TermOutput:
    """A loss term's share of one micro-batch."""

    tokens: Any  # [n, L] per-token loss (0 where masked)
    normaliser: str = WEIGHTS  # WEIGHTS | NORM (module docstring)
    sums: dict[str, float] = field(default_factory=dict)  # added to the step's update statistics (kl_sum, ...)
    diagnostics: dict[str, Any] = field(default_factory=dict)  # ``Metric``s, combined over micro-batches and passes


#: a loss term: (update stage, batch, pass) -> its output, or None when it adds nothing to this micro-batch
LossTerm = Callable[[Any, "StepBatch", PolicyPass], "TermOutput | None"]


def policy_pass(stage: Any, b: StepBatch, rows: slice) -> PolicyPass:
    """The policy's forward over ``rows`` (module docstring)."""
    from mmrlvr.train.forward import LOGPROB_CHUNK, prefix_sharing, response_logits, token_logprobs

    rt, cfg, rollouts = stage.rt, stage.cfg, b.rollouts
    inputs = rt.inputs(rollouts, b.vision, b.images_per_row, rows)
    mask, ids = rollouts.response_mask[rows], rollouts.response_ids[rows]
    dc = b.deferred if b.deferred is not None and not b.deferred.done else None
    beside = dc.beside(rows, ids, mask) if dc is not None else None  # deferred credit's view of the distribution
    logits = ent = None
    if b.distribution_losses:  # distillation terms read chosen vocabulary ids' log-probs: this pass keeps the logits
        from mmrlvr.algos.logits import entropy_from_logits, logprobs_from_logits

        logits = response_logits(rt.model, inputs, rollouts.response_ids.shape[1])  # on the model's device
        logp = logprobs_from_logits(logits, ids.to(logits.device), temperature=cfg.rollout.temperature,
                                    chunk_size=LOGPROB_CHUNK, observe=beside).to(ids.device)
        if dc is None:
            with torch.no_grad():
                ent = entropy_from_logits(logits.detach(), temperature=cfg.rollout.temperature,
                                          chunk_size=LOGPROB_CHUNK).to(ids.device)
    else:  # the fused head and prefix sharing as for plain GRPO, no [n, L, V] logits
        logp, ent = token_logprobs(rt.model, inputs, ids, cfg.rollout.temperature, with_entropy=beside is None,
                                   observe=beside, **prefix_sharing(cfg, rollouts))
    if dc is not None:
        w, adv, ent = dc.apply_signals(rows, beside.signals(ids.device), rollouts.old_logprobs[rows])
        b.token_weights[rows] = w
        b.advantages[rows] = adv
    return PolicyPass(rows, logp, ent, mask, logits, float(mask.sum()))


def policy_loss_term(stage: Any, b: StepBatch, p: PolicyPass) -> TermOutput:
    """``algo.loss`` with its parameters, times the rollout-correction weights (TIS / MIS: pi_old / pi_rollout);
    records the off-policy statistics per pi_old bin. A loss's ``LossStats.diagnostics`` reach the step's
    metrics."""
    from mmrlvr.algos.losses import call_policy_loss

    old, w = b.rollouts.old_logprobs[p.rows], b.token_weights[p.rows]
    loss_tok, lstats = call_policy_loss(stage.loss_name, p.logp, old, b.advantages[p.rows], w,
                                        generator=stage.generator, **stage.loss_params)
    stage.record_offpolicy(p.logp, old, w)
    if b.is_weights is not None:
        loss_tok = loss_tok * b.is_weights[p.rows]
    sums = {"clip_sum": float(getattr(lstats, "clip_fraction", 0.0)) * p.tokens,
            "ratio_sum": float(getattr(lstats, "ratio_mean", 1.0)) * p.tokens,
            "ratio_max": float(getattr(lstats, "ratio_max", 1.0))}
    return TermOutput(loss_tok, WEIGHTS, sums, dict(getattr(lstats, "diagnostics", None) or {}))


def kl_term(stage: Any, b: StepBatch, p: PolicyPass) -> TermOutput | None:
    """``algo.kl_coef`` times the KL estimator (``algo.kl_estimator``) to the reference policy, per token."""
    if stage.kl_fn is None:
        return None
    kl_tok = stage.kl_fn(p.logp, b.ref_logprobs[p.rows], mask=p.mask)
    return TermOutput(stage.cfg.algo.kl_coef * kl_tok, WEIGHTS, {"kl_sum": float((kl_tok.detach() * p.mask).sum())})


def distribution_term(stage: Any, b: StepBatch, p: PolicyPass) -> TermOutput | None:
    """The distribution terms (``batch.distribution_losses``: distillation), each over the policy's log-probs of
    its chosen vocabulary ids, summed."""
    if not b.distribution_losses:
        return None
    from mmrlvr.algos.distill import logprobs_of_ids

    total = None
    for term in b.distribution_losses:
        part = term.token_loss(p.rows, logprobs_of_ids(p.logits, term.ids[p.rows].to(p.logits.device),
                                                       stage.cfg.rollout.temperature)).to(p.logp.device)
        total = part if total is None else total + part
    return TermOutput(total, NORM)


def auxiliary_term(stage: Any, b: StepBatch, p: PolicyPass) -> TermOutput | None:
    """The plain auxiliary terms (``batch.extra_loss``), defined over the whole batch's log-probs: this
    micro-batch's (with gradient) are placed into a full-size tensor, and its rows kept."""
    if b.extra_loss is None:
        return None
    rows = p.rows
    full = b.rollouts.old_logprobs.index_copy(0, torch.arange(rows.start, rows.stop), p.logp)
    return TermOutput(b.extra_loss(full)[rows], NORM)


#: the update's loss terms, in the order they are summed
LOSS_TERMS: list[LossTerm] = [policy_loss_term, kl_term, distribution_term, auxiliary_term]


def summed_terms(outs: list[TermOutput], has_norm: bool) -> tuple[Any, Any]:
    """(the terms normalised by the token weights, those normalised by the credit's normaliser tokens or None),
    each summed in list order; without a credit normaliser every term is in the first."""
    first = second = None
    for out in outs:
        if out.normaliser == WEIGHTS:
            first = out.tokens if first is None else first + out.tokens
        else:
            second = out.tokens if second is None else second + out.tokens
    if second is not None and not has_norm:
        first, second = first + second, None
    return first, second
