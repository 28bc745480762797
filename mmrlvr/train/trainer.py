"""The GRPO-family training loop: rollout -> rewards -> advantages -> credit -> policy update -> store.

Reads top to bottom: ``Trainer.train`` calls ``run_step`` for each step, and ``run_step`` calls one
method per stage of the data path (DESIGN.md). All math lives in ``mmrlvr.algos`` / ``mmrlvr.credit``;
this module only moves typed values between stages, handles devices/processes through ``accelerate``,
and writes the run directory.

Multi-process (``accelerate launch --num_processes N``): every process builds the same global batch of
prompts (``DataOrder``), takes its contiguous shard, samples its groups, and normalises its loss by the
*global* token (or sequence) count, so DDP's gradient average reproduces the single-process gradient.

Deliberately simple: one optimizer step per pass over the rollout batch (``algo.epochs`` passes), the
reference policy is the LoRA-disabled model (or a frozen copy for full fine-tuning).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmrlvr.config import RunConfig
from mmrlvr.errors import UserError
from mmrlvr.rollout.base import RolloutBatch, SamplingParams
from mmrlvr.train.data import DataOrder, load_split, shard
from mmrlvr.train.forward import LOGPROB_CHUNK, VisionFeatureCache, response_logits, slice_inputs, token_logprobs
from mmrlvr.train.metrics import MetricsWriter


@dataclass
class StepData:
    """Everything one step computed before the update, for the loss and for the rollout records."""

    batch: RolloutBatch
    rewards: torch.Tensor  # [N]
    results: list  # N RewardResult
    advantages: torch.Tensor  # [N], or [N, L] per token (consistency.scope: answer); after credit scaling
    token_weights: torch.Tensor  # [N, L] response mask times credit weights
    ref_logprobs: torch.Tensor | None  # [N, L]
    extra_loss: torch.Tensor | None  # [N, L] per-token term from the credit scheme (PAPO)
    signals: Any  # credit TokenSignals or None
    credit_stats: dict[str, float]
    vision: VisionFeatureCache | None
    images_per_row: list[int]
    token_entropy: torch.Tensor | None = None  # [N, L] from the first update pass (for the store)
    token_ratio: torch.Tensor | None = None  # [N, L] pi/pi_old in the first update pass
    deferred: Any = None  # DeferredCredit: credit computed inside the first update pass (VEPO, entropy top-k)


class NonFiniteLoss(RuntimeError):
    pass


def _agg_denominator(weights: torch.Tensor, mode: str) -> float:
    """What ``agg_loss(mode)`` divides by for these [n, L] weights: tokens, live rows, or rows."""
    if mode == "token-mean":
        return float(weights.sum())
    if mode == "seq-mean-token-mean":
        return float((weights.sum(dim=1) > 0).sum())
    return float(weights.shape[0])


def load_plugins(plugins: list[str]) -> None:
    """Import user modules (``pkg.module``) or files (``path/to/rewards.py``) so their registrations run."""
    import importlib
    import importlib.util
    import sys

    for spec in plugins:
        if spec.endswith(".py"):
            path = Path(spec)
            if not path.is_file():
                raise UserError(f"plugins: {spec}: no such file")
            name = f"mmrlvr_plugin_{path.stem}"
            if name in sys.modules:
                continue
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        else:
            try:
                importlib.import_module(spec)
            except ImportError as exc:
                raise UserError(f"plugins: cannot import {spec!r}: {exc}") from None


class Trainer:
    def __init__(self, cfg: RunConfig, *, resume: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.output_dir)
        self.resume = resume
        self._setup()

    # ------------------------------------------------------------------------------------------ setup
    def _setup(self) -> None:
        from accelerate import Accelerator

        cfg = self.cfg
        load_plugins(cfg.plugins)
        self.accel = Accelerator(cpu=not torch.cuda.is_available())
        self.is_main = self.accel.is_main_process
        torch.manual_seed(cfg.seed)
        if not cfg.model.path:
            raise UserError("model.path: no model folder given (build one with `mmrlvr tiny build`)")
        from mmrlvr.models import load_policy

        from mmrlvr.train.model_path import resolve_model_path

        model_path = resolve_model_path(cfg.model.path) if self.accel.is_main_process else None
        self.accel.wait_for_everyone()
        model_path = model_path or resolve_model_path(cfg.model.path)  # built by the main process by now
        model, self.processor = load_policy(
            model_path, dtype=cfg.model.dtype, device=str(self.accel.device),
            attn_implementation=cfg.model.attn_implementation,
        )
        self.ref_model = None
        if cfg.model.freeze_vision:
            from mmrlvr.models.lora import freeze_vision

            freeze_vision(model)
        if cfg.model.lora.enabled:
            from mmrlvr.models.lora import apply_lora

            lc = cfg.model.lora
            model = apply_lora(model, r=lc.r, alpha=lc.alpha, dropout=lc.dropout,
                               target_modules=tuple(lc.target_modules), init=lc.init)
        elif cfg.algo.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise UserError("model: no trainable parameters (check model.lora and model.freeze_vision)")
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                           weight_decay=cfg.optim.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self.model, self.optimizer = self.accel.prepare(model, self.optimizer)
        self.policy = self.accel.unwrap_model(self.model)
        self.engine = self._build_engine()
        self.reward = self._build_reward()
        for fn in self._reward_fns():
            if getattr(fn, "needs_policy", False):
                fn.attach_policy(self.policy, self.processor)  # e.g. GRPO-CARE's EMA reference
        self.train_samples = load_split(cfg.data.train, cfg.data, "train")
        self.eval_samples = load_split(cfg.data.eval, cfg.data, "test") if cfg.data.eval else []
        if cfg.eval.limit:
            self.eval_samples = self.eval_samples[: cfg.eval.limit]
        self.order = DataOrder(len(self.train_samples), cfg.rollout.prompts_per_step, cfg.seed)
        self.credit = self._build_credit()
        from mmrlvr.train.deferred_credit import can_defer

        self.defer_credit = cfg.credit.scheme != "none" and cfg.credit.in_update and can_defer(self.credit)
        tok = getattr(self.processor, "tokenizer", self.processor)
        self.vision_start_id = tok.convert_tokens_to_ids("<|vision_start|>")
        self.metrics = MetricsWriter(self.run_dir, tensorboard=cfg.tensorboard, enabled=self.is_main)
        self.writer = None
        if cfg.log_rollouts and self.is_main:
            from mmrlvr.store.writer import RolloutWriter

            self.writer = RolloutWriter(self.run_dir, run_id=self.run_dir.name)
        self.start_step = 0
        self.bad_steps = 0
        self.skipped_steps = 0

    def _lr_lambda(self, step: int) -> float:
        o = self.cfg.optim
        if o.warmup_steps and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        total = max(1, self.cfg.max_steps - o.warmup_steps)
        frac = min(1.0, max(0, step - o.warmup_steps) / total)
        if o.schedule == "linear":
            return 1.0 - frac
        if o.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * frac))
        return 1.0

    def _build_engine(self):
        if self.cfg.rollout.engine == "vllm":
            from mmrlvr.rollout.vllm import VLLMEngine

            return VLLMEngine.from_config(self.cfg, self.policy, self.processor)
        from mmrlvr.rollout.hf import HFEngine

        return HFEngine(self.policy, self.processor)

    def _build_reward(self):
        from mmrlvr.rewards.combine import CombinedReward, RewardSpec

        specs = [RewardSpec(s.name, s.weight, dict(s.params)) for s in self.cfg.rewards]
        for spec in specs:
            if spec.name == "rubric" and self.cfg.rubric.judge != "none":
                spec.params.setdefault("judge", self.cfg.rubric.judge)
                spec.params.setdefault("judge_params", dict(self.cfg.rubric.judge_params))
            if spec.name in ("rubric", "consistency"):
                spec.params.setdefault("group_size", self.cfg.rollout.group_size)
        return CombinedReward(specs)

    def _reward_fns(self) -> list:
        return list(getattr(self.reward, "fns", [self.reward]))

    def _build_credit(self):
        from mmrlvr.credit import build_scheme

        return build_scheme(self.cfg.credit.scheme, **self.cfg.credit.params)

    # ------------------------------------------------------------------------------------------- loop
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            from mmrlvr.store.atomic import atomic_write_text

            atomic_write_text(self.run_dir / "config.yaml", cfg.to_yaml())
        if self.resume:
            self._resume()
        summary: dict[str, Any] = {}
        if cfg.eval.at_start and self.eval_samples and self.start_step == 0:
            summary["before"] = self.evaluate(step=0)
        from tqdm.auto import tqdm

        bar = tqdm(range(self.start_step, cfg.max_steps), desc="train", disable=not (cfg.progress and self.is_main),
                   initial=self.start_step, total=cfg.max_steps, dynamic_ncols=True)
        last: dict[str, Any] = {}
        try:
            for step in bar:
                last = self.run_step(step)
                bar.set_postfix({k: f"{last[k]:.3f}" for k in ("reward/mean", "accuracy") if k in last})
                done = step + 1
                if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.max_steps and self.eval_samples:
                    self.evaluate(step=done)
                if cfg.save_every and done % cfg.save_every == 0 and done < cfg.max_steps:
                    self.save(done)
            if cfg.max_steps > self.start_step or not (self.run_dir / "checkpoints").exists():
                self.save(cfg.max_steps)
            if cfg.eval.at_end and self.eval_samples:
                summary["after"] = self.evaluate(step=cfg.max_steps)
        finally:
            bar.close()
            if self.writer is not None:
                self.writer.close()
            self.metrics.close()
        summary["last"] = last
        summary["skipped_steps"] = self.skipped_steps
        return summary

    def run_step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        data = self.collect(step)
        t_gen = data.batch.timings.get("generate_s", 0.0)
        t1 = time.perf_counter()
        try:
            stats = self.update(data)
            self.engine.sync_weights(self.policy)  # no-op for hf; pushes weights / adapter into vLLM
            self.bad_steps = 0
        except NonFiniteLoss as exc:
            self.optimizer.zero_grad(set_to_none=True)
            self.bad_steps += 1
            self.skipped_steps += 1
            stats = {"skipped": 1.0}
            if self.bad_steps >= self.cfg.max_bad_steps:
                raise RuntimeError(f"step {step}: {self.bad_steps} consecutive steps with a non-finite loss "
                                   f"({exc}); stopping (max_bad_steps={self.cfg.max_bad_steps})") from exc
        t2 = time.perf_counter()
        metrics = self.step_metrics(data, stats)
        metrics.update({"time/step_s": t2 - t0, "time/generate_s": t_gen, "time/train_s": t2 - t1,
                        "lr": self.scheduler.get_last_lr()[0]})
        metrics = self._reduce_metrics(metrics)
        # step numbers in files are 1-based: "step k" = the k-th update (and the rollouts it learned from)
        self.metrics.log(step + 1, metrics)
        if self.writer is not None:
            self.write_records(step + 1, data)
        return metrics

    # ------------------------------------------------------------------------------------ stages
    def collect(self, step: int) -> StepData:
        """Rollout, rewards, advantages, credit and reference log-probs for one step (no gradients)."""
        cfg = self.cfg
        idx = shard(self.order.indices(step), self.accel.process_index, self.accel.num_processes)
        samples = [self.train_samples[i] for i in idx]
        params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k)
        self.model.eval()
        t0 = time.perf_counter()
        batch = self.engine.generate(samples, cfg.rollout.group_size, params, seed=cfg.seed, step=step)
        batch.timings.setdefault("generate_s", time.perf_counter() - t0)
        batch.timings["step"] = step
        from mmrlvr.rewards.base import score_batch

        results = score_batch(self.reward, batch.completions, batch.samples)
        self._reward_metrics = {}
        for fn in self._reward_fns():  # per-call statistics of rewards that keep them (judge/unknown_rate, ...)
            if hasattr(fn, "metrics"):
                self._reward_metrics.update(fn.metrics())
        rewards = torch.tensor([r.score for r in results], dtype=torch.float32)
        rewards = rewards + self._overlong(batch)
        advantages = self.advantages(rewards, results, batch, step)
        # count images in the prompt part only: a response may itself contain a <|vision_start|> token
        images_per_row = (batch.input_ids[:, :batch.prompt_length] == self.vision_start_id).sum(dim=1).tolist()
        vision = None
        if cfg.model.freeze_vision:
            vision = VisionFeatureCache(self.policy, batch.vision, images_per_row, cfg.rollout.group_size,
                                        features=batch.image_features)
            vision = vision if vision.ok else None
        weights = batch.response_mask.clone()
        if cfg.algo.mask_truncated:
            trunc = torch.tensor([c.finish_reason == "length" for c in batch.completions])
            weights[trunc] = 0.0
        if cfg.algo.dynamic_sampling:
            # DAPO: groups whose rewards are all equal leave the loss and its normaliser (not refilled:
            # the step trains on the groups that carry signal)
            from mmrlvr.algos import dynamic_sampling_filter

            keep = dynamic_sampling_filter(rewards, batch.group_index)[batch.group_index]  # [N] bool
            weights[~keep] = 0.0
        signals, extra_loss, credit_stats, deferred = None, None, {}, None
        if cfg.credit.scheme != "none" and self.defer_credit:
            from mmrlvr.credit.signals import response_hidden
            from mmrlvr.train.deferred_credit import DeferredCredit

            pert = None
            if self.credit.needs_perturbed:
                pert = response_hidden(self.policy, self._perturbed_inputs(batch, step), batch.prompt_length,
                                       batch.response_ids.shape[1], rows_per_prompt=cfg.rollout.group_size)
            deferred = DeferredCredit(self.credit, pert, weights.clone(), advantages.clone(),
                                      cfg.credit.chunk_size, cfg.rollout.temperature)
        elif cfg.credit.scheme != "none":
            clean = self._inputs(batch, vision, images_per_row, slice(0, batch.num_rows))
            signals, credit = self.credit_pass(batch, clean, advantages, weights, step)
            weights = weights * credit.token_weights
            advantages = advantages * (credit.adv_scale if advantages.dim() == 1 else credit.adv_scale[:, None])
            extra_loss = credit.extra_loss
            credit_stats = dict(credit.stats)
        ref = self.reference_logprobs(batch, vision, images_per_row) if cfg.algo.kl_coef > 0 else None
        return StepData(batch, rewards, results, advantages, weights, ref, extra_loss, signals,
                        credit_stats, vision, images_per_row, deferred=deferred)

    def _overlong(self, batch: RolloutBatch) -> torch.Tensor:
        cache = self.cfg.algo.overlong_cache
        if cache <= 0:
            return torch.zeros(batch.num_rows)
        from mmrlvr.algos import overlong_penalty

        lengths = batch.response_mask.sum(dim=1)
        return overlong_penalty(lengths, self.cfg.rollout.max_new_tokens, cache, self.cfg.algo.overlong_penalty)

    def advantages(self, rewards: torch.Tensor, results: list, batch: RolloutBatch, step: int) -> torch.Tensor:
        """Group-relative advantages [N]; CORA-style splitting when configured ([N, L] with
        ``consistency.scope: answer``)."""
        from mmrlvr.algos import ADVANTAGES

        cc = self.cfg.consistency
        if cc.split_advantage:
            from mmrlvr.algos import split_advantages
            from mmrlvr.consistency.bonus import beta_schedule

            cons_w = next(s.weight for s in self.cfg.rewards if s.name == cc.component)
            cons = torch.tensor([r.components.get(cc.component, 0.0) for r in results], dtype=torch.float32)
            task = rewards - cons_w * cons
            beta = beta_schedule(step, cc.beta_warmup_steps, cc.beta_decay_steps, cc.beta, cc.beta_min)
            if cc.scope == "answer":  # [N, L]: the consistency term reaches the answer's tokens only
                from mmrlvr.algos import token_split_advantages
                from mmrlvr.consistency.spans import answer_token_mask

                m = answer_token_mask([c.text for c in batch.completions], batch.response_ids,
                                      batch.response_mask, getattr(self.processor, "tokenizer", self.processor))
                return token_split_advantages(task, cons, batch.group_index, m, cc.alpha, beta)
            return split_advantages(task, cons, batch.group_index, cc.alpha, beta)
        return ADVANTAGES.get(self.cfg.algo.advantage)(rewards, batch.group_index)

    def credit_pass(self, batch: RolloutBatch, clean_inputs: dict[str, Any], advantages: torch.Tensor,
                    weights: torch.Tensor, step: int):
        """Per-token signals (plus one forward on the perturbed image when the scheme needs it) -> credit.

        For schemes that are not deferred into the update (VPPO, PAPO: they read only the perturbed pass)."""
        from mmrlvr.credit import token_signals_from_model

        cc = self.cfg.credit
        scheme = self.credit
        pert_inputs = self._perturbed_inputs(batch, step) if scheme.needs_perturbed else None
        # the clean full-vocabulary pass is needed for entropy/JSD (VEPO, entropy top-k, RSI); VPPO and
        # PAPO read only the perturbed pass's sampled-token log-probs
        distribution = scheme.needs_distribution or not scheme.needs_perturbed
        with torch.no_grad():
            signals = token_signals_from_model(
                self.policy, clean_inputs if distribution else None, pert_inputs, batch.prompt_length,
                batch.response_ids, batch.response_mask, chunk_size=cc.chunk_size,
                temperature=self.cfg.rollout.temperature, old_logprobs=batch.old_logprobs,
                distribution=distribution, rows_per_prompt=self.cfg.rollout.group_size,
            )
        return signals, scheme(signals, weights, advantages, old_logprobs=batch.old_logprobs)

    def _perturbed_inputs(self, batch: RolloutBatch, step: int) -> dict[str, Any]:
        """Model inputs with the scheme's (or the configured) perturbation of the images, seeded per step."""
        from mmrlvr.credit import perturb_vision

        cc = self.cfg.credit
        name, params = self.credit.perturbation or ("gaussian", {})
        if cc.perturbation:
            name, params = cc.perturbation, {}
        params = {**params, **cc.perturbation_params}
        vision = perturb_vision(batch.vision, name, seed=self.cfg.seed * 1_000_003 + step,
                                processor=self.processor, **params)
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, **vision}

    def _inputs(self, batch: RolloutBatch, vision: VisionFeatureCache | None, images_per_row: list[int],
                rows: slice) -> dict[str, Any]:
        if vision is not None:
            return vision.inputs(batch.input_ids, batch.attention_mask, rows)
        return slice_inputs(batch.model_inputs(), rows, images_per_row)

    def _micro_slices(self, n: int) -> list[slice]:
        mbs = self.cfg.algo.micro_batch_size
        return [slice(i, min(n, i + mbs)) for i in range(0, n, mbs)]

    def _reference_context(self):
        if self.ref_model is not None:
            return contextlib.nullcontext()
        disable = getattr(self.policy, "disable_adapter", None)
        if disable is None:
            raise UserError("algo.kl_coef > 0 needs a reference: use model.lora.enabled or full fine-tuning")
        return disable()

    def reference_logprobs(self, batch: RolloutBatch, vision, images_per_row) -> torch.Tensor:
        model = self.ref_model if self.ref_model is not None else self.policy
        out = []
        with torch.no_grad(), self._reference_context():
            for rows in self._micro_slices(batch.num_rows):
                lp, _ = token_logprobs(model, self._inputs(batch, vision, images_per_row, rows),
                                       batch.response_ids[rows], self.cfg.rollout.temperature)
                out.append(lp)
        from mmrlvr.algos import zero_masked

        return zero_masked(torch.cat(out), batch.response_mask > 0)

    def _global_sum(self, value: float) -> float:
        if self.accel.num_processes == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.accel.device)
        return float(self.accel.reduce(t, reduction="sum").item())

    def update(self, data: StepData) -> dict[str, float]:
        """``algo.epochs`` passes over the rollout batch, one optimizer step each."""
        from mmrlvr.algos import KL_ESTIMATORS, POLICY_LOSSES, agg_loss

        cfg, a = self.cfg, self.cfg.algo
        batch, weights = data.batch, data.token_weights
        loss_fn = POLICY_LOSSES.get(a.loss)
        kl_fn = KL_ESTIMATORS.get(a.kl_estimator) if a.kl_coef > 0 else None
        # normaliser of the whole global batch, so micro-batches and processes add up to one mean. With
        # credit computed inside the first pass, a micro-batch's token weights exist only after its forward:
        # that pass backpropagates unnormalised sums and divides the gradients by the normaliser at the end
        deferred = data.deferred if data.deferred is not None and not data.deferred.done else None
        global_den = None if deferred is not None else self._global_sum(_agg_denominator(weights, a.agg))
        norm_constant = float(cfg.rollout.max_new_tokens)
        self.model.train()
        # NSR's random rescue is seeded per step so a resumed run draws the same noise
        self._loss_generator = torch.Generator().manual_seed(self.cfg.seed * 7_919 + int(batch.timings.get("step", 0)))
        totals: dict[str, float] = {}
        self._recorded_rows: dict[int, bool] = {}  # rows whose first-pass entropy/ratio are stored
        for _epoch in range(a.epochs):
            slices = self._micro_slices(batch.num_rows)
            den_sum, epoch_loss = 0.0, 0.0
            for i, rows in enumerate(slices):
                sync = contextlib.nullcontext() if i == len(slices) - 1 else self.accel.no_sync(self.model)
                with sync:
                    stats = self._micro_step(data, rows, loss_fn, kl_fn, global_den, a.agg, norm_constant)
                den_sum += stats.pop("den")
                epoch_loss += stats.pop("loss")
                for k, v in stats.items():
                    totals[k] = max(totals.get(k, v), v) if k == "ratio_max" else totals.get(k, 0.0) + v
            if global_den is None:  # the deferred-credit pass: now the normaliser is known
                global_den = self._global_sum(den_sum)
                inv = 1.0 / max(global_den, 1e-8)
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(inv)
                epoch_loss *= inv
                data.signals, data.credit_stats = deferred.finish(batch.old_logprobs)
            totals["loss"] = totals.get("loss", 0.0) + epoch_loss
            grad_norm = self._optimizer_step()
            totals["grad_norm"] = totals.get("grad_norm", 0.0) + grad_norm
        passes = a.epochs
        return {k: (v / passes if k in ("grad_norm", "loss", "kl", "policy_loss") else v) for k, v in totals.items()}

    def _micro_step(self, data: StepData, rows: slice, loss_fn, kl_fn, global_den: float | None, agg_mode: str,
                    norm_constant: float) -> dict[str, float]:
        from mmrlvr.algos import agg_loss, call_policy_loss

        cfg, a, batch = self.cfg, self.cfg.algo, data.batch
        inputs = self._inputs(batch, data.vision, data.images_per_row, rows)
        mask = batch.response_mask[rows]
        dc = data.deferred if data.deferred is not None and not data.deferred.done else None
        if dc is not None:  # credit from this pass's own clean logits (mmrlvr.train.deferred_credit)
            from mmrlvr.algos import logprobs_from_logits

            logits = response_logits(self.model, inputs, batch.response_ids.shape[1])
            logp = logprobs_from_logits(logits, batch.response_ids[rows], temperature=cfg.rollout.temperature,
                                        chunk_size=LOGPROB_CHUNK)
            w, adv, ent = dc.apply(rows, logits, batch.response_ids[rows], mask, batch.old_logprobs[rows])
            data.token_weights[rows] = w
            data.advantages[rows] = adv
            del logits
        else:
            logp, ent = token_logprobs(self.model, inputs, batch.response_ids[rows], cfg.rollout.temperature,
                                       with_entropy=True)
        w = data.token_weights[rows]
        if data.token_ratio is None:
            data.token_entropy = torch.zeros_like(batch.old_logprobs)
            data.token_ratio = torch.zeros_like(batch.old_logprobs)
        if not self._recorded_rows.get(rows.start):
            self._recorded_rows[rows.start] = True
            with torch.no_grad():
                valid = mask > 0
                data.token_ratio[rows] = torch.where(valid, (logp.detach() - batch.old_logprobs[rows]).clamp(-20, 20).exp(), 0.0)
                if ent is not None:
                    data.token_entropy[rows] = torch.where(valid, ent, 0.0)
        loss_tok, lstats = call_policy_loss(a.loss, logp, batch.old_logprobs[rows], data.advantages[rows], w,
                                            generator=self._loss_generator, **self._loss_params())
        kl_val = 0.0
        if kl_fn is not None:
            kl_tok = kl_fn(logp, data.ref_logprobs[rows], mask=mask)
            loss_tok = loss_tok + a.kl_coef * kl_tok
            kl_val = float((kl_tok.detach() * mask).sum())
        if data.extra_loss is not None:
            # the scheme's term is defined over the whole batch: place this micro-batch's log-probs
            # (with gradient) into a full-size tensor, then keep its rows
            full = batch.old_logprobs.index_copy(0, torch.arange(rows.start, rows.stop), logp)
            loss_tok = loss_tok + data.extra_loss(full)[rows]
        local_den = _agg_denominator(w, agg_mode)
        loss = agg_loss(loss_tok, w, a.agg, norm_constant=norm_constant)
        # agg_loss normalises by this micro-batch; rescale to the global normaliser (times world size,
        # because DDP averages gradients over processes). global_den None: leave the sum (update divides)
        scale = local_den if global_den is None else local_den / max(global_den, 1e-8)
        scale = scale * self.accel.num_processes
        loss = loss * scale
        if not torch.isfinite(loss):
            raise NonFiniteLoss(f"loss is {loss.item()}")
        self.accel.backward(loss)
        n_tok = float(mask.sum())
        return {
            "loss": float(loss.detach()) / self.accel.num_processes, "den": local_den,
            "kl_sum": kl_val, "tokens": n_tok,
            "entropy_sum": float((ent * mask).sum()) if ent is not None else 0.0,
            "clip_sum": float(getattr(lstats, "clip_fraction", 0.0)) * n_tok,
            "ratio_sum": float(getattr(lstats, "ratio_mean", 1.0)) * n_tok,
            "ratio_max": float(getattr(lstats, "ratio_max", 1.0)),
        }

    def _loss_params(self) -> dict[str, Any]:
        a = self.cfg.algo
        params: dict[str, Any] = {"eps_low": a.eps_low, "eps_high": a.eps_high}
        if a.loss in ("ppo_clip", "nsr"):
            params["dual_clip"] = a.dual_clip
        if a.loss == "nsr":
            params["noise"] = a.nsr_noise
        return params

    def _optimizer_step(self) -> float:
        clip = self.cfg.optim.grad_clip
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is not None and not torch.isfinite(p.grad).all():
                raise NonFiniteLoss("non-finite gradient")
        if clip > 0:
            norm = self.accel.clip_grad_norm_(params, clip)
        else:
            norm = torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in params if p.grad is not None))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._optimizer_steps = getattr(self, "_optimizer_steps", 0) + 1
        for fn in self._reward_fns():
            hook = getattr(fn, "on_optimizer_step", None)
            if hook is not None:
                hook(self.policy, self._optimizer_steps)
        return float(norm)

    # --------------------------------------------------------------------------------- metrics/records
    def step_metrics(self, data: StepData, stats: dict[str, float]) -> dict[str, Any]:
        from mmrlvr.train.step_metrics import rollout_metrics

        m = rollout_metrics(data.batch, data.rewards, data.results, self.cfg.rollout.group_size)
        tokens = max(stats.get("tokens", 0.0), 1.0)
        if "tokens" in stats:
            m.update({
                "loss": stats["loss"], "grad_norm": stats["grad_norm"],
                "kl": stats["kl_sum"] / tokens, "entropy/mean": stats["entropy_sum"] / tokens,
                "clip_fraction": stats["clip_sum"] / tokens, "ratio/mean": stats["ratio_sum"] / tokens,
                "ratio/max": stats["ratio_max"],
            })
        m["skipped"] = stats.get("skipped", 0.0)
        m.update(getattr(self, "_reward_metrics", {}))
        m.update(data.credit_stats)
        return m

    def _reduce_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        if self.accel.num_processes == 1:
            return metrics
        keys = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))
        t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=self.accel.device)
        t = self.accel.reduce(t, reduction="mean")
        return {**metrics, **{k: float(v) for k, v in zip(keys, t.tolist())}}

    def write_records(self, step: int, data: StepData) -> None:
        from mmrlvr.train.records import build_records

        records = build_records(step, data, self.processor, self.writer, self.cfg)
        self.writer.write_step(step, records)

    # ---------------------------------------------------------------------------------- eval/ckpt
    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out greedy accuracy, avg@k, pass@k, plus the inconsistency rate (and the rubric score when a
        rubric reward is configured) on the very same responses."""
        from mmrlvr.train.evaluate import EvalExtras, evaluate_samples

        self.model.eval()
        extras = EvalExtras(rubric=self._rubric_fn(), group_size=self.cfg.eval.k)
        result = evaluate_samples(self.engine, self.eval_samples, k=self.cfg.eval.k,
                                  temperature=self.cfg.eval.temperature,
                                  max_new_tokens=self.cfg.rollout.max_new_tokens, seed=self.cfg.seed,
                                  progress=self.cfg.progress and self.is_main, observe=extras)
        result.update(extras.metrics())
        metrics = {f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))}
        metrics["eval/accuracy"] = result["greedy_accuracy"]  # DESIGN.md's name for the headline number
        self.metrics.log(step, metrics)
        return result

    def _rubric_fn(self):
        for spec, fn in zip(self.cfg.rewards, self._reward_fns()):
            if spec.name == "rubric":
                # a static-weight copy: scoring held-out responses must not move POW3R's training state
                copy_for_eval = getattr(fn, "for_evaluation", None)
                return copy_for_eval(self.cfg.eval.k) if copy_for_eval else fn
        return None

    def save(self, step: int) -> None:
        from mmrlvr.train.checkpoint import save_checkpoint

        self.accel.wait_for_everyone()
        if self.is_main:
            if self.writer is not None:
                self.writer.flush()
            save_checkpoint(self.run_dir, step, self.policy, self.optimizer, self.scheduler,
                            {"config_hash": self.cfg.hash(), "lora": self._lora_info(),
                             "reward_state": self._reward_state()},
                            keep=self.cfg.keep_checkpoints)
        self.accel.wait_for_everyone()

    def _reward_state(self) -> dict[str, Any]:
        """JSON-able state of rewards that adapt during training (POW3R weights), by position."""
        return {str(i): fn.state_dict() for i, fn in enumerate(self._reward_fns()) if hasattr(fn, "state_dict")}

    def _lora_info(self) -> dict[str, Any] | None:
        lc = self.cfg.model.lora
        if not lc.enabled:
            return None
        return {"r": lc.r, "alpha": lc.alpha, "dropout": lc.dropout, "target_modules": list(lc.target_modules),
                "init": lc.init}

    def _resume(self) -> None:
        from mmrlvr.train.checkpoint import list_checkpoints, load_checkpoint

        found = list_checkpoints(self.run_dir)
        if not found:
            if self.is_main:
                print(f"resume: no complete checkpoint under {self.run_dir}/checkpoints; starting from step 0")
            return
        state = load_checkpoint(found[-1], self.policy, self.optimizer, self.scheduler)
        self.start_step = int(state["step"])
        for i, fn in enumerate(self._reward_fns()):  # e.g. POW3R criterion weights
            saved = (state.get("reward_state") or {}).get(str(i))
            if saved is not None and hasattr(fn, "load_state_dict"):
                fn.load_state_dict(saved)
        self.metrics.truncate_after(self.start_step)
        if self.is_main:
            print(f"resume: continuing from {found[-1]} (step {self.start_step})")
