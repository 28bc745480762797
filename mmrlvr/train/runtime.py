"""``Runtime``: what the stages of a training step share — model, processor, engine, reward, optimizer, data.

``build_runtime(cfg)`` does the set-up once (accelerate, policy + LoRA, reference, optimizer, engine, reward,
data); stages receive the Runtime and never reach into the trainer. Also here: the few helpers every stage
needs (micro-batch slices, model inputs with the vision cache, sums over processes).
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from mmrlvr.config import RunConfig
from mmrlvr.errors import UserError
from mmrlvr.train.data import load_split
from mmrlvr.train.forward import slice_inputs
from mmrlvr.train.reward_setup import build_run_reward


@dataclass
class Runtime:
    cfg: RunConfig
    accel: Any  # accelerate.Accelerator
    model: torch.nn.Module  # as prepared by accelerate (DDP-wrapped with several processes)
    policy: torch.nn.Module  # the unwrapped policy (peft model for LoRA runs)
    ref_model: torch.nn.Module | None  # frozen copy for full fine-tuning with KL; None = adapter-off policy
    processor: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    engine: Any  # RolloutEngine
    reward: Any  # CombinedReward
    train_samples: list
    eval_samples: list
    vision_start_id: int
    metrics_writer: Any = None  # MetricsWriter (metrics.jsonl + trackers); writes on the main process only
    rollout_writer: Any = None  # RolloutWriter (Parquet per step) on the main process, or None
    data_reports: list = field(default_factory=list)  # data load / length reports (their metrics() are logged)
    extra_metrics: dict[str, float] = field(default_factory=dict)  # logged with the next step's row, then cleared
    pipeline: Any = None  # the step's stages (set by Pipeline), for stages that run earlier kinds again
    padding: Any = None  # mmrlvr.train.padding.PaddingMeter on the policy and reference (set by the Trainer)
    topology: Any = None  # mmrlvr.train.distributed.Topology: world size, nodes, strategy, prompts per rank
    counters: dict[str, int] = field(default_factory=lambda: {"bad_steps": 0, "skipped_steps": 0,
                                                              "optimizer_steps": 0})

    @property
    def is_main(self) -> bool:
        return self.accel.is_main_process

    def reward_fns(self) -> list:
        """The reward components, in config order (one object for a single reward)."""
        return list(getattr(self.reward, "fns", [self.reward]))

    def micro_slices(self, n: int) -> list[slice]:
        mbs = self.cfg.algo.micro_batch_size
        return [slice(i, min(n, i + mbs)) for i in range(0, n, mbs)]

    def inputs(self, rollouts: Any, vision: Any, images_per_row: list[int], rows: slice) -> dict[str, Any]:
        """Model inputs for ``rows``, reusing the step's vision features when there is a cache, on the policy's
        device (the batch stays on the CPU: ``mmrlvr.models.placement``)."""
        from mmrlvr.models.placement import to_model

        if vision is not None:
            return to_model(vision.inputs(rollouts.input_ids, rollouts.attention_mask, rows), self.policy)
        videos = [len(s.meta.get("videos") or []) for s in rollouts.samples]
        return to_model(slice_inputs(rollouts.model_inputs(), rows, images_per_row, videos if any(videos) else None),
                        self.policy)

    def global_sum(self, value: float) -> float:
        """``value`` summed over processes (losses are normalised by global counts)."""
        if self.accel.num_processes == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.accel.device)
        return float(self.accel.reduce(t, reduction="sum").item())

    def reduce_fn(self):
        """``reduce(t, op="sum")``: a tensor reduced over processes (all-reduce; op sum | min | max), or None in
        one process — for statistics of the global batch inside pure functions (DelTA's centroids, VPPO's
        min-max scale)."""
        if self.accel.num_processes == 1:
            return None
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}

        device = self.accel.device  # NCCL reduces CUDA tensors only; credit signals may live on the CPU

        def reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
            out = t.detach().to(device, copy=True).contiguous()
            dist.all_reduce(out, op=ops[op])
            return out.to(t.device)

        return reduce

    def unsharded(self):
        """A context in which every FSDP2 block of the policy is gathered (a no-op for an unsharded model).

        For no-grad passes that call a part of the model (the backbone, for hidden states) instead of its root:
        the root's forward hook is what gathers the root's own weights (embeddings, norms), so such a call on a
        sharded model meets DTensor shards (``aten.embedding got mixed torch.Tensor and DTensor``). Generation
        gathers the same way, once per call."""
        from mmrlvr.train.distributed import gathered

        return gathered(self.policy)

    def gather_rows(self, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], slice]:
        """Each [n_r, ...] tensor concatenated over processes in rank order (the global batch), and the slice of
        this process's rows in it. One process: the tensors themselves. For statistics of the whole batch
        (REINFORCE++ whitens over every row of the step, not over one rank's share); Python values per row (sample
        ids): ``gather_values``."""
        if self.accel.num_processes == 1:
            return list(tensors), slice(0, int(tensors[0].shape[0]))
        from mmrlvr.train.distributed import _all_gather

        parts = _all_gather([t.detach().cpu() for t in tensors], self.accel.num_processes)
        start = sum(int(p[0].shape[0]) for p in parts[:self.accel.process_index])
        rows = slice(start, start + int(tensors[0].shape[0]))
        return [torch.cat([p[i] for p in parts]) for i in range(len(tensors))], rows

    def gather_values(self, values: list[Any]) -> tuple[list[Any], slice]:
        """Per-row Python values (sample ids, answers, anything picklable) concatenated over processes in rank
        order, and the slice of this process's values in the result; one process: ``values`` itself. Every process
        calls it once with its own list (of any length) and gets the same global list: for a stage that keeps
        per-prompt state, so every rank's state is the whole batch's (docs/extending.md, "A stage with per-prompt
        state, on several processes")."""
        if self.accel.num_processes == 1:
            return list(values), slice(0, len(values))
        from mmrlvr.train.distributed import _all_gather

        parts = _all_gather(list(values), self.accel.num_processes)
        start = sum(len(p) for p in parts[:self.accel.process_index])
        return [v for p in parts for v in p], slice(start, start + len(values))

    def any_rank(self, flag: bool) -> bool:
        """True on every process when ``flag`` holds on any (a decision all ranks must take together: skipping
        a step whose loss is non-finite on one rank, another refill round)."""
        return self.global_sum(float(bool(flag))) > 0

    def reward_state(self) -> dict[str, Any]:
        """JSON-able state of rewards that adapt during training (POW3R weights), by position."""
        return {str(i): fn.state_dict() for i, fn in enumerate(self.reward_fns()) if hasattr(fn, "state_dict")}

    def load_reward_state(self, state: dict[str, Any] | None) -> None:
        for i, fn in enumerate(self.reward_fns()):
            saved = (state or {}).get(str(i))
            if saved is not None and hasattr(fn, "load_state_dict"):
                fn.load_state_dict(saved)

    def eval_rubric(self):
        """The rubric reward for held-out scoring, as a static-weight copy (scoring held-out responses must not
        move POW3R's training state), or None when the run has no rubric reward."""
        from mmrlvr.train.heldout import eval_rubric

        return eval_rubric(self.cfg, self.reward_fns())

    def heldout_eval(self) -> tuple[dict[str, Any], dict[str, float]]:
        """The held-out evaluation: greedy accuracy, avg@k, pass@k, plus the inconsistency rate (and the rubric
        score when a rubric reward is configured) on the very same responses. Returns (result, eval/* metrics)."""
        from mmrlvr.train.heldout import evaluate_run

        cfg = self.cfg
        self.model.eval()
        from mmrlvr.train.tool_setup import with_tools

        result = evaluate_run(with_tools(self.engine, cfg), self.eval_samples, k=cfg.eval.k, temperature=cfg.eval.temperature,
                              max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed, rubric=self.eval_rubric(),
                              progress=cfg.progress and self.is_main, per_prompt=True)
        metrics = {f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))}
        metrics["eval/accuracy"] = result["greedy_accuracy"]  # the headline number's documented name
        return result, metrics

    def summaries(self) -> list[str]:
        """End-of-run lines from the rewards (e.g. each judge's verdict counts and unknown rate)."""
        from mmrlvr.rubric.reward import judge_summaries

        return list(judge_summaries(self.reward))

    def lora_info(self) -> dict[str, Any] | None:
        lc = self.cfg.model.lora
        if not lc.enabled:
            return None
        return {"r": lc.r, "alpha": lc.alpha, "dropout": lc.dropout, "target_modules": list(lc.target_modules),
                "init": lc.init}


