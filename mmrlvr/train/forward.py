"""Teacher-forced passes over (prompt + response): log-probs and entropies of the response tokens.

Layout (mmrlvr.rollout.base): response token j is predicted by the logits at position P-1+j. We ask the
model for only the last L+1 positions (``logits_to_keep``) so a long image prompt never materialises
[N, P+L, V] logits, then drop the final position.

``VisionFeatureCache`` runs the vision tower once per distinct prompt per step and hands the features to
every later pass (reference, policy, perturbed-free passes) through transformers' ``mm_encoder_outputs``
— valid only while the vision tower is frozen (it gets no gradient, so reuse is exact).

``token_logprobs`` never materialises the [N, L, V] logits of a micro-batch (V = 151,936 for Qwen): the
LM head's *input* (the last L+1 hidden states) is captured by a forward pre-hook that hands the head an
empty slice, and ``mmrlvr.algos.logits.logprobs_from_hidden`` computes log-probs (and entropies) chunk by
chunk, its backward recomputing each chunk. The model is still called through its own ``forward`` (so
DDP's gradient hooks, peft's adapters and accelerate's wrappers all run). ``response_logits`` keeps the
full-logits path for callers that need the distribution itself (deferred token credit).
"""

from __future__ import annotations

import collections
from typing import Any

import torch

from mmrlvr.algos import entropy_from_logits, logprobs_from_logits
from mmrlvr.algos.cpu_linear import onednn_linears
from mmrlvr.algos.logits import Observer, logprobs_from_hidden
from mmrlvr.models.placement import model_device, to_model
from mmrlvr.rollout.vision import encode_images, encoder_outputs, find_vlm_core, supports_precomputed_vision

# positions per chunk of the full-vocabulary log-prob / entropy passes. Measured on CPU ([4, 512, 32k]
# logits, one thread): 256 takes about half the time of 1024, whose [1024, V] float32 buffers (131 MB) are
# returned to the OS and page-faulted back in on every chunk; 128 gains nothing more.
LOGPROB_CHUNK = 256


def response_logits(model: torch.nn.Module, inputs: dict[str, Any], response_length: int) -> torch.Tensor:
    """Logits predicting each response token. Returns [N, L, V] (float, as the model computes it), on the
    model's device (``inputs`` are moved there)."""
    out = model(**to_model(inputs, model), logits_to_keep=response_length + 1, use_cache=False)
    return out.logits[:, :-1, :]


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under DDP / torch.compile wrappers (peft models keep their wrapper: it forwards)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def fusable_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The LM head when logits are exactly ``lm_head(hidden)``: a bias-free ``nn.Linear`` and no final
    soft-capping / logit scaling in the config (Gemma-2 style); else None (callers use the logits path).
    A peft-wrapped head (LoRA on lm_head, modules_to_save) is not a plain ``nn.Linear`` and is refused."""
    core = _unwrap(model)
    get = getattr(core, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    configs = [getattr(core, "config", None)]
    configs.append(getattr(configs[0], "text_config", None))
    for cfg in configs:
        for key in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale"):
            v = getattr(cfg, key, None) if cfg is not None else None
            if v not in (None, 1, 1.0):
                return None
    return head


class _CaptureHeadInput:
    """Forward pre-hook on the LM head: keep its input, give the head an empty position slice instead.

    The model's forward then returns [N, 0, V] logits (no vocabulary-sized buffer) while the hidden states
    stay in the autograd graph. ``states`` stays None if the model never called its head with a tensor
    argument (the caller then falls back to the logits path)."""

    def __init__(self) -> None:
        self.states: torch.Tensor | None = None

    def __call__(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        if self.states is not None or not args or not torch.is_tensor(args[0]) or args[0].dim() < 2:
            return None
        self.states = args[0]
        return (args[0][..., :0, :], *args[1:])


def response_hidden_states(model: torch.nn.Module, inputs: dict[str, Any], response_length: int
                           ) -> tuple[torch.Tensor, torch.nn.Linear] | None:
    """(hidden states [N, L, H] that predict each response token, the LM head), or None when the model's
    logits are not ``head(hidden)`` or the capture did not happen (then use ``response_logits``)."""
    head = fusable_head(model)
    if head is None:
        return None
    hook = _CaptureHeadInput()
    handle = head.register_forward_pre_hook(hook)
    try:
        out = model(**inputs, logits_to_keep=response_length + 1, use_cache=False)  # on its device (token_logprobs)
    finally:
        handle.remove()
    states = hook.states
    del out
    if states is None or states.shape[-2] < response_length + 1:
        return None
    return states[..., -(response_length + 1):-1, :], head


def token_logprobs(model: torch.nn.Module, inputs: dict[str, Any], response_ids: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False,
                   chunk_size: int = LOGPROB_CHUNK, *, prompt_length: int | None = None,
                   rows_per_prompt: int = 1, observe: Observer | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t) [N, L] (and entropy H_t [N, L], detached) at the sampling temperature.

    Fused path (``logprobs_from_hidden``) whenever the head allows it: equal to the logits path below
    up to float rounding (tests: 1e-5 in float32 on the tiny VLM and a Qwen2.5-VL-3B-shaped stand-in).
    With ``rows_per_prompt`` = G > 1 and ``prompt_length`` (``model.prefix_sharing``) each group's prompt runs
    once (``prefix_shared_logprobs``) where that applies; gradient or not follows the caller's grad mode.
    ``observe`` (``mmrlvr.algos.logits.Observer``) sees every chunk's logits on whichever path runs (in-update
    token credit reads the clean distribution there: ``mmrlvr.credit.signals.SignalsBeside``).

    The pass runs on the model's device; the results come back on ``response_ids``' device (the batch's:
    ``mmrlvr.models.placement``), with the gradient flowing back through the copy."""
    home = response_ids.device
    inputs, response_ids = to_model(inputs, model), response_ids.to(model_device(model))
    with onednn_linears(model):  # no-grad passes: oneDNN's CPU products (``mmrlvr.algos.cpu_linear``)
        logp, ent = _token_logprobs(model, inputs, response_ids, temperature, with_entropy, chunk_size,
                                    prompt_length, rows_per_prompt, observe)
    return logp.to(home), (ent.to(home) if ent is not None else None)


