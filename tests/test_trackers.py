"""Trackers through accelerate (TensorBoard, wandb offline, trackio local, MLflow file store): hparams logged
once and the very numbers and names of metrics.jsonl. Each tracker's test skips when its package is absent."""

from __future__ import annotations

import glob
import json
import math
import sqlite3
import struct
from pathlib import Path

import pytest

from mmrlvr.errors import UserError
from mmrlvr.train.metrics import MetricsWriter, check_report_to, flatten_hparams, mlflow_name, read_metrics

ROWS = [
    (1, {"loss": 0.5, "reward/mean": 0.25, "eval/avg@8": 0.125, "skipped": 0.0, "nan_metric": float("nan")}),
    (2, {"loss": 0.375, "reward/mean": 0.5, "judge/unknown_rate": 1.0}),
    (3, {"loss": -0.0625, "reward/mean": 0.75, "eval/avg@8": 0.5}),
]
HPARAMS = {"seed": 3, "optim": {"lr": 0.001, "betas": [0.9, 0.99]}, "model": {"path": "tiny:qwen2_5_vl"}}


def expected_series() -> dict[str, list[tuple[int, float]]]:
    """Per metric name, its (step, value) pairs as metrics.jsonl has them (NaN is null there, so not sent)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for step, row in ROWS:
        for k, v in row.items():
            if isinstance(v, float) and math.isfinite(v):
                out.setdefault(k, []).append((step, v))
    return out


def write(run: Path, tracker: str, **kw) -> MetricsWriter:
    w = MetricsWriter(run, tensorboard=False, report_to=[tracker], hparams=HPARAMS, **kw)
    for step, row in ROWS:
        w.log(step, row)
    w.close()
    series = {}
    for row in read_metrics(run / "metrics.jsonl"):
        for k, v in row.items():
            if k != "step" and v is not None:
                series.setdefault(k, []).append((row["step"], v))
    assert series == expected_series()  # metrics.jsonl itself unchanged by the trackers
    return w


def test_helpers():
    assert flatten_hparams(HPARAMS) == {"seed": 3, "optim/lr": 0.001, "optim/betas": "[0.9, 0.99]",
                                        "model/path": "tiny:qwen2_5_vl"}
    assert mlflow_name("eval/avg@8") == "eval/avg_at_8"
    with pytest.raises(UserError, match="known: tensorboard, wandb, trackio, mlflow"):
        check_report_to(["wandbb"])
    assert check_report_to(["tensorboard", "tensorboard"]) == ["tensorboard"]


def test_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write(tmp_path, "tensorboard")
    acc = EventAccumulator(str(tmp_path / "events"))
    acc.Reload()
    got = {tag: [(e.step, pytest.approx(e.value)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert got == expected_series()
    hparams = [Path(p) for p in glob.glob(str(tmp_path / "events" / "*" / "hparams.yml"))]
    assert len(hparams) == 1 and "optim/lr: 0.001" in hparams[0].read_text()


def _wandb_records(path: Path):
    """Records of a wandb offline ``.wandb`` file (LevelDB-log framing: 7-byte header, 32 KiB blocks)."""
    data = path.read_bytes()
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            yield buf


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2 as pb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write(tmp_path, "wandb")
    files = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    import time

    def kinds_now() -> list:
        out = []
        for data in _wandb_records(Path(files[0])):
            record = pb.Record()
            record.ParseFromString(data)
            out.append(record.WhichOneof("record_type"))
        return out

    deadline = time.time() + 60  # wandb's service process may still be flushing the offline file
    while "exit" not in kinds_now() and time.time() < deadline:
        time.sleep(0.5)
    got: dict[str, list] = {}
    config: dict[str, object] = {}
    kinds = []
    for data in _wandb_records(Path(files[0])):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        kinds.append(kind)
        if kind == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            for k, v in items.items():
                if not k.startswith("_"):
                    got.setdefault(k, []).append((items["_step"], v))
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    assert got == expected_series(), kinds
    assert config["optim/lr"] == 0.001 and config["seed"] == 3


def test_trackio_local(tmp_path):
    """In a fresh process: trackio fixes its local folder (TRACKIO_DIR) when it is imported."""
    import os
    import subprocess
    import sys

    pytest.importorskip("trackio")
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
              f"from test_trackers import write; from pathlib import Path; "
              f"write(Path({str(tmp_path / 'run')!r}), 'trackio', project='mmrlvr-test')")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    dbs = glob.glob(str(tmp_path / "trackio" / "*.db"))
    assert len(dbs) == 1
    con = sqlite3.connect(dbs[0])
    got: dict[str, list] = {}
    for step, blob in con.execute("select step, metrics from metrics order by step"):
        for k, v in json.loads(blob).items():
            got.setdefault(k, []).append((step, v))
    assert got == expected_series()
    (blob,) = con.execute("select config from configs").fetchone()
    config = json.loads(blob)
    assert config["optim/lr"] == 0.001 and config["seed"] == 3


def test_mlflow_file_store(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    write(tmp_path, "mlflow")
    from mlflow.tracking import MlflowClient

    client = MlflowClient((tmp_path / "mlruns").resolve().as_uri())
    (experiment,) = [e for e in client.search_experiments() if e.name == "mmrlvr"]
    (run,) = client.search_runs([experiment.experiment_id])
    want = expected_series()
    for name, series in want.items():
        history = client.get_metric_history(run.info.run_id, mlflow_name(name))
        assert sorted((m.step, m.value) for m in history) == series, name
    assert run.data.params["optim/lr"] == "0.001"
    mlflow.set_tracking_uri(None)


def test_report_to_is_read_from_the_run_config(tmp_path):
    """The trainer's MetricsWriter(run_dir, tensorboard=..., enabled=...) picks report_to from config.yaml."""
    pytest.importorskip("tensorboard")
    import yaml

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"seed": 5, "report_to": ["tensorboard"],
                                                          "optim": {"lr": 0.5}}))
    w = MetricsWriter(tmp_path, tensorboard=False)
    w.log(1, {"loss": 1.0})
    assert list(w.trackers) == ["tensorboard"]
    w.close()
    (hp,) = glob.glob(str(tmp_path / "events" / "*" / "hparams.yml"))
    assert "optim/lr: 0.5" in Path(hp).read_text()


