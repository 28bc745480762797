"""Reference: log-probs of the responses under the reference policy, for the KL penalty (``algo.kl_coef``).

The reference is the adapter-disabled policy for LoRA runs (exactly the base model, no second copy) or a
frozen copy of the initial weights for full fine-tuning. ``none`` when there is no KL term.
"""

from __future__ import annotations

import contextlib

import torch

from mmrlvr.algos import zero_masked
from mmrlvr.errors import UserError
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.forward import token_logprobs
from mmrlvr.train.stages.base import Stage, register_stage


@register_stage("reference", "none")
class NoReference(Stage):
    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.kl_coef <= 0

    def __call__(self, b: StepBatch) -> None:
        pass


@register_stage("reference", "frozen", priority=10)
class FrozenReference(Stage):
    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.kl_coef > 0

    def context(self):
        if self.rt.ref_model is not None:
            return contextlib.nullcontext()
        disable = getattr(self.rt.policy, "disable_adapter", None)
        if disable is None:
            raise UserError("algo.kl_coef > 0 needs a reference: use model.lora.enabled or full fine-tuning")
        return disable()

    def __call__(self, b: StepBatch) -> None:
        rt, rollouts = self.rt, b.rollouts
        model = rt.ref_model if rt.ref_model is not None else rt.policy
        out = []
        with torch.no_grad(), self.context():
            for rows in rt.micro_slices(rollouts.num_rows):
                lp, _ = token_logprobs(model, rt.inputs(rollouts, b.vision, b.images_per_row, rows),
                                       rollouts.response_ids[rows], self.cfg.rollout.temperature)
                out.append(lp)
        b.ref_logprobs = zero_masked(torch.cat(out), rollouts.response_mask > 0)
