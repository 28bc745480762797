"""vLLM rollout engine (GPU, optional extra ``mmrlvr[vllm]``): fast sampling, same ``RolloutBatch`` out.

Split in two on purpose:
- pure request building (``build_requests``, ``vllm_sampling_kwargs``, ``to_vllm_prompt``): prompt text from
  the processor's chat template (one ``<|image_pad|>`` per image; vLLM expands it), the images as
  ``multi_modal_data``, our ``SamplingParams`` mapped to vLLM's, and one request per response row with its
  own seed ``row_seed(seed, step, prompt id, sample index)``. Tested on CPU without vLLM installed.
  Videos (``sample.meta["videos"]``, the frames ``mmrlvr.data.video`` sampled) go as ``multi_modal_data["video"]``:
  a [T, H, W, 3] uint8 array per clip, with ``(array, metadata)`` and ``do_sample_frames=False`` where the model
  times frames from metadata (Qwen3-VL), so vLLM sees exactly the frames the HF processor and trainer see.
- ``VLLMEngine``: runs the requests through an offline ``vllm.LLM`` and assembles the batch with the HF
  processor's prompt tensors (so the trainer teacher-forces exactly as with ``HFEngine``).

Log-probs: vLLM returns the sampled token's log-prob (``logprobs=0``). The engine is created with
``logprobs_mode="processed_logprobs"`` so they are taken after temperature scaling, i.e.
log_softmax(logits / T) as in ``HFEngine`` — but, unlike ``HFEngine``, after top-k / top-p truncation too
(renormalised over the kept tokens), and from vLLM's kernels (bf16 numerics differ from the trainer's
forward). Where exact ratios at step start matter, recompute old log-probs with a teacher-forced pass.

Weight sync (after each optimizer step): ``mode="weights"`` sends the trainer's (LoRA-merged) state dict
to the workers' ``model.load_weights`` through ``LLM.collective_rpc`` and resets the prefix cache;
``mode="lora"`` saves the adapter to a folder and passes a new ``LoRARequest`` with the next requests.
These paths need a GPU box with vLLM: ``benchmarks/gpu_check.sh`` exercises them; CPU tests cannot.
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
VIDEO_METADATA_MODELS: frozenset[str] = frozenset({"qwen3_vl", "qwen3_vl_moe"})


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


def import_vllm() -> Any:
    """``vllm``, or a UserError saying how to get it (it is an optional, GPU-only extra)."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise UserError("rollout.engine=vllm needs vLLM (GPU only): pip install 'mmrlvr[vllm]'; "
                        f"or use rollout.engine=hf ({exc})") from None


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside each vLLM worker process (``collective_rpc``)."""
    device = next(worker.model_runner.model.parameters()).device
    worker.model_runner.model.load_weights(weights=[(n, t.to(device)) for n, t in weights])


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


class VLLMEngine:
    """``RolloutEngine`` over an offline ``vllm.LLM`` (see the module docstring).

    model_path: the folder vLLM loads first (the policy's starting weights). processor: the HF processor
    of the same folder (prompt tensors for teacher forcing). sync: "weights" or "lora".
    policy: the trainer's model; when given, every ``generate`` first syncs its current weights (so a
    trainer that never calls ``sync_weights``, or one that resumed from a checkpoint, still samples from
    the current policy). llm_kwargs: passed to ``vllm.LLM`` (e.g. gpu_memory_utilization, max_model_len).
    """

    @classmethod
    def from_config(cls, cfg: Any, policy: torch.nn.Module, processor: Any) -> "VLLMEngine":
        """The engine for a ``RunConfig`` (rollout.engine = vllm), colocated with the trainer's policy."""
        from mmrlvr.train.model_path import resolve_model_path

        gen = getattr(policy, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else None)
        dtype = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}.get(cfg.model.dtype, "auto")
        return cls(resolve_model_path(cfg.model.path), processor, policy=policy, eos_ids=eos_ids, dtype=dtype,
                   gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization, seed=cfg.seed)

    def __init__(self, model_path: str | Path, processor: Any, *, sync: str = "weights",
                 eos_ids: list[int] | None = None, policy: torch.nn.Module | None = None,
                 **llm_kwargs: Any) -> None:
        if sync not in ("weights", "lora"):
            raise UserError(f"unknown vLLM weight sync {sync!r}; use 'weights' or 'lora'")
        vllm = import_vllm()
        self._vllm = vllm
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.sync = sync
        eos = eos_ids if eos_ids is not None else [self.tokenizer.eos_token_id]
        self.eos_ids = [int(e) for e in eos]
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0])
        kwargs = {"model": str(model_path), "logprobs_mode": "processed_logprobs", "enable_prefix_caching": True,
                  **llm_kwargs}
        if sync == "lora":
            kwargs.setdefault("enable_lora", True)
        self.llm = vllm.LLM(**kwargs)
        try:
            self.model_type = str(json.loads((Path(model_path) / "config.json").read_text()).get("model_type", ""))
        except (OSError, ValueError):
            self.model_type = ""
        self._lora_request = None
        self._lora_version = 0
        self._lora_dir = Path(tempfile.mkdtemp(prefix="mmrlvr-lora-"))
        self.policy = policy

    def generate(self, samples: list[Sample], group_size: int, params: SamplingParams, *, seed: int,
                 step: int) -> RolloutBatch:
        t0 = time.perf_counter()
        if self.policy is not None:
            self.sync_weights(self.policy)
        t_sync = time.perf_counter()
        requests = build_requests(self.processor, samples, group_size, params, seed=seed, step=step,
                                  stop_token_ids=self.eos_ids)
        prompts = [to_vllm_prompt(r, video_metadata=self.model_type in VIDEO_METADATA_MODELS) for r in requests]
        sampling = [self._vllm.SamplingParams(**r.sampling) for r in requests]
        kwargs = {"lora_request": self._lora_request} if self._lora_request is not None else {}
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False, **kwargs)
        t1 = time.perf_counter()
        rows, lps, finish = [], [], []
        for out in outputs:  # vLLM returns outputs in request order
            o = out.outputs[0]
            ids = list(o.token_ids)
            rows.append(ids)
            lps.append(sampled_logprobs(ids, o.logprobs))
            finish.append("stop" if o.finish_reason == "stop" else "length")
        # prompt tensors for the trainer's teacher-forced pass come from the HF processor, as HFEngine's
        tokenizer = self.tokenizer
        inputs = encode_prompt_batch(self.processor, samples)
        vision = expand_vision(inputs, [len(s.images) for s in samples], group_size,
                               [len(s.meta.get("videos") or []) for s in samples])
        return assemble_batch(samples, group_size, inputs, vision, pad_rows(rows, self.pad_id, torch.long),
                              pad_rows(lps, 0.0, torch.float), eos_ids=self.eos_ids, pad_id=self.pad_id,
                              tokenizer=tokenizer, finish_reasons=finish,
                              timings={"sync_s": t_sync - t0, "generate_s": t1 - t_sync,
                                       "total_s": time.perf_counter() - t0})

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push the trainer's current weights into vLLM (call after every optimizer step)."""
        if self.sync == "lora":
            self._lora_version += 1
            folder = self._lora_dir / f"v{self._lora_version}"
            model.save_pretrained(folder)  # a PeftModel saves only the adapter
            lora_request_cls = importlib.import_module("vllm.lora.request").LoRARequest
            self._lora_request = lora_request_cls(f"policy-v{self._lora_version}", self._lora_version, str(folder))
            return
        weights = list(merged_state_dict(model).items())
        self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