def test_unknown_tracker_in_config_is_a_user_error(tmp_path):
    import yaml

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"report_to": ["neptune"]}))
    with pytest.raises(UserError, match="neptune"):
        MetricsWriter(tmp_path, tensorboard=False).log(1, {"loss": 1.0})


def test_a_training_run_logs_to_wandb_what_metrics_jsonl_has(tmp_path, monkeypatch):
    """End to end: `report_to: [wandb]` in a run config (no trainer wiring beyond MetricsWriter)."""
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2 as pb

    from mmrlvr.config import load_config
    from mmrlvr.models.tiny import build_tiny
    from mmrlvr.train.trainer import Trainer

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    model = build_tiny("qwen2_5_vl", tmp_path / "m")
    run = tmp_path / "run"
    cfg = {"output_dir": str(run), "max_steps": 2, "save_every": 0, "progress": False, "tensorboard": False,
           "log_rollouts": False, "report_to": ["wandb"], "model": {"path": str(model)},
           "data": {"train": "synth:count", "eval": "synth:count", "train_size": 8, "eval_size": 2},
           "rollout": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4},
           "eval": {"at_start": True, "at_end": False, "k": 1}}
    Trainer(load_config(data=cfg)).train()
    want: dict[str, list] = {}
    for row in read_metrics(run / "metrics.jsonl"):
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                want.setdefault(k, []).append((row["step"], v))
    assert "loss" in want and "eval/greedy_accuracy" in want
    (path,) = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
    import time

    deadline = time.time() + 60
    while True:
        got: dict[str, list] = {}
        config: dict[str, object] = {}
        done = False
        for data in _wandb_records(Path(path)):
            record = pb.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            done |= kind == "exit"
            if kind == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                for k, v in items.items():
                    if not k.startswith("_"):
                        got.setdefault(k, []).append((items["_step"], v))
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        if done or time.time() > deadline:
            break
        time.sleep(0.5)
    assert got.keys() == want.keys()
    for k in want:
        assert [(s, pytest.approx(v)) for s, v in want[k]] == got[k], k
    assert config["rollout/group_size"] == 2 and config["report_to"] == '["wandb"]'
