"""Token credit: which response tokens the policy gradient reaches, and how strongly (docs/credit.md).

- ``none``: every response token (the loss weights stay the response mask).
- ``in_update`` (``credit.in_update``, schemes that read the clean distribution and decide each row alone:
  VEPO, entropy top-k, RSI): runs the perturbed-image pass now (if the scheme needs one) and defers the scheme
  to the update's first forward, which computes the clean logits anyway (``mmrlvr.train.deferred_credit``).
- ``separate``: a no-grad signal pass now (clean and/or perturbed), the scheme's token weights, advantage
  scale and auxiliary loss (PAPO) applied before the update (VPPO, PAPO, plug-ins without ``row_local``).
"""

from __future__ import annotations

from typing import Any

from mmrlvr.lazy_import import lazy_module
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.stages.base import Stage, all_rows, register_stage

torch = lazy_module("torch")  # selection (config checks) runs without torch; the stages' work imports it


def _scheme(cfg):
    from mmrlvr.credit import build_scheme

    return build_scheme(cfg.credit.scheme, **cfg.credit.scheme_params)


class _CreditStage(Stage):
    def __init__(self, rt) -> None:
        super().__init__(rt)
        self.scheme = _scheme(self.cfg)

    def perturbed_inputs(self, b: StepBatch) -> dict[str, Any]:
        """Model inputs with the scheme's (or the configured) perturbation of the images, seeded per step."""
        from mmrlvr.credit import perturb_vision

        cc = self.cfg.credit
        name, params = self.scheme.perturbation or ("gaussian", {})
        if cc.perturbation:
            name, params = cc.perturbation, {}
        params = {**params, **cc.perturbation_params}
        vision = perturb_vision(b.rollouts.vision, name, seed=self.cfg.seed * 1_000_003 + b.step,
                                processor=self.rt.processor, **params)
        return {"input_ids": b.rollouts.input_ids, "attention_mask": b.rollouts.attention_mask, **vision}


@register_stage("credit", "none")
class NoCredit(Stage):
    selected_by = ("credit.scheme",)
    fallback = True

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.credit.scheme == "none"

    def __call__(self, b: StepBatch) -> None:
        pass


@register_stage("credit", "in_update", priority=20)
class InUpdateCredit(_CreditStage):
    """Schemes that read the clean distribution take it from the update's first forward (one forward less)."""

    selected_by = ("credit.scheme", "credit.in_update")
    reads = ("credit.",)
    when_text = "a credit.scheme that reads the clean distribution, with credit.in_update: true"

    @classmethod
    def when(cls, cfg) -> bool:
        if cfg.credit.scheme == "none" or not cfg.credit.in_update:
            return False
        from mmrlvr.train.deferred_credit import can_defer

        return can_defer(_scheme(cfg))

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.credit.signals import response_hidden
        from mmrlvr.train.deferred_credit import DeferredCredit

        cfg, rollouts = self.cfg, b.rollouts
        pert = None
        if self.scheme.needs_perturbed:
            with self.rt.unsharded():  # the backbone is called directly (FSDP2: its root weights gathered first)
                pert = response_hidden(self.rt.policy, self.perturbed_inputs(b), rollouts.prompt_length,
                                       rollouts.response_ids.shape[1], rows_per_prompt=rollouts.uniform_group_size() or 1)
        b.deferred = DeferredCredit(self.scheme, pert, b.token_weights.clone(), b.advantages.clone(),
                                    cfg.credit.chunk_size, cfg.rollout.temperature)


