"""Stages of the seed methods that need hidden states (issue 19; docs/methods.md).

- credit ``hidden_credit`` (schemes with ``needs_hidden``: DelTA, ``credit.scheme: delta``): one no-grad
  forward for the LM-head input states of the response tokens, then the scheme's token coefficients
  multiply the loss weights (A·c_t).
- advantages ``poise`` (``algo.advantage: poise``): one no-grad forward for pooled prompt/response states and
  entropies; A = r − b̂ with the online probe's cross-rollout baseline (``mmrlvr.algos.poise``); the probe's
  held-out MSE/AUC go to ``batch.diagnostics`` (``poise/...``).
- advantages ``popo`` (``algo.loss: popo``): POPO's group-softmax weights over positive rollouts become the
  advantages, non-positive rows leave the loss and its normaliser (``popo/...`` counts groups without one).
- update ``popo`` (``algo.loss: popo``): the policy-gradient update plus POPO's similarity and entropy terms,
  from one extra forward (with gradient) per micro-batch for the final-norm states, one no-grad forward with
  the EMA target parameters, and the predictor's own optimizer (``mmrlvr.algos.popo``).

Contract additions (docs/architecture.md): DelTA and POISE read the policy's hidden states through
``Runtime.inputs`` + ``mmrlvr.credit.signals``; POPO's update needs the final-norm states *with gradient*,
which it computes itself (a second forward of the micro-batch). The probe / predictor / EMA states are not
in checkpoints yet: a resumed run starts them afresh. POISE and POPO run on one process only: validation refuses
a multi-process launch naming the option (``mmrlvr.train.distributed.one_process_only``).
"""

from __future__ import annotations

from typing import Any

import torch

from mmrlvr.train.batch import StepBatch
from mmrlvr.train.stages.base import Stage, register_stage
from mmrlvr.train.stages.update import PolicyGradient


def _all_rows(rt, b: StepBatch) -> dict[str, Any]:
    return rt.inputs(b.rollouts, b.vision, b.images_per_row, slice(0, b.rollouts.num_rows))


@register_stage("credit", "hidden_credit", priority=30)
class HiddenStateCredit(Stage):
    """Credit schemes that read the LM-head input states (``needs_hidden``), e.g. DelTA."""

    @classmethod
    def when(cls, cfg) -> bool:
        from mmrlvr.credit import CREDIT_SCHEMES

        name = cfg.credit.scheme
        return name in CREDIT_SCHEMES and bool(getattr(CREDIT_SCHEMES.get(name), "needs_hidden", False))

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.credit import build_scheme

        self.scheme = build_scheme(self.cfg.credit.scheme, **self.cfg.credit.params)

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.credit.signals import response_hidden

        rollouts = b.rollouts
        with torch.no_grad(), self.rt.unsharded():  # the backbone is called directly (FSDP2: gathered first)
            hidden = response_hidden(self.rt.policy, _all_rows(self.rt, b), rollouts.prompt_length,
                                     rollouts.response_ids.shape[1], rows_per_prompt=self.cfg.rollout.group_size)
        dev, home = hidden.states.device, b.token_weights.device  # [N, L, H] stays on the model's device
        reduce = self.rt.reduce_fn()  # several processes: batch-wide statistics of the global batch
        from mmrlvr.credit.schemes import takes_reduce

        extra = {"reduce": reduce} if reduce is not None and takes_reduce(self.scheme) else {}
        credit = self.scheme(None, b.token_weights.to(dev), b.advantages.to(dev),
                             old_logprobs=rollouts.old_logprobs.to(dev), hidden=hidden.states, **extra)
        b.token_weights = b.token_weights * credit.token_weights.to(home)
        b.credit_stats = dict(credit.stats)


@register_stage("advantages", "poise", priority=20)
class PoiseAdvantage(Stage):
    """POISE (arXiv 2605.07579): r − b̂, b̂ an online probe on *other* rollouts' states of the same prompt."""

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.advantage == "poise"

    @classmethod
    def validate(cls, cfg) -> list[str]:
        from mmrlvr.train.distributed import one_process_only

        # each rank's probe would learn from its own shard only: the baselines would differ from one process's
        return one_process_only("algo.advantage: poise", "its online probe is trained on one process's rollouts")

    def __init__(self, rt) -> None:
        super().__init__(rt)
        self.probe = None

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.algos.poise import PoiseProbe, poise_advantages, poise_features_from_model

        a, rollouts = self.cfg.algo, b.rollouts
        feats = poise_features_from_model(self.rt.policy, _all_rows(self.rt, b), rollouts.prompt_length,
                                          rollouts.response_mask, temperature=self.cfg.rollout.temperature)
        if self.probe is None:
            self.probe = PoiseProbe(feats.shape[1], lr=a.poise_lr, buffer_steps=a.poise_buffer_steps,
                                    train_iters=a.poise_train_iters, seed=self.cfg.seed)
        adv, stats = poise_advantages(b.rewards, rollouts.group_index, feats.cpu(), self.probe)
        b.advantages = adv.to(b.rewards.device)
        b.diagnostics.update(stats)


