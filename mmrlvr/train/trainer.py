"""The training loop: set-up, the step pipeline once per step, evaluation and checkpoint cadence, resume.

A step is a fixed sequence of named stages over one ``StepBatch`` (``mmrlvr.train.stages``; docs/architecture.md):

    generate -> score -> shape -> advantages -> reference -> credit -> update -> record

Which implementation fills each stage is chosen by name from a registry, by the config. This module only
orchestrates; the math lives in ``mmrlvr.algos`` / ``mmrlvr.credit``, the stages in ``mmrlvr.train.stages``,
the shared set-up (model, optimizer, engine, rewards, data) in ``mmrlvr.train.runtime``.

Several processes (``torchrun`` / ``accelerate launch``): every process builds the same global batch of
prompts, takes its contiguous shard, and normalises its loss by the *global* count, so DDP's gradient average
reproduces the single-process gradient.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrlvr.config import LoadedConfig, RunConfig
from mmrlvr.train.batch import StepBatch
from mmrlvr.train.metrics import MetricsWriter
from mmrlvr.train.runtime import build_runtime
from mmrlvr.train.stages import Pipeline
from mmrlvr.train.stages.record import PROGRESS_KEYS

StepData = StepBatch  # the name older code and plug-ins use


class Trainer:
    def __init__(self, config: RunConfig | LoadedConfig, *, resume: bool = False) -> None:
        """``config``: a loaded and checked config (``mmrlvr.config.load``, ``mmrlvr.validation.check_run``: its
        notes are printed, its plan reused) or a ``RunConfig`` (its sources read from its values)."""
        loaded = config if isinstance(config, LoadedConfig) else LoadedConfig.of(config)
        self.loaded = loaded
        cfg = loaded.config
        self.cfg = cfg
        self.run_dir = Path(cfg.output_dir)
        self.resume = resume
        from mmrlvr.plugins import load_plugins, load_run_plugins

        if resume:  # a plug-in file gone since the run: the run folder's copy (mmrlvr.plugins)
            load_run_plugins(self.run_dir, cfg.plugins, resume=True)
        else:
            load_plugins(cfg.plugins)  # plug-in stages validate too
        from mmrlvr.train.distributed import honour_launcher, print_rank0

        note = honour_launcher(cfg)  # an accelerate FSDP config runs FSDP2, never a silent DDP
        if note:
            print_rank0(f"note: {note}")
        from mmrlvr.train.plan import build_plan

        # stage selection and each selected stage's checks, before any model load (ConfigErrors); once: the
        # validation's plan when it built one
        self.plan = loaded.plan if loaded.plan is not None else build_plan(cfg, loaded.sources)
        self.rt = build_runtime(cfg, notes=loaded.notes)
        self.pipeline = Pipeline(self.rt, names=self.plan.names())
        from mmrlvr.train.padding import PaddingMeter

        self.rt.padding = PaddingMeter().attach(self.rt.policy, self.rt.ref_model)  # tokens/padding_share
        self.rt.metrics_writer = MetricsWriter(self.run_dir, tensorboard=cfg.tensorboard, enabled=self.is_main)
        if cfg.log_rollouts and self.is_main:
            from mmrlvr.store.writer import RolloutWriter

            self.rt.rollout_writer = RolloutWriter(self.run_dir, run_id=self.run_dir.name)
        self.start_step = 0

    # the run's shared objects, by the names scripts and tests use
    is_main = property(lambda self: self.rt.is_main)
    model = property(lambda self: self.rt.model)
    policy = property(lambda self: self.rt.policy)
    ref_model = property(lambda self: self.rt.ref_model)
    processor = property(lambda self: self.rt.processor)
    engine = property(lambda self: self.rt.engine)
    optimizer = property(lambda self: self.rt.optimizer)
    scheduler = property(lambda self: self.rt.scheduler)
    train_samples = property(lambda self: self.rt.train_samples)
    eval_samples = property(lambda self: self.rt.eval_samples)
    metrics = property(lambda self: self.rt.metrics_writer)
    writer = property(lambda self: self.rt.rollout_writer)
    skipped_steps = property(lambda self: self.rt.counters["skipped_steps"])

    # ------------------------------------------------------------------------------------------- loop
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            from mmrlvr.store.atomic import atomic_write_text

            atomic_write_text(self.run_dir / "config.yaml", cfg.to_yaml())
            atomic_write_text(self.run_dir / "plan.json", self.plan.to_json())  # what runs, why, with which settings
            if cfg.progress:
                print("\n".join(self.plan.lines()))
            from mmrlvr.plugins import save_run_plugins

            save_run_plugins(self.run_dir, cfg.plugins, resume=self.resume)  # plugins/: copies + manifest.json
        if self.resume:
            self._resume()
        if self.start_step == 0 and self.rt.topology is not None:  # the run's topology, once (dist/*, step 1)
            self.rt.extra_metrics.update(self.rt.topology.metrics())
        summary: dict[str, Any] = {}
        if cfg.eval.at_start and self.eval_samples and self.start_step == 0:
            summary["before"] = self.heldout_eval(step=0)
        from tqdm.auto import tqdm

        from mmrlvr.train.distributed import record_passes
        from mmrlvr.train.forward import PASS_COUNTS

        bar = tqdm(range(self.start_step, cfg.max_steps), desc="train", disable=not (cfg.progress and self.is_main),
                   initial=self.start_step, total=cfg.max_steps, dynamic_ncols=True)
        last: dict[str, Any] = {}
        try:
            for step in bar:
                PASS_COUNTS.clear()
                last = self.run_step(step)
                if step == self.start_step and self.rt.topology is not None:  # which path the passes took
                    record_passes(self.rt.topology, PASS_COUNTS, self.run_dir, self.is_main)
                bar.set_postfix({k: f"{last[k]:.3f}" for k in PROGRESS_KEYS if k in last})
                done = step + 1
                if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.max_steps and self.eval_samples:
                    self.heldout_eval(step=done)
                if cfg.save_every and done % cfg.save_every == 0 and done < cfg.max_steps:
                    self.save(done)
            if cfg.max_steps > self.start_step or not (self.run_dir / "checkpoints").exists():
                self.save(cfg.max_steps)
            if cfg.eval.at_end and self.eval_samples:
                summary["after"] = self.heldout_eval(step=cfg.max_steps)
            if self.is_main:
                for line in self.rt.summaries():
                    print(line)
        finally:
            bar.close()
            if self.writer is not None:
                self.writer.close()
            self.metrics.close()
            close_engine = getattr(self.engine, "close", None)  # vLLM: its engine process ends with the run
            if callable(close_engine):
                close_engine()
        summary["last"] = last
        summary["skipped_steps"] = self.skipped_steps
        return summary

    def run_step(self, step: int) -> dict[str, Any]:
        """One training step through every stage; returns the metrics it logged."""
        return self.pipeline.run(step).logged

    # ---------------------------------------------------------------------------------- eval/ckpt
    def heldout_eval(self, step: int) -> dict[str, float]:
        """Held-out evaluation (``Runtime.evaluate``), logged at ``step``; each prompt's outcome goes to
        ``eval/step_NNNNNN.jsonl`` (id, greedy 0/1, hits of k) so two runs compare prompt by prompt (paired)."""
        result, metrics = self.rt.heldout_eval()
        self.metrics.log(step, metrics)
        rows = result.pop("per_prompt", None)
        if self.is_main and rows:
            import json

            folder = self.run_dir / "eval"
            folder.mkdir(exist_ok=True)
            path = folder / f"step_{step:06d}.jsonl"
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps({**row, "k": result.get("k")}) + "\n" for row in rows))
            tmp.replace(path)  # a crash mid-write leaves the previous file, never half of one
        return result

    def save(self, step: int) -> None:
        """A checkpoint from every process: sharded (FSDP2) models write each rank's shards, others rank 0 alone."""
        from mmrlvr.train.checkpoint import save_distributed

        self.rt.accel.wait_for_everyone()
        if self.is_main and self.writer is not None:
            self.writer.flush()
        save_distributed(self.run_dir, step, self.policy, self.optimizer, self.scheduler,
                         {"config_hash": self.cfg.hash(), "lora": self.rt.lora_info(),
                          "reward_state": self.rt.reward_state()},
                         keep=self.cfg.keep_checkpoints, processor=self.processor,
                         strategy=self.cfg.distributed.strategy, stage_state=self.pipeline.state_dict())
        self.rt.accel.wait_for_everyone()

    def _resume(self) -> None:
        from mmrlvr.train.checkpoint import list_checkpoints, load_checkpoint

        found = list_checkpoints(self.run_dir)
        if not found:
            if self.is_main:
                print(f"resume: no complete checkpoint under {self.run_dir}/checkpoints; starting from step 0")
            return
        state = load_checkpoint(found[-1], self.policy, self.optimizer, self.scheduler)
        self.start_step = int(state["step"])
        from mmrlvr.train.checkpoint import load_stage_state

        self.pipeline.load_state_dict(load_stage_state(found[-1]) or {})  # samplers, probes, predictors
        self.rt.load_reward_state(state.get("reward_state"))  # e.g. POW3R criterion weights
        self.metrics.truncate_after(self.start_step)
        if self.is_main:
            print(f"resume: continuing from {found[-1]} (step {self.start_step})")
