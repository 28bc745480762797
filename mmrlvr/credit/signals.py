"""Per-token signals for token credit: entropy, vision sensitivity (JSD), entropy shift, log-probs.

As in docs/credit.md: P_t = softmax(logits | I) (clean image), Q_t = softmax(logits | I') (perturbed image);
per response token t

    H_t   = H(P_t)                                  entropy of the clean policy
    JSD_t = ½ KL(P_t‖M_t) + ½ KL(Q_t‖M_t),  M_t = (P_t + Q_t)/2      in [0, ln 2]
    ΔH_t  = H(Q_t) − H(P_t)                         entropy shift caused by the perturbation
    logp_t = log P_t(o_t),  logq_t = log Q_t(o_t)   the sampled token under each pass

All of them need the full vocabulary, and [N, L, V] logits are large (V ≈ 150k for Qwen). So the work is
chunked over tokens: only ``chunk_size`` rows of [V] log-probabilities per pass exist at a time, and only
valid (unmasked) tokens are computed. Each side can be given as logits [N, L, V] (the trainer already has
the clean ones) or as final hidden states [N, L, H] plus the model's ``lm_head`` (``Hidden``), in which case
logits are produced chunk by chunk and the perturbed pass's [N, L, V] logits never exist.

Also here: ``vppo_dependency`` (VPPO's sampled-token k3, no full-vocab pass needed) and
``perception_k3`` (PAPO's per-token KL estimate). Everything runs without gradient except
``perception_k3``, which PAPO's loss differentiates through the clean log-probs.

Not done here: choosing tokens (``schemes``), perturbing images (``perturb``). Models whose logits are not
``lm_head(last hidden state)`` (final logit soft-capping, logit scaling) need logits passed in directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from mmrlvr.errors import UserError
from mmrlvr.lazy_import import lazy_module

# torch, and the model-side helpers (mmrlvr.algos.logits, mmrlvr.models.*), are imported where the work runs:
# config checks import this module (through mmrlvr.credit.schemes) without torch
torch = lazy_module("torch")

LOG2 = math.log(2.0)


class TokenSignals(NamedTuple):
    """Per-token signals for N responses of length L; every field is 0 at masked positions.

    entropy:       [N, L] H(P_t), nats; None when the clean pass was skipped (sampled-only VPPO/PAPO)
    jsd:           [N, L] JSD(P_t, Q_t), nats in [0, ln 2]; None without a perturbed pass
    entropy_shift: [N, L] H(Q_t) − H(P_t); None without a perturbed pass
    logp:          [N, L] log P_t(o_t), the sampled token under the clean input; None like entropy
    logq:          [N, L] log Q_t(o_t), the sampled token under the perturbed input; None without one
    old_logp:      [N, L] log π_old(o_t|I) from the sampler, passed through when known (VPPO reads it)
    """

    entropy: torch.Tensor | None
    jsd: torch.Tensor | None
    entropy_shift: torch.Tensor | None
    logp: torch.Tensor | None
    logq: torch.Tensor | None
    old_logp: torch.Tensor | None = None


@dataclass(frozen=True)
class Hidden:
    """Final hidden states of the response positions plus the head that turns them into logits.

    states: [N, L, H] — the hidden state that predicts response token j sits at j
    head:   the model's output embedding (``model.get_output_embeddings()``, i.e. ``lm_head``)
    """

    states: torch.Tensor
    head: Callable[[torch.Tensor], torch.Tensor]


Source = Any  # torch.Tensor | Hidden: logits [N, L, V], or hidden states and the head that makes them


def _chunk_log_probs(source: Source, rows: torch.Tensor, cols: torch.Tensor, temperature: float) -> torch.Tensor:
    """log-softmax over the vocabulary for the (row, col) positions: [c, V] float32.

    Indexing by (row, col) gathers only these positions, so a non-contiguous slice such as
    ``logits[:, P-1:P-1+L]`` is never copied whole."""
    if isinstance(source, Hidden):
        logits = source.head(source.states[rows, cols])  # [c, V]
    else:
        logits = source[rows, cols]  # [c, V]
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def _plogp_sum(p: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Σ_v p_v log p_v per row, with 0·log 0 = 0: [c, V] -> [c].

    The plain product is the fast path (one fused multiply-sum); only rows that came out NaN — those
    with −inf log-probs from blocked vocabulary entries, where 0·(−inf) = NaN — are redone with a mask."""
    out = (p * logp).sum(-1)
    bad = out.isnan()
    if bool(bad.any()):
        pb, lb = p[bad], logp[bad]
        out[bad] = torch.where(pb > 0, pb * lb, torch.zeros_like(pb)).sum(-1)
    return out


