"""The command line as a user meets it: help for every command, one-paragraph errors, eval to JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mmrlvr.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", *args], capture_output=True, text=True, env=ENV,
                          check=check, timeout=600)


def test_top_level_help_lists_every_command():
    out = run("--help", check=True).stdout
    for name in COMMANDS:
        assert f"  {name}" in out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name):
    res = run(name, "--help")
    assert res.returncode == 0, res.stderr
    assert "usage" in res.stdout.lower()


@pytest.mark.parametrize("args, message", [
    (["train", "nope.yaml"], "nope.yaml: config file not found"),
    (["nonsense"], "unknown command 'nonsense'"),
    (["eval", "--model", "/no/such/model", "--data", "synth:count"], "no such folder"),
    (["data", "synth", "--task", "juggling", "--split", "train", "--n", "2", "--out", "x"], "juggling"),
])
def test_bad_input_gives_one_paragraph_and_exit_2(args, message):
    res = run(*args)
    assert res.returncode == 2
    assert message in res.stderr
    assert "Traceback" not in res.stderr


def test_train_dry_run_prints_the_resolved_config(tmp_path):
    res = run("train", str(ROOT / "configs" / "demo-tiny.yaml"), "algo.preset=dapo", "seed=7", "--dry-run",
              check=True)
    cfg = yaml.safe_load(res.stdout)
    assert cfg["seed"] == 7 and cfg["algo"]["eps_high"] == pytest.approx(0.28)


def test_bad_override_names_the_key():
    res = run("train", str(ROOT / "configs" / "demo-tiny.yaml"), "optim.lr=fast", "--dry-run")
    assert res.returncode == 2 and "optim.lr: expected a number" in res.stderr


def test_eval_writes_json_and_applies_a_lora_checkpoint(tmp_path):
    from mmrlvr.models.tiny import build_tiny

    model = build_tiny("qwen2_5_vl", tmp_path / "m")
    cfg = {
        "output_dir": str(tmp_path / "run"), "max_steps": 1, "progress": False, "tensorboard": False,
        "log_rollouts": False, "model": {"path": str(model), "lora": {"enabled": True}},
        "data": {"train": "synth:count", "train_size": 8},
        "rollout": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 8},
        "eval": {"at_start": False, "at_end": False},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    run("train", str(tmp_path / "c.yaml"), check=True)
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000001"
    out = tmp_path / "eval.json"
    res = run("eval", "--model", str(model), "--adapter", str(ckpt), "--data", "synth:count", "--k", "2",
              "--limit", "4", "--max-new-tokens", "8", "--out", str(out), check=True)
    result = json.loads(out.read_text())
    assert result["n"] == 4 and 0.0 <= result["avg@2"] <= 1.0 and "pass@2" in result
    assert json.loads(res.stdout) == result