@register_stage("credit", "separate", priority=10)
class SeparateCredit(_CreditStage):
    """The scheme's signals from their own no-grad passes (clean and/or perturbed) before the update."""

    selected_by = ("credit.scheme",)
    reads = ("credit.",)
    when_text = "credit.scheme other than none"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.credit.scheme != "none"

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.credit import token_signals_from_model

        cfg, rt, rollouts, scheme = self.cfg, self.rt, b.rollouts, self.scheme
        clean = rt.inputs(rollouts, b.vision, b.images_per_row, slice(0, rollouts.num_rows))
        pert_inputs = self.perturbed_inputs(b) if scheme.needs_perturbed else None
        # the clean full-vocabulary pass is needed for entropy/JSD (VEPO, entropy top-k, RSI); VPPO and
        # PAPO read only the perturbed pass's sampled-token log-probs
        distribution = scheme.needs_distribution or not scheme.needs_perturbed
        with torch.no_grad(), rt.unsharded():  # hidden-state passes call the backbone (FSDP2: gathered first)
            signals = token_signals_from_model(
                rt.policy, clean if distribution else None, pert_inputs, rollouts.prompt_length,
                rollouts.response_ids, rollouts.response_mask, chunk_size=cfg.credit.chunk_size,
                temperature=cfg.rollout.temperature, old_logprobs=rollouts.old_logprobs,
                distribution=distribution, rows_per_prompt=rollouts.uniform_group_size() or 1,
            )
        from mmrlvr.credit.schemes import takes_reduce

        reduce = rt.reduce_fn()  # several processes: a scheme's batch-wide statistics (VPPO's scale) are global
        extra = {"reduce": reduce} if reduce is not None and takes_reduce(scheme) else {}
        credit = scheme(signals, b.token_weights, b.advantages, old_logprobs=rollouts.old_logprobs, **extra)
        b.signals = signals
        b.token_weights = b.token_weights * credit.token_weights
        adv = b.advantages
        b.advantages = adv * (credit.adv_scale if adv.dim() == 1 else credit.adv_scale[:, None])
        if credit.extra_loss is not None:
            b.aux_losses.append(credit.extra_loss)
        if getattr(credit, "norm_weights", None) is not None:  # e.g. VPPO: divide by all response tokens
            b.norm_weights = credit.norm_weights
        b.credit_stats = dict(credit.stats)


@register_stage("credit", "hidden_credit", priority=30)
class HiddenStateCredit(Stage):
    """Credit schemes that read the LM-head input states (``needs_hidden``), e.g. DelTA: one no-grad forward for
    the response tokens' states, then the scheme's token coefficients multiply the loss weights (A·c_t)."""

    selected_by = ("credit.scheme",)
    reads = ("credit.scheme", "credit.scheme_params.")
    when_text = "a credit.scheme that reads hidden states (delta)"

    @classmethod
    def when(cls, cfg) -> bool:
        name = cfg.credit.scheme
        if name == "none":
            return False
        from mmrlvr.credit import CREDIT_SCHEMES

        return name in CREDIT_SCHEMES and bool(getattr(CREDIT_SCHEMES.get(name), "needs_hidden", False))

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.credit import build_scheme

        self.scheme = build_scheme(self.cfg.credit.scheme, **self.cfg.credit.scheme_params)

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.credit.signals import response_hidden

        rollouts = b.rollouts
        with torch.no_grad(), self.rt.unsharded():  # the backbone is called directly (FSDP2: gathered first)
            hidden = response_hidden(self.rt.policy, all_rows(self.rt, b), rollouts.prompt_length,
                                     rollouts.response_ids.shape[1], rows_per_prompt=rollouts.uniform_group_size() or 1)
        dev, home = hidden.states.device, b.token_weights.device  # [N, L, H] stays on the model's device
        reduce = self.rt.reduce_fn()  # several processes: batch-wide statistics of the global batch
        from mmrlvr.credit.schemes import takes_reduce

        extra = {"reduce": reduce} if reduce is not None and takes_reduce(self.scheme) else {}
        credit = self.scheme(None, b.token_weights.to(dev), b.advantages.to(dev),
                             old_logprobs=rollouts.old_logprobs.to(dev), hidden=hidden.states, **extra)
        b.token_weights = b.token_weights * credit.token_weights.to(home)
        b.credit_stats = dict(credit.stats)
