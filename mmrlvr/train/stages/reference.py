"""Reference: log-probs of the sampled responses under the other policies the update needs.

- ``old_policy`` (``algo.recompute_old_logprobs``; on by default when ``algo.epochs > 1`` or the engine is vLLM):
  pi_old recomputed by the *training* model, teacher-forced, before any update — the sampler's log-probs
  (vLLM kernels, another precision, KV-cache decoding) are not the training model's, and PPO's ratio must
  start at exactly 1. It logs the rollout/training mismatch every step and, with ``algo.rollout_correction``,
  weights the policy loss by the truncated (TIS) or masked (MIS) importance ratio pi_old / pi_rollout, as TRL's
  ``vllm_importance_sampling_correction`` (``token_truncate`` / ``token_mask`` / ``sequence_*``) and verl's
  rollout IS do (``mmrlvr.algos.rollout_correction``; ``algo.rollout_correction_params``: cap 3.0 as TRL, verl's is
  2.0; level token | sequence).
- ``frozen`` (``algo.kl_coef > 0``): the reference for the KL penalty — the adapter-disabled policy for LoRA runs
  (exactly the base model, no second copy) or a frozen copy of the initial weights for full fine-tuning.
- ``teacher`` (``algo.advantage: opd``): on-policy distillation's teacher (``mmrlvr.train.teacher``) scores the
  sampled tokens teacher-forced (``teacher_logprobs``), and — after ``old_policy``, so π_old is the training model's
  — the stage completes the advantages: A_t = −(log π_old − log π_teacher) + reward_weight · A_grpo [N, L]
  (``mmrlvr.algos.opd``; the ``opd`` advantages stage wrote A_grpo). π_old is recomputed by default under OPD
  (``recompute_enabled``): the student's and the teacher's log-probs then come from the same teacher-forced pass, so
  a teacher with the policy's weights gives advantages of exactly 0.
"""

from __future__ import annotations

import contextlib
from typing import Any

from mmrlvr.errors import UserError
from mmrlvr.lazy_import import lazy_module
from mmrlvr.metric import Metric
from mmrlvr.run_settings import recompute_enabled
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.stages.base import Stage, register_stage

torch = lazy_module("torch")  # selection (config checks) runs without torch; the stages' work imports it


def note_agreement(b: StepBatch, vision_start_id: int, trainer: torch.Tensor, sampler: torch.Tensor) -> None:
    """The step's rollout/trainer agreement (``mmrlvr.algos.agreement``) into the batch's diagnostics, and each
    token's gap (trainer - sampler log-prob) into ``b.sampler_gap`` for the rollout records. Called by whichever
    stage first has the trainer's pi_old: this one when it recomputes it, else the update's first pass."""
    from mmrlvr.algos.agreement import after_image_mask, agreement_metrics

    rollouts = b.rollouts
    mask = rollouts.response_mask
    in_prompt = (rollouts.input_ids[:, :rollouts.prompt_length] == vision_start_id).sum(dim=1).tolist()
    head = after_image_mask(mask, in_prompt, rollouts.turns)
    b.diagnostics.update(agreement_metrics(trainer, sampler, mask, head))
    b.sampler_gap = torch.where(mask > 0, trainer.float() - sampler.float(), torch.zeros_like(sampler, dtype=torch.float))


