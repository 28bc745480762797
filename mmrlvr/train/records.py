"""Turn one step's StepData into RolloutRecords for the store (and so for the inspector).

Per-token arrays come from what the step already computed (old log-probs, credit signals and weights,
the broadcast advantage); nothing here runs the model. Images are stored once per run by content hash;
the ImageStore keeps a cache of what it has written so repeated prompts cost a hash, not a PNG encode.
"""

from __future__ import annotations

import json
import subprocess
from functools import lru_cache
from typing import Any

from mmrlvr.store.images import ImageStore
from mmrlvr.store.record import RolloutRecord


@lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except Exception:
        return ""


def _list(t) -> list[float]:
    return [float(x) for x in t.tolist()]


def _boxes(value: Any) -> list[list[float]]:
    if not value:
        return []
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (int, float)):
        value = [value]
    out = []
    for b in value:
        try:
            if len(b) == 4:
                out.append([float(x) for x in b])
        except TypeError:
            continue
    return out


def _gt_boxes(sample) -> list[list[float]]:
    if sample.answer_type != "box" or not sample.answer:
        return []
    try:
        return _boxes(json.loads(sample.answer))
    except (ValueError, TypeError):
        return []


class _ImageRefs:
    """id(image) -> stored relative path, so each distinct image is encoded once per run."""

    def __init__(self, store: ImageStore) -> None:
        self.store = store
        self.cache: dict[int, tuple[Any, str]] = {}

    def ref(self, image) -> str:
        hit = self.cache.get(id(image))
        if hit is not None and hit[0] is image:
            return hit[1]
        rel = self.store.put(image)
        self.cache[id(image)] = (image, rel)
        return rel


_REFS: dict[str, _ImageRefs] = {}


class _TokenTexts:
    """token id -> ``tokenizer.decode([id])``, decoded once per tokenizer. Why: the record stage shows every
    response token on its own (the inspector's token strip); decoding them one call each took about a tenth of
    the demo's record stage, and one token's text depends only on its id."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.texts = tok, {}

    def __call__(self, ids: list[int]) -> list[str]:
        texts = self.texts
        for t in ids:
            if t not in texts:
                texts[t] = self.tok.decode([t])
        return [texts[t] for t in ids]


_TOKEN_TEXTS: dict[int, _TokenTexts] = {}


def _token_texts(tok: Any) -> _TokenTexts:
    """The texts of ``tok`` (the few most recent tokenizers are kept: a process that loads many, such as a test
    session, does not keep them all alive)."""
    hit = _TOKEN_TEXTS.get(id(tok))
    if hit is None or hit.tok is not tok:
        while len(_TOKEN_TEXTS) >= 4:
            _TOKEN_TEXTS.pop(next(iter(_TOKEN_TEXTS)))
        hit = _TOKEN_TEXTS[id(tok)] = _TokenTexts(tok)
    return hit


from mmrlvr.store.images import VIDEO_FPS_KEY, VIDEO_FRAMES_KEY, video_frame_refs  # noqa: E402  (frames of video prompts)


def build_records(step: int, data, processor, writer, cfg) -> list[RolloutRecord]:
    batch = data.batch
    key = str(writer.run_dir) if hasattr(writer, "run_dir") else cfg.output_dir
    refs = _REFS.setdefault(key, _ImageRefs(ImageStore(key)))
    tok = getattr(processor, "tokenizer", processor)
    token_texts = _token_texts(tok)
    sig = data.signals
    run_id, chash, commit = str(getattr(writer, "run_id", "")), cfg.hash(), git_commit()
    fields = getattr(data, "record_fields", {}) or {}
    for name, values in fields.items():
        if len(values) != batch.num_rows:
            raise ValueError(f"record field {name!r}: {len(values)} values for {batch.num_rows} rows (a stage must "
                             f"give one value per row of the batch the record stage sees)")
    records = []
    sizes = [s.stop - s.start for s in batch.group_slices() for _ in range(s.stop - s.start)]  # each row's group
    for i in range(batch.num_rows):
        sample, comp, res = batch.samples[i], batch.completions[i], data.results[i]
        n = batch.response_extent(i)  # multi-turn: tool turns included (their tokens carry no loss)
        ids = batch.response_ids[i, :n].tolist()
        parsed = res.parsed or {}
        flat = {}
        for name, val in parsed.items():
            if isinstance(val, dict):
                flat.update({k: v for k, v in val.items() if k not in flat})
        cons = parsed.get("consistency") if isinstance(parsed.get("consistency"), dict) else None
        rubric = parsed.get("rubric") if isinstance(parsed.get("rubric"), dict) else {}
        criteria = rubric.get("rubric") if isinstance(rubric.get("rubric"), list) else []
        records.append(RolloutRecord(
            run_id=run_id, step=step, prompt_id=str(sample.id), sample_index=int(batch.sample_index[i]),
            group_size=sizes[i], prompt_text=sample.question,
            image_refs=[refs.ref(im) for im in sample.images],
            response_text=comp.text, response_token_ids=ids,
            response_tokens=token_texts(ids),
            token_logprob=_list(batch.old_logprobs[i, :n]),
            token_entropy=(_list(sig.entropy[i, :n]) if sig is not None and sig.entropy is not None
                           else _list(data.token_entropy[i, :n]) if data.token_entropy is not None else []),
            token_ratio=_list(data.token_ratio[i, :n]) if data.token_ratio is not None else [],
            token_sampler_gap=_list(data.sampler_gap[i, :n]) if data.sampler_gap is not None else [],
            token_vision_sensitivity=_vision_sensitivity(sig, i, n),
            token_credit_weight=_list(data.token_weights[i, :n]),
            token_advantage=(_list(data.advantages[i, :n]) if data.advantages.dim() == 2
                             else [float(data.advantages[i])] * n),
            reward=float(data.rewards[i]), reward_components={k: float(v) for k, v in res.components.items()},
            advantage=_row_advantage(data.advantages, data.batch.response_mask, i), finish_reason=comp.finish_reason,
            ground_truth=sample.answer, parsed_answer=_str_or_none(flat.get("answer")),
            parsed_boxes=_boxes(flat.get("boxes") or flat.get("pred_boxes")), gt_boxes=_gt_boxes(sample),
            rubric_results=[_criterion(c) for c in criteria],
            consistency=_consistency(cons),
            config_hash=chash, git_commit=commit,
            extra={"task": sample.meta.get("task", ""), "answer_type": sample.answer_type,
                   **(_video_extra(sample, refs.ref) if sample.meta.get("videos") else {}),
                   **({"guide": comp.meta["guide"]} if comp.meta.get("guide") else {}),
                   **(_turns_extra(batch, i, refs.ref) if batch.turns is not None else {}),
                   **{k: v[i] for k, v in fields.items()}},
        ))
    return records


def _video_extra(sample: Any, ref: Any) -> dict[str, Any]:
    """The stored frames of each video of ``sample`` and their sampling fps (the inspector's frame strip
    times each frame with it; None where the loader recorded no fps)."""
    fps = [v.get("fps") if isinstance(v, dict) else None for v in sample.meta.get("videos") or []]
    return {VIDEO_FRAMES_KEY: video_frame_refs(sample, ref), VIDEO_FPS_KEY: [float(f) if f else None for f in fps]}


def _vision_sensitivity(sig, i: int, n: int) -> list[float]:
    """JSD(P, Q) per token when the scheme compared full distributions, else VPPO's sampled-token k3."""
    if sig is None:
        return []
    if sig.jsd is not None:
        return _list(sig.jsd[i, :n])
    if sig.logq is not None and sig.old_logp is not None:
        from mmrlvr.credit import vppo_dependency

        return _list(vppo_dependency(sig.logq[i:i + 1, :n], sig.old_logp[i:i + 1, :n])[0])
    return []