def token_signals(p: Source | None, q: Source | None, response_ids: torch.Tensor, mask: torch.Tensor, *,
                  chunk_size: int = 256, temperature: float = 1.0, distribution: bool = True) -> TokenSignals:
    """Entropy, JSD, entropy shift and sampled-token log-probs, chunked over valid tokens.

    p:            clean pass — logits [N, L, V] or ``Hidden`` ([N, L, H] + lm_head), aligned with responses
                  (``logits[:, P-1:P-1+L]`` of the full sequence); None (only with distribution=False)
                  skips the clean side: entropy and logp come back None
    q:            perturbed pass, same forms; None computes only entropy and logp (no vision signals)
    response_ids: [N, L] long, the sampled tokens o_t
    mask:         [N, L], > 0 on tokens that count; masked positions get 0 in every output
    chunk_size:   valid tokens per chunk; peak extra memory is ~ 5 · chunk_size · V float32
                  (V = 152k: ~780 MB at 256, ~200 MB at 64)
    temperature:  logits are divided by it first, matching the temperature the responses were sampled at
    distribution: False skips the full-vocabulary comparison of P and Q (jsd and entropy_shift stay None)
                  and only reads logq from the perturbed pass — all VPPO and PAPO need, at ~1/3 the cost

    JSD is computed as H(M) − (H(P) + H(Q))/2 (equal to ½KL(P‖M) + ½KL(Q‖M)), which needs one log over
    the vocabulary instead of three; float32 rounding leaves an absolute error of ~1e-6 nats, clamped
    into [0, ln 2]. Rows where the two passes agree exactly get JSD exactly 0.
    """
    if chunk_size < 1:
        raise UserError(f"chunk_size must be >= 1, got {chunk_size}")
    if p is None and (q is None or distribution):
        raise UserError("token_signals needs the clean pass p unless it only reads logq (q given, distribution=False)")
    N, L = response_ids.shape
    home = response_ids.device  # the batch's; the passes' tensors may be on the model's (GPU) device
    source = p if p is not None else q
    device = source.states.device if isinstance(source, Hidden) else source.device
    response_ids, mask = response_ids.to(device), mask.to(device)
    rows, cols = (mask > 0).nonzero(as_tuple=True)  # [M] each: the valid tokens, row-major
    out = {k: torch.zeros(N, L, device=device) for k in _SIGNAL_KEYS}
    with torch.no_grad():
        for s in range(0, rows.numel(), chunk_size):
            r, c = rows[s:s + chunk_size], cols[s:s + chunk_size]
            lp = _chunk_log_probs(p, r, c, temperature) if p is not None else None  # [c, V]
            lq = _chunk_log_probs(q, r, c, temperature) if q is not None else None
            for k, v in _chunk_signals(lp, lq, response_ids[r, c], distribution).items():
                out[k][r, c] = v
    return _as_signals({k: v.to(home) for k, v in out.items()}, p is not None, q is not None, distribution)


_SIGNAL_KEYS = ("entropy", "logp", "jsd", "shift", "logq")


def _chunk_signals(lp: torch.Tensor | None, lq: torch.Tensor | None, tok: torch.Tensor,
                   distribution: bool) -> dict[str, torch.Tensor]:
    """The signals of one chunk of positions from its clean and perturbed log-probabilities ([c, V] each, float32;
    either may be None): {"logp", "entropy"} from P, {"logq"} from Q, {"jsd", "shift"} from both with
    ``distribution``. The buffers of ``lp`` and ``lq`` are reused (overwritten)."""
    out: dict[str, torch.Tensor] = {}
    tok = tok.unsqueeze(-1)  # [c, 1]
    if lp is not None:
        out["logp"] = lp.gather(-1, tok).squeeze(-1)
        pp = lp.exp()
        h_p = -_plogp_sum(pp, lp)
        out["entropy"] = h_p
    if lq is None:
        return out
    out["logq"] = lq.gather(-1, tok).squeeze(-1)
    if not distribution or lp is None:
        return out
    qq = lq.exp()
    h_q = -_plogp_sum(qq, lq)
    # Identical rows have bitwise-equal entropies; only those candidates get the full comparison.
    same = h_p == h_q  # [c]
    if bool(same.any()):
        same[same.clone()] = (lp[same] == lq[same]).all(-1)
    mm = pp.add_(qq).mul_(0.5)  # M = (P + Q)/2, in P's buffer
    h_m = -_plogp_sum(mm, torch.log(mm, out=lq))  # log M in lq's buffer
    jsd = (h_m - 0.5 * (h_p + h_q)).clamp_(0.0, LOG2)
    out["jsd"] = torch.where(same, torch.zeros_like(jsd), jsd)
    out["shift"] = h_q - h_p
    return out


