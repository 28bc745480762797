"""``StepBatch``: the one typed value that flows through the stages of a training step.

Each stage (``mmrlvr.train.stages``) reads some fields and writes others; docs/architecture.md lists which.
N = rollouts in this process's share of the step (prompts x G), L = response tokens (padded).
A field is ``None`` until the stage that writes it has run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the batch is a plain container: importing it (stage selection) needs no torch
    import torch

    from mmrlvr.rollout.base import RolloutBatch

#: an auxiliary loss term: given the policy's response log-probs of the *whole* batch [N, L] (rows outside the
#: current micro-batch detached), the per-token loss [N, L] to add (e.g. PAPO's perception term).
#: A term with an ``ids`` attribute ([N, L, k] vocabulary ids) is a *distribution* term instead: the update gathers
#: the policy's log-probs of those ids per micro-batch and calls ``term.token_loss(rows, logp_ids [n, L, k])``
#: -> [n, L] (distillation: ``mmrlvr.train.aux_losses``)
AuxLoss = Callable[["torch.Tensor"], "torch.Tensor"]


@dataclass
class StepBatch:
    step: int  # 0-based index of the optimizer step this batch trains
    round: int = 0  # generation round within the step (dynamic-sampling refill draws more prompts)
    # generate
    samples: list = field(default_factory=list)  # the prompts the sampler chose (this process's share)
    rollouts: RolloutBatch | None = None  # prompt + response ids, masks, old log-probs, vision inputs
    images_per_row: list[int] = field(default_factory=list)  # images in each row's prompt
    tree: Any = None  # TreeLayout when the rollouts are trees (rollout.strategy: tree): each leaf's nodes and segments
    vision: Any = None  # VisionFeatureCache: vision-tower outputs shared by every later pass, or None
    # score / shape
    results: list = field(default_factory=list)  # N RewardResult (score, components, parsed)
    rewards: torch.Tensor | None = None  # [N] total reward after the shaping transforms
    token_weights: torch.Tensor | None = None  # [N, L] loss weights: response mask x filters x credit
    norm_weights: torch.Tensor | None = None  # [N, L] tokens counted by the loss normaliser (None: token_weights)
    row_mask: torch.Tensor | None = None  # [N] bool, rows that belong to the batch (None: all); rows dropped by
    #                                       dynamic sampling leave every normaliser, seq-mean-token-sum's too
    #: every batch the step generated, in round order, as the shaping stages left it, when a stage rebuilt ``self``
    #: from several rounds (dynamic-sampling refill); empty: ``self`` holds every generated group. What a sampler
    #: observes after the step: every group, kept or dropped (``generated_rounds``)
    generated: list["StepBatch"] = field(default_factory=list)
    # advantages / credit
    advantages: torch.Tensor | None = None  # [N], or [N, L] per token; after credit scaling
    signals: Any = None  # credit TokenSignals (entropy, jsd, ...) for records and metrics
    deferred: Any = None  # DeferredCredit: credit applied inside the update's first pass
    aux_losses: list[AuxLoss] = field(default_factory=list)
    # reference / update
    ref_logprobs: torch.Tensor | None = None  # [N, L] under the reference policy (KL), or None
    teacher_logprobs: torch.Tensor | None = None  # [N, L] under OPD's teacher (algo.advantage: opd), 0 on padding
    rollout_logprobs: torch.Tensor | None = None  # [N, L] the sampler's log-probs when pi_old was recomputed
    is_weights: torch.Tensor | None = None  # [N, L] rollout-correction weights on the policy loss (TIS / MIS)
    token_entropy: torch.Tensor | None = None  # [N, L] policy entropy from the first update pass
    token_ratio: torch.Tensor | None = None  # [N, L] pi/pi_old in the first update pass
    sampler_gap: torch.Tensor | None = None  # [N, L] log pi_old (trainer) - log pi (sampler) per sampled token
    update_stats: dict[str, float] = field(default_factory=dict)  # loss, grad_norm, kl_sum, ... (update stage)
    # diagnostics, merged into metrics.jsonl by the record stage in this order; each value a ``mmrlvr.metric.Metric``
    # (it says how the values of several processes combine)
    reward_metrics: dict[str, float] = field(default_factory=dict)  # rewards' own counters (judge/unknown_rate)
    credit_stats: dict[str, float] = field(default_factory=dict)  # credit/selected_fraction, ...
    diagnostics: dict[str, float] = field(default_factory=dict)  # any other stage's per-step statistics
    #: per-row values a stage adds to the rollout records (``RolloutRecord.extra[name]``): name -> one JSON-able
    #: value per row of the batch as the record stage sees it (after shaping: write them in a later stage)
    record_fields: dict[str, list[Any]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage kind
    logged: dict[str, Any] = field(default_factory=dict)  # what the record stage wrote for this step

    def generated_rounds(self) -> list["StepBatch"]:
        """The step's generated batches, every group once (a refill step: each round's; else ``[self]``)."""
        return self.generated or [self]

    # the records builder and older code read these names
    @property
    def batch(self) -> RolloutBatch | None:
        return self.rollouts

    @property
    def extra_loss(self) -> AuxLoss | None:
        """The plain auxiliary terms (over the sampled tokens' log-probs) as one, or None."""
        plain = [fn for fn in self.aux_losses if getattr(fn, "ids", None) is None]
        if not plain:
            return None
        if len(plain) == 1:
            return plain[0]
        return lambda logp: sum(fn(logp) for fn in plain)

    @property
    def distribution_losses(self) -> list[Any]:
        """The auxiliary terms over the policy's log-probs of chosen vocabulary ids (they have ``ids``)."""
        return [fn for fn in self.aux_losses if getattr(fn, "ids", None) is not None]
