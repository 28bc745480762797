"""Per-step metrics: one JSON object per line in ``metrics.jsonl`` (always with ``step``), plus trackers.

Each line is written with a single ``write`` + flush + fsync, so a crash leaves at most one partial last
line; ``read_metrics`` skips it. On resume, lines after the checkpoint's step are dropped so the file reads
as if the run had never stopped.

Trackers (``report_to: [tensorboard, wandb, trackio, mlflow]``) go through accelerate's tracker classes
(``accelerate.tracking``): the hyperparameters (the run's config, flattened to ``section/key``, secrets
already redacted in ``config.yaml``) are logged once at the start, then every ``log`` sends the same
numbers under the same names as ``metrics.jsonl`` (MLflow alone rejects ``@`` in a name: ``avg@8`` is
``avg_at_8`` there). Where they write: TensorBoard ``RUN/events/``; wandb ``RUN/wandb/`` (``WANDB_MODE=offline``
for no network); trackio its local store (``TRACKIO_DIR``); MLflow ``MLFLOW_TRACKING_URI``, by default
the file store ``RUN/mlruns``. Project name: ``MMRLVR_PROJECT`` or ``mmrlvr``; run name: the run folder's.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError

TRACKERS: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null says "not a number this step"
    return v


def check_report_to(names: list[str] | tuple[str, ...] | None) -> list[str]:
    """The tracker names, validated: known, and their package importable (``UserError`` naming the extra)."""
    import importlib.util

    out = []
    for name in names or []:
        if name not in TRACKERS:
            raise UserError(f"report_to: unknown tracker {name!r}; known: {', '.join(TRACKERS)}")
        if importlib.util.find_spec(TRACKERS[name]) is None and not (
                name == "tensorboard" and importlib.util.find_spec("tensorboardX")):
            raise UserError(f"report_to: {name} is not installed (pip install 'mmrlvr[{name}]')")
        if name not in out:
            out.append(name)
    return out


def flatten_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-3}}`` -> ``{"optim/lr": 0.001}``; lists and None as strings (trackers take scalars).

    >>> flatten_hparams({"seed": 0, "optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "x": None})
    {'seed': 0, 'optim/lr': 0.1, 'optim/betas': '[0.9, 0.99]', 'x': 'None'}
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_hparams(value, name + "/"))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value, default=str) if isinstance(value, (list, tuple)) else str(value)
    return out


def mlflow_name(name: str) -> str:
    """MLflow's allowed metric-name characters: ``@`` -> ``_at_``, anything else outside [\\w\\-. /] -> ``_``.

    >>> mlflow_name("eval/avg@8"), mlflow_name("judge/unknown_rate")
    ('eval/avg_at_8', 'judge/unknown_rate')
    """
    return re.sub(r"[^\w\-. /]", "_", name.replace("@", "_at_"))


def _make_tracker(name: str, run_dir: Path, project: str):
    from accelerate import tracking

    run_name = run_dir.name
    if name == "tensorboard":
        return tracking.TensorBoardTracker("events", str(run_dir))
    if name == "wandb":
        return tracking.WandBTracker(project, name=run_name, dir=str(run_dir))
    if name == "trackio":
        return tracking.TrackioTracker(project, name=run_name)
    if name == "mlflow":
        import mlflow

        if not os.environ.get("MLFLOW_TRACKING_URI"):  # a local store in the run folder, no server needed
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 keeps it in maintenance mode
            mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        return tracking.MLflowTracker(project, logging_dir=str(run_dir / "mlruns"), run_name=run_name)
    raise UserError(f"report_to: unknown tracker {name!r}; known: {', '.join(TRACKERS)}")


class MetricsWriter:
    """``metrics.jsonl`` plus the trackers in ``report_to``.

    ``report_to`` / ``hparams``: when not given, read from the run's ``config.yaml`` at the first ``log``
    (the trainer writes it before the first step), so a config's ``report_to`` works without more wiring.
    ``tensorboard=True`` adds TensorBoard (the config's ``tensorboard`` switch).
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True, enabled: bool = True, *,
                 report_to: list[str] | None = None, hparams: dict[str, Any] | None = None,
                 project: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.enabled = enabled
        self._tensorboard = tensorboard
        self._report_to = report_to
        self._hparams = hparams
        self.project = project or os.environ.get("MMRLVR_PROJECT", "mmrlvr")
        self.trackers: dict[str, Any] = {}
        self._started = False
        if enabled and report_to is not None:
            self._start()

    # ------------------------------------------------------------------------------------- trackers
    def _config_file(self) -> dict[str, Any]:
        path = self.run_dir / "config.yaml"
        if not path.is_file():
            return {}
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            return {}
        return data if isinstance(data, dict) else {}

    def _start(self) -> None:
        self._started = True
        names = list(self._report_to or [])
        config: dict[str, Any] | None = None
        if self._report_to is None:
            config = self._config_file()
            names = list(config.get("report_to") or [])
        if self._tensorboard and "tensorboard" not in names:
            names.insert(0, "tensorboard")
        try:
            names = check_report_to(names)
        except UserError:
            if names == ["tensorboard"] and self._report_to is None:  # the default switch, package missing
                return
            raise
        if not names:
            return
        hparams = self._hparams
        if hparams is None:
            hparams = config if config is not None else self._config_file()
        flat = flatten_hparams(hparams or {})
        from accelerate import PartialState

        PartialState()  # accelerate's trackers log through its state (the trainer's Accelerator made it already)
        for name in names:
            tracker = _make_tracker(name, self.run_dir, self.project)
            tracker.start()
            if flat:
                tracker.store_init_configuration(flat)
            self.trackers[name] = tracker

    def _track(self, step: int, row: dict[str, Any]) -> None:
        values = {k: v for k, v in row.items()
                  if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if not values:
            return
        for name, tracker in self.trackers.items():
            if name == "mlflow":
                tracker.log({mlflow_name(k): v for k, v in values.items()}, step=step)
            else:
                tracker.log(values, step=step)
            if name == "tensorboard":
                tracker.writer.flush()

    # -------------------------------------------------------------------------------------- public
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
        if not self._started:
            self._start()
        self._track(step, row)

    def close(self) -> None:
        for tracker in self.trackers.values():
            try:
                tracker.finish()
            except Exception:  # noqa: BLE001 - a tracker failing to close must not hide the run's result
                pass
        self.trackers = {}


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
