"""Several processes that never hang: a rank that raises stops every rank with its message; a loss that is not
finite on one rank skips the step on every rank (2 gloo ranks under torchrun, each asserting it ran as 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from multiproc import env, torchrun_cmd, train_cli

pytestmark = pytest.mark.matrix  # multi-process runs: beside the matrix, after the suite (.ci/run)
ROOT = Path(__file__).resolve().parents[1]
FAULTS = str(ROOT / "tests" / "scripts" / "plugin_rank_faults.py")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def _cfg(tiny_dir: str, out: Path, **extra) -> Path:
    import yaml

    from test_train_loop import small_config

    cfg = small_config(tiny_dir, out, max_steps=3, log_rollouts=False, **extra)
    cfg["plugins"] = [*cfg["plugins"], FAULTS]
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_rank_that_raises_stops_both_ranks_within_60_s_with_its_message(tiny_dir, tmp_path, strategy):
    stamp = tmp_path / "raised_at"
    cfg = _cfg(tiny_dir, tmp_path / "run", distributed__strategy=strategy)
    fault = {"FAULT_RANK": "1", "FAULT_STEP": "1", "FAULT_KIND": "raise", "FAULT_STAMP": str(stamp)}
    p = subprocess.run(torchrun_cmd(*train_cli(cfg)), env={**env(), **fault}, capture_output=True, text=True,
                       timeout=600)
    ended = time.time()
    assert stamp.exists(), p.stderr[-3000:]  # the premise: rank 1 raised during the run
    assert p.returncode != 0
    assert ended - float(stamp.read_text()) < 60, "the other rank must not wait for a collective that never comes"
    assert "rank 1 of 2 failed: RuntimeError: planted failure on rank 1 at step 2" in p.stderr, p.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "topology.json").read_text())["world_size"] == 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1]  # step 1 was written and kept


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(tiny_dir, tmp_path):
    cfg = _cfg(tiny_dir, tmp_path / "run")
    fault = {"FAULT_RANK": "1", "FAULT_STEP": "1", "FAULT_KIND": "nan"}
    p = subprocess.run(torchrun_cmd(*train_cli(cfg)), env={**env(), **fault}, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "topology.json").read_text())["world_size"] == 2
    rows = {r["step"]: r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())}
    assert rows[2]["skipped"] == 1.0 and "loss" not in rows[2]  # skipped by both ranks (no hang, no divergence)
    assert rows[1]["skipped"] == 0.0 and rows[3]["skipped"] == 0.0
    assert '"skipped_steps": 1' in p.stdout
