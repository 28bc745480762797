"""Typed run configuration: YAML file + dotted ``key=value`` overrides, validated on load.

Every field has a one-line help string (``field(metadata={"help": ...})``); ``describe()`` prints them.
Loading checks types and cross-field rules and raises ``UserError`` naming the file and the dotted key
(``configs/x.yaml: algo.eps_high: expected a number, got 'abc'``). Unknown keys are errors that list the
known ones, so a typo never silently falls back to a default.

Deliberately not here: anything that imports torch or transformers (configs load in milliseconds).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmrlvr.errors import ConfigErrors, UserError, did_you_mean


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with a help string (mutable defaults through default_factory)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: json.loads(json.dumps(d)), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class LoraConfig:
    enabled: bool = _f(False, "train a LoRA adapter (peft) instead of all weights")
    r: int = _f(16, "LoRA rank")
    alpha: int = _f(32, "LoRA alpha (scale = alpha / r)")
    dropout: float = _f(0.0, "LoRA dropout")
    target_modules: list[str] = _f(["q_proj", "k_proj", "v_proj", "o_proj"], "module names to adapt")
    init: str = _f("default", "adapter initialisation: default | gaussian | orthogonal | pissa | olora | mica | rlpo | rlmo (base-preserving SVD, arXiv 2606.31813) | milora (PiSSA on minor components)")


@dataclass
class ModelConfig:
    path: str = _f("", "local model folder (a Hugging Face checkpoint or `mmrlvr tiny build` output)")
    dtype: str = _f("float32", "weights dtype: float32 | bfloat16 | float16")
    attn_implementation: str | None = _f(None, "attention kernel: eager | sdpa | flash_attention_2 (None = default)")
    freeze_vision: bool = _f(True, "freeze the vision tower (and reuse its features across passes)")
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA settings"})
    gradient_checkpointing: bool = _f(False, "recompute layer activations in the backward (transformers' own; less memory, ~1 extra forward)")
    prefix_sharing: bool = _f(True, "run each group's prompt (image tokens included) once in the reference, old-policy and policy passes, the G responses on its repeated KV cache (equal up to float rounding; Qwen-VL models; also under DDP / FSDP2; not in a pass with gradient under gradient checkpointing; docs/performance.md)")
    heap_mmap_threshold_mib: int = _f(4, "CPU (glibc): in the policy pass, buffers of this many MiB or more are mmap'd, so freed activations go back to the OS instead of leaving holes in the heap (lower peak memory, same results; mmrlvr/train/host_memory.py); 0 = glibc's default")


@dataclass
class DataConfig:
    train: str = _f("", "training data: a dataset dir, Parquet/JSON(L) file, or `synth:TASK` (generated in memory)")
    eval: str | None = _f(None, "held-out data (same forms as train); None = no eval")
    preset: str | None = _f(None, "column preset: easyr1 | virl | grounding | choice | mmrlvr (None = auto)")
    columns: dict[str, str] = _f({}, "map of our fields (problem, answer, images, options, rubric, id) to columns")
    template: str = _f("r1", "prompt template: r1 (<think>/<answer>, system prompt) | r1_user (same, in the user turn) | boxed (\\boxed{}) | plain")
    train_size: int = _f(2000, "rows generated for `synth:` training data")
    eval_size: int = _f(200, "rows generated for `synth:` eval data")
    image_size: int = _f(112, "image side for `synth:` data")
    min_pixels: int = _f(28 * 28, "smallest image area after resizing (qwen-vl-utils semantics)")
    max_pixels: int = _f(448 * 448, "largest image area after resizing")
    on_error: str = _f("raise", "bad rows: raise (error naming row and field) | skip (skip and count)")
    factor: int = _f(28, "image sides are rounded to multiples of this (patch x merge: 28 for Qwen2/2.5-VL, 32 for Qwen3-VL)")
    max_image_pixels: int = _f(50_000_000, "images larger than this (before resizing) are errors (decompression bombs)")
    image_dir: str | None = _f(None, "base folder for relative image paths (default: next to the data file)")
    train_split: str | None = _f(None, "split of a DatasetDict folder for training (e.g. train)")
    eval_split: str | None = _f(None, "split of a DatasetDict folder for eval (e.g. test)")
    format: str = _f("auto", "dataset layout: auto (detected, and the choice is printed) | verl | easyr1 | vlm_r1 | "
                     "llava | visual_rft | virl | grounding | choice | mmrlvr (data.preset is the older name)")
    system_prompt: str | None = _f(None, "system prompt for every row (overrides the template's and the data's own)")
    prompt_template: str | None = _f(None, "Jinja template of the user text with {{ content }} (a file, a string, or a "
                                     "shipped one: r1_tags | boxed_math | grounding_json); replaces data.template")
    answer_format: str = _f("auto", "how responses state the answer: auto (from the prompt template) | r1 | boxed | "
                            "raw; rewards read it through mmrlvr.data.prompts.answer_format")
    max_prompt_length: int = _f(0, "drop rows whose prompt (text + image/video tokens) is longer (0 = no limit); "
                                "prompts are never cut")
    max_dropped_share: float = _f(0.1, "stop with an error if more than this share of rows is too long to keep")
    train_options: dict[str, Any] = _f({}, "per-dataset overrides for data.train (format, columns, min_pixels, "
                                       "max_pixels, max_prompt_length, prompt_template, ...)")
    eval_options: dict[str, Any] = _f({}, "per-dataset overrides for data.eval (same keys as train_options)")
    video_fps: float = _f(2.0, "frames sampled per second of video")
    video_max_frames: int = _f(8, "at most this many frames per video (evenly spaced)")
    video_min_frames: int = _f(2, "at least this many frames per video")
    video_max_pixels: int = _f(112 * 112, "largest frame area after resizing (per frame)")


@dataclass
class RolloutConfig:
    engine: str = _f("hf", "rollout engine: hf (transformers generate on the trainer's model) | vllm (vLLM in its own "
                     "process: a GPU, or CPU from the environment `bash .ci/vllm-env DIR` builds; docs/vllm.md)")
    group_size: int = _f(8, "G: responses sampled per prompt")
    prompts_per_step: int = _f(16, "B: prompts per optimisation step (global, across processes)")
    max_new_tokens: int = _f(32, "response length limit")
    temperature: float = _f(1.0, "sampling temperature (log-probs use the same temperature)")
    top_p: float = _f(1.0, "nucleus sampling")
    top_k: int = _f(0, "top-k sampling (0 = off)")
    vllm_gpu_memory_utilization: float = _f(0.35, "vLLM: share of GPU memory for the colocated engine")
    vllm_kv_cache_gib: float = _f(1.0, "vLLM on CPU: memory for its KV cache in GiB (vLLM's own default takes most of "
                                  "the machine's memory)")
    vllm_max_model_len: int = _f(0, "vLLM: the longest sequence (prompt + response) it serves; 0 = the model's own")
    vllm_dtype: str = _f("auto", "vLLM's weights and compute: auto (model.dtype) | float32 | bfloat16 | float16; a "
                         "lower precision than the trainer's widens the rollout/trainer gap (docs/vllm.md)")
    vllm_sync: str = _f("weights", "vLLM weight sync after each optimizer step: weights (the whole model, any LoRA "
                        "merged in) | lora (the adapter as a vLLM LoRA, vision-tower modules included)")
    sampler: str = _f("uniform", "which prompts each step draws (parameters: rollout.sampler_params): uniform (a fresh "
                      "permutation per epoch; also called shuffle) | disagreement (SGAC: a selector ranks prompts by "
                      "answer disagreement, success rate, reward variance and difficulty) | budget (TRACE: group sizes "
                      "by p(1 - p) within a sample budget) | plug-ins")
    sampler_params: dict[str, Any] = _f({}, "parameters of rollout.sampler")
    strategy: str = _f("groups", "how a group is built: groups (G independent samples per prompt) | tree (TreeRPO: "
                       "branching^depth leaves sharing segments; parameters: rollout.strategy_params)")
    strategy_params: dict[str, Any] = _f({}, "tree: {depth: 2, branching: 2, segment_length: 0 (= max_new_tokens / "
                                         "depth)}")
    tools: list[str] = _f([], "tools a multi-turn rollout offers the model (zoom, rotate, or tools a plug-in "
                          "registers); empty: one turn. The model calls them in <tool_call> blocks")
    max_turns: int = _f(4, "multi-turn: the most model turns per trajectory (each up to max_new_tokens)")
    max_trajectory_tokens: int = _f(1024, "multi-turn: the most response tokens per trajectory, model and tool turns "
                                    "(image tokens included) together")
    tool_params: dict[str, Any] = _f({}, "multi-turn: {time_budget_s: 10 (per call), max_image_pixels: 1048576 (per "
                                     "returned image), describe: true (list the tools' schemas in the system turn; "
                                     "false for a model trained on the calls)}")
    summarize: dict[str, Any] = _f({}, "ReSum: {at_tokens: N} asks the model to summarise its progress when a "
                                   "trajectory's context reaches N tokens (or a turn runs out of tokens) and restarts "
                                   "it from the prompt plus the summary; every segment trains with the trajectory's "
                                   "final reward. Optional: instruction (the request). Empty: off")
    guide: dict[str, Any] = _f({}, "NPO near-future guides: {from: CHECKPOINT_DIR | auto, gate: 0.6, tries: 4, "
                               "delta: 10} puts one verified-correct response of a later checkpoint into each group "
                               "below the gate (auto: the run trained delta steps ahead in a second process; empty: "
                               "off)")


@dataclass
class AlgoConfig:
    preset: str | None = _f(None, "grpo | dapo | dr_grpo | gspo | cispo: fills the fields below unless set explicitly")
    advantage: str = _f("grpo", "advantage estimator (parameters: algo.advantage_params): grpo | dr_grpo | rloo | "
                        "reinforce_pp | pass_at_k | poise | opd | plug-ins")
    loss: str = _f("ppo_clip", "policy loss (parameters: algo.loss_params; mmrlvr train --help-config lists the "
                   "losses, built-in and plug-in, with theirs)")
    eps_low: float = _f(0.2, "lower clip range (ratio >= 1 - eps_low)")
    eps_high: float = _f(0.2, "upper clip range (DAPO clip-higher: 0.28)")
    dual_clip: float | None = _f(None, "dual-clip constant c for A < 0 (e.g. 3.0); None = off")
    loss_params: dict[str, Any] = _f({}, "parameters of algo.loss, e.g. nsr {noise: 0.2}, popo {threshold: 0.5} "
                                     "(mmrlvr train --help-config lists each loss's)")
    advantage_params: dict[str, Any] = _f({}, "parameters of algo.advantage, e.g. grpo {unbiased: false}, "
                                          "reinforce_pp {baseline: false}, poise {lr: 1e-3}, opd {teacher: DIR}")
    clip: str = _f("fixed", "clip rule of ppo_clip/nsr: fixed (eps_low/eps_high) | acpo (variance-adaptive per probability bin, arXiv 2606.22570)")
    clip_params: dict[str, Any] = _f({}, "parameters of algo.clip, e.g. acpo {eps0: 0.2, alpha: 3.0, eps_min: 0, "
                                     "eps_max: 3.0}")
    agg: str = _f("token-mean", "loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm")
    kl_coef: float = _f(0.0, "beta: weight of the KL penalty to the reference policy (0 = no reference pass)")
    kl_estimator: str = _f("k3", "KL estimator: k1 | k2 | k3")
    epochs: int = _f(1, "gradient passes over each rollout batch (>1 = off-policy steps with importance ratios)")
    micro_batch_size: int = _f(64, "rows per forward/backward (gradient accumulation over the rest)")
    dynamic_sampling: bool = _f(False, "DAPO: drop groups with no signal and refill the batch (parameters: "
                                "algo.dynamic_sampling_params)")
    dynamic_sampling_params: dict[str, Any] = _f({}, "parameters of dynamic sampling: {metric: accuracy (DAPO) | "
                                                 "reward, max_rounds: 3 (generation rounds per step, 1 = no refill)}")
    recompute_old_logprobs: bool | None = _f(None, "recompute pi_old with the training model before the update (null = when epochs > 1, engine vllm or "
                                                  "algo.advantage opd)")
    rollout_correction: str = _f("none", "rollout/training mismatch correction on the policy loss (parameters: "
                                 "algo.rollout_correction_params): none | tis (truncate) | mis (mask)")
    rollout_correction_params: dict[str, Any] = _f({}, "parameters of algo.rollout_correction: tis / mis {cap: 3.0 "
                                                   "(TRL's; verl's 2.0), level: token | sequence}")
    aux_losses: list[dict[str, Any]] = _f([], "auxiliary losses added to the policy loss, a list of {name, weight, "
                                          "params}: forward_ce (distillation from a privileged or other expert)")
    mask_truncated: bool = _f(False, "DAPO: drop responses that hit max_new_tokens from the loss")
    overlong_cache: int = _f(0, "DAPO overlong shaping: penalise linearly in the last N tokens (0 = off)")
    overlong_penalty: float = _f(1.0, "DAPO overlong shaping: penalty at max length")


@dataclass
class OptimConfig:
    lr: float = _f(1e-4, "learning rate (AdamW)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    betas: list[float] = _f([0.9, 0.999], "AdamW betas")
    grad_clip: float = _f(1.0, "clip the global gradient norm (0 = off)")
    schedule: str = _f("constant", "lr schedule: constant | linear | cosine")
    warmup_steps: int = _f(0, "linear warm-up steps")
    state_dtype: str = _f("auto", "AdamW moment dtype: auto (= weights) | float32 | bfloat16 | float16")


@dataclass
class CreditConfig:
    scheme: str = _f("none", "token credit: none | entropy_topk | vepo | vppo | papo | rsi | delta (DelTA, hidden states)")
    scheme_params: dict[str, Any] = _f({}, "parameters of credit.scheme (see docs/credit.md), e.g. vepo {alpha: 0.7, "
                                       "rho: 0.2, mode: mask}")
    perturbation: str | None = _f(None, "perturbed image for the counterfactual pass: gaussian | zero | patch_blackout | blur (None = the scheme's paper default)")
    perturbation_params: dict[str, Any] = _f({}, "perturbation parameters, e.g. {std: 1.0}")
    chunk_size: int = _f(256, "tokens per chunk for full-vocabulary signals (memory bound)")
    in_update: bool = _f(True, "schemes that read the clean distribution (vepo, entropy_topk, rsi) take it from the "
                         "update's first forward instead of a separate no-grad pass (same credit, one forward less)")


@dataclass
class RewardSpecConfig:
    name: str = _f("", "registered reward name (format, accuracy, auto_accuracy, choice, numeric, grounding, consistency, rubric, ...)")
    weight: float = _f(1.0, "weight in the total reward")
    params: dict[str, Any] = _f({}, "reward parameters")


@dataclass
class ConsistencyConfig:
    split_advantage: bool = _f(False, "CORA-style: normalise task and consistency rewards separately, "
                               "A = alpha*A_task + beta*A_cons (the consistency term on the tokens of `scope`)")
    alpha: float = _f(1.0, "weight of the task advantage when splitting")
    beta: float = _f(0.5, "peak weight of the consistency advantage when splitting")
    beta_warmup_steps: int = _f(0, "steps to ramp beta up from 0")
    beta_decay_steps: int = _f(0, "steps over which beta decays to beta_min after warm-up (0 = no decay)")
    beta_min: float = _f(0.0, "beta after decay")
    component: str = _f("consistency", "reward component used as the consistency reward when splitting")
    scope: str = _f("answer", "tokens the consistency advantage reaches when splitting: answer (only the final "
                    "answer's tokens, so the thinking is never pushed to match the answer) | all (CORA)")


@dataclass
class RubricConfig:
    judge: str = _f("none", "judge for non-programmatic criteria: none | local | openai")
    judge_params: dict[str, Any] = _f({}, "judge settings (model path, base_url, model, votes, timeout, "
                                          "api_key_env / api_key_file for keys, ...)")
    max_unknown_rate: float | None = _f(0.5, "stop training when more than this fraction of the recent judged "
                                             "criteria got no verdict (judge down); null = never stop")
    warn_unknown_rate: float = _f(0.1, "print a warning when the recent judge unknown rate passes this")


@dataclass
class EvalConfig:
    every: int = _f(0, "evaluate every N steps (0 = only before and after training)")
    k: int = _f(8, "samples per prompt for avg@k / pass@k")
    temperature: float = _f(1.0, "sampling temperature for avg@k")
    limit: int | None = _f(None, "evaluate on the first N eval samples (None = all)")
    at_start: bool = _f(True, "evaluate before the first step")
    at_end: bool = _f(True, "evaluate after the last step")


@dataclass
class DistributedConfig:
    strategy: str = _f("ddp", "several processes: ddp (every rank holds the whole model) | fsdp2 (torch's fully_shard: "
                       "parameters, gradients and optimizer state sharded over ranks; see docs/scaling.md)")


@dataclass
class StagesConfig:
    """Which registered stage fills each step of the pipeline, in the order a step runs them (docs/architecture.md);
    null = chosen from the rest of the config (e.g. ``credit.scheme`` picks the credit stage)."""

    generate: str | None = _f(None, "sampler + rollout strategy (groups, tree, multi_turn)")
    score: str | None = _f(None, "rewards for every rollout (rewards)")
    shape: str | list[str] | None = _f(None, "reward transforms / row filters, added to the automatic ones, run in "
                                       "priority order (guide, vote_split, drop_unscored, overlong, mask_truncated, "
                                       "dynamic_sampling)")
    advantages: str | None = _f(None, "advantage stage (group, consistency_split, poise, popo, tree, opd)")
    reference: str | list[str] | None = _f(None, "pi_old recompute and pi_ref for the KL term, added to the automatic "
                                           "ones (old_policy, frozen, aux_losses, teacher)")
    credit: str | None = _f(None, "token credit stage (none, in_update, separate, hidden_credit)")
    update: str | None = _f(None, "policy update (policy_gradient, popo)")
    record: str | None = _f(None, "metrics and rollout records (metrics_and_rollouts)")


@dataclass
class RunConfig:
    output_dir: str = _f("runs/run", "run directory: config.yaml, metrics.jsonl, rollouts/, checkpoints/")
    seed: int = _f(0, "seed for data order, sampling and perturbations")
    max_steps: int = _f(100, "optimisation steps")
    save_every: int = _f(25, "checkpoint every N steps (0 = only at the end)")
    keep_checkpoints: int = _f(2, "checkpoints kept on disk (oldest removed)")
    log_rollouts: bool = _f(True, "write RolloutRecords (Parquet per step) for the inspector")
    max_bad_steps: int = _f(3, "stop after this many consecutive steps with a NaN/inf loss (each is skipped)")
    tensorboard: bool = _f(True, "also write TensorBoard events")
    report_to: list[str] = _f([], "trackers through accelerate: tensorboard | wandb | trackio | mlflow (pip install 'mmrlvr[wandb]', ...)")
    progress: bool = _f(True, "show a progress bar")
    plugins: list[str] = _f([], "Python files or modules imported first: register custom rewards, credit schemes, ...")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "policy model"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "datasets"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "sampling"})
    algo: AlgoConfig = field(default_factory=AlgoConfig, metadata={"help": "RL algorithm"})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"help": "optimiser"})
    credit: CreditConfig = field(default_factory=CreditConfig, metadata={"help": "token credit"})
    rewards: list[RewardSpecConfig] = field(
        default_factory=lambda: [RewardSpecConfig("format", 0.2), RewardSpecConfig("auto_accuracy", 1.0)],
        metadata={"help": "reward components: list of {name, weight, params}"},
    )
    consistency: ConsistencyConfig = field(default_factory=ConsistencyConfig, metadata={"help": "consistency training"})
    rubric: RubricConfig = field(default_factory=RubricConfig, metadata={"help": "rubric judging"})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "evaluation"})
    stages: StagesConfig = field(default_factory=StagesConfig, metadata={"help": "step pipeline: the stage for each kind (null: auto)"})
    distributed: DistributedConfig = field(default_factory=DistributedConfig,
                                           metadata={"help": "multi-process strategy"})

    def to_dict(self, redact: bool = False) -> dict[str, Any]:
        """Plain nested dict; ``redact=True`` replaces secrets (``redact_secrets``) for anything written out."""
        d = dataclasses.asdict(self)
        return redact_secrets(d) if redact else d

    def hash(self) -> str:
        """Short stable hash of the config (stored in every RolloutRecord); secrets do not enter it, so a
        rotated API key keeps the hash (and nothing derived from a key is written anywhere)."""
        blob = json.dumps(self.to_dict(redact=True), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def to_yaml(self, redact: bool = True) -> str:
        """YAML of the config, secrets redacted by default: this is what lands in the run's config.yaml."""
        return yaml.safe_dump(self.to_dict(redact=redact), sort_keys=False)


