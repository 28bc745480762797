"""``RolloutWriter``: one Parquet shard per training step, written in the background, atomically.

The trainer calls ``write_step(step, records)`` and carries on; a background thread turns the records
into an Arrow table with ``ROLLOUT_SCHEMA`` and writes ``rollouts/step-{step:08d}.parquet`` through a temp
file + ``os.replace``. So:

* a reader (the inspector, possibly running while the run trains) sees only complete shards;
* a crash loses at most the steps still queued (the queue holds at most ``max_pending`` steps, and
  ``write_step`` blocks when it is full, so a slow disk slows the trainer instead of eating memory);
* an error in the background thread (disk full, a value Arrow cannot store) is re-raised by the next
  ``write_step`` / ``flush`` / ``close``, never silently lost.

Records are converted to plain rows (``RolloutRecord.to_row``, which copies every list) in the caller's
thread, so the trainer may reuse or mutate its objects right after ``write_step`` returns.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Sequence

import pyarrow.parquet as pq

from mmrlvr.store.atomic import atomic_path
from mmrlvr.store.record import RolloutRecord, rows_to_table

ROLLOUTS_DIR = "rollouts"


def step_filename(step: int) -> str:
    """``step-00000012.parquet``: zero-padded so a plain sort is step order."""
    return f"step-{int(step):08d}.parquet"


class RolloutWriterError(RuntimeError):
    """The background writer failed; ``__cause__`` is the original error."""


class RolloutWriter:
    """Write per-step rollout shards of run ``run_id`` under ``run_dir/rollouts/``.

    >>> with RolloutWriter("runs/demo", run_id="demo") as writer:   # doctest: +SKIP
    ...     writer.write_step(0, records)
    """

    def __init__(self, run_dir: str | os.PathLike[str], run_id: str, *, max_pending: int = 2,
                 background: bool = True, compression: str = "zstd") -> None:
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.rollouts_dir = self.run_dir / ROLLOUTS_DIR
        self.rollouts_dir.mkdir(parents=True, exist_ok=True)
        self.compression = compression
        self._error: BaseException | None = None
        self._error_step: int | None = None
        self._closed = False
        self._background = background
        self._queue: queue.Queue[tuple[int, list[dict[str, Any]]] | None] = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name=f"RolloutWriter[{run_id}]", daemon=True)
            self._thread.start()

    # -- public API -------------------------------------------------------------------------------------
    def write_step(self, step: int, records: Sequence[RolloutRecord]) -> None:
        """Queue the records of ``step`` for writing (blocks while ``max_pending`` steps are queued)."""
        self._check_open()
        self._raise_pending_error()
        rows = []
        for rec in records:
            if rec.run_id != self.run_id:
                raise ValueError(f"record run_id {rec.run_id!r} != writer run_id {self.run_id!r} "
                                 f"(step {step}, prompt {rec.prompt_id!r}, sample {rec.sample_index})")
            if rec.step != step:
                raise ValueError(f"record step {rec.step} written as step {step} "
                                 f"(prompt {rec.prompt_id!r}, sample {rec.sample_index})")
            rows.append(rec.to_row())
        if self._background:
            self._queue.put((int(step), rows))
        else:
            self._write(int(step), rows)

    def flush(self) -> None:
        """Wait until every queued step is on disk; re-raise a background error."""
        if self._background and self._thread is not None and self._thread.is_alive():
            self._queue.join()
        self._raise_pending_error()

    def close(self) -> None:
        """Flush, stop the background thread; re-raise a background error. Safe to call twice."""
        if self._closed:
            self._raise_pending_error()
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        self._raise_pending_error()

    def path_for(self, step: int) -> Path:
        return self.rollouts_dir / step_filename(step)

    def __enter__(self) -> "RolloutWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
        else:  # don't hide the caller's exception behind a writer error; still write what was queued
            try:
                self.close()
            except RolloutWriterError:
                pass

    # -- internals --------------------------------------------------------------------------------------
    def _write(self, step: int, rows: list[dict[str, Any]]) -> None:
        table = rows_to_table(rows)
        with atomic_path(self.path_for(step)) as tmp:
            pq.write_table(table, tmp, compression=self.compression)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                step, rows = item
                try:
                    self._write(step, rows)
                except BaseException as exc:  # noqa: BLE001 - surfaced to the caller on its next call
                    if self._error is None:
                        self._error, self._error_step = exc, step
            finally:
                self._queue.task_done()

    def _raise_pending_error(self) -> None:
        if self._error is not None:
            exc, step = self._error, self._error_step
            self._error = None
            raise RolloutWriterError(
                f"writing rollouts of step {step} to {self.path_for(step or 0)} failed: "
                f"{type(exc).__name__}: {exc}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise RolloutWriterError("write_step after close()")