@register_stage("advantages", "popo", priority=15)
class PopoAdvantage(Stage):
    """POPO's weights over positive rollouts as the advantages; other rows leave the loss (counted)."""

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.loss == "popo"

    @classmethod
    def validate(cls, cfg) -> list[str]:
        from mmrlvr.train.distributed import one_process_only

        # the update's extra backward runs on the unwrapped model (DDP would not average its gradients), skips
        # micro-batches without positive rows (FSDP2 ranks would wait in each other's all-gathers), and its
        # predictor and EMA target live outside the wrapper
        return one_process_only("algo.loss: popo", "its similarity pass and predictor are not synchronised "
                                "across processes")

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.algos.masked import masked_mean
        from mmrlvr.algos.popo import popo_weights

        a, rollouts = self.cfg.algo, b.rollouts
        valid = (rollouts.response_mask > 0).to(torch.float32)
        ell = masked_mean(torch.where(valid > 0, rollouts.old_logprobs, 0.0), valid, dim=-1)
        adv, positive, stats = popo_weights(b.rewards, rollouts.group_index, ell, temperature=a.popo_temperature,
                                            threshold=a.popo_threshold)
        b.advantages = adv
        b.token_weights = b.token_weights * positive[:, None].to(b.token_weights.dtype)
        b.diagnostics.update(stats)


@register_stage("update", "popo", priority=10)
class PopoUpdate(PolicyGradient):
    """The policy-gradient update with POPO's similarity (0.1) and entropy (0.01) terms on positive rows."""

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.loss == "popo"

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.algos.popo import PopoSimilarity

        core = rt.policy.get_base_model() if hasattr(rt.policy, "get_base_model") else rt.policy
        hidden = core.get_output_embeddings().weight.shape[1]
        a = self.cfg.algo
        from mmrlvr.models.placement import model_device

        self.sim = PopoSimilarity(hidden, tau=a.popo_ema_tau).to(model_device(core))
        self.sim_opt = torch.optim.AdamW(self.sim.parameters(), lr=self.cfg.optim.lr)
        self.sim_stats: dict[str, float] = {}

    def update(self, b: StepBatch) -> dict[str, float]:
        w_rows = b.advantages * (b.token_weights.sum(-1) > 0)
        self._w_total = float(w_rows.sum())
        self._tok_total = float(b.token_weights.gt(0).sum())
        self.sim_stats = {"popo/sim_loss": 0.0, "popo/entropy": 0.0}
        stats = super().update(b)
        passes = max(self.cfg.algo.epochs, 1)
        b.diagnostics.update({k: v / passes for k, v in self.sim_stats.items()})
        return stats

    def micro_step(self, b: StepBatch, rows: slice, global_den, norm_constant: float) -> dict[str, float]:
        stats = super().micro_step(b, rows, global_den, norm_constant)
        w = (b.advantages[rows] * (b.token_weights[rows].sum(-1) > 0)).float()
        mask = b.token_weights[rows] > 0
        if float(w.sum()) <= 0 or self._w_total <= 0:
            return stats
        from mmrlvr.algos.popo import masked_mean_features

        rt, a = self.rt, self.cfg.algo
        inputs = rt.inputs(b.rollouts, b.vision, b.images_per_row, rows)
        P, L = b.rollouts.prompt_length, b.rollouts.response_ids.shape[1]
        core = rt.policy.get_base_model() if hasattr(rt.policy, "get_base_model") else rt.policy
        # the target first: swapping the EMA parameters in and out writes the weights in place, which must not
        # happen between the online forward and its backward
        device = inputs["input_ids"].device  # the model's (rt.inputs); the batch's weights are on the CPU
        mask, w = mask.to(device), w.to(device)
        with torch.no_grad(), self.sim.target(rt.policy):
            target = core.model(**inputs, use_cache=False).last_hidden_state[:, P - 1:P - 1 + L]
            f_target = masked_mean_features(target, mask)
        states = core.model(**inputs, use_cache=False).last_hidden_state[:, P - 1:P - 1 + L]  # with grad
        f_online = masked_mean_features(states, mask)
        gen = torch.Generator().manual_seed(self.cfg.seed * 104_729 + b.step * 31 + rows.start)
        l_sim = self.sim.loss(f_online, f_target, w, generator=gen) * (float(w.sum()) / self._w_total)
        head = core.get_output_embeddings()
        logp = torch.log_softmax(head(states.to(head.weight.dtype)).float() / self.cfg.rollout.temperature, -1)
        ent = -(logp.exp() * logp).sum(-1)  # [n, L], with grad
        l_ent = -(ent * mask).sum() / max(self._tok_total, 1.0)
        loss = (a.popo_sim_coef * l_sim + a.popo_ent_coef * l_ent) * rt.accel.num_processes
        if not torch.isfinite(loss):
            from mmrlvr.train.stages.update import NonFiniteLoss

            raise NonFiniteLoss(f"popo auxiliary loss is {loss.item()}")
        rt.accel.backward(loss)
        self.sim_stats["popo/sim_loss"] += float(l_sim.detach())
        self.sim_stats["popo/entropy"] += float(-l_ent.detach())
        stats["loss"] += float(loss.detach()) / rt.accel.num_processes
        return stats

    def optimizer_step(self) -> float:
        norm = super().optimizer_step()
        self.sim_opt.step()
        self.sim_opt.zero_grad(set_to_none=True)
        self.sim.update_target(self.rt.policy)
        return norm