def _token_logprobs(model, inputs, response_ids, temperature, with_entropy, chunk_size, prompt_length,
                    rows_per_prompt, observe) -> tuple[torch.Tensor, torch.Tensor | None]:
    if rows_per_prompt > 1 and prompt_length is not None:
        shared = prefix_shared_logprobs(model, inputs, response_ids, prompt_length, rows_per_prompt,
                                        temperature=temperature, with_entropy=with_entropy, chunk_size=chunk_size,
                                        observe=observe)
        if shared is not None:
            return shared
    captured = response_hidden_states(model, inputs, response_ids.shape[1])
    if captured is not None:
        states, head = captured
        PASS_COUNTS["fused"] += 1
        return logprobs_from_hidden(states, head.weight, response_ids, temperature=temperature,
                                    chunk_size=chunk_size, with_entropy=with_entropy, observe=observe)
    logits = response_logits(model, inputs, response_ids.shape[1])
    PASS_COUNTS["logits"] += 1
    logp = logprobs_from_logits(logits, response_ids, temperature=temperature, chunk_size=chunk_size,
                                observe=observe)
    ent = None
    if with_entropy:
        with torch.no_grad():
            ent = entropy_from_logits(logits.detach(), temperature=temperature, chunk_size=chunk_size)
    return logp, ent


def prefix_sharing(cfg: Any, rollouts: Any) -> dict[str, Any]:
    """``token_logprobs``' prefix-sharing arguments for a run's passes over a ``RolloutBatch``: the group size
    and prompt length with ``model.prefix_sharing``, nothing without it."""
    if not cfg.model.prefix_sharing:
        return {}
    g = rollouts.uniform_group_size()
    if g is None:  # groups of different sizes: no shared layout of G rows per prompt, whole rows instead
        return {}
    return {"prompt_length": rollouts.prompt_length, "rows_per_prompt": g}