def _as_signals(out: dict[str, torch.Tensor], has_p: bool, has_q: bool, distribution: bool) -> TokenSignals:
    full = has_q and distribution and has_p
    return TokenSignals(entropy=out["entropy"] if has_p else None, jsd=out["jsd"] if full else None,
                        entropy_shift=out["shift"] if full else None, logp=out["logp"] if has_p else None,
                        logq=out["logq"] if has_q else None)


class SignalsBeside:
    """``token_signals`` computed beside a chunked log-prob pass that already has the clean logits of each chunk.

    The policy update's log-probs (``mmrlvr.algos.logits``: the fused head, or chunked logits) form each chunk's
    clean logits ``z`` (divided by the temperature) and their log-sum-exp; called with them, this turns the chunk
    into the clean log-probabilities and compares them with the perturbed pass ``q`` at the same positions (its
    logits formed here, chunk by chunk, from its hidden states). So in-update credit needs no [n, L, V] tensor
    and no second clean head product. Same per-chunk arithmetic as ``token_signals`` (``_chunk_signals``); the
    logits come from the pass's own products, so values agree with a separate clean pass up to float rounding.

    Positions are the pass's chunks over [n, L] (masked ones included); ``signals()`` zeroes masked positions as
    ``token_signals`` does. ``ran`` stays False if the pass never called it."""

    def __init__(self, q: Source | None, response_ids: torch.Tensor, mask: torch.Tensor, *, temperature: float = 1.0,
                 distribution: bool = True) -> None:
        self.q, self.ids, self.mask = q, response_ids, mask
        self.temperature, self.distribution = temperature, distribution
        self.out: dict[str, torch.Tensor] = {}
        self.ran = False

    def __call__(self, idx: tuple, z: torch.Tensor, lse: torch.Tensor) -> None:
        from mmrlvr.algos.logits import head_logits

        with torch.no_grad():
            if not self.out:
                self.out = {k: torch.zeros(self.ids.shape, device=z.device) for k in _SIGNAL_KEYS}
                self.ids, self.mask = self.ids.to(z.device), self.mask.to(z.device)
            self.ran = True
            lead, V = z.shape[:-1], z.shape[-1]
            lp = torch.log_softmax(z.reshape(-1, V).float(), dim=-1)
            lq = None
            if self.q is not None:
                if isinstance(self.q, Hidden):
                    states = self.q.states.to(z.device)[idx]
                    head = self.q.head
                    if type(head) is torch.nn.Linear and head.bias is None:  # the product the clean chunk took:
                        zq = head_logits(states, head.weight)  # equal states give bit-equal logits (JSD 0)
                    else:
                        zq = head(states)
                else:
                    zq = self.q[idx]
                zq = zq.reshape(-1, V).float()
                lq = torch.log_softmax(zq / self.temperature if self.temperature != 1.0 else zq, dim=-1)
            for k, v in _chunk_signals(lp, lq, self.ids[idx].reshape(-1), self.distribution).items():
                self.out[k][idx] = v.reshape(lead)

    def signals(self, home: torch.device | None = None) -> TokenSignals:
        valid = self.mask > 0
        out = {k: torch.where(valid, v, torch.zeros_like(v)).to(home or self.mask.device) for k, v in self.out.items()}
        return _as_signals(out, True, self.q is not None, self.distribution)