def _criterion(c: dict) -> dict:
    """A rubric criterion result in the store's fixed struct layout."""
    def num(v):
        return None if v is None else float(v)

    return {"id": str(c.get("id", "")), "text": str(c.get("text", "")), "category": str(c.get("category", "")),
            "verdict": str(c.get("verdict", "unknown")), "score": num(c.get("score")), "weight": num(c.get("weight")),
            "rationale": str(c.get("rationale") or ""), "judge": str(c.get("judge") or "")}


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


def _consistency(c: dict | None) -> dict | None:
    if not c:
        return None
    span = c.get("conclusion_span")
    return {
        "verdict": str(c.get("verdict", "unknown")),
        "p_consistent": None if c.get("p_consistent") is None else float(c["p_consistent"]),
        "conclusion": None if c.get("conclusion") is None else str(c["conclusion"]),
        "conclusion_span": list(span) if span else None,
        "thinking_correct": c.get("thinking_correct"),
        "answer_correct": c.get("answer_correct"),
    }


def _turns_extra(batch: Any, i: int, ref: Any) -> dict[str, Any]:
    """A multi-turn row's turns for the inspector: each turn's kind, span in ``response_token_ids``, text, calls and
    the stored refs of the images a tool returned (``turn_images``: the row's images after the prompt's)."""
    n_prompt = len(batch.samples[i].images)
    images = batch.row_images[i] if batch.row_images is not None else []
    out = {"turns": batch.turns[i], "turn_images": [ref(im) for im in images[n_prompt:]]}
    region = batch.samples[i].meta.get("region")
    if region:  # the gold region a zoom should find (synth:zoom), for the turn view's IoU
        out["region"] = region
    return out


def _row_advantage(adv, mask, i: int) -> float:
    """One number per rollout: the advantage, or its mean over valid tokens when it is per token."""
    if adv.dim() == 1:
        return float(adv[i])
    valid = mask[i] > 0
    return float(adv[i][valid].mean()) if bool(valid.any()) else 0.0