def prefix_shared_logprobs(model: torch.nn.Module, inputs: dict[str, Any], response_ids: torch.Tensor,
                           prompt_length: int, rows_per_prompt: int, temperature: float = 1.0,
                           with_entropy: bool = False, chunk_size: int = LOGPROB_CHUNK,
                           observe: Observer | None = None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """log pi(o_t) [N, L] (and entropies) with each group's prompt run once, or None (then the whole-row pass).

    Prefix sharing (``model.prefix_sharing``; docs/performance.md, "Prefix sharing"): the G rows of a group share
    their prompt (image tokens included), so ``mmrlvr.credit.signals.shared_prefix_states`` runs the prompt
    once per group with a KV cache repeated G times and only the responses on top; log-probs come from the fused
    chunked head. Under ``torch.no_grad`` for the reference / old-policy passes; with gradient for the policy
    pass, where the prompt's activations are kept once per group instead of G times. Equal to the whole-row
    pass up to float rounding (tests: values and gradients within 1e-5 on the tiny VLM, full weights and
    LoRA). ``rows_per_prompt`` larger than the rows given (a micro-batch smaller than a group) shares within
    the micro-batch (gcd of the two).

    Under DDP / FSDP2 the pass runs through the wrapper's ``__call__`` (``through_wrappers``), so gradients are
    synchronised and sharded parameters gathered as for a whole-row pass (tested: 2 processes equal one within
    1e-5, prefix sharing on in both).

    None, and the caller runs the whole rows, when: the rows are not groups with equal prompts, the model cannot
    split its positions, the head is not fusable, the model is compiled (``torch.compile``), gradient
    checkpointing is on in a pass with gradient (see below), or a trainable vision tower would need gradient
    through ``pixel_values``."""
    import math

    from mmrlvr.credit.signals import shared_prefix_states

    n, L = response_ids.shape
    G = math.gcd(rows_per_prompt, n)
    head = fusable_head(model)
    if head is None or G < 2 or L < 2:
        return None
    outer = _unwrap(model)
    if getattr(model, "_orig_mod", None) is not None:
        return None  # torch.compile: its graph is of the model's own forward
    core = outer.get_base_model() if hasattr(outer, "get_base_model") else outer
    grad = torch.is_grad_enabled()
    if grad and any(getattr(m, "gradient_checkpointing", False) is True for m in core.modules()):
        # transformers' checkpointed decoder layers re-run their forward in the backward, and the KV-cache write
        # inside attention would run again there: the responses' pass reads and extends the prompt's cache, so
        # its recomputation would see a cache already extended (transformers turns the cache off in training
        # under checkpointing for this reason). Whole rows instead.
        return None
    backbone = getattr(core, "model", None)
    if not isinstance(backbone, torch.nn.Module):
        return None

    def shared() -> torch.Tensor | None:
        return shared_prefix_states(backbone, inputs, prompt_length, L, G, grad=grad, cached_features=True)

    states = through_wrappers(model, shared) if _wrapped(model) else shared()
    if states is None:
        return None
    PASS_COUNTS["prefix_shared"] += 1
    return logprobs_from_hidden(states, head.weight, response_ids, temperature=temperature,
                                chunk_size=chunk_size, with_entropy=with_entropy, observe=observe)


#: the passes ``token_logprobs`` ran in this process by path ("prefix_shared", "fused": whole rows through the
#: fused head, "logits": whole rows with [n, L, V] logits); the trainer logs and resets them each step
#: (``passes/...``), so a run shows which path its passes took
PASS_COUNTS: collections.Counter[str] = collections.Counter()


def _wrapped(model: torch.nn.Module) -> bool:
    """Whether ``model`` is DDP's wrapper or an FSDP2 module: its gradient synchronisation (DDP's reducer, prepared
    in its forward) or its parameter gathering (FSDP2's root hooks) live in ``model.__call__``."""
    if _unwrap(model) is not model:
        return True
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def through_wrappers(model: torch.nn.Module, fn: Any) -> Any:
    """``fn()`` run as the forward of the module under DDP / FSDP2, called through ``model.__call__``.

    Why: a pass that calls the language model directly (prefix sharing: the prompt once with a KV cache, then the
    responses on top) would skip what the wrappers do around the model's forward: DDP prepares its reducer there
    (without it the backward's gradients are not averaged over processes) and FSDP2's root hooks gather the root's
    parameters (embeddings, final norm) and arm its backward. With ``fn`` installed as the inner module's forward
    for the one call, the wrappers run exactly as for a whole-row pass; ``fn``'s output (a tensor) is the
    forward's output, so DDP and FSDP2 see the graph the backward runs through. The tensor lives on after the
    call (FSDP2 does not reshard the root after its forward: ``shard_model``)."""
    inner = _unwrap(model)
    own = inner.__dict__.get("forward")  # accelerate may have set one (its autocast wrapper): put it back after
    inner.forward = lambda *args, **kwargs: fn()  # an instance attribute: the class's forward is untouched
    try:
        return model()
    finally:
        if own is not None:
            inner.forward = own
        else:
            del inner.forward


class VisionFeatureCache:
    """Vision-tower outputs computed once for the distinct prompts of a step, expanded to N rows.

    ``rows_per_prompt`` = G (rows are group-contiguous and every row of a group carries the same images).
    Images of row r are the next ``images_per_row[r]`` entries of ``image_grid_thw``.
    ``ok`` is False when the model cannot take precomputed features; callers then pass pixel_values.
    """

    def __init__(self, model: torch.nn.Module, vision: dict[str, Any], images_per_row: list[int],
                 rows_per_prompt: int | list[int], features: list[torch.Tensor] | None = None) -> None:
        # rows_per_prompt: G, or each group's row count when the sizes differ
        self.ok = False
        self.images_per_row = images_per_row
        grid = vision.get("image_grid_thw")
        if (find_vlm_core(model) is None or not supports_precomputed_vision(model) or "pixel_values" not in vision
                or grid is None or sum(images_per_row) != grid.shape[0]):
            return
        first_image = [0]
        for k in images_per_row:
            first_image.append(first_image[-1] + k)
        if features is None:  # encode the distinct images (first row of every group) and expand
            offsets = [0]
            for p in grid.prod(-1).tolist():
                offsets.append(offsets[-1] + p)
            sizes = ([rows_per_prompt] * -(-len(images_per_row) // rows_per_prompt)
                     if isinstance(rows_per_prompt, int) else list(rows_per_prompt))
            starts = {sum(sizes[:j]) for j in range(len(sizes))}
            keep = [i for r in sorted(starts) for i in range(first_image[r], first_image[r + 1])]
            if not keep:
                return
            pixels = torch.cat([vision["pixel_values"][offsets[i]:offsets[i + 1]] for i in keep], dim=0)
            distinct = encode_images(model, pixels, grid[keep])
            features, cursor = [], 0
            for r, k in enumerate(images_per_row):
                if r in starts:
                    group = distinct[cursor:cursor + k]
                    cursor += k
                features.extend(group)
        if len(features) != grid.shape[0]:
            return
        self.features = features
        self.first_image = first_image
        self.extra = {k: v for k, v in vision.items() if k != "pixel_values"}
        self.ok = True

    def inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: slice) -> dict[str, Any]:
        """Model kwargs for ``rows`` that reuse the cached features instead of ``pixel_values``."""
        i0, i1 = self.first_image[rows.start], self.first_image[rows.stop]
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, **self.extra}
        return {**slice_inputs(inputs, rows, self.images_per_row),
                "mm_encoder_outputs": encoder_outputs(self.features[i0:i1])}


