"""``RolloutReader``: read a run's rollout shards, fast enough for 100k+ rollouts, while the run writes.

Two levels:

* **The index** (``reader.index``): one pandas row per rollout with the scalar columns only (step,
  prompt id, sample index, reward, advantage, finish reason, response length) plus one column per reward
  component (``c:<name>``), and where the row lives (``_file``, ``_row``). It is built from the Parquet
  column chunks of those columns, so opening a run never touches text or per-token arrays.
  ``refresh()`` re-lists ``rollouts/`` and reads only new or changed shards: the inspector can follow a
  run that is still training.
* **Records** (``read_step``, ``group``, ``records``): whole ``RolloutRecord`` objects, loaded lazily per
  shard (a small LRU cache of decoded shards).

Filtering (``filter``) works on the index, and loads ``response_text`` only when a regex is given.
Only complete shards are ever seen: the writer renames a finished temp file into place, and temp files
(``.step-*.parquet.tmp-*``) don't match ``step-*.parquet``. A shard that cannot be read (e.g. copied in
half-way by hand) is skipped and listed in ``reader.errors``.

The same files are readable without mmrlvr::

    pyarrow.parquet.read_table("runs/x/rollouts/step-00000003.parquet")
    pandas.read_parquet("runs/x/rollouts/")
    datasets.load_dataset("parquet", data_files="runs/x/rollouts/step-*.parquet")
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from mmrlvr.errors import UserError
from mmrlvr.store.record import INDEX_COLUMNS, RolloutRecord
from mmrlvr.store.writer import ROLLOUTS_DIR

STEP_FILE_RE = re.compile(r"^step-(\d+)\.parquet$")
COMPONENT_PREFIX = "c:"
#: a component "passes" when its value is at least this (binary components are 0/1; IoU uses IoU@0.5)
PASS_THRESHOLD = 0.5
METRICS_FILE = "metrics.jsonl"


@dataclass
class _Shard:
    path: Path
    step: int
    mtime_ns: int
    size: int
    table: pa.Table  # index columns only


class RolloutReader:
    """Read-only view of ``run_dir/rollouts/step-*.parquet`` (+ ``metrics.jsonl``). Thread-safe."""

    def __init__(self, run_dir: str | os.PathLike[str], *, cache_shards: int = 8) -> None:
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise UserError(f"run folder {self.run_dir} does not exist")
        self.rollouts_dir = self.run_dir / ROLLOUTS_DIR
        self.errors: dict[str, str] = {}  # shard path -> why it was skipped
        self._bad: dict[str, tuple[int, int]] = {}  # unreadable shard -> (mtime, size): not retried until it changes
        self._shards: dict[int, _Shard] = {}
        self._index: pd.DataFrame | None = None
        self._files: list[Path] = []
        self._lock = threading.RLock()
        self._cache: OrderedDict[Path, tuple[int, pa.Table]] = OrderedDict()
        self._cache_size = cache_shards
        self._text_cache: dict[tuple[Path, int, str], list[str | None]] = {}
        self.refresh()

    # -- the index --------------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Pick up new / changed / removed shards. Returns True when the index changed."""
        with self._lock:
            found = self._list_shards()
            todo = [(step, path, st) for step, (path, st) in found.items()
                    if self._bad.get(str(path)) != (st.st_mtime_ns, st.st_size)
                    and (step not in self._shards
                         or (self._shards[step].mtime_ns, self._shards[step].size) != (st.st_mtime_ns, st.st_size))]
            removed = [step for step in self._shards if step not in found]
            for step in removed:
                del self._shards[step]
            if todo:
                workers = min(8, len(todo))
                if workers > 1:
                    with ThreadPoolExecutor(workers) as pool:
                        results = list(pool.map(self._read_index_table, todo))
                else:
                    results = [self._read_index_table(t) for t in todo]
                for shard in results:
                    if shard is not None:
                        self._shards[shard.step] = shard
            changed = bool(todo or removed) or self._index is None
            if changed:
                self._index = self._build_index()
            return changed

    @property
    def index(self) -> pd.DataFrame:
        """The scalar index (see module docstring). Call ``refresh()`` to follow a running run."""
        with self._lock:
            assert self._index is not None
            return self._index

    def steps(self) -> list[int]:
        """Steps with a readable shard, ascending (refreshes first)."""
        self.refresh()
        with self._lock:
            return sorted(self._shards)

    def components(self) -> list[str]:
        """Reward component names present in the run."""
        return [c[len(COMPONENT_PREFIX):] for c in self.index.columns if c.startswith(COMPONENT_PREFIX)]

    def groups(self, step: int) -> pd.DataFrame:
        """One row per prompt group of ``step``: prompt_id, n, reward mean/std/min/max, zero_variance."""
        idx = self.index
        sub = idx[idx["step"] == step]
        return group_summary(sub)

    # -- records ----------------------------------------------------------------------------------------
    def read_step(self, step: int) -> list[RolloutRecord]:
        """All records of one step, ordered by (prompt_id, sample_index)."""
        table = self._full_table(self._shard_path(step))
        records = [RolloutRecord.from_row(r) for r in table.to_pylist()]
        records.sort(key=lambda r: (r.prompt_id, r.sample_index))
        return records

    def group(self, step: int, prompt_id: str) -> list[RolloutRecord]:
        """The G records of one prompt at one step, by sample_index."""
        idx = self.index
        rows = idx[(idx["step"] == step) & (idx["prompt_id"] == prompt_id)]
        if rows.empty:
            raise UserError(f"no rollouts for prompt {prompt_id!r} at step {step} in {self.run_dir}")
        return sorted(self.records(rows), key=lambda r: r.sample_index)

    def record(self, step: int, prompt_id: str, sample_index: int) -> RolloutRecord:
        idx = self.index
        rows = idx[(idx["step"] == step) & (idx["prompt_id"] == prompt_id) & (idx["sample_index"] == sample_index)]
        if rows.empty:
            raise UserError(f"no rollout step={step} prompt={prompt_id!r} sample={sample_index} in {self.run_dir}")
        return self.records(rows.iloc[:1])[0]

    def records(self, rows: pd.DataFrame) -> list[RolloutRecord]:
        """Load the full records of index rows (in the order of ``rows``), touching only their shards."""
        out: dict[tuple[int, int], RolloutRecord] = {}
        for file_code, part in rows.groupby("_file", sort=False):
            table = self._full_table(self._files[int(file_code)])
            picked = table.take(pa.array(part["_row"].to_numpy(dtype=np.int64)))
            for row_i, rec in zip(part["_row"].tolist(), picked.to_pylist()):
                out[(int(file_code), int(row_i))] = RolloutRecord.from_row(rec)
        return [out[(int(f), int(r))] for f, r in zip(rows["_file"].tolist(), rows["_row"].tolist())]

    def texts(self, rows: pd.DataFrame, field: str = "response_text") -> list[str | None]:
        """``field`` (``response_text`` / ``prompt_text``) of index rows, in their order; reads only that
        column of the rows' shards (cached), e.g. for text previews beside filter results."""
        if field not in ("response_text", "prompt_text"):
            raise UserError(f"field must be 'response_text' or 'prompt_text', not {field!r}")
        return [self._text_column(int(f), field)[int(r)] for f, r in zip(rows["_file"].tolist(), rows["_row"].tolist())]

    def data_files(self) -> list[str]:
        """Shard paths, for ``datasets.load_dataset("parquet", data_files=...)``."""
        with self._lock:
            return [str(self._shards[s].path) for s in sorted(self._shards)]

    # -- filtering --------------------------------------------------------------------------------------
    def filter(self, step_range: tuple[int | None, int | None] | None = None,
               reward_range: tuple[float | None, float | None] | None = None,
               component: str | None = None, passed: bool | None = None,
               advantage_sign: str | int | None = None, finish_reason: str | Sequence[str] | None = None,
               regex: str | None = None, limit: int | None = None, *, prompt_id: str | None = None,
               regex_field: str = "response_text", order: str = "step") -> pd.DataFrame:
        """Index rows matching every given condition (None = no condition).

        step_range / reward_range: inclusive ``(lo, hi)``, either side may be None.
        component + passed: rows where reward component ``component`` is >= PASS_THRESHOLD (passed=True)
            or < it (passed=False); with passed=None, rows that have the component at all.
        advantage_sign: "+" / "positive" / 1, "-" / "negative" / -1, "0" / "zero" / 0 (|A| < 1e-8).
        finish_reason: one reason or a list of reasons.
        regex: Python regular expression searched in ``regex_field`` (``response_text`` or
            ``prompt_text``); only this column is read from the shards, and only for rows that passed the
            other conditions.
        order: "step" (step, prompt, sample) or "round_robin" (one sample of each group before any group
            gives a second: a varied sample of a big selection).
        limit: keep the first ``limit`` rows after ordering.
        """
        idx = self.index
        mask = np.ones(len(idx), dtype=bool)
        if step_range is not None:
            lo, hi = step_range
            if lo is not None:
                mask &= idx["step"].to_numpy() >= lo
            if hi is not None:
                mask &= idx["step"].to_numpy() <= hi
        if reward_range is not None:
            lo, hi = reward_range
            rewards = idx["reward"].to_numpy()
            if lo is not None:
                mask &= rewards >= lo
            if hi is not None:
                mask &= rewards <= hi
        if component:
            col = COMPONENT_PREFIX + component
            if col not in idx.columns:
                raise UserError(f"unknown reward component {component!r}; known: {self.components()}")
            values = idx[col].to_numpy(dtype=float)
            present = ~np.isnan(values)
            if passed is None:
                mask &= present
            elif passed:
                mask &= present & (np.nan_to_num(values, nan=-np.inf) >= PASS_THRESHOLD)
            else:
                mask &= present & (np.nan_to_num(values, nan=np.inf) < PASS_THRESHOLD)
        elif passed is not None:
            raise UserError("filter(passed=...) needs component=NAME")
        if advantage_sign is not None:
            mask &= _advantage_mask(idx["advantage"].to_numpy(), advantage_sign)
        if finish_reason:
            reasons = [finish_reason] if isinstance(finish_reason, str) else list(finish_reason)
            mask &= idx["finish_reason"].isin(reasons).to_numpy()
        if prompt_id is not None:
            mask &= (idx["prompt_id"] == prompt_id).to_numpy()
        result = idx[mask]
        if regex:
            result = result[self._regex_mask(result, regex, regex_field)]
        if order == "round_robin":
            result = round_robin(result, limit)  # orders positions, then takes only the first `limit` rows
        elif order != "step":
            raise UserError(f"unknown order {order!r}; use 'step' or 'round_robin'")
        if limit is not None:
            result = result.iloc[: max(int(limit), 0)]
        return result

    def prompt_history(self, prompt_id: str) -> pd.DataFrame:
        """Per-step summary of one prompt across the run (reward mean/std/max, n)."""
        idx = self.index
        return group_summary(idx[idx["prompt_id"] == prompt_id], by="step")

    # -- metrics ----------------------------------------------------------------------------------------
    def metrics(self) -> list[dict[str, Any]]:
        """Rows of ``metrics.jsonl`` (a half-written last line of a running run is skipped)."""
        return read_metrics(self.run_dir / METRICS_FILE)

    # -- internals --------------------------------------------------------------------------------------
    def _list_shards(self) -> dict[int, tuple[Path, os.stat_result]]:
        found: dict[int, tuple[Path, os.stat_result]] = {}
        if not self.rollouts_dir.is_dir():
            return found
        with os.scandir(self.rollouts_dir) as it:
            for entry in it:
                m = STEP_FILE_RE.match(entry.name)
                if m and entry.is_file():
                    found[int(m.group(1))] = (Path(entry.path), entry.stat())
        return found

    def _read_index_table(self, item: tuple[int, Path, os.stat_result]) -> _Shard | None:
        step, path, st = item
        try:
            # ParquetFile.read skips the dataset layer of read_table (~2x faster per small file); the
            # parallelism is across shards (refresh's thread pool), so no threads inside one read
            with pq.ParquetFile(path) as pf:
                table = pf.read(columns=list(INDEX_COLUMNS), use_threads=False)
        except Exception as exc:  # noqa: BLE001 - a bad shard must not hide the others
            self.errors[str(path)] = f"{type(exc).__name__}: {exc}"
            self._bad[str(path)] = (st.st_mtime_ns, st.st_size)
            return None
        self.errors.pop(str(path), None)
        self._bad.pop(str(path), None)
        return _Shard(path, step, st.st_mtime_ns, st.st_size, table)

    def _build_index(self) -> pd.DataFrame:
        steps = sorted(self._shards)
        self._files = [self._shards[s].path for s in steps]
        self._cache.clear()
        self._text_cache.clear()
        if not steps:
            cols = {c: pd.Series(dtype=t) for c, t in
                    [("step", "int64"), ("prompt_id", "object"), ("sample_index", "int64"),
                     ("group_size", "int64"), ("reward", "float64"), ("advantage", "float64"),
                     ("finish_reason", "object"), ("num_response_tokens", "int64"), ("_file", "int64"),
                     ("_row", "int64")]}
            return pd.DataFrame(cols)
        tables = [self._shards[s].table for s in steps]
        lengths = [t.num_rows for t in tables]
        table = pa.concat_tables(tables)
        comps_json = table.column("reward_components")
        table = table.drop_columns(["reward_components"])
        df = table.to_pandas()
        df["_file"] = np.repeat(np.arange(len(tables), dtype=np.int64), lengths)
        df["_row"] = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
        comps = parse_components(comps_json)
        for name in comps.columns:
            df[COMPONENT_PREFIX + name] = comps[name].to_numpy(dtype=float)
        return df.sort_values(["step", "prompt_id", "sample_index"], kind="stable").reset_index(drop=True)

    def _shard_path(self, step: int) -> Path:
        with self._lock:
            shard = self._shards.get(int(step))
        if shard is None:
            self.refresh()
            with self._lock:
                shard = self._shards.get(int(step))
        if shard is None:
            raise UserError(f"no rollouts for step {step} in {self.rollouts_dir} (steps: {self.steps()[:20]}...)")
        return shard.path

    def _full_table(self, path: Path) -> pa.Table:
        with self._lock:
            mtime = path.stat().st_mtime_ns
            hit = self._cache.get(path)
            if hit is not None and hit[0] == mtime:
                self._cache.move_to_end(path)
                return hit[1]
        table = pq.read_table(path)
        with self._lock:
            self._cache[path] = (mtime, table)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return table

    def _regex_mask(self, rows: pd.DataFrame, pattern: str, field: str) -> np.ndarray:
        if field not in ("response_text", "prompt_text"):
            raise UserError(f"regex_field must be 'response_text' or 'prompt_text', not {field!r}")
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise UserError(f"invalid regular expression {pattern!r}: {exc}") from None
        out = np.zeros(len(rows), dtype=bool)
        files = rows["_file"].to_numpy()
        row_ids = rows["_row"].to_numpy()
        for code in np.unique(files):
            sel = np.nonzero(files == code)[0]
            texts = self._text_column(int(code), field)
            out[sel] = [bool(t is not None and rx.search(t)) for t in (texts[i] for i in row_ids[sel])]
        return out

    def _text_column(self, file_code: int, field: str) -> list[str | None]:
        path = self._files[file_code]
        key = (path, file_code, field)
        with self._lock:
            hit = self._text_cache.get(key)
        if hit is None:
            hit = pq.read_table(path, columns=[field]).column(field).to_pylist()
            with self._lock:
                self._text_cache[key] = hit
        return hit


