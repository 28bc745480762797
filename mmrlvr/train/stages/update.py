"""Update: ``algo.epochs`` passes of the policy loss over the rollout batch, one optimizer step each.

Per micro-batch: one policy pass (the response log-probs with gradient, ``mmrlvr.train.loss_terms.policy_pass``)
and the loss terms over it (``self.terms``: the policy loss chosen by ``algo.loss``, the KL penalty to the
reference, distillation and auxiliary terms), aggregated by ``algo.agg`` and normalised by the *global* count of
the whole batch (all micro-batches and processes), so gradient accumulation and DDP's average reproduce one big
batch.

Credit deferred into this pass (``batch.deferred``) is applied to each micro-batch from its own clean logits;
its normaliser is only known after the first pass, so that pass backpropagates unnormalised sums and the
gradients are divided by the global normaliser at the end (same gradient).

A non-finite loss or gradient skips the step (counted); ``max_bad_steps`` consecutive ones stop the run. With
several processes the skip is decided together: a loss that is non-finite on one rank skips the step on all.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

from mmrlvr.lazy_import import lazy_module
from mmrlvr.metric import Metric, combine
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.host_memory import policy_pass_heap
from mmrlvr.train.stages.base import Stage, register_stage

torch = lazy_module("torch")  # selection (config checks) runs without torch; the stages' work imports it


class NonFiniteLoss(RuntimeError):
    pass


def agg_denominator(weights: torch.Tensor, mode: str, row_mask: torch.Tensor | None = None) -> float:
    """What ``agg_loss(mode)`` divides by for these [n, L] weights: tokens, live rows, or rows.

    ``row_mask`` [n] bool: rows that belong to the batch (dynamic sampling drops whole groups: they leave the
    seq-mean-token-sum(-norm) row count too, as DAPO removes them from the batch)."""
    if mode == "token-mean":
        return float(weights.sum())
    if mode == "seq-mean-token-mean":
        return float((weights.sum(dim=1) > 0).sum())
    return float(weights.shape[0] if row_mask is None else row_mask.sum())


def policy_loss_params(algo: Any) -> dict[str, Any]:
    """The keyword arguments of ``algo.loss`` from the ``algo`` config section: the loss-owned values (the loss's
    own defaults were filled in at config load, ``mmrlvr.algos.presets.resolve_loss_params``) that its signature
    takes, and the clip rule (``algo.clip``: fixed | acpo) for losses that take one."""
    from mmrlvr.algos.losses import POLICY_LOSSES
    from mmrlvr.algos.presets import loss_kwargs

    accepted = inspect.signature(POLICY_LOSSES.get(algo.loss)).parameters
    kwargs = loss_kwargs(algo.loss, vars(algo))  # the clip rule included: another rule on a loss without one raises
    return {k: v for k, v in kwargs.items() if k in accepted}


@register_stage("update", "policy_gradient")
class PolicyGradient(Stage):
    """``algo.epochs`` passes of ``algo.loss`` (with ``algo.loss_params``) over the batch, one optimizer step each."""

    selected_by = ("algo.loss",)
    fallback = True
    reads = ("algo.loss", "algo.loss_params.", "algo.eps_low", "algo.eps_high", "algo.dual_clip", "algo.clip",
             "algo.clip_params.", "algo.agg", "algo.kl_coef", "algo.epochs", "algo.micro_batch_size")

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        from mmrlvr.methods import configured

        a = cfg.algo
        loss, params = configured(cfg, "loss")
        out: dict[str, Any] = {"algo.loss": loss}
        from mmrlvr.algos.presets import loss_clip_keys

        for k in loss_clip_keys(loss):
            out[f"algo.{k}"] = getattr(a, k)
        out.update({f"algo.loss_params.{k}": v for k, v in params.items()})
        if a.clip != "fixed":
            rule, cp = configured(cfg, "clip")
            out["algo.clip"] = rule
            out.update({f"algo.clip_params.{k}": v for k, v in cp.items()})
        out.update({"algo.agg": a.agg, "algo.kl_coef": a.kl_coef, "algo.epochs": a.epochs,
                    "algo.micro_batch_size": a.micro_batch_size})
        if a.kl_coef > 0:
            out["algo.kl_estimator"] = a.kl_estimator
        return out

    def __init__(self, rt) -> None:
        super().__init__(rt)
        a = self.cfg.algo
        self.loss_name = a.loss
        self.loss_params = policy_loss_params(a)
        from mmrlvr.algos.kl import KL_ESTIMATORS

        self.kl_fn = KL_ESTIMATORS.get(a.kl_estimator) if a.kl_coef > 0 else None
        from mmrlvr.train.loss_terms import LOSS_TERMS

        self.terms = list(LOSS_TERMS)  # summed in this order (mmrlvr.train.loss_terms)
        self.after_step_hooks = [h for h in (getattr(fn, "on_optimizer_step", None) for fn in rt.reward_fns()) if h]

    def __call__(self, b: StepBatch) -> None:
        rt = self.rt
        try:
            with policy_pass_heap(self.cfg.model.heap_mmap_threshold_mib, on_cpu=rt.accel.device.type == "cpu"):
                b.update_stats = self.update(b)
            rt.engine.sync_weights(rt.policy)  # no-op for hf; pushes weights / adapter into vLLM
            rt.counters["bad_steps"] = 0
        except NonFiniteLoss as exc:
            rt.optimizer.zero_grad(set_to_none=True)
            rt.counters["bad_steps"] += 1
            rt.counters["skipped_steps"] += 1
            b.update_stats = {"skipped": 1.0}
            if rt.counters["bad_steps"] >= self.cfg.max_bad_steps:
                raise RuntimeError(f"step {b.step}: {rt.counters['bad_steps']} consecutive steps with a non-finite "
                                   f"loss ({exc}); stopping (max_bad_steps={self.cfg.max_bad_steps})") from exc

    def update(self, b: StepBatch) -> dict[str, float]:
        rt, a = self.rt, self.cfg.algo
        rollouts = b.rollouts
        deferred = b.deferred if b.deferred is not None and not b.deferred.done else None
        norm_w = b.norm_weights if b.norm_weights is not None else b.token_weights
        global_den = None if deferred is not None else rt.global_sum(agg_denominator(norm_w, a.agg, b.row_mask))
        if global_den == 0:  # no token carries signal on any process: no forward, no optimizer step
            return self.zero_signal(b)
        norm_constant = float(self.cfg.rollout.max_new_tokens)
        rt.model.train()
        # NSR's random rescue is seeded per step so a resumed run draws the same noise
        self.generator = torch.Generator().manual_seed(self.cfg.seed * 7_919 + b.step)
        self.term_diagnostics: list[dict[str, Any]] = []  # the loss terms' own metrics, per micro-batch and pass
        totals: dict[str, float] = {}
        self.recorded_rows: dict[int, bool] = {}  # rows whose first-pass entropy/ratio are stored
        from mmrlvr.algos.clipping import OffPolicyDiagnostics

        self.offpolicy = OffPolicyDiagnostics()  # per pi_old bin, over every pass of this step
        for _epoch in range(a.epochs):
            slices = rt.micro_slices(rollouts.num_rows)
            den_sum, epoch_loss = 0.0, 0.0
            for i, rows in enumerate(slices):
                sync = contextlib.nullcontext() if i == len(slices) - 1 else rt.accel.no_sync(rt.model)
                with sync:
                    stats = self.micro_step(b, rows, global_den, norm_constant)
                den_sum += stats.pop("den")
                epoch_loss += stats.pop("loss")
                for k, v in stats.items():
                    totals[k] = max(totals.get(k, v), v) if k == "ratio_max" else totals.get(k, 0.0) + v
            if global_den is None:  # the deferred-credit pass: now the normaliser is known
                global_den = rt.global_sum(den_sum)
                if global_den == 0:
                    b.signals, b.credit_stats = deferred.finish(rollouts.old_logprobs)
                    return self.zero_signal(b)
                inv = 1.0 / max(global_den, 1e-8)
                for p in rt.model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(inv)
                epoch_loss *= inv
                b.signals, b.credit_stats = deferred.finish(rollouts.old_logprobs)
            totals["loss"] = totals.get("loss", 0.0) + epoch_loss
            grad_norm = self.optimizer_step()
            totals["grad_norm"] = totals.get("grad_norm", 0.0) + grad_norm
        b.diagnostics.update(self.offpolicy.metrics())
        b.diagnostics.update(combine(self.term_diagnostics))  # over every micro-batch of every pass
        if b.sampler_gap is None and b.token_ratio is not None:
            # pi_old is the sampler's own (no recompute): the first pass, before any optimizer step, teacher-forced
            # the trainer's pi_old, and its ratio to the sampler's is the agreement
            from mmrlvr.train.stages.reference import note_agreement

            valid = rollouts.response_mask > 0
            trainer = rollouts.old_logprobs + torch.where(valid, b.token_ratio.clamp_min(1e-30).log(), 0.0)
            note_agreement(b, rt.vision_start_id, trainer, rollouts.old_logprobs)
        passes = a.epochs
        return {k: (v / passes if k in ("grad_norm", "loss", "kl", "policy_loss") else v) for k, v in totals.items()}

    def zero_signal(self, b: StepBatch) -> dict[str, float]:
        """A step whose every token weight is zero (e.g. every group dropped by dynamic sampling): parameters,
        optimizer moments and the schedule stay exactly as they are (AdamW would move them with no signal)."""
        self.rt.optimizer.zero_grad(set_to_none=True)
        b.diagnostics["update/zero_signal"] = Metric.max(1.0)  # every process takes this step together
        return {}

    def micro_step(self, b: StepBatch, rows: slice, global_den: float | None, norm_constant: float) -> dict[str, float]:
        """One micro-batch: the policy pass, the loss terms (``self.terms``), their aggregate scaled to the
        batch's global normaliser, the backward; returns the sums this micro-batch adds to the step's statistics
        (``loss``: its share of the normalised loss; ``den``: its share of the normaliser)."""
        from mmrlvr.train.loss_terms import policy_pass

        p = policy_pass(self, b, rows)
        self.record_first_pass(b, p)
        outs = [out for term in self.terms if (out := term(self, b, p)) is not None]
        p.logits = None
        loss, den = self.aggregate(b, rows, outs, global_den, norm_constant)
        # taken together: a rank that skipped the backward alone would leave the others in DDP's all-reduce
        if self.rt.any_rank(not bool(torch.isfinite(loss))):
            where = f"loss is {loss.item()}" if not torch.isfinite(loss) else "another process's loss is not finite"
            raise NonFiniteLoss(where)
        self.rt.accel.backward(loss)
        stats = {"loss": float(loss.detach()) / self.rt.accel.num_processes, "den": den, "kl_sum": 0.0,
                 "tokens": p.tokens, "entropy_sum": float((p.entropy * p.mask).sum()) if p.entropy is not None else 0.0}
        for out in outs:
            stats.update({k: stats.get(k, 0.0) + v for k, v in out.sums.items()})
            if out.diagnostics:
                self.term_diagnostics.append(out.diagnostics)
        return stats

    def aggregate(self, b: StepBatch, rows: slice, outs: list, global_den: float | None,
                  norm_constant: float) -> tuple[Any, float]:
        """(the terms aggregated by ``algo.agg`` and scaled to the global normaliser, this micro-batch's share of
        that normaliser). ``agg_loss`` normalises by this micro-batch; the scale turns that into the global
        normaliser, times the processes (DDP averages gradients over them). ``global_den`` None (deferred credit's
        first pass): the sum is left unnormalised and the update divides the gradients afterwards."""
        from mmrlvr.algos.aggregation import agg_loss
        from mmrlvr.train.loss_terms import summed_terms

        a = self.cfg.algo
        w = b.token_weights[rows]
        # the normaliser's tokens: a credit scheme's norm_weights (VPPO: all response tokens), else the weights
        nw = b.norm_weights[rows] if b.norm_weights is not None else None
        main, beside = summed_terms(outs, has_norm=nw is not None)
        loss = agg_loss(main, w, a.agg, norm_constant=norm_constant, norm_mask=nw)
        if beside is not None:  # terms over the normaliser's tokens (VPPO's entropy term: all of them)
            loss = loss + agg_loss(beside, nw, a.agg, norm_constant=norm_constant, norm_mask=nw)
        local_den = agg_denominator(nw if nw is not None else w, a.agg)  # what agg_loss divided this slice by
        row_mask = b.row_mask[rows] if b.row_mask is not None else None
        share = agg_denominator(nw if nw is not None else w, a.agg, row_mask)  # its share of the batch's
        scale = local_den if global_den is None else local_den / max(global_den, 1e-8)
        return loss * (scale * self.rt.accel.num_processes), share

    def record_first_pass(self, b: StepBatch, p: Any) -> None:
        """Each row's entropy and ratio to pi_old from the step's first pass over it (before any optimizer step),
        for the records and the rollout/trainer agreement."""
        rollouts = b.rollouts
        if b.token_ratio is None:
            b.token_entropy = torch.zeros_like(rollouts.old_logprobs)
            b.token_ratio = torch.zeros_like(rollouts.old_logprobs)
        if self.recorded_rows.get(p.rows.start):
            return
        self.recorded_rows[p.rows.start] = True
        with torch.no_grad():
            valid = p.mask > 0
            log_ratio = (p.logp.detach() - rollouts.old_logprobs[p.rows]).clamp(-20, 20)
            b.token_ratio[p.rows] = torch.where(valid, log_ratio.exp(), 0.0)
            if p.entropy is not None:
                b.token_entropy[p.rows] = torch.where(valid, p.entropy, 0.0)

    def record_offpolicy(self, logp: torch.Tensor, old_logp: torch.Tensor, weights: torch.Tensor) -> None:
        """Ratio statistics per pi_old bin (``offpolicy/...``), with the clip bounds the loss used (ACPO's too)."""
        from mmrlvr.algos.clipping import loss_bounds

        with torch.no_grad():
            valid = weights > 0
            ratio = torch.where(valid, (logp.detach() - old_logp).clamp(-20, 20).exp(), torch.ones_like(logp))
            low, high = loss_bounds(self.loss_params, logp.detach(), ratio, valid)
            self.offpolicy.add(ratio, old_logp, valid, low, high)

    def optimizer_step(self) -> float:
        """Check the gradients, clip them, step the optimizer and scheduler; returns the gradient norm."""
        rt = self.rt
        clip = self.cfg.optim.grad_clip
        params = [p for p in rt.model.parameters() if p.requires_grad]
        from mmrlvr.train.optim import NonFiniteGradient, clip_grad_norm_and_check

        try:  # one pass: the global norm (reduced over FSDP2 shards) also detects NaN/inf before anything is scaled
            norm = clip_grad_norm_and_check(params, clip)
        except NonFiniteGradient as exc:
            raise NonFiniteLoss(str(exc)) from None
        rt.optimizer.step()
        rt.scheduler.step()
        rt.optimizer.zero_grad(set_to_none=True)
        rt.counters["optimizer_steps"] += 1
        for hook in self.after_step_hooks:
            hook(rt.policy, rt.counters["optimizer_steps"])
        return float(norm)


@register_stage("update", "popo", priority=10)
class PopoUpdate(PolicyGradient):
    """The policy-gradient update with POPO's similarity (0.1) and entropy (0.01) terms on positive rows, from one
    extra forward (with gradient) per micro-batch for the final-norm states, one no-grad forward with the EMA target
    parameters, and the predictor's own optimizer (``mmrlvr.algos.popo``). The predictor, its optimizer and the EMA
    target are in checkpoints."""

    selected_by = ("algo.loss",)
    reads = PolicyGradient.reads + ("algo.loss_params.",)
    when_text = "algo.loss: popo"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.loss == "popo"

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.algos.popo import PopoSimilarity

        core = rt.policy.get_base_model() if hasattr(rt.policy, "get_base_model") else rt.policy
        hidden = core.get_output_embeddings().weight.shape[1]
        from mmrlvr.methods import configured
        from mmrlvr.models.placement import model_device

        self.popo = configured(self.cfg, "loss")[1]
        self.sim = PopoSimilarity(hidden, tau=self.popo["ema_tau"]).to(model_device(core))
        self.sim_opt = torch.optim.AdamW(self.sim.parameters(), lr=self.cfg.optim.lr)
        self.sim_stats: dict[str, float] = {}

    def update(self, b: StepBatch) -> dict[str, float]:
        w_rows = b.advantages * (b.token_weights.sum(-1) > 0)
        self._w_total = float(w_rows.sum())
        self._tok_total = float(b.token_weights.gt(0).sum())
        self.sim_stats = {"popo/sim_loss": 0.0, "popo/entropy": 0.0}
        stats = super().update(b)
        passes = max(self.cfg.algo.epochs, 1)
        # this process's weighted means (over its positive-advantage weight and its tokens), per pass
        b.diagnostics.update({"popo/sim_loss": Metric.mean(self.sim_stats["popo/sim_loss"] / passes, n=self._w_total),
                              "popo/entropy": Metric.mean(self.sim_stats["popo/entropy"] / passes, n=self._tok_total)})
        return stats

    def micro_step(self, b: StepBatch, rows: slice, global_den, norm_constant: float) -> dict[str, float]:
        stats = super().micro_step(b, rows, global_den, norm_constant)
        w = (b.advantages[rows] * (b.token_weights[rows].sum(-1) > 0)).float()
        mask = b.token_weights[rows] > 0
        if float(w.sum()) <= 0 or self._w_total <= 0:
            return stats
        from mmrlvr.algos.popo import masked_mean_features

        rt = self.rt
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
        loss = (self.popo["sim_coef"] * l_sim + self.popo["ent_coef"] * l_ent) * rt.accel.num_processes
        if not torch.isfinite(loss):
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

    def state_dict(self) -> dict[str, Any]:
        return {"sim": {k: v.detach().cpu() for k, v in self.sim.state_dict().items()},
                "ema": {k: v.detach().cpu() for k, v in self.sim._ema.items()}, "opt": self.sim_opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = next(self.sim.parameters()).device
        self.sim.load_state_dict(state["sim"])
        self.sim._ema = {k: v.to(device) for k, v in state["ema"].items()}
        self.sim_opt.load_state_dict(state["opt"])