@register_stage("reference", "old_policy", priority=20)
class OldPolicy(Stage):
    """pi_old recomputed by the training model (off-policy passes, or a vLLM sampler), with the rollout correction."""

    selected_by = ("algo.recompute_old_logprobs",)
    reads = ("algo.recompute_old_logprobs", "algo.rollout_correction", "algo.rollout_correction_params.")
    when_text = ("algo.epochs > 1, rollout.engine: vllm, algo.advantage: opd or algo.recompute_old_logprobs: true "
                 "(the default HF engine with one epoch samples with the training weights, so its pi_old needs no "
                 "recompute)")

    @classmethod
    def reason(cls, cfg) -> str:
        a = cfg.algo
        if a.recompute_old_logprobs:
            return "algo.recompute_old_logprobs: true"
        if a.epochs > 1:
            return f"algo.epochs: {a.epochs}"
        if cfg.rollout.engine != "vllm" and a.advantage == "opd":
            return "algo.advantage: opd"
        return f"rollout.engine: {cfg.rollout.engine}"

    @classmethod
    def when(cls, cfg) -> bool:
        return recompute_enabled(cfg)

    @classmethod
    def plan_params(cls, cfg) -> dict[str, Any]:
        from mmrlvr.methods import configured

        name, params = configured(cfg, "rollout_correction")
        return {"algo.rollout_correction": name, **{f"algo.rollout_correction_params.{k}": v for k, v in params.items()}}

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.algos.rollout_correction import ROLLOUT_CORRECTIONS
        from mmrlvr.methods import configured

        name, self.correction_params = configured(self.cfg, "rollout_correction")  # names and ranges checked at load
        self.correction = ROLLOUT_CORRECTIONS.get(name)

    def __call__(self, b: StepBatch) -> None:
        from mmrlvr.algos.masked import zero_masked
        from mmrlvr.train.forward import prefix_sharing, token_logprobs

        rt, rollouts = self.rt, b.rollouts
        mask = rollouts.response_mask
        out = []
        rt.model.eval()
        with torch.no_grad():
            for rows in rt.micro_slices(rollouts.num_rows):
                lp, _ = token_logprobs(rt.policy, rt.inputs(rollouts, b.vision, b.images_per_row, rows),
                                       rollouts.response_ids[rows], self.cfg.rollout.temperature,
                                       **prefix_sharing(self.cfg, rollouts))
                out.append(lp)
        train = zero_masked(torch.cat(out), mask > 0)
        sampler = rollouts.old_logprobs
        valid = mask > 0
        diff = (train - sampler)[valid]
        ratio = diff.clamp(-20, 20).exp()
        note_agreement(b, rt.vision_start_id, train, sampler)
        if diff.numel():  # percentiles do not combine exactly over processes: means over the tokens they were taken from
            n = diff.numel()
            q = torch.quantile(ratio.double(), torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64)).tolist()
            b.diagnostics.update({"rollout/is_ratio_p01": Metric.mean(q[0], n=n),
                                  "rollout/is_ratio_p50": Metric.mean(q[1], n=n),
                                  "rollout/is_ratio_p99": Metric.mean(q[2], n=n),
                                  "rollout/is_ratio_max": Metric.max(float(ratio.max()))})
        w = self.correction(train, sampler, mask, **self.correction_params)
        if w is not None:
            from mmrlvr.algos.rollout_correction import ratios

            b.is_weights = w
            level = self.correction_params.get("level", "token")
            changed = w[valid] != ratios(train, sampler, mask, level)[valid]  # truncated or masked by the cap
            b.diagnostics["rollout/corrected_fraction"] = Metric.mean(
                float(changed.float().mean()) if diff.numel() else 0.0, n=diff.numel())
        b.rollout_logprobs = sampler
        rollouts.old_logprobs = train


@register_stage("reference", "frozen", priority=10)
class FrozenReference(Stage):
    """pi_ref for the KL term: the adapter disabled (LoRA) or a frozen copy (full fine-tuning)."""

    selected_by = ("algo.kl_coef",)
    reads = ("algo.kl_estimator",)
    when_text = "algo.kl_coef > 0"

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
        from mmrlvr.algos.masked import zero_masked
        from mmrlvr.train.forward import prefix_sharing, token_logprobs

        rt, rollouts = self.rt, b.rollouts
        model = rt.ref_model if rt.ref_model is not None else rt.policy
        out = []
        with torch.no_grad(), self.context():
            for rows in rt.micro_slices(rollouts.num_rows):
                lp, _ = token_logprobs(model, rt.inputs(rollouts, b.vision, b.images_per_row, rows),
                                       rollouts.response_ids[rows], self.cfg.rollout.temperature,
                                       **prefix_sharing(self.cfg, rollouts))
                out.append(lp)
        b.ref_logprobs = zero_masked(torch.cat(out), rollouts.response_mask > 0)


@register_stage("reference", "aux_losses", priority=0)
class AuxiliaryLosses(Stage):
    """This step's auxiliary loss terms (``algo.aux_losses``, ``mmrlvr.train.aux_losses``): each entry's teacher
    pass (forward CE's expert) runs here, before the update, and its term joins ``batch.aux_losses``."""

    selected_by = ("algo.aux_losses",)
    reads = ("algo.aux_losses",)
    when_text = "algo.aux_losses is not empty"

    @classmethod
    def when(cls, cfg) -> bool:
        return bool(cfg.algo.aux_losses)

    @classmethod
    def reason(cls, cfg) -> str:
        return "algo.aux_losses: " + ", ".join(str(e.get("name") if isinstance(e, dict) else e)
                                                for e in cfg.algo.aux_losses)

    @classmethod
    def plan_params(cls, cfg) -> dict:
        from mmrlvr.methods import listed_entries

        out = {}
        for i, (name, weight, params) in enumerate(listed_entries(cfg, "aux_loss")[0]):
            out[f"algo.aux_losses.{i}.name"] = name
            out[f"algo.aux_losses.{i}.weight"] = weight
            out.update({f"algo.aux_losses.{i}.params.{k}": v for k, v in params.items()})
        return out

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.methods import listed_entries
        from mmrlvr.train.aux_losses import AUX_LOSSES

        entries, problems = listed_entries(self.cfg, "aux_loss")
        if problems:
            from mmrlvr.errors import ConfigErrors

            raise ConfigErrors(problems)
        self.terms = [AUX_LOSSES.get(name)(rt, weight=weight, **params) for name, weight, params in entries]

    def __call__(self, b: StepBatch) -> None:
        for term in self.terms:
            part = term.prepare(b)
            if part is not None:
                b.aux_losses.append(part)

    def state_dict(self):
        states = [getattr(t, "state_dict", lambda: None)() for t in self.terms]
        return None if all(s is None for s in states) else {"terms": states}

    def load_state_dict(self, state) -> None:
        for term, s in zip(self.terms, state.get("terms", [])):
            if s is not None:
                term.load_state_dict(s)