def parse_components(column: pa.ChunkedArray | pa.Array) -> pd.DataFrame:
    """JSON ``reward_components`` strings -> one float column per component (NaN where absent).

    Uses Arrow's C++ JSON reader (100k rows in milliseconds); falls back to Python's ``json`` when a
    value is not strict JSON (NaN/Infinity, which Python writes but Arrow refuses).
    """
    values = column.to_pylist() if not isinstance(column, list) else column
    if not values:
        return pd.DataFrame()
    lines = [v if v else "{}" for v in values]
    try:
        data = ("\n".join(lines) + "\n").encode()
        parsed = pajson.read_json(io.BytesIO(data))
        df = parsed.to_pandas()
        if len(df) != len(lines):
            raise ValueError("row count mismatch")
        return df.apply(pd.to_numeric, errors="coerce") if len(df.columns) else pd.DataFrame(index=range(len(lines)))
    except (pa.ArrowInvalid, ValueError, TypeError):
        dicts = [json.loads(v) for v in lines]
        df = pd.DataFrame.from_records(dicts)
        return df.apply(pd.to_numeric, errors="coerce")


def group_summary(rows: pd.DataFrame, by: str = "prompt_id") -> pd.DataFrame:
    """Group statistics: n, reward mean/std/min/max, spread (max - min), zero_variance (all equal)."""
    if rows.empty:
        return pd.DataFrame(columns=[by, "n", "reward_mean", "reward_std", "reward_min", "reward_max",
                                     "spread", "zero_variance"])
    g = rows.groupby(by, sort=True)["reward"]
    out = pd.DataFrame({
        "n": g.size(),
        "reward_mean": g.mean(),
        "reward_std": g.std(ddof=0),
        "reward_min": g.min(),
        "reward_max": g.max(),
    })
    out["spread"] = out["reward_max"] - out["reward_min"]
    out["zero_variance"] = out["spread"].abs() < 1e-8
    return out.reset_index()


