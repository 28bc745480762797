"""``RolloutRecord``: the one contract between the trainer, the rollout store and the inspector.

One record is one sampled response (sample ``sample_index`` of the ``group_size`` responses to prompt
``prompt_id`` at training step ``step``) with everything needed to understand its reward and its
gradient: the text, the tokens, per-token signals, the reward broken into components and rubric
criteria, the parsed answer and boxes, and the consistency verdict.

Storage layout (``ROLLOUT_SCHEMA``, one Parquet file per step, see ``mmrlvr.store.writer``):

* Scalars are plain Arrow scalars (``int64``, ``float64``, ``string``).
* Lists are typed Arrow lists (token ids ``list<int32>``, per-token signals ``list<float32>``, boxes
  ``list<list<float64>>``). Per-token arrays that were not computed are stored as **empty lists**, never
  missing columns, so every shard has the same schema.
* Dicts with fixed keys are Arrow structs: ``rubric_results`` is ``list<struct<id, text, category, verdict,
  score, weight, rationale, judge>>``; ``consistency`` is a nullable ``struct<verdict, p_consistent,
  conclusion, conclusion_span, thinking_correct, answer_correct>``.
* Dicts with free keys (``reward_components``, ``extra``) are **JSON strings**: ``datasets``, pandas and
  pyarrow all read a string column the same way, whereas Arrow's map type comes back as a list of pairs in
  pandas and is awkward in ``datasets``. Use ``json.loads(row["reward_components"])``.
* ``num_response_tokens`` is derived (``len(response_token_ids)``) and stored so the inspector's index can
  be built from scalar columns only.

Video prompts keep their sampled frames in ``extra["video_frames"]`` (``mmrlvr.store.images.VIDEO_FRAMES_KEY``):
one list of image refs per video, stored like ``image_refs``, so old readers are unaffected.

Boxes (``parsed_boxes``, ``gt_boxes``) are ``[x1, y1, x2, y2]`` in pixels of the *stored* image
``image_refs[0]`` (the trainer converts model coordinates before writing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = "1"

#: per-token signal fields (each ``list[float]`` of length ``num_response_tokens``, or empty)
TOKEN_ARRAY_FIELDS: tuple[str, ...] = (
    "token_logprob",
    "token_entropy",
    "token_vision_sensitivity",
    "token_credit_weight",
    "token_advantage",
    "token_ratio",
    "token_sampler_gap",
)

RUBRIC_KEYS: tuple[str, ...] = ("id", "text", "category", "verdict", "score", "weight", "rationale", "judge")
CONSISTENCY_KEYS: tuple[str, ...] = (
    "verdict", "p_consistent", "conclusion", "conclusion_span", "thinking_correct", "answer_correct",
)

_RUBRIC_TYPE = pa.struct([
    ("id", pa.string()),
    ("text", pa.string()),
    ("category", pa.string()),
    ("verdict", pa.string()),  # "pass" | "fail" | "unknown"
    ("score", pa.float64()),
    ("weight", pa.float64()),
    ("rationale", pa.string()),
    ("judge", pa.string()),
])
_CONSISTENCY_TYPE = pa.struct([
    ("verdict", pa.string()),  # e.g. "consistent" | "inconsistent" | "unknown"
    ("p_consistent", pa.float64()),
    ("conclusion", pa.string()),  # the conclusion extracted from the thinking
    ("conclusion_span", pa.list_(pa.int64())),  # [start, end) character offsets into response_text
    ("thinking_correct", pa.bool_()),
    ("answer_correct", pa.bool_()),
])
_BOXES = pa.list_(pa.list_(pa.float64()))

ROLLOUT_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("prompt_id", pa.string()),
        ("sample_index", pa.int64()),
        ("group_size", pa.int64()),
        ("prompt_text", pa.string()),
        ("image_refs", pa.list_(pa.string())),
        ("response_text", pa.string()),
        ("response_token_ids", pa.list_(pa.int32())),
        ("response_tokens", pa.list_(pa.string())),
        *[(name, pa.list_(pa.float32())) for name in TOKEN_ARRAY_FIELDS],
        ("reward", pa.float64()),
        ("reward_components", pa.string()),  # JSON object {name: float}
        ("advantage", pa.float64()),
        ("finish_reason", pa.string()),
        ("ground_truth", pa.string()),
        ("parsed_answer", pa.string()),
        ("parsed_boxes", _BOXES),
        ("gt_boxes", _BOXES),
        ("rubric_results", pa.list_(_RUBRIC_TYPE)),
        ("consistency", _CONSISTENCY_TYPE),
        ("config_hash", pa.string()),
        ("git_commit", pa.string()),
        ("extra", pa.string()),  # JSON object
        ("num_response_tokens", pa.int64()),  # derived: len(response_token_ids)
    ],
    metadata={"mmrlvr.schema_version": SCHEMA_VERSION},
)

#: the columns the inspector's index reads (cheap: no text, no per-token lists)
INDEX_COLUMNS: tuple[str, ...] = (
    "step", "prompt_id", "sample_index", "group_size", "reward", "reward_components", "advantage",
    "finish_reason", "num_response_tokens",
)


@dataclass
class RolloutRecord:
    """One sampled response and everything the inspector shows about it (see module docstring)."""

    run_id: str
    step: int
    prompt_id: str
    sample_index: int
    group_size: int
    prompt_text: str = ""
    image_refs: list[str] = field(default_factory=list)
    response_text: str = ""
    response_token_ids: list[int] = field(default_factory=list)
    response_tokens: list[str] = field(default_factory=list)  # decoded per token, for heatmaps
    token_logprob: list[float] = field(default_factory=list)
    token_entropy: list[float] = field(default_factory=list)
    token_vision_sensitivity: list[float] = field(default_factory=list)
    token_credit_weight: list[float] = field(default_factory=list)  # 0 = not selected by the credit scheme
    token_advantage: list[float] = field(default_factory=list)
    token_ratio: list[float] = field(default_factory=list)
    token_sampler_gap: list[float] = field(default_factory=list)  # log pi_old (trainer) - log pi (sampler)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    advantage: float = 0.0
    finish_reason: str = "stop"
    ground_truth: str | None = None
    parsed_answer: str | None = None
    parsed_boxes: list[list[float]] = field(default_factory=list)
    gt_boxes: list[list[float]] = field(default_factory=list)
    rubric_results: list[dict[str, Any]] = field(default_factory=list)
    consistency: dict[str, Any] | None = None
    config_hash: str = ""
    git_commit: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_token_ids)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when the record breaks the contract."""
        where = f"record step={self.step} prompt={self.prompt_id!r} sample={self.sample_index}"
        n = len(self.response_token_ids)
        if len(self.response_tokens) and len(self.response_tokens) != n:
            raise ValueError(f"{where}: response_tokens has {len(self.response_tokens)} entries, "
                             f"response_token_ids has {n}")
        for name in TOKEN_ARRAY_FIELDS:
            values = getattr(self, name)
            if len(values) and len(values) != n:
                raise ValueError(f"{where}: {name} has {len(values)} values for {n} response tokens")
        for name in ("parsed_boxes", "gt_boxes"):
            for i, box in enumerate(getattr(self, name)):
                if len(box) != 4:
                    raise ValueError(f"{where}: {name}[{i}] must be [x1, y1, x2, y2], got {box!r}")
        if not (0 <= self.sample_index < max(self.group_size, 1)):
            raise ValueError(f"{where}: sample_index must be in [0, group_size={self.group_size})")

    def to_row(self) -> dict[str, Any]:
        """A dict matching ``ROLLOUT_SCHEMA`` (lists copied, so later edits of the record don't leak in)."""
        self.validate()
        row: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("reward_components", "extra"):
                value = json.dumps(_jsonable(value), sort_keys=True, allow_nan=True)
            elif f.name == "rubric_results":
                value = [_coerce(crit, _RUBRIC_KINDS) for crit in value]
            elif f.name == "consistency":
                value = None if not value else _coerce(value, _CONSISTENCY_KINDS)
            elif hasattr(value, "tolist"):  # numpy array / torch tensor of per-token values
                value = value.tolist()
            elif isinstance(value, (list, tuple)):
                value = [v.tolist() if hasattr(v, "tolist") else list(v) if isinstance(v, (list, tuple)) else v
                         for v in value]
            row[f.name] = value
        for name in _STR_FIELDS:  # e.g. an int ground truth: store its text, don't fail the writer
            if row[name] is not None and not isinstance(row[name], str):
                row[name] = str(row[name])
        row["step"] = int(self.step)
        row["sample_index"] = int(self.sample_index)
        row["group_size"] = int(self.group_size)
        row["reward"] = float(self.reward)
        row["advantage"] = float(self.advantage)
        row["num_response_tokens"] = self.num_response_tokens
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "RolloutRecord":
        """Inverse of ``to_row`` (accepts a row from pyarrow ``to_pylist`` or ``datasets``)."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in row:
                continue
            value = row[f.name]
            if f.name in ("reward_components", "extra"):
                value = json.loads(value) if value else {}
            elif f.name == "rubric_results":
                value = [dict(c) for c in (value or [])]
            elif f.name == "consistency":
                value = dict(value) if value else None
            elif isinstance(value, list):
                value = [list(v) if isinstance(v, (list, tuple)) else v for v in value]
            elif value is None and f.name in ("image_refs", "parsed_boxes", "gt_boxes", "response_token_ids",
                                              "response_tokens", *TOKEN_ARRAY_FIELDS):
                value = []
            kwargs[f.name] = value
        return cls(**kwargs)


def records_to_table(records: list[RolloutRecord]) -> pa.Table:
    """Records -> an Arrow table with exactly ``ROLLOUT_SCHEMA`` (same schema even when all optional
    fields are empty)."""
    rows = [r.to_row() for r in records]
    return rows_to_table(rows)


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows from ``RolloutRecord.to_row`` -> an Arrow table with ``ROLLOUT_SCHEMA``."""
    return pa.Table.from_pylist(rows, schema=ROLLOUT_SCHEMA)