@register_stage("reference", "teacher", priority=15)
class TeacherLogprobs(Stage):
    """On-policy distillation (``algo.advantage: opd``): the frozen teacher's log-probs of the sampled tokens, then
    the per-token advantages.

    Runs after ``old_policy`` (priority 20), so ``rollouts.old_logprobs`` is the training model's π_old (recomputed by
    default under OPD; with ``algo.recompute_old_logprobs: false`` it is the sampler's, as the Thinking Machines
    recipe reads it). The teacher sees the policy's own inputs (``Runtime.inputs``): the same token ids, the same
    processed images and videos through its own vision tower — once per distinct prompt when the policy caches its
    frozen tower's features (a cache of the teacher's own), the policy's cached features themselves when the two
    towers are identical (the student's own earlier checkpoint with ``model.freeze_vision``), raw pixels when the
    policy has no cache — at the sampling temperature, prefix sharing as the policy's passes.

    Writes ``teacher_logprobs`` [N, L] (0 on padding), ``advantages`` [N, L] (``mmrlvr.algos.opd.opd_advantages``
    from the ``opd`` advantages stage's [N] reward term), ``opd/reverse_kl`` (mean of log π_old − log π_teacher over
    the response tokens of the batch's rows, weighted by that count over processes), ``opd/tokens`` and
    ``time/opd_teacher_s``; the rollout records carry each token's teacher log-prob (``extra.teacher_logprob``)."""

    selected_by = ("algo.advantage",)
    reads = ("algo.advantage_params.",)
    when_text = "algo.advantage: opd"

    @classmethod
    def when(cls, cfg) -> bool:
        return cfg.algo.advantage == "opd"

    def __init__(self, rt) -> None:
        super().__init__(rt)
        from mmrlvr.methods import configured
        from mmrlvr.train.teacher import load_teacher, same_vision_tower

        params = configured(self.cfg, "advantage")[1]
        self.spec, self.reward_weight = str(params["teacher"]), float(params["reward_weight"])
        self.teacher = load_teacher(rt, self.spec, "algo.advantage_params.teacher")
        self.shares_vision = bool(self.cfg.model.freeze_vision) and same_vision_tower(rt.policy, self.teacher)

    def vision(self, b: StepBatch):
        """The vision inputs of this step's teacher passes (see the class docstring), or None: raw pixels."""
        if b.vision is None:
            return None
        if self.shares_vision:
            return b.vision
        from mmrlvr.algos.cpu_linear import onednn_linears
        from mmrlvr.train.forward import VisionFeatureCache

        rollouts = b.rollouts
        with torch.no_grad(), onednn_linears(self.teacher):  # as the engine encodes the policy's
            cache = VisionFeatureCache(self.teacher, rollouts.vision, b.images_per_row, rollouts.rows_sharing_images())
        return cache if cache.ok else None

    def logprobs(self, b: StepBatch) -> torch.Tensor:
        """The teacher's log-probs of the sampled tokens [N, L], 0 on padding (no gradient)."""
        from mmrlvr.algos.masked import zero_masked
        from mmrlvr.train.forward import prefix_sharing, token_logprobs

        rt, rollouts = self.rt, b.rollouts
        vision = self.vision(b)
        out = []
        with torch.no_grad():
            for rows in rt.micro_slices(rollouts.num_rows):
                lp, _ = token_logprobs(self.teacher, rt.inputs(rollouts, vision, b.images_per_row, rows),
                                       rollouts.response_ids[rows], self.cfg.rollout.temperature,
                                       **prefix_sharing(self.cfg, rollouts))
                out.append(lp.float())
        return zero_masked(torch.cat(out), rollouts.response_mask > 0)

    def __call__(self, b: StepBatch) -> None:
        import time

        from mmrlvr.algos.opd import opd_advantages, reverse_kl_tokens

        t0 = time.perf_counter()
        rollouts = b.rollouts
        reward_term = b.advantages
        if reward_term is None or reward_term.dim() != 1:
            raise RuntimeError("the teacher reference stage completes the opd advantages stage's [N] reward term; got "
                               f"{None if reward_term is None else tuple(reward_term.shape)} (stages.advantages must "
                               "be opd)")
        teacher = self.logprobs(b)
        b.teacher_logprobs = teacher
        mask = rollouts.response_mask > 0
        if b.row_mask is not None:  # rows outside the batch (dropped groups) carry nothing
            mask = mask & b.row_mask[:, None]
        mask = mask.to(torch.float32)
        student = rollouts.old_logprobs
        b.advantages = opd_advantages(student, teacher, mask, reward_term, self.reward_weight)
        tokens = float(mask.sum())
        kl = float(reverse_kl_tokens(student, teacher, mask).sum())
        b.diagnostics.update({"opd/reverse_kl": Metric.mean(kl / tokens if tokens else 0.0, n=tokens),
                              "opd/tokens": Metric.sum(tokens),
                              "time/opd_teacher_s": Metric.max(time.perf_counter() - t0)})
        b.record_fields["teacher_logprob"] = [[float(x) for x in teacher[i, :rollouts.response_extent(i)].tolist()]
                                              for i in range(rollouts.num_rows)]