def lr_lambda(cfg: RunConfig):
    """The learning-rate multiplier per optimizer step: linear warm-up, then constant / linear / cosine."""
    o = cfg.optim

    def fn(step: int) -> float:
        if o.warmup_steps and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        total = max(1, cfg.max_steps - o.warmup_steps)
        frac = min(1.0, max(0, step - o.warmup_steps) / total)
        if o.schedule == "linear":
            return 1.0 - frac
        if o.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * frac))
        return 1.0

    return fn


def reference_copy(model: torch.nn.Module, *, share_frozen: bool = True) -> torch.nn.Module:
    """A frozen copy of ``model`` for the KL reference (full fine-tuning; LoRA disables the adapter instead).

    With ``share_frozen`` the copy holds the policy's *frozen* parameters themselves, not copies: they
    never change, so the reference computes the same thing while the process holds them once (the frozen
    vision tower of Qwen2.5-VL-3B is ~670 M parameters, 2.7 GB in float32). Not with FSDP2, which replaces
    the policy's parameters by sharded ones and must shard the reference on its own.
    """
    memo: dict[int, Any] = {}
    if share_frozen:
        memo = {id(p): p for p in model.parameters() if not p.requires_grad}  # buffers stay copies (a
        # training-mode forward may update one in place, e.g. a norm's running statistics)
    ref = copy.deepcopy(model, memo).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _load_model(cfg: RunConfig, accel: Any):
    from mmrlvr.models import load_policy
    from mmrlvr.train.model_path import resolve_model_path

    if not cfg.model.path:
        raise UserError("model.path: no model folder given (build one with `mmrlvr tiny build`)")
    model_path = resolve_model_path(cfg.model.path) if accel.is_main_process else None
    accel.wait_for_everyone()
    model_path = model_path or resolve_model_path(cfg.model.path)  # built by the main process by now
    model, processor = load_policy(model_path, dtype=cfg.model.dtype, device=str(accel.device),
                                   attn_implementation=cfg.model.attn_implementation)
    ref_model = None
    if cfg.model.freeze_vision:
        from mmrlvr.models.lora import freeze_vision

        freeze_vision(model)
    if cfg.model.lora.enabled:
        from mmrlvr.models.lora import apply_lora

        lc = cfg.model.lora
        model = apply_lora(model, r=lc.r, alpha=lc.alpha, dropout=lc.dropout,
                           target_modules=tuple(lc.target_modules), init=lc.init)
    elif cfg.algo.kl_coef > 0:
        from mmrlvr.train.distributed import strategy_of

        ref_model = reference_copy(model, share_frozen=strategy_of(cfg) != "fsdp2")
    if cfg.model.gradient_checkpointing:  # after the reference copy: the frozen reference never backpropagates
        from mmrlvr.models.lora import enable_gradient_checkpointing

        enable_gradient_checkpointing(model)
    return model, processor, ref_model