def _distinct_image_inputs(backbone: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """Inputs that run the vision tower once per distinct image, or None when that gains nothing or the
    model cannot take precomputed features.

    The distinct images' features (``mmrlvr.rollout.vision.encode_images``: merged tokens plus Qwen3-VL's
    deepstack layers) are handed to every copy through ``mm_encoder_outputs``. Exact: the features of an
    image do not depend on the other images."""
    from mmrlvr.credit.perturb import distinct_images
    from mmrlvr.rollout.vision import encode_images, encoder_outputs, supports_precomputed_vision

    pv, grid = inputs.get("pixel_values"), inputs.get("image_grid_thw")
    if (pv is None or grid is None or inputs.get("pixel_values_videos") is not None
            or not supports_precomputed_vision(backbone)):
        return None
    unique, source = distinct_images(pv, grid)
    if len(unique) == grid.shape[0]:
        return None
    blocks = torch.split(pv, grid.prod(-1).tolist())
    feats = encode_images(backbone, torch.cat([blocks[i] for i in unique]), grid[unique])
    rest = {k: v for k, v in inputs.items() if k != "pixel_values"}
    return {**rest, "mm_encoder_outputs": encoder_outputs([feats[u] for u in source])}


def final_hidden_states(model: torch.nn.Module, inputs: dict[str, Any], *,
                        dedupe_images: bool = True) -> tuple[torch.Tensor, Callable]:
    """Run ``model`` (no gradient) up to its final (normed) hidden states: ([N, S, H], lm_head).

    For transformers' *ForConditionalGeneration / *ForCausalLM models the backbone is ``model.model`` and
    the head ``get_output_embeddings()``; calling the backbone skips the [N, S, V] logits entirely. peft
    wrappers are unwrapped with ``get_base_model()`` (the LoRA layers stay active; inside
    ``disable_adapter()`` they are off, as for the reference model). Other models fall back to
    ``output_hidden_states=True`` (which does compute their logits once). With ``dedupe_images`` the
    vision tower runs once per distinct image when the model supports precomputed image features."""
    from mmrlvr.models.placement import to_model

    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = core.get_output_embeddings() if hasattr(core, "get_output_embeddings") else None
    if head is None:
        raise UserError(f"{type(core).__name__} has no output embeddings (lm_head); pass logits instead")
    backbone = getattr(core, "model", None)
    inputs = to_model(inputs, core)
    with torch.no_grad():
        if isinstance(backbone, torch.nn.Module):
            fast = _distinct_image_inputs(backbone, inputs) if dedupe_images else None
            out = backbone(**(fast or inputs), use_cache=False)
            states = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        else:
            states = model(**inputs, output_hidden_states=True, use_cache=False).hidden_states[-1]
    return states, head


def _images_per_row(backbone: torch.nn.Module, input_ids: torch.Tensor) -> list[int] | None:
    start = getattr(getattr(backbone, "config", None), "vision_start_token_id", None)
    return None if start is None else (input_ids == start).sum(dim=1).tolist()


def _groups_share_images(G: int, starts: list[int], grid: torch.Tensor, images: list[torch.Tensor] | tuple) -> bool:
    """Whether every row of each G-row group carries its group head's images (equal token ids do not say so:
    two prompts with one template and same-sized images tokenize alike). Row r's images are
    ``starts[r]:starts[r+1]``; ``images`` holds one tensor per image: its pixel block, or its cached features
    (the same tensor object when the step's cache repeated them, else compared by value)."""
    if len(images) != grid.shape[0]:
        return False
    for r in range(len(starts) - 1):
        h = r - r % G
        if starts[r + 1] - starts[r] != starts[h + 1] - starts[h]:
            return False
        for i, j in zip(range(starts[r], starts[r + 1]), range(starts[h], starts[h + 1])):
            if r != h and not (torch.equal(grid[i], grid[j])
                               and (images[i] is images[j] or torch.equal(images[i], images[j]))):
                return False
    return True


def shared_prefix_states(backbone: torch.nn.Module, inputs: dict[str, Any], prompt_length: int,
                         response_length: int, rows_per_prompt: int, *, grad: bool = False,
                         cached_features: bool = False) -> torch.Tensor | None:
    """The response-predicting hidden states [N, L, H] with each prompt encoded once, or None.

    Rows come in groups of ``rows_per_prompt`` (G) that share one prompt (ids, mask and images) — the G
    rollouts of a GRPO group. The prompt, image tokens included, is most of each sequence, so the pass
    runs the B = N/G distinct prompts once with a KV cache, repeats the cache G times and runs only the N
    responses on top. Positions are the ones a single pass over the whole sequence computes (Qwen-VL's 3D
    rope, ``compute_3d_position_ids``), passed explicitly to both halves, so the result equals
    ``final_hidden_states(...)[:, P-1:P-1+L]`` up to float rounding (tested per family).

    ``grad``: keep the autograd graph (the policy pass). Causal attention makes a prompt position's states
    independent of what follows, so the one prompt pass is the G rows' prompt passes exactly; its gradient is
    the sum of the G rows' (the repeat's backward), as backpropagating G copies would give. Images come as
    ``pixel_values`` (the group heads' are encoded here, without gradient: the tower must be frozen when
    ``grad``) or, with ``cached_features`` (``model.prefix_sharing``'s passes), as the step's cached features
    (``mm_encoder_outputs``; the group heads' are selected). The token-credit passes leave it off: with cached
    features they run whole rows, the rounding the stage goldens pin.

    None when this does not apply: G < 2, rows of a group that differ in their prompt, video inputs,
    ``inputs_embeds``, a trainable vision tower under ``grad``, or a model without 3D positions / precomputed
    image features (the caller then runs the full pass)."""
    import contextlib

    from mmrlvr.models.cache_arg import output_cache, with_cache
    from mmrlvr.models.positions import row_positions
    from mmrlvr.rollout.vision import encode_images, encoder_outputs, select_images, supports_precomputed_vision

    G, P, L = rows_per_prompt, prompt_length, response_length
    ids, mask = inputs.get("input_ids"), inputs.get("attention_mask")
    if (G < 2 or ids is None or mask is None or ids.shape[0] % G or inputs.get("pixel_values_videos") is not None
            or "inputs_embeds" in inputs or ("mm_encoder_outputs" in inputs and not cached_features)
            or not hasattr(backbone, "compute_3d_position_ids") or not supports_precomputed_vision(backbone)):
        return None
    N, B = ids.shape[0], ids.shape[0] // G
    first = torch.arange(0, N, G, device=ids.device)
    for t in (ids[:, :P], mask[:, :P]):
        if not bool((t.view(B, G, P) == t[first].unsqueeze(1)).all()):
            return None
    per_row = _images_per_row(backbone, ids[:, :P])
    grid, pv, cached = inputs.get("image_grid_thw"), inputs.get("pixel_values"), inputs.get("mm_encoder_outputs")
    extra = {k: inputs[k] for k in ("mm_token_type_ids",) if k in inputs}
    pos = row_positions(backbone, ids, mask, grid, _images_per_row(backbone, ids), extra)  # each row's once a step
    if pos is None:  # the language model's own default: 0..S-1 on every row
        pos = torch.arange(ids.shape[1], device=ids.device).view(1, 1, -1).expand(3, N, -1)
    prefix: dict[str, Any] = {"input_ids": ids[first, :P], "attention_mask": mask[first, :P],
                              "position_ids": pos[..., first, :P]}
    if pv is not None or cached is not None:
        if grid is None or per_row is None or sum(per_row) != grid.shape[0]:
            return None
        starts = [0]
        for k in per_row:
            starts.append(starts[-1] + k)
        keep = [i for r in first.tolist() for i in range(starts[r], starts[r + 1])]  # images of the group heads
        pooled = getattr(cached.get("image"), "pooler_output", None) if cached is not None else None
        blocks = torch.split(pv, grid.prod(-1).tolist()) if cached is None else None
        images = blocks if cached is None else pooled
        if not isinstance(images, (tuple, list)) or not _groups_share_images(G, starts, grid, images):
            return None
        if cached is not None:
            heads = select_images(cached, keep)
        else:
            tower = getattr(backbone, "visual", None)
            if grad and (tower is None or any(p.requires_grad for p in tower.parameters())):
                return None  # encode_images runs without gradient: a trainable tower would get none
            heads = encoder_outputs(encode_images(backbone, torch.cat([blocks[i] for i in keep]), grid[keep]))
        if heads is None:
            return None
        prefix.update(mm_encoder_outputs=heads, image_grid_thw=grid[keep])
    if "mm_token_type_ids" in extra:
        prefix["mm_token_type_ids"] = extra["mm_token_type_ids"][first, :P]
    with contextlib.nullcontext() if grad else torch.no_grad():
        head_out = backbone(**prefix, use_cache=True)
        cache = output_cache(head_out)
        cache.batch_repeat_interleave(G)
        tail = backbone(input_ids=ids[:, P:P + L - 1], attention_mask=mask[:, :P + L - 1],
                        position_ids=pos[..., P:P + L - 1], **with_cache(backbone, cache), use_cache=True)
        last_prompt = head_out.last_hidden_state[:, -1:].repeat_interleave(G, dim=0)  # predicts response token 0
        return torch.cat([last_prompt, tail.last_hidden_state], dim=1)  # [N, L, H]


def response_hidden(model: torch.nn.Module, inputs: dict[str, Any], prompt_length: int,
                    response_length: int, rows_per_prompt: int = 1) -> Hidden:
    """Hidden states that predict the L response tokens: positions P-1 .. P-1+L-1 (RolloutBatch layout).

    With ``rows_per_prompt`` = G > 1 (group-contiguous rows sharing a prompt) each prompt is encoded once
    (``shared_prefix_states``) when the model allows it."""
    from mmrlvr.models.placement import to_model

    P, L = prompt_length, response_length
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(core, "model", None)
    inputs = to_model(inputs, core)
    if rows_per_prompt > 1 and L > 1 and isinstance(backbone, torch.nn.Module):
        states = shared_prefix_states(backbone, inputs, P, L, rows_per_prompt)
        if states is not None:
            return Hidden(states=states, head=core.get_output_embeddings())
    states, head = final_hidden_states(model, inputs)  # [N, P+L, H]
    return Hidden(states=states[:, P - 1:P - 1 + L], head=head)


def token_signals_from_model(model: torch.nn.Module, inputs_clean: dict[str, Any] | None,
                             inputs_pert: dict[str, Any] | None, prompt_length: int,
                             response_ids: torch.Tensor, mask: torch.Tensor, *, chunk_size: int = 256,
                             temperature: float = 1.0, logits_clean: torch.Tensor | None = None,
                             old_logprobs: torch.Tensor | None = None, distribution: bool = True,
                             rows_per_prompt: int = 1) -> TokenSignals:
    """Teacher-forced signals for prompt + response; extra passes run without gradient.

    inputs_clean / inputs_pert: ``model(**inputs)`` keyword arguments (``RolloutBatch.model_inputs()``,
        the second with perturbed pixel values); inputs_pert None skips the vision signals.
    logits_clean: [N, L, V] response-aligned clean logits the trainer already has (then inputs_clean is
        not run); otherwise the clean pass is run here, also chunked through lm_head. With
        distribution=False both may be None: only the perturbed pass runs (entropy / logp None).
    old_logprobs: [N, L] sampler log-probs, stored in the result as ``old_logp`` for VPPO.
    distribution: see ``token_signals`` (False: only logq from the perturbed pass; the scheme's
        ``needs_distribution`` says which it needs).
    rows_per_prompt: G when rows come in group-contiguous blocks sharing a prompt (GRPO rollouts): each
        prompt is then encoded once per pass (``shared_prefix_states``).
    prompt_length: P; response_ids, mask: [N, L]."""
    L = response_ids.shape[1]
    if logits_clean is not None:
        p: Source = logits_clean.detach()
    elif inputs_clean is not None:
        p = response_hidden(model, inputs_clean, prompt_length, L, rows_per_prompt)
    elif not distribution and inputs_pert is not None:
        p = None  # sampled-only: VPPO / PAPO read logq and take log pi_old from old_logprobs
    else:
        raise UserError("token_signals_from_model needs inputs_clean or logits_clean")
    q = response_hidden(model, inputs_pert, prompt_length, L, rows_per_prompt) if inputs_pert is not None else None
    sig = token_signals(p, q, response_ids, mask, chunk_size=chunk_size, temperature=temperature,
                        distribution=distribution)
    return sig._replace(old_logp=old_logprobs)


def vppo_dependency(logq_sampled: torch.Tensor, old_logp: torch.Tensor,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """VPPO's visual dependency of each sampled token (arXiv:2510.09285, [code]): [N, L] -> [N, L].

    d_t = clamp(log π(o_t|I') − log π_old(o_t|I), −20, 20);  S_t = clamp(e^{d_t} − d_t − 1, 0, 10),
    the k3 KL estimate on the sampled token only. 0 where ``mask`` is 0 (also where log-probs are −inf)."""
    d = (logq_sampled - old_logp).clamp(-20.0, 20.0)
    s = (d.exp() - d - 1.0).clamp(0.0, 10.0)
    if mask is not None:
        s = torch.where(mask > 0, s, torch.zeros_like(s))
    return torch.nan_to_num(s, nan=0.0)


def perception_k3(logp: torch.Tensor, logq: torch.Tensor, *, max_kl: float = 10.0) -> torch.Tensor:
    """PAPO's per-token perception KL, k3 estimate of KL(π(·|I) ‖ π(·|I_mask)) on the sampled token.

    d_t = logq_t − logp_t (logq: masked-image pass, no gradient; logp: current policy, with gradient);
    k3_t = e^{d_t} − d_t − 1 ≥ 0, clamped to ``max_kl`` so maximising it cannot run away
    ([ours]: the clamp value; PAPO counters the same "KL hacking" with extra entropy losses). [N, L]."""
    d = (logq.detach() - logp).clamp(-20.0, 20.0)
    return (d.exp() - d - 1.0).clamp(max=max_kl)
