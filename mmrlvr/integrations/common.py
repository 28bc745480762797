"""What the TRL and verl adapters share: rows -> ``Sample``, rollout groups, batch logging values.

Both peers hand a reward function loose values (TRL: dataset columns, one list per column; verl: a ground
truth string and an ``extra_info`` dict). ``make_sample`` turns one row's values into the ``Sample`` the
mmrlvr rewards expect, with the same normalisation as ``mmrlvr.data.loading`` (numbers to text, choice
answers to option letters, JSON strings for rubric and meta) and errors that name the row and field.

Groups: the group-aware rewards (``rubric`` with saturation/POW3R, ``consistency`` with ``variant="care"``)
need the G rollouts of one prompt side by side. ``score_in_groups`` takes one group label per rollout,
reorders the batch so each group is contiguous (a stable sort, so an already grouped batch keeps its
order), labels the rollouts so either reward finds the same groups (``completion.meta["group_index"]`` and a
per-group ``sample.id``), scores, and puts the results back in the caller's order.

Nothing here imports torch, TRL or verl.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from typing import Any, Mapping, Sequence

from PIL import Image

from mmrlvr.errors import DataError, UserError
from mmrlvr.registry import RegistryError
from mmrlvr.rewards.base import RewardFn, build_reward, guard_metrics, score_batch
from mmrlvr.types import Completion, RewardResult, Sample

GROUP_AWARE = ("rubric", "consistency")


def ensure_registered() -> None:
    """Import the packages whose rewards register on import (``consistency``, ``rubric``)."""
    import mmrlvr.consistency  # noqa: F401  registers "consistency"
    import mmrlvr.rewards  # noqa: F401  registers format/accuracy/auto_accuracy/grounding/...
    import mmrlvr.rubric  # noqa: F401  registers "rubric"


def build(name: str, params: Mapping[str, Any], where: str) -> RewardFn:
    """``build_reward`` with user-facing errors (unknown name lists the known ones; bad params named)."""
    ensure_registered()
    try:
        return build_reward(name, **plain(params))
    except RegistryError as exc:
        raise UserError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: bad parameters {sorted(params)} for reward {name!r}: {exc}") from None


def plain(value: Any) -> Any:
    """Deep copy into plain dicts/lists (Hydra's DictConfig/ListConfig, numpy arrays from Parquet)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy arrays and scalars
        return plain(value.tolist())
    if isinstance(value, (list, tuple)) or (hasattr(value, "__iter__") and type(value).__name__ == "ListConfig"):
        return [plain(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- rows

def _json_or(value: Any, what: str, kinds: tuple[type, ...], where: str) -> Any:
    value = plain(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataError(f"{what} is not valid JSON ({exc.msg})", source=where, field=what) from None
    if value is not None and not isinstance(value, kinds):
        raise DataError(f"{what} must be {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}",
                        source=where, field=what)
    return value


def load_images(values: Any, where: str) -> list[Image.Image]:
    """PIL images from a value or list of values (PIL, path, bytes, ``{"bytes", "path"}``, data URL)."""
    from mmrlvr.data.images import load_image

    values = plain(values) if not isinstance(values, Image.Image) else values
    if values is None:
        return []
    if not isinstance(values, list):
        values = [values]
    out = []
    for i, v in enumerate(values):
        if v is None:
            continue
        try:
            out.append(v.convert("RGB") if isinstance(v, Image.Image) and v.mode != "RGB" else load_image(v))
        except DataError as exc:
            raise DataError(f"image {i}: {exc}", source=where, field="images") from None
    return out


def messages_from_prompt(prompt: Any, n_images: int) -> list[dict[str, Any]]:
    """Chat messages in mmrlvr's format (``{"type": "image"}`` placeholders) from a TRL/verl prompt.

    Accepts a plain string, or conversational messages whose content is a string or a list of parts (parts
    that went through Arrow carry ``None`` for the keys other part types use; image payloads are dropped:
    the images travel in ``Sample.images``).
    """
    if prompt is None or isinstance(prompt, str):
        text = (prompt or "").replace("<image>", "").strip()  # verl-style placeholders become image parts
        parts = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
        return [{"role": "user", "content": parts}]
    messages = []
    for msg in plain(prompt):
        content = msg.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") == "image":
                    parts.append({"type": "image"})
                elif p.get("type") == "text":
                    parts.append({"type": "text", "text": p.get("text") or ""})
            content = parts
        messages.append({"role": msg.get("role", "user"), "content": content if content is not None else ""})
    return messages


def make_sample(*, sample_id: str, messages: list[dict[str, Any]], images: list[Image.Image], answer: Any,
                answer_type: str, rubric: Any = None, options: Any = None, meta: Any = None,
                where: str = "row") -> Sample:
    """One ``Sample`` from loose row values, normalised like ``mmrlvr.data.loading`` (see module docstring)."""
    from mmrlvr.data.loading import ANSWER_TYPES, choice_letter, normalise_answer, parse_box

    if answer_type not in ANSWER_TYPES:
        raise DataError(f"unknown answer_type {answer_type!r}; known: {', '.join(ANSWER_TYPES)}",
                        source=where, field="answer_type")
    meta_d = dict(_json_or(meta, "meta", (dict,), where) or {})
    rubric_v = _json_or(rubric, "rubric", (list, dict), where)
    if isinstance(rubric_v, dict) and isinstance(rubric_v.get("criteria"), list):
        rubric_v = rubric_v["criteria"]
    answer = plain(answer)
    try:
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            text = None
        elif answer_type == "box":
            if isinstance(answer, list) and answer and isinstance(answer[0], list):  # several boxes
                text = json.dumps(answer)
            elif isinstance(answer, str) and answer.strip().startswith("[["):
                text = answer.strip()
            else:
                text = json.dumps([int(v) if v.is_integer() else v for v in parse_box(answer)])
        elif answer_type == "choice" and options is not None:
            opts = [str(o) for o in _json_or(options, "options", (list,), where)]
            meta_d["options"] = opts
            text = choice_letter(answer, opts)
        else:
            text = normalise_answer(answer)
    except DataError as exc:
        raise DataError(str(exc), source=where, field="answer") from None
    return Sample(id=sample_id, messages=messages, images=images, answer=text, answer_type=answer_type,
                  rubric=rubric_v, meta=meta_d)


def content_key(*parts: Any, images: Sequence[Image.Image] = ()) -> str:
    """A short hash of a prompt's content (text values and image pixels): rows with equal keys share a prompt."""
    h = hashlib.sha1()
    for p in parts:
        h.update(json.dumps(plain(p), sort_keys=True, default=str).encode())
        h.update(b"\0")
    for im in images:
        h.update(f"{im.mode}{im.size}".encode())
        h.update(im.tobytes())
    return h.hexdigest()[:16]


# -------------------------------------------------------------------------------------------- groups

def labels_from_keys(keys: Sequence[Any]) -> list[int]:
    """Group label per row: rows with equal keys share a label; labels count up in order of first appearance."""
    seen: dict[Any, int] = {}
    return [seen.setdefault(k, len(seen)) for k in keys]


def labels_from_blocks(keys: Sequence[Any], group_size: int, where: str) -> list[int]:
    """Consecutive blocks of ``group_size`` rows; every row of a block must share one prompt key."""
    n = len(keys)
    if group_size < 1:
        raise UserError(f"{where}: group_size must be >= 1, got {group_size}")
    if n % group_size:
        raise UserError(f"{where}: a batch of {n} rollouts does not split into groups of {group_size}; with "
                        "several processes each one's batch must hold whole groups (see docs/integrations.md)")
    for start in range(0, n, group_size):
        if len(set(keys[start:start + group_size])) != 1:
            raise UserError(f"{where}: rows {start}..{start + group_size - 1} should be the {group_size} rollouts "
                            "of one prompt but hold different prompts; the rollouts of a prompt must be "
                            "contiguous (or leave group_size unset to group by prompt content)")
    return [i // group_size for i in range(n)]


def score_in_groups(fn: RewardFn, completions: Sequence[Completion], samples: Sequence[Sample],
                    labels: Sequence[int]) -> list[RewardResult]:
    """Score with each group contiguous and labelled (module docstring); results in the input order."""
    order = sorted(range(len(samples)), key=lambda i: labels[i])  # stable: ties keep their order
    comps = [replace(completions[i], meta={**completions[i].meta, "group_index": int(labels[i])}) for i in order]
    samps = [replace(samples[i], id=f"{samples[i].id}#{labels[i]}") for i in order]
    scored = score_batch(fn, comps, samps)
    out: list[RewardResult | None] = [None] * len(samples)
    for pos, i in enumerate(order):
        out[i] = scored[pos]
    return out  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------- logging

def batch_metrics(label: str, results: Sequence[RewardResult], fn: RewardFn) -> dict[str, float]:
    """Finite per-batch values worth logging next to a reward's mean.

    ``rewards/<label>/<component>``: mean of each sub-component over the rollouts that have it (e.g.
    ``rewards/rubric/crit/count``); the reward's own ``metrics()`` when it has them (``judge/unknown_rate``,
    ``rubric/undetermined_rate``, ...); for ``consistency``, ``inconsistency_rate`` and the
    ``consistency/*`` breakdown (``mmrlvr.consistency.consistency_metrics``); the reward guard's counts
    (``reward/errors``, ``reward/over_budget``, ``reward/dropped``; ``mmrlvr.rewards.base.guard_metrics``).
    """
    sums: dict[str, list[float]] = {}
    for r in results:
        for name, value in r.components.items():
            if name != label and value is not None and math.isfinite(float(value)):
                sums.setdefault(f"rewards/{label}/{name}", []).append(float(value))
    out = {k: sum(v) / len(v) for k, v in sums.items()}
    extra = getattr(fn, "metrics", None)
    if callable(extra):
        out.update({k: float(v) for k, v in extra().items()})
    out.update({k: v for k, v in guard_metrics(fn).items() if k != "reward/rows"})
    if type(fn).__name__ == "ConsistencyReward":
        from mmrlvr.consistency.metrics import consistency_metrics

        out.update(consistency_metrics([r.parsed for r in results]))
    return {k: v for k, v in out.items() if v is not None and math.isfinite(v)}


def as_callable_name(label: str) -> str:
    """TRL shows ``__name__`` as ``rewards/<name>/mean``; keep it one path segment."""
    return label.replace("/", "_")
