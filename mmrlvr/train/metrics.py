"""Per-step metrics: one JSON object per line in ``metrics.jsonl`` (always with ``step``) and TensorBoard.

Each line is written with a single ``write`` + flush + fsync, so a crash leaves at most one partial last
line; ``read_metrics`` skips it. On resume, lines after the checkpoint's step are dropped so the file reads
as if the run had never stopped.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null says "not a number this step"
    return v


class MetricsWriter:
    def __init__(self, run_dir: Path, tensorboard: bool = True, enabled: bool = True) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self._tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(run_dir) / "events"))
            except Exception:  # tensorboard missing: local files first, TB optional
                self._tb = None

    def truncate_after(self, step: int) -> None:
        """Drop lines with ``step`` > step (resume)."""
        if not self.enabled or not self.path.exists():
            return
        keep = [m for m in read_metrics(self.path) if m.get("step", -1) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(m) + "\n" for m in keep))
        os.replace(tmp, self.path)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete lines of a metrics file (a torn last line is skipped)."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