def build_engine(cfg: RunConfig, policy: torch.nn.Module, processor: Any):
    if cfg.rollout.engine == "vllm":
        from mmrlvr.rollout.vllm import VLLMEngine

        return VLLMEngine.from_config(cfg, policy, processor)
    from mmrlvr.rollout.hf import HFEngine

    return HFEngine(policy, processor)


def build_runtime(cfg: RunConfig, notes: list[str] | tuple[str, ...] = ()) -> Runtime:
    """Set up a run: processes, policy (+ LoRA / reference), optimizer, engine, reward and data; ``notes`` (the
    load's: loss defaults applied, keys moved) printed once by the main process."""
    from accelerate import Accelerator

    from mmrlvr.plugins import load_plugins

    load_plugins(cfg.plugins)
    accel = Accelerator(cpu=not torch.cuda.is_available())
    from mmrlvr.train import distributed

    topology = distributed.setup(accel, cfg, cfg.output_dir)  # a lone copy of an N-process launch stops here
    if accel.is_main_process:
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    torch.manual_seed(cfg.seed)
    model, processor, ref_model = _load_model(cfg, accel)
    model, ref_model = distributed.shard(accel, cfg, model, ref_model)  # fsdp2: before the optimizer sees params
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise UserError("model: no trainable parameters (check model.lora and model.freeze_vision)")
    from mmrlvr.train.optim import build_optimizer

    optimizer = build_optimizer(trainable, cfg.optim)  # fused AdamW where the device has it
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    prepared, optimizer = distributed.prepare(accel, model, optimizer)  # accel.prepare, unless sharded
    policy = accel.unwrap_model(prepared)
    if accel.num_processes == 1:
        from mmrlvr.models.tied_embedding import sparse_tied_embedding_grad

        sparse_tied_embedding_grad(policy)  # tied head: no second [V, H] gradient in the backward
    engine = distributed.wrap_engine(build_engine(cfg, policy, processor), policy)  # fsdp2: gather per generate
    reward = build_run_reward(cfg)
    for fn in getattr(reward, "fns", [reward]):
        if getattr(fn, "needs_policy", False):
            fn.attach_policy(policy, processor)  # e.g. GRPO-CARE's EMA reference
    data_reports: list = []  # load / length reports (rows dropped as too long: data/dropped_too_long)
    train_samples = load_split(cfg.data.train, cfg.data, "train", processor=processor, reports=data_reports)
    eval_samples = load_split(cfg.data.eval, cfg.data, "test", processor=processor) if cfg.data.eval else []
    if cfg.eval.limit:
        eval_samples = eval_samples[: cfg.eval.limit]
    tok = getattr(processor, "tokenizer", processor)
    return Runtime(cfg=cfg, accel=accel, model=prepared, policy=policy, ref_model=ref_model, processor=processor,
                   optimizer=optimizer, scheduler=scheduler, engine=engine, reward=reward,
                   train_samples=train_samples, eval_samples=eval_samples,
                   vision_start_id=tok.convert_tokens_to_ids("<|vision_start|>"), topology=topology,
                   data_reports=data_reports)