_STR_FIELDS = ("run_id", "prompt_id", "prompt_text", "response_text", "finish_reason", "ground_truth",
               "parsed_answer", "config_hash", "git_commit")
# Field kinds of the struct columns. Values are coerced (a bool score becomes 1.0, a number id becomes a
# string, anything unconvertible becomes null) and unknown keys are dropped: a display-only field must never
# make the background writer fail and cost the trainer a step of rollouts.
_RUBRIC_KINDS = {"id": str, "text": str, "category": str, "verdict": str, "score": float, "weight": float,
                 "rationale": str, "judge": str}
_CONSISTENCY_KINDS = {"verdict": str, "p_consistent": float, "conclusion": str, "conclusion_span": "span",
                      "thinking_correct": bool, "answer_correct": bool}


def _coerce(d: dict[str, Any], kinds: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, kind in kinds.items():
        v = d.get(key)
        if v is None:
            out[key] = None
        elif kind == "span":
            try:
                out[key] = [int(v[0]), int(v[1])] if len(v) == 2 else None
            except (TypeError, ValueError, IndexError):
                out[key] = None
        elif kind is float:
            try:
                out[key] = float(v)
            except (TypeError, ValueError):
                out[key] = None
        elif kind is bool:
            out[key] = bool(v) if isinstance(v, (bool, int, float)) or hasattr(v, "item") else None
        else:
            out[key] = str(v)
    return out


def _jsonable(value: Any) -> Any:
    """Make numpy/torch scalars and tuples JSON-serialisable; keep NaN/inf (json writes NaN/Infinity)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return _jsonable(item())
        except (TypeError, ValueError):
            pass
    return str(value)