def slice_inputs(inputs: dict[str, Any], rows: slice, images_per_row: list[int],
                 videos_per_row: list[int] | None = None) -> dict[str, Any]:
    """Rows ``rows`` of a batch of model inputs, slicing the flat per-image tensors consistently.

    Qwen processors give ``pixel_values`` as concatenated patches of all images and ``image_grid_thw``
    as one row per image; a micro-batch must take exactly its rows' images (and, with ``videos_per_row``, its
    rows' videos: ``pixel_values_videos`` / ``video_grid_thw`` / ``second_per_grid_ts``).
    """
    from mmrlvr.data.video_processing import VIDEO_KEYS, slice_video_rows

    n = inputs["input_ids"].shape[0]
    video = bool(videos_per_row) and any(videos_per_row) and any(k in inputs for k in VIDEO_KEYS)
    first_img = sum(images_per_row[:rows.start])
    last_img = sum(images_per_row[:rows.stop])
    out: dict[str, Any] = {}
    grid = inputs.get("image_grid_thw")
    for k, v in inputs.items():
        if k == "pixel_values" and grid is not None:
            patches = grid.prod(-1)
            p0 = int(patches[:first_img].sum())
            p1 = int(patches[:last_img].sum())
            out[k] = v[p0:p1]
        elif k == "image_grid_thw":
            out[k] = v[first_img:last_img]
        elif video and k in VIDEO_KEYS:
            continue  # sliced per video below
        elif torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == n:
            out[k] = v[rows]
        else:
            out[k] = v
    if video:
        out.update(slice_video_rows(inputs, rows, videos_per_row))
    return out