def round_robin(rows: pd.DataFrame, limit: int | None = None) -> pd.DataFrame:
    """Reorder rows so every (step, prompt) group gives its first sample before any gives its second
    (only the first ``limit`` rows of that order when given: the order is computed on positions, so a big
    selection is never copied whole)."""
    if rows.empty:
        return rows
    rank = rows.groupby(["step", "prompt_id"], sort=False).cumcount()
    order = np.lexsort((rows["sample_index"].to_numpy(), rows["prompt_id"].to_numpy().astype(str),
                        rows["step"].to_numpy(), rank.to_numpy()))
    if limit is not None:
        order = order[: max(int(limit), 0)]
    return rows.iloc[order]


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse a metrics JSONL file; skip a trailing partial line (the writer may be mid-append)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "step" in row:
                out.append(row)
    return out


def _advantage_mask(adv: np.ndarray, sign: str | int) -> np.ndarray:
    key = str(sign).strip().lower()
    if key in ("+", "pos", "positive", "1", "+1"):
        return adv > 1e-8
    if key in ("-", "neg", "negative", "-1"):
        return adv < -1e-8
    if key in ("0", "zero"):
        return np.abs(adv) <= 1e-8
    raise UserError(f"advantage_sign must be '+', '-' or '0', not {sign!r}")


__all__ = ["RolloutReader", "group_summary", "round_robin", "read_metrics", "parse_components",
           "PASS_THRESHOLD", "COMPONENT_PREFIX"]
