"""Auxiliary losses chosen in the config: ``algo.aux_losses: [{name: forward_ce, weight: 0.1, params: {...}}]``.

Each entry builds one object from ``AUX_LOSSES`` with the run and its parameters; every step the ``aux_losses``
reference stage (``mmrlvr.train.stages.reference``) asks each for this step's term (``prepare(batch)``) and appends
it to ``StepBatch.aux_losses``, which the update adds to the per-token policy loss. A term is either

- a plain ``AuxLoss`` (``logp [N, L] -> loss [N, L]``, from the policy's log-probs of the sampled tokens), or
- a ``TokenDistributionLoss``: it names vocabulary ids per response position (``ids`` [N, L, k]); the update's
  forward gathers the policy's log-probs of those ids (``logp_ids`` [n, L, k], with gradient) for each micro-batch
  and calls ``term.token_loss(rows, logp_ids)`` -> [n, L]. Distillation needs the policy's probability of the
  *teacher's* tokens, not only of the sampled one: this is the stage contract's extension for it.

A plug-in registers a class the same way: ``@AUX_LOSSES.register("my_loss")`` with ``__init__(self, rt, weight,
**params)`` and ``prepare(self, batch)``; optional ``state_dict`` / ``load_state_dict`` go into checkpoints.

Each built-in declares its parameters (``mmrlvr.methods.declare``) just above its class; the config checks import
this module without torch (``torch = lazy_module("torch")``) to read them.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from mmrlvr.errors import UserError
from mmrlvr.lazy_import import lazy_module
from mmrlvr.methods import Param, declare
from mmrlvr.metric import Metric
from mmrlvr.registry import Registry

torch = lazy_module("torch")

AUX_LOSSES: Registry = Registry("auxiliary loss")

#: the privileged context appended to the expert's copy of the prompt (never to the student's)
PRIVILEGED_TEMPLATE = "\n\n(Reference {what}, for checking your work: {value})"


def privileged_sample(sample: Any, context: str) -> Any:
    """A copy of ``sample`` whose last user message ends with the privileged context: the gold answer
    (``context: answer``) or the row's ``meta[context]`` (a dataset column such as a verifier's trace). The
    original sample (the student's prompt) is not touched. Raises ``UserError`` naming the row when it has none."""
    value = sample.answer if context == "answer" else (sample.meta or {}).get(context)
    if value is None or str(value).strip() == "":
        where = "a gold answer" if context == "answer" else f"a {context!r} value in its row"
        raise UserError(f"forward_ce (expert: privileged): sample {sample.id!r} has no {where} to give the expert")
    hint = PRIVILEGED_TEMPLATE.format(what="answer" if context == "answer" else context, value=str(value).strip())
    messages = copy.deepcopy(sample.messages)
    user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    if user is None:
        raise UserError(f"forward_ce (expert: privileged): sample {sample.id!r} has no user message")
    content = user.get("content")
    if isinstance(content, list):
        texts = [part for part in content if isinstance(part, dict) and part.get("type") == "text"]
        if texts:
            texts[-1]["text"] = str(texts[-1].get("text", "")) + hint
        else:
            content.append({"type": "text", "text": hint.lstrip()})
    else:
        user["content"] = str(content or "") + hint
    out = copy.copy(sample)
    out.messages = messages
    return out


class TopKTarget:
    """This step's forward-CE term: the expert's top-k ids and probabilities per response position
    (``ids``, ``probs`` [N, L, k]) and the horizon mask [N, L]; ``token_loss(rows, logp_ids)`` is
    ``weight · forward_ce`` on those rows (``mmrlvr.algos.distill``)."""

    def __init__(self, ids: torch.Tensor, probs: torch.Tensor, mask: torch.Tensor, weight: float,
                 diagnostics: dict[str, float] | None = None) -> None:
        self.ids, self.probs, self.mask, self.weight = ids, probs, mask, weight
        self.diagnostics = diagnostics  # the step's: ``distill/ce`` from the first pass over each row
        self.tokens = float((mask > 0).sum())
        self._seen: set[int] = set()

    def token_loss(self, rows: slice, logp_ids: torch.Tensor) -> torch.Tensor:
        from mmrlvr.algos.distill import forward_ce

        mask = self.mask[rows].to(logp_ids.device)
        ce = forward_ce(logp_ids, self.probs[rows].to(logp_ids.device), mask)
        if self.diagnostics is not None and rows.start not in self._seen and self.tokens:
            self._seen.add(rows.start)
            self.diagnostics["distill/ce"] = Metric.mean(self.diagnostics.get("distill/ce", 0.0)
                                                         + float(ce.detach().sum()) / self.tokens, n=self.tokens)
        return self.weight * ce


def rollout_token_cap(cfg: Any, step: int) -> int:
    """How many tokens a response may have at ``step`` (0-based): ``rollout.max_new_tokens``, cut to
    ceil(share · max_new_tokens) by every forward-CE entry with ``rollout: truncated`` (the horizon paper's truncated
    rollouts, arXiv 2605.31490: the student only generates what the expert will score — where the time and
    memory savings come from). The generate stage asks this before it samples."""
    import math

    from mmrlvr.algos.distill import horizon_share
    from mmrlvr.methods import listed_entries

    cap = int(cfg.rollout.max_new_tokens)
    for name, _, params in listed_entries(cfg, "aux_loss")[0]:
        if name == "forward_ce" and params.get("rollout") == "truncated":
            steps = int(params["horizon_steps"]) or int(cfg.max_steps)
            share = horizon_share(params["horizon"], step, steps, float(params["horizon_start"]))
            cap = min(cap, max(1, math.ceil(share * cfg.rollout.max_new_tokens - 1e-9)))
    return cap


def _horizon_ok(v) -> bool:
    if v in ("full", "progressive"):
        return True
    return not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v <= 1


def _forward_ce_check(cfg, p) -> list[str]:
    """The privileged expert re-encodes the sample's own prompt with the hint: it cannot see what a multi-turn
    rollout added to the context (a ReSum segment's summary restart, a tool's returned images)."""
    out = []
    if p["rollout"] == "truncated":
        if p["horizon"] == "full":
            out.append("rollout: truncated needs a horizon below full (a share in (0, 1] or progressive): at full "
                       "the rollout is not cut")
        shape = [k for k, v in (("rollout.strategy: tree", cfg.rollout.strategy == "tree"),
                                ("rollout.tools", cfg.rollout.tools), ("rollout.summarize", cfg.rollout.summarize))
                 if v]
        out += [f"rollout: truncated cuts flat groups' responses only; {k} builds its rollouts in segments or "
                "turns of their own" for k in shape]
    if p["expert"] != "privileged":
        return out
    grown = [k for k, v in (("rollout.summarize", cfg.rollout.summarize), ("rollout.tools", cfg.rollout.tools)) if v]
    return out + [f"expert: privileged re-encodes each sample's original prompt, so it would score a response whose "
            f"context {key} changed (a ReSum segment restarts from a summary; a tool turn adds images) against the "
            f"wrong prompt; use a model folder as the expert (it reads the student's own inputs) or unset {key}"
            for key in grown]


declare("aux_loss", "forward_ce", "forward cross-entropy to an expert's top-k next-token distribution on the "
        "student's own responses (rich-feedback DAgger; with a horizon, on-policy distillation)",
        Param("expert", "privileged", "privileged: the policy itself with `context` added to its prompt | a model "
              "folder (or tiny: spec) with the same tokenizer"),
        Param("context", "answer", "privileged context: answer (the row's gold answer) | a dataset column name "
              "kept in the row's metadata (e.g. a verifier's trace)"),
        Param("top_k", 20, "the expert's top-k tokens the cross-entropy sums over", ">= 1", lambda v: v >= 1),
        Param("horizon", "full", "the share of each response the expert scores: full | a share in (0, 1] | "
              "progressive (grows from horizon_start to 1 over horizon_steps)", "full | (0, 1] | progressive",
              _horizon_ok, kind=object),
        Param("horizon_start", 0.25, "the progressive horizon's share at step 0", "in (0, 1]",
              lambda v: 0 < v <= 1),
        Param("horizon_steps", 0, "steps over which the progressive horizon grows to 1 (0: max_steps)", ">= 0",
              lambda v: v >= 0),
        Param("rollout", "full", "full: the student generates whole responses and the horizon masks what the expert "
              "scores | truncated: the student generates only ceil(share x rollout.max_new_tokens) tokens (the "
              "paper's TOPD at a fixed share, POPD with progressive) and the expert scores all of them",
              choices=("full", "truncated")),
        source="arXiv:2606.05152 (forward CE), arXiv:2605.31490 (horizon)", config_check=_forward_ce_check)


@AUX_LOSSES.register("forward_ce")
class ForwardCE:
    """Forward cross-entropy to an expert on the student's own responses (``mmrlvr.algos.distill``).

    ``expert: privileged`` — the policy itself (its current weights, no gradient) with the privileged context in
    its prompt (``privileged_sample``): the prompt is re-encoded with the hint, the student's sampled response
    appended, and the pass teacher-forces the response. The student's rows (``batch.rollouts``) are never changed.
    ``expert: MODEL_DIR`` (or a ``tiny:`` spec) — another model, frozen, on the student's own prompt; its tokenizer
    must be the student's (same vocabulary), checked at start.

    Horizon: only the first share of each response is scored (``horizon``); the teacher's forward covers the
    prompt plus the longest kept prefix of the micro-batch. Logged: ``distill/ce`` (mean CE per scored token),
    ``distill/horizon`` (the share), ``distill/teacher_tokens`` (response tokens the expert scored this step) and
    ``distill/teacher_token_share`` (of all response tokens: 1 − share is the teacher cost the horizon saved),
    ``distill/expert_top_k_mass`` (the expert probability the top k hold), ``time/distill_expert_s``.
    """

    def __init__(self, rt: Any, weight: float = 1.0, expert: str = "privileged", context: str = "answer",
                 top_k: int = 20, horizon: Any = "full", horizon_start: float = 0.25, horizon_steps: int = 0,
                 rollout: str = "full") -> None:
        self.rt, self.weight = rt, float(weight)
        self.truncated = rollout == "truncated"  # the generate stage cut the responses (``rollout_token_cap``)
        self.context, self.top_k = context, int(top_k)
        self.horizon, self.horizon_start = horizon, float(horizon_start)
        self.horizon_steps = int(horizon_steps) or int(rt.cfg.max_steps)  # a resumed run must keep the schedule
        self.expert_name = expert
        self.model = None if expert == "privileged" else self._load_expert(expert)

    def _load_expert(self, spec: str) -> Any:
        from mmrlvr.train.teacher import load_teacher  # one loader for every teacher (OPD's too)

        return load_teacher(self.rt, spec, "forward_ce: the expert")

    # ------------------------------------------------------------------------------------------------ step
    def prepare(self, b: Any) -> TopKTarget | None:
        from mmrlvr.algos.distill import expert_top_k, horizon_columns, horizon_mask, horizon_share

        rollouts = b.rollouts
        share = horizon_share(self.horizon, b.step, self.horizon_steps, self.horizon_start)
        # truncated rollouts end at the horizon already: the expert scores every generated token
        mask = rollouts.response_mask.clone() if self.truncated else horizon_mask(rollouts.response_mask, share)
        n, length = rollouts.response_ids.shape
        ids = torch.zeros(n, length, self.top_k, dtype=torch.long)
        probs = torch.zeros(n, length, self.top_k)
        t0 = time.perf_counter()
        mass, scored = 0.0, 0.0
        for rows in self.rt.micro_slices(n):
            cols = horizon_columns(mask[rows])
            if cols == 0:
                continue
            logits = self.expert_logits(b, rows, cols)  # [n, cols, V]
            top_ids, top_p = expert_top_k(logits, self.top_k, self.rt.cfg.rollout.temperature)
            ids[rows, :cols] = top_ids.cpu()
            probs[rows, :cols] = top_p.cpu()
            kept = mask[rows, :cols] > 0
            mass += float(top_p.sum(-1).cpu()[kept].sum())
            scored += float(kept.sum())
            del logits
        total = float((rollouts.response_mask > 0).sum())
        b.diagnostics.update({"distill/horizon": Metric.same(share), "distill/teacher_tokens": Metric.sum(scored),
                              "distill/teacher_token_share": Metric.mean(scored / total if total else 0.0, n=total),
                              "distill/expert_top_k_mass": Metric.mean(mass / scored if scored else 0.0, n=scored),
                              "time/distill_expert_s": Metric.max(time.perf_counter() - t0)})
        return TopKTarget(ids, probs, mask, self.weight, b.diagnostics)

    def expert_logits(self, b: Any, rows: slice, cols: int) -> torch.Tensor:
        """The expert's logits predicting response tokens [0, cols) of ``rows`` (no gradient)."""
        from mmrlvr.train.forward import response_logits

        rollouts = b.rollouts
        P = rollouts.prompt_length
        scored = cols  # response positions the forward computes logits for (cut to cols at the end)
        if self.model is None:
            inputs, model = self.privileged_inputs(b, rows, cols), self.rt.policy
        else:
            from mmrlvr.train.forward import slice_inputs

            inputs, model = slice_inputs(rollouts.model_inputs(), rows, b.images_per_row), self.model
            seq = inputs["input_ids"].shape[1]
            if (inputs["input_ids"][:, P + cols:] == self.rt.vision_start_id).any():
                # a tool turn's image lies past the kept prefix: cutting its tokens would leave its pixels without
                # placeholders, so the expert reads the whole sequence and the logits are cut instead
                scored = seq - P
            else:  # per-token entries (ids, mask, mm_token_type_ids) end where the kept response prefix ends
                inputs = {k: (v[:, :P + cols] if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == seq
                              else v) for k, v in inputs.items()}
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return response_logits(model, inputs, scored)[:, :cols]
        finally:
            model.train(was_training)

    def privileged_inputs(self, b: Any, rows: slice, cols: int) -> dict[str, Any]:
        """The expert's inputs for ``rows``: each prompt re-encoded with the privileged context (left-padded),
        then the student's sampled response tokens [0, cols). New tensors: the batch is not modified."""
        from mmrlvr.rollout.hf import encode_prompt_batch, expand_vision

        rollouts = b.rollouts
        P = rollouts.prompt_length
        samples = rollouts.samples[rows]
        group = rollouts.group_index[rows].tolist()
        firsts = [i for i, g in enumerate(group) if i == 0 or group[i - 1] != g]  # one prompt per group run
        counts = [(firsts[j + 1] if j + 1 < len(firsts) else len(group)) - f for j, f in enumerate(firsts)]
        distinct = [privileged_sample(samples[f], self.context) for f in firsts]
        enc = encode_prompt_batch(self.rt.processor, distinct)
        images = [len(s.images) for s in distinct]
        videos = [len(s.meta.get("videos") or []) for s in distinct]
        # one prompt per row (a micro-batch may cut a group: each prompt repeats by its own count)
        repeats = torch.tensor(counts)
        prompt_ids = enc["input_ids"].repeat_interleave(repeats, dim=0)
        prompt_mask = enc["attention_mask"].repeat_interleave(repeats, dim=0)
        vision = _repeat_vision(enc, images, videos, counts, expand_vision)
        response = rollouts.input_ids[rows, P:P + cols]
        response_mask = rollouts.attention_mask[rows, P:P + cols]
        n, p = prompt_ids.shape
        for key, value in vision.items():  # per-token entries (mm_token_type_ids): the response is text
            if isinstance(value, torch.Tensor) and value.dim() == 2 and tuple(value.shape) == (n, p):
                vision[key] = torch.cat([value, torch.zeros(n, cols, dtype=value.dtype)], dim=1)
        return {"input_ids": torch.cat([prompt_ids, response], dim=1),
                "attention_mask": torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1), **vision}

    def state_dict(self) -> dict[str, Any] | None:
        return None  # the horizon follows the step; the expert is the policy itself or a frozen model


def _repeat_vision(enc: dict[str, Any], images: list[int], videos: list[int], counts: list[int],
                   expand_vision: Any) -> dict[str, Any]:
    """The vision inputs of distinct prompts repeated ``counts[j]`` times each, in the processor's layout."""
    if all(c == counts[0] for c in counts):
        return expand_vision(enc, images, counts[0], videos)
    from mmrlvr.rollout.hf import _slice_rows

    parts = []
    for j, c in enumerate(counts):
        one = _slice_rows({k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")}, images, j, j + 1,
                          videos)
        parts.append(expand_vision(one, images[j:j + 1], c, videos[j:j + 1]))
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