# ----------------------------------------------------------------------------------------------------
# Secrets: a run folder never holds one (config.yaml, trackers' hparams and logs get the redacted form)

#: key names whose values are secrets wherever they sit in a config (judge_params, reward params, ...)
SECRET_KEY = re.compile(r"api[_-]?key|password|passwd|secret|(^|[_-])token$|authorization|credentials?$|"
                        r"private[_-]?key|access[_-]?key|cookie", re.IGNORECASE)
#: keys that match SECRET_KEY by name but name where a secret lives, or a tokenizer's special tokens
_NOT_SECRET = re.compile(r"(_env|_file|_path|_var)$|^(pad|eos|bos|unk|sep|cls|mask|image|video)_token$",
                         re.IGNORECASE)
REDACTED = "<redacted>"
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")


def is_secret_key(key: object) -> bool:
    """True for config keys whose values are secrets (``api_key``, ``hf_token``, ``password``, ``secret``...).

    >>> [is_secret_key(k) for k in ("api_key", "hf_token", "max_tokens", "api_key_env", "client_secret")]
    [True, True, False, False, True]
    """
    return isinstance(key, str) and bool(SECRET_KEY.search(key)) and not _NOT_SECRET.search(key)


def redact_secrets(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, scalars) with secret values replaced by ``"<redacted>"``.

    Secret values are those under a secret-named key at any depth, credentials in URLs
    (``https://user:pw@host``) and ``Bearer``/``Basic`` header values in any string.

    >>> redact_secrets({"judge_params": {"api_key": "sk-1", "base_url": "http://u:p@h:8000/v1", "model": "m"}})
    {'judge_params': {'api_key': '<redacted>', 'base_url': 'http://<redacted>@h:8000/v1', 'model': 'm'}}
    """
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(k) and v not in (None, "", {}, []) else redact_secrets(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_secrets(v) for v in obj]
    if isinstance(obj, str):
        return _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", _URL_USERINFO.sub(f"{REDACTED}@", obj))
    return obj


# ----------------------------------------------------------------------------------------------------
# Validation of values against type hints. Every problem is collected (one line each, naming the file and
# the dotted key) and raised together as ``ConfigErrors``, so a user fixes a config in one pass.

#: a number as YAML 1.1 leaves it a string ("1e-4", "5e3"): accepted where a number is expected
_NUMBER_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        return getattr(origin, "__name__", str(origin))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, file: str, key: str, problems: list[str] | None = None) -> Any:
    """Check ``value`` against type ``tp`` (ints accepted for floats); raise UserError naming file and key.

    Problems inside nested sections are appended to ``problems`` (when given) instead of raised, so one
    bad key does not hide the next.
    """

    def bad(expected: str) -> UserError:
        return UserError(f"{file}: {key}: expected {expected}, got {value!r}")

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, file, key, problems)
            except UserError:
                continue
        raise bad(_type_name(tp))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad(f"a mapping of {tp.__name__} fields")
        return _build(tp, value, file, key, problems)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, file, f"{key}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad("a mapping")
        _, val_tp = typing.get_args(tp) or (Any, Any)
        if val_tp is Any:
            return dict(value)
        return {k: _coerce(v, val_tp, file, f"{key}.{k}", problems) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad("true/false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)  # 1e3 written for 1000
        raise bad("an integer")
    if tp is float:
        number = value
        if isinstance(value, str) and _NUMBER_TEXT.match(value.strip()):
            number = float(value)  # YAML 1.1 reads "1e-4" as a string
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            if not math.isfinite(number):
                raise bad("a finite number")
            return float(number)
        raise bad("a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad("a string")
    return value


def _build(cls: type, data: dict[str, Any], file: str, prefix: str = "", problems: list[str] | None = None) -> Any:
    """Build dataclass ``cls`` from ``data``; bad keys become problems and keep their defaults."""
    collect = problems is not None
    problems = problems if problems is not None else []
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            problems.append(f"{file}: {key}: unknown key; known keys here: {', '.join(sorted(names))}"
                            f"{did_you_mean(k, names)}")
            continue
        try:
            kwargs[k] = _coerce(v, hints[k], file, key, problems)
        except UserError as exc:
            problems.append(str(exc))
    if not collect and problems:
        raise ConfigErrors(problems)
    return cls(**kwargs)


def _parse_scalar(text: str) -> Any:
    """Parse an override value with YAML rules (``3`` -> int, ``1e-4`` -> float, ``[a,b]`` -> list)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        # YAML 1.1 reads "1e-4" as a string; accept it as a number
        try:
            return float(value) if any(c in value for c in "eE.") else int(value)
        except ValueError:
            return value
    return value


def _list_item(node: list, part: str, key: str) -> Any:
    if not part.isdigit() or int(part) >= len(node):
        raise UserError(f"override {key!r}: {part!r} is not an index of a list of {len(node)} item(s) "
                        "(write the whole list in the YAML file to change its length)")
    return node[int(part)]


def _apply_one(data: dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise UserError(f"override {item!r}: expected key=value (e.g. algo.loss=gspo)")
    key, raw = item.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise UserError(f"override {item!r}: expected a dotted key before '=' (e.g. rollout.group_size=8)")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(node, list):
            node = _list_item(node, part, key)
            continue
        if not isinstance(node, dict):
            raise UserError(f"override {key!r}: {'.'.join(parts[:i])} is a single value, not a section")
        if part not in node or node[part] is None:
            node[part] = [] if nxt.isdigit() else {}
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        _list_item(node, last, key)
        node[int(last)] = _parse_scalar(raw)
    elif isinstance(node, dict):
        node[last] = _parse_scalar(raw)
    else:
        raise UserError(f"override {key!r}: {'.'.join(parts[:-1])} is a single value, not a section")


def apply_overrides(data: dict[str, Any], overrides: list[str], problems: list[str] | None = None) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (lists of mappings are indexed: ``rewards.1.weight=2``).

    With ``problems`` given, a bad override is appended there and the others still apply.
    """
    for item in overrides:
        try:
            _apply_one(data, item)
        except UserError as exc:
            if problems is None:
                raise
            problems.append(str(exc))
    return data


def _merge_preset(data: dict[str, Any], problems: list[str] | None = None, where: str = "config") -> dict[str, Any]:
    """Fill algo fields from ``algo.preset`` (``mmrlvr.algos.presets``); keys the user wrote win."""
    algo = data.get("algo") or {}
    if not isinstance(algo, dict):
        return data  # the type check reports it
    name = algo.get("preset")
    if not name:
        return data
    from mmrlvr.algos.presets import PRESETS  # plain dicts, no torch work at import

    if not isinstance(name, str) or name not in PRESETS:
        msg = (f"{where}: algo.preset: unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}"
               f"{did_you_mean(name, sorted(PRESETS))}")
        if problems is None:
            raise UserError(msg)
        problems.append(msg)
        return data
    p = PRESETS[name]
    lp = p.get("loss_params", {})
    ov = p.get("overlong", {})
    rollout = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
    max_new = rollout.get("max_new_tokens", RolloutConfig().max_new_tokens)
    if not isinstance(max_new, (int, float)) or isinstance(max_new, bool):
        max_new = RolloutConfig().max_new_tokens  # the type check reports it
    merged: dict[str, Any] = {
        "advantage": p["advantage"], "loss": p["loss"], "agg": p["agg_mode"],
        "kl_coef": p["kl_coef"], "kl_estimator": p["kl_estimator"],
        "dynamic_sampling": p["dynamic_sampling"],
        "mask_truncated": bool(ov.get("mask_truncated", False)),
        "overlong_cache": int(round(ov.get("cache_fraction", 0.0) * max_new)) if ov.get("shaping") else 0,
        "overlong_penalty": float(ov.get("penalty", 1.0)),
    }
    for key in ("eps_low", "eps_high", "dual_clip"):
        if key in lp:
            merged[key] = lp[key]
    if p.get("advantage_params") and algo.get("advantage", p["advantage"]) == p["advantage"]:
        merged["advantage_params"] = {**p["advantage_params"], **(algo.get("advantage_params") or {})}
    merged.update({k: v for k, v in algo.items() if k != "advantage_params" or "advantage_params" not in merged})
    data["algo"] = merged
    return data


#: value sets owned by the config layer (names that live in registries are checked by mmrlvr.validation)
ENGINES = ("hf", "vllm")
VLLM_SYNCS = ("weights", "lora")
DTYPES = ("float32", "bfloat16", "float16", "auto")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
SCHEDULES = ("constant", "linear", "cosine")
DISTRIBUTED_STRATEGIES = ("ddp", "fsdp2")  # mmrlvr.train.distributed.STRATEGIES
ON_ERROR = ("raise", "skip")
CONSISTENCY_SCOPES = ("answer", "all")


class _RangeChecks:
    """Problems collected in order, one line each (file: key: rule, got)."""

    def __init__(self, where: str) -> None:
        self.where, self.out = where, []

    def need(self, key: str, value: Any, ok: bool, rule: str) -> None:
        if not ok:
            self.out.append(f"{self.where}: {key}: must be {rule}, got {value!r}")

    def one_of(self, key: str, value: Any, allowed: tuple[str, ...]) -> None:
        if value not in allowed:
            self.out.append(f"{self.where}: {key}: unknown value {value!r}; allowed: {', '.join(allowed)}"
                            f"{did_you_mean(value, allowed)}")


def range_problems(cfg: RunConfig, where: str = "config") -> list[str]:
    """Every value-range and cross-field problem of a typed config, one line each (file: key: rule, got), section
    by section in the order of the config."""
    ck = _RangeChecks(where)
    for section in (_run_ranges, _model_ranges, _data_ranges, _rollout_ranges, _algo_ranges, _optim_ranges,
                    _reward_ranges, _consistency_ranges, _eval_ranges):
        section(ck, cfg)
    return ck.out


def _run_ranges(ck: _RangeChecks, cfg: RunConfig) -> None:
    """The run's own keys."""
    ck.need("seed", cfg.seed, cfg.seed >= 0, ">= 0")
    ck.need("max_steps", cfg.max_steps, cfg.max_steps >= 0, ">= 0")
    ck.need("save_every", cfg.save_every, cfg.save_every >= 0, ">= 0 (0 = only at the end)")
    ck.need("keep_checkpoints", cfg.keep_checkpoints, cfg.keep_checkpoints >= 0, ">= 0 (0 = keep all)")
    ck.need("max_bad_steps", cfg.max_bad_steps, cfg.max_bad_steps >= 0, ">= 0")
    ck.need("output_dir", cfg.output_dir, bool(str(cfg.output_dir).strip()), "a folder path")


def _model_ranges(ck: _RangeChecks, cfg: RunConfig) -> None:
    """model.*"""
    m = cfg.model
    ck.one_of("model.dtype", m.dtype, DTYPES)
    if m.attn_implementation is not None:
        ck.one_of("model.attn_implementation", m.attn_implementation, ATTN_IMPLEMENTATIONS)
    ck.need("model.heap_mmap_threshold_mib", m.heap_mmap_threshold_mib, 0 <= m.heap_mmap_threshold_mib <= 32,
         "in [0, 32] (MiB; 0 = glibc's default)")
    ck.need("model.lora.r", m.lora.r, m.lora.r >= 1, ">= 1")
    ck.need("model.lora.alpha", m.lora.alpha, m.lora.alpha > 0, "> 0")
    ck.need("model.lora.dropout", m.lora.dropout, 0 <= m.lora.dropout < 1, "in [0, 1)")
    if m.lora.enabled:
        ck.need("model.lora.target_modules", m.lora.target_modules, bool(m.lora.target_modules), "a non-empty list")


def _data_ranges(ck: _RangeChecks, cfg: RunConfig) -> None:
    """data.*"""
    d = cfg.data
    ck.one_of("data.on_error", d.on_error, ON_ERROR)
    for key in ("train_size", "eval_size", "image_size", "min_pixels", "factor", "max_image_pixels"):
        ck.need(f"data.{key}", getattr(d, key), getattr(d, key) >= 1, ">= 1")
    ck.need("data.max_pixels", d.max_pixels, d.max_pixels >= d.min_pixels, f">= data.min_pixels ({d.min_pixels})")
    if hasattr(d, "max_prompt_length"):  # keys of the data layer (mmrlvr.data.from_config)
        ck.need("data.max_prompt_length", d.max_prompt_length, d.max_prompt_length >= 0, ">= 0 (0 = no limit)")
        ck.need("data.max_dropped_share", d.max_dropped_share, 0 <= d.max_dropped_share <= 1, "in [0, 1]")
        ck.need("data.video_fps", d.video_fps, d.video_fps > 0, "> 0")
        ck.need("data.video_min_frames", d.video_min_frames, d.video_min_frames >= 1, ">= 1")
        ck.need("data.video_max_frames", d.video_max_frames, d.video_max_frames >= d.video_min_frames,
             f">= data.video_min_frames ({d.video_min_frames})")
        ck.need("data.video_max_pixels", d.video_max_pixels, d.video_max_pixels >= 1, ">= 1")


def _rollout_ranges(ck: _RangeChecks, cfg: RunConfig) -> None:
    """rollout.* (the vLLM sync against model.lora)"""
    r, m = cfg.rollout, cfg.model
    ck.one_of("rollout.engine", r.engine, ENGINES)
    ck.need("rollout.group_size", r.group_size, r.group_size >= 2, ">= 2 (group-relative advantages need a group)")
    ck.need("rollout.prompts_per_step", r.prompts_per_step, r.prompts_per_step >= 1, ">= 1")
    ck.need("rollout.max_new_tokens", r.max_new_tokens, r.max_new_tokens >= 1, ">= 1")
    ck.need("rollout.temperature", r.temperature, r.temperature > 0, "> 0")
    ck.need("rollout.top_p", r.top_p, 0 < r.top_p <= 1, "in (0, 1]")
    ck.need("rollout.top_k", r.top_k, r.top_k >= 0, ">= 0 (0 = off)")
    ck.need("rollout.vllm_gpu_memory_utilization", r.vllm_gpu_memory_utilization,
         0 < r.vllm_gpu_memory_utilization <= 1, "in (0, 1]")
    ck.need("rollout.vllm_kv_cache_gib", r.vllm_kv_cache_gib, r.vllm_kv_cache_gib > 0, "> 0 (GiB)")
    ck.need("rollout.vllm_max_model_len", r.vllm_max_model_len, r.vllm_max_model_len >= 0, ">= 0 (0 = the model's own)")
    ck.one_of("rollout.vllm_sync", r.vllm_sync, VLLM_SYNCS)
    ck.one_of("rollout.vllm_dtype", r.vllm_dtype, DTYPES)
    if r.engine == "vllm" and r.vllm_sync == "lora" and not m.lora.enabled:
        ck.out.append(f"{ck.where}: rollout.vllm_sync: 'lora' needs model.lora.enabled: true (a full fine-tune syncs its "
                   f"weights: vllm_sync: weights)")


def _algo_ranges(ck: _RangeChecks, cfg: RunConfig) -> None:
    """algo.* (overlong shaping against rollout.max_new_tokens)"""
    a, r = cfg.algo, cfg.rollout
    ck.need("algo.eps_low", a.eps_low, 0 <= a.eps_low <= 1, "in [0, 1] (CISPO: eps_low 1 = no lower bound)")
    ck.need("algo.eps_high", a.eps_high, a.eps_high >= 0, ">= 0")
    if a.dual_clip is not None:
        ck.need("algo.dual_clip", a.dual_clip, a.dual_clip > 1, "> 1 (e.g. 3.0) or null")
    ck.need("algo.kl_coef", a.kl_coef, a.kl_coef >= 0, ">= 0 (0 = no KL term)")
    ck.need("algo.epochs", a.epochs, a.epochs >= 1, ">= 1")
    ck.need("algo.micro_batch_size", a.micro_batch_size, a.micro_batch_size >= 1, ">= 1")
    ck.need("algo.overlong_cache", a.overlong_cache, 0 <= a.overlong_cache < max(r.max_new_tokens, 1),
         f">= 0 and < rollout.max_new_tokens ({r.max_new_tokens})")
    ck.need("algo.overlong_penalty", a.overlong_penalty, a.overlong_penalty >= 0, ">= 0")


def _optim_ranges(ck: _RangeChecks, cfg: RunConfig) -> None:
    """optim.*"""
    o = cfg.optim
    ck.need("optim.lr", o.lr, o.lr >= 0, ">= 0")
    ck.need("optim.weight_decay", o.weight_decay, o.weight_decay >= 0, ">= 0")
    ck.need("optim.betas", o.betas, len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "two numbers in [0, 1)")
    ck.need("optim.grad_clip", o.grad_clip, o.grad_clip >= 0, ">= 0 (0 = off)")
    ck.one_of("optim.schedule", o.schedule, SCHEDULES)
    ck.need("optim.warmup_steps", o.warmup_steps, o.warmup_steps >= 0, ">= 0")
    if hasattr(o, "state_dtype"):
        ck.one_of("optim.state_dtype", o.state_dtype, DTYPES)


def _reward_ranges(ck: _RangeChecks, cfg: RunConfig) -> None:
    """rubric.*, credit.*, rewards"""
    rb = cfg.rubric
    if getattr(rb, "max_unknown_rate", None) is not None:
        ck.need("rubric.max_unknown_rate", rb.max_unknown_rate, 0 <= rb.max_unknown_rate <= 1, "in [0, 1] or null (never stop)")
    if hasattr(rb, "warn_unknown_rate"):
        ck.need("rubric.warn_unknown_rate", rb.warn_unknown_rate, 0 <= rb.warn_unknown_rate <= 1, "in [0, 1]")
    ck.need("credit.chunk_size", cfg.credit.chunk_size, cfg.credit.chunk_size >= 1, ">= 1")
    for i, spec in enumerate(cfg.rewards):
        if not spec.name:
            ck.out.append(f"{ck.where}: rewards[{i}].name: missing (a registered reward name, e.g. format)")


def _consistency_ranges(ck: _RangeChecks, cfg: RunConfig) -> None:
    """consistency.*, distributed.*"""
    c = cfg.consistency
    ck.one_of("consistency.scope", c.scope, CONSISTENCY_SCOPES)
    for key in ("alpha", "beta", "beta_min", "beta_warmup_steps", "beta_decay_steps"):
        ck.need(f"consistency.{key}", getattr(c, key), getattr(c, key) >= 0, ">= 0")
    if c.split_advantage and c.component not in [s.name for s in cfg.rewards]:
        ck.out.append(f"{ck.where}: consistency.split_advantage: needs a reward named {c.component!r} in rewards "
                   f"(have: {', '.join(s.name for s in cfg.rewards) or 'none'})")
    if hasattr(cfg, "distributed"):
        ck.one_of("distributed.strategy", cfg.distributed.strategy, DISTRIBUTED_STRATEGIES)


def _eval_ranges(ck: _RangeChecks, cfg: RunConfig) -> None:
    """eval.*"""
    e = cfg.eval
    ck.need("eval.every", e.every, e.every >= 0, ">= 0 (0 = only before and after training)")
    ck.need("eval.k", e.k, e.k >= 1, ">= 1")
    ck.need("eval.temperature", e.temperature, e.temperature > 0, "> 0")
    if e.limit is not None:
        ck.need("eval.limit", e.limit, e.limit >= 1, ">= 1 or null (all)")


def validate(cfg: RunConfig, where: str = "config") -> RunConfig:
    """Cross-field checks that a single field's type cannot express (a config built in code; a loaded one had them
    in ``collect_config``), every problem raised at once; then the defaults that depend on other keys."""
    problems = range_problems(cfg, where)
    if problems:
        raise ConfigErrors(problems)
    return apply_dependent_defaults(cfg)


def apply_dependent_defaults(cfg: RunConfig) -> RunConfig:
    """Defaults that depend on other keys, written into ``cfg``: the answer-scoped consistency split's reward
    variant."""
    if cfg.consistency.split_advantage and cfg.consistency.scope == "answer":
        # the consistency advantage reaches only the answer's tokens, so plain agreement is safe there (it
        # cannot be earned by rewriting the thinking) and it measured best of the answer-scoped variants;
        # sequence-level use keeps the reward's own default (accurate_only)
        for spec in cfg.rewards:
            if spec.name == cfg.consistency.component and "variant" not in spec.params:
                spec.params["variant"] = "plain"
    return cfg


def _read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{p}: is a folder, not a config file (give a YAML file, e.g. configs/demo-tiny.yaml)")
    if not p.is_file():
        raise UserError(f"{p}: config file not found")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError:
        raise UserError(f"{p}: not a text file (a YAML config is expected)") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{p}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{p}: the top level must be a mapping of keys")
    return raw


_KEY = re.compile(r"^[A-Za-z_][\w.\[\]<>-]*$")


@dataclass(frozen=True)
class Problem:
    """One problem of a config: where it was found (the file, or ``config``), the key it is about (``""`` when it
    is about the whole config) and what is wrong. ``str()`` is the line the CLI prints: ``where: key: message``."""

    where: str
    key: str
    message: str

    @classmethod
    def parse(cls, line: str, where: str) -> "Problem":
        """The problem a check reported as a line (``where: key: message``, or any text)."""
        prefixed = line.startswith(f"{where}: ")
        rest = line[len(where) + 2:] if prefixed else line
        head, sep, tail = rest.partition(": ")
        where = where if prefixed else ""  # a line that names no file is printed as it was reported
        if sep and _KEY.match(head):
            return cls(where, head, tail)
        return cls(where, "", rest)

    def __str__(self) -> str:
        body = f"{self.key}: {self.message}" if self.key else self.message
        return f"{self.where}: {body}" if self.where else body


@dataclass
class LoadedConfig:
    """A run's config as loaded and checked: the typed config and what the load learnt beside it.

    ``sources``: where each value set in the file or the overrides came from (``user``, ``preset``, ``loss default``;
    every other key has its default), for the plan and the stage selection (a fallback stage conflicts only with a
    choice the run asked for). ``notes``: lines the run prints at its start (loss defaults applied, keys moved).
    ``plan``: the run's plan once the stages are checked (``mmrlvr.validation.check_run``), built once and handed to
    the trainer. ``problems``: every problem found, each with its key."""

    config: RunConfig
    where: str = "config"
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    plan: Any = None

    @classmethod
    def of(cls, cfg: RunConfig) -> "LoadedConfig":
        """A config built in code: its sources read from its values (``value_sources``), no notes, no plan."""
        return cls(cfg, sources=value_sources(cfg))

    def add(self, lines: list[str]) -> None:
        """Problems reported as lines by a check; a problem two checks found is kept once."""
        for line in lines:
            p = Problem.parse(line, self.where)
            if p not in self.problems:
                self.problems.append(p)

    def raise_problems(self) -> "LoadedConfig":
        """``ConfigErrors`` listing every problem, or ``self``."""
        if self.problems:
            raise ConfigErrors([str(p) for p in self.problems])
        return self


def _leaf_values(data: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every leaf of a nested mapping, as ``leaf_keys`` names them (lists are values)."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix: data} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(_leaf_values(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def value_sources(cfg: RunConfig) -> dict[str, str]:
    """Where the values of a config built in code come from, read from the values themselves: a key whose value is
    what its preset (``algo.preset``) or its loss's own defaults give is ``preset`` / ``loss default``, any other key
    whose value is not the default is ``user``. A loaded config knows its sources from the file and the overrides
    (``LoadedConfig.sources``); the two differ only for a key set to the value it would have had anyway."""
    values = _leaf_values(json.loads(json.dumps(dataclasses.asdict(cfg), default=str)))
    defaults = _leaf_values(json.loads(json.dumps(dataclasses.asdict(RunConfig()), default=str)))
    seed = {"algo": {"preset": cfg.algo.preset, "loss": cfg.algo.loss},
            "rollout": {"max_new_tokens": cfg.rollout.max_new_tokens}}
    filled = _merge_preset(json.loads(json.dumps(seed)), [], "config") if cfg.algo.preset else seed
    preset = {k: v for k, v in _leaf_values(filled).items() if k not in _leaf_values(seed)}
    _, defaulted = _apply_loss_defaults(filled, set(seed["algo"]) | {k.split(".", 1)[1] for k in preset
                                                                     if k.startswith("algo.")})
    loss = {f"algo.{k}": filled["algo"][k] for k in defaulted}
    out: dict[str, str] = {}
    for key, value in values.items():
        if key in preset and preset[key] == value:
            out[key] = "preset"
        elif key in loss and loss[key] == value:
            out[key] = "loss default"
        elif value != defaults.get(key):
            out[key] = "user"
    return out


def collect_config(path: str | Path | None = None, overrides: list[str] | None = None,
                   data: dict[str, Any] | None = None) -> LoadedConfig:
    """The config with every type, key, override and range problem found (``LoadedConfig.problems``), none raised.

    A missing or unreadable file still raises at once (nothing else can be checked). Bad values keep their
    defaults in the returned config so later checks (``mmrlvr.validation``) can still run on the rest.
    """
    where = str(path) if path is not None else "config"
    raw: dict[str, Any] = _read_yaml(path) if path is not None else {}
    if data:
        raw = {**raw, **json.loads(json.dumps(data))}
    problems: list[str] = []
    raw = apply_overrides(raw, list(overrides or []), problems)
    notes: list[str] = []
    _move_method_keys(raw, notes, problems, where)
    _move_renamed_keys(raw, notes, problems, where)
    user_keys = set(leaf_keys(raw))
    user_algo = raw.get("algo") if isinstance(raw.get("algo"), dict) else {}
    user_algo_keys = set(user_algo)
    raw = _merge_preset(raw, problems, where)
    preset_keys = set(leaf_keys(raw)) - user_keys
    loss_notes, defaulted = _apply_loss_defaults(raw, user_algo_keys)
    notes += loss_notes
    loss_default_keys = {f"algo.{k}" for k in defaulted} - user_keys
    cfg = _build(RunConfig, raw, where, "", problems)
    problems += range_problems(cfg, where)
    problems += _builtin_method_problems(cfg, where)
    sources = {**{k: "preset" for k in preset_keys}, **{k: "loss default" for k in loss_default_keys},
               **{k: "user" for k in user_keys}}
    loaded = LoadedConfig(cfg, where, sources, notes)
    loaded.add(problems)
    return loaded


def _builtin_method_problems(cfg: RunConfig, where: str) -> list[str]:
    """Parameters of the built-in methods the config names (``mmrlvr.methods``), checked at load; a name that is
    not built in may be a plug-in's: ``mmrlvr.validation.method_problems`` checks it once plug-ins are loaded."""
    from mmrlvr.methods import METHOD_KINDS, _declared, _dotted, resolve_method

    out: list[str] = []
    for kind, mk in METHOD_KINDS.items():
        if mk.listed:  # checked whole (names included) by mmrlvr.validation.method_problems
            continue
        name = _dotted(cfg, mk.name_key)
        if mk.params_key and name in _declared(kind):
            out += resolve_method(kind, name, _dotted(cfg, mk.params_key), where)[1]
    return out


def leaf_keys(data: Any, prefix: str = "") -> list[str]:
    """Dotted keys of every value in a nested mapping (``{"algo": {"loss_params": {"noise": 0.1}}}`` ->
    ``["algo.loss_params.noise"]``); lists are values (``rewards`` is one key)."""
    if not isinstance(data, dict) or (prefix and not data):
        return [prefix] if prefix else []
    out: list[str] = []
    for k, v in data.items():
        out += leaf_keys(v, f"{prefix}.{k}" if prefix else str(k))
    return out


#: method parameters that were ``algo`` fields before parameters moved beside their method:
#: old key -> (method kind, method, parameter); they work for one release, with a note naming the new key
MOVED_METHOD_KEYS: dict[str, tuple[str, str, str]] = {
    "nsr_noise": ("loss", "nsr", "noise"),
    "acpo_eps0": ("clip", "acpo", "eps0"), "acpo_alpha": ("clip", "acpo", "alpha"),
    "acpo_eps_min": ("clip", "acpo", "eps_min"), "acpo_eps_max": ("clip", "acpo", "eps_max"),
    "popo_temperature": ("loss", "popo", "temperature"), "popo_threshold": ("loss", "popo", "threshold"),
    "popo_sim_coef": ("loss", "popo", "sim_coef"), "popo_ent_coef": ("loss", "popo", "ent_coef"),
    "popo_ema_tau": ("loss", "popo", "ema_tau"),
    "poise_lr": ("advantage", "poise", "lr"), "poise_buffer_steps": ("advantage", "poise", "buffer_steps"),
    "poise_train_iters": ("advantage", "poise", "train_iters"),
}
_KIND_KEY = {"loss": ("loss", "ppo_clip"), "advantage": ("advantage", "grpo"), "clip": ("clip", "fixed")}


#: keys renamed so that every method's parameters sit beside its name as ``X_params``: old -> new (section, key);
#: a config written with the old name (a run folder's config.yaml) loads with a note
RENAMED_KEYS: dict[tuple[str, str], str] = {
    ("credit", "params"): "scheme_params",
    ("algo", "rollout_correction_cap"): "rollout_correction_params.cap",
    ("algo", "rollout_correction_level"): "rollout_correction_params.level",
    ("algo", "dynamic_sampling_metric"): "dynamic_sampling_params.metric",
    ("algo", "dynamic_sampling_max_rounds"): "dynamic_sampling_params.max_rounds",
}


def _move_renamed_keys(raw: dict[str, Any], notes: list[str], problems: list[str], where: str) -> None:
    """Values under a renamed key (``RENAMED_KEYS``) move to the new one with a note; set both ways, a problem."""
    for (section, old), new in RENAMED_KEYS.items():
        block = raw.get(section)
        if not isinstance(block, dict) or old not in block:
            continue
        value = block.pop(old)
        *parents, leaf = new.split(".")
        target = block
        for p in parents:
            target = target.setdefault(p, {}) if isinstance(target.get(p, {}), dict) else None
            if target is None:
                break
        if target is None:
            continue  # the new key holds something other than a mapping: the type check reports it
        if leaf in target:
            problems.append(f"{where}: {section}.{old} and {section}.{new} are the same setting ({section}.{old} "
                            f"is its old name); keep {section}.{new}")
            continue
        target[leaf] = value
        notes.append(f"{section}.{old} is now {section}.{new} (a method's parameters sit beside its name); "
                     f"rename it in the config")


def _move_method_keys(raw: dict[str, Any], notes: list[str], problems: list[str], where: str) -> None:
    """Old method-prefixed ``algo`` keys (``algo.popo_threshold``) move to their method's parameters
    (``algo.loss_params.threshold``), with a note; a value set both ways is a problem naming both keys. An old key
    of a method the run does not use is checked, noted as inert and dropped."""
    algo = raw.get("algo")
    if not isinstance(algo, dict):
        return
    from mmrlvr.methods import METHOD_KINDS, method_spec

    for old in [k for k in algo if k in MOVED_METHOD_KEYS]:
        kind, method, param = MOVED_METHOD_KEYS[old]
        value = algo.pop(old)
        name_field, default = _KIND_KEY[kind]
        params_key = METHOD_KINDS[kind].params_key
        new = f"{params_key}.{param}"
        spec = method_spec(kind, method)
        why = spec.param(param).problem(value) if spec is not None and spec.param(param) else None
        if why:
            problems.append(f"{where}: algo.{old}: {why} (now {new})")
            continue
        chosen = algo.get(name_field, default)
        if chosen != method:
            notes.append(f"algo.{old} is inert: it is a parameter of {METHOD_KINDS[kind].name_key}: {method}, and this "
                         f"run uses {chosen!r} (the key is now {new})")
            continue
        params = algo.setdefault(f"{kind}_params", {})
        if not isinstance(params, dict):
            continue  # the type check reports it
        if param in params:
            problems.append(f"{where}: algo.{old} and {new} are the same parameter; keep {new}")
            continue
        params[param] = value
        notes.append(f"algo.{old} is now {new} (the old key works until the next release)")


def _apply_loss_defaults(raw: dict[str, Any], user_algo_keys: set[str]) -> tuple[list[str], set[str]]:
    """Each policy loss owns its defaults (``mmrlvr.algos.presets.loss_defaults``): ``algo.loss: gspo`` without a
    preset gets GSPO's clip range and aggregation, not PPO's. Keys the user wrote (or the loss's own preset filled)
    win. Returns one note per loss whose defaults were applied, for the run's log, and the keys set from the
    loss's defaults (the plan's "loss default" source)."""
    algo = raw.get("algo") if isinstance(raw.get("algo"), dict) else {}
    loss = algo.get("loss", AlgoConfig().loss)
    if not isinstance(loss, str):
        return [], set()  # the type check reports it
    from mmrlvr.algos.presets import explicit_algo_keys, resolve_loss_params

    values = {**{f.name: getattr(AlgoConfig(), f.name) for f in dataclasses.fields(AlgoConfig)}, **algo}
    explicit = explicit_algo_keys(user_algo_keys, algo.get("preset"), loss)
    params, notes = resolve_loss_params(loss, values, explicit)
    if params:
        raw["algo"] = {**algo, **params}
    return notes, set(params) - explicit


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> RunConfig:
    """Load a YAML config (or a dict), apply overrides, validate. Errors name the file and the key.

    Every problem is reported at once (``ConfigErrors``, one line each).
    """
    return load(path, overrides, data).config


def load(path: str | Path | None = None, overrides: list[str] | None = None,
         data: dict[str, Any] | None = None) -> LoadedConfig:
    """``load_config`` keeping what the load learnt beside the config (``LoadedConfig``: sources, notes), for a
    trainer that prints the notes and shows each setting's source. Raises ``ConfigErrors`` like ``load_config``."""
    loaded = collect_config(path, overrides, data).raise_problems()  # ranges checked there
    apply_dependent_defaults(loaded.config)
    return loaded


def describe(cls: type = RunConfig, prefix: str = "") -> list[str]:
    """One line per config key with its default and help (``mmrlvr train --help-config``)."""
    lines = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"{key}: {f.metadata.get('help', '')}")
            lines.extend(describe(tp, key + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(default) or (isinstance(default, list) and default and dataclasses.is_dataclass(default[0])):
            default = json.loads(json.dumps(default, default=lambda o: dataclasses.asdict(o)))
        lines.append(f"{key} = {default!r}  # {f.metadata.get('help', '')}{_declared_names(key)}")
    return lines


def _declared_names(key: str) -> str:
    """``: name | name | ... | plug-ins`` for a key that names a method (``algo.loss``), from the methods' own
    declarations, so the help never lists a name twice or misses one."""
    from mmrlvr.methods import METHOD_KINDS, _declared

    kind = next((k for k, mk in METHOD_KINDS.items() if mk.name_key == key and k == "loss"), None)
    if kind is None:
        return ""
    return ": " + " | ".join([*_declared(kind), "plug-ins"])
