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


def run(*args: str, check: bool = False, cwd: Path | None = None, py: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *py, "-m", "mmrlvr.cli", *args], capture_output=True, text=True, env=ENV,
                          check=check, timeout=600, cwd=cwd)


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
              check=True, cwd=tmp_path)  # output_dir runs/demo-tiny: under tmp_path, never an existing run
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


def test_doc_dry_run_reports_every_problem(tmp_path):
    """docs/training.md's example: three mistakes, three lines, exit 2, nothing created."""
    cfg = ROOT / "configs" / "demo-tiny.yaml"
    res = run("train", str(cfg), "algo.loss=ppo", "credit.scheme=vep", "rollout.top_p=2", "--dry-run", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.splitlines() == [
        "mmrlvr train: error: 3 problems found before loading the model:",
        f"  {cfg}: rollout.top_p: must be in (0, 1], got 2.0",
        f"  {cfg}: algo.loss: unknown policy loss 'ppo'; allowed: cispo, clip_cov, gspo, kl_cov, nsr, popo, ppo_clip (did you mean 'ppo_clip'?)",
        f"  {cfg}: credit.scheme: unknown credit scheme 'vep'; allowed: delta, entropy_topk, none, papo, rsi, vepo, vppo "
        "(did you mean 'vepo'?)",
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("order", [
    ["CFG", "--dry-run", "--resume", "seed=7", "max_steps=500"],
    ["CFG", "seed=7", "--resume", "max_steps=500", "--dry-run"],
    ["--resume", "seed=7", "CFG", "max_steps=500", "--dry-run"],
    ["seed=7", "max_steps=500", "CFG", "--dry-run", "--resume"],
])
def test_flags_and_overrides_in_any_order(tmp_path, order):
    cfg = str(ROOT / "configs" / "demo-tiny.yaml")
    res = run("train", *[cfg if a == "CFG" else a for a in order], check=True, cwd=tmp_path)
    out = yaml.safe_load(res.stdout)
    assert out["seed"] == 7 and out["max_steps"] == 500


def test_flag_abbreviations_are_refused(tmp_path):
    """`--resum` must not silently mean --resume (or start a run at all)."""
    res = run("train", str(ROOT / "configs" / "demo-tiny.yaml"), "--resum", cwd=tmp_path)
    assert res.returncode == 2 and "unrecognized arguments: --resum" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_output_piped_into_head_ends_quietly():
    """`mmrlvr train --help-config | head -1`: the reader leaves early; no BrokenPipe traceback."""
    import fcntl

    proc = subprocess.Popen([sys.executable, "-m", "mmrlvr.cli", "train", "--help-config"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    fcntl.fcntl(proc.stdout.fileno(), 1031, 4096)  # F_SETPIPE_SZ: a one-page pipe, so the writer blocks early
    assert proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_no_future_warnings_from_our_calls(tmp_path):
    """Dry runs and a one-step LoRA run with FutureWarnings as errors (none of ours reach the user)."""
    cfg = str(ROOT / "configs" / "demo-tiny.yaml")
    py = ("-W", "error::FutureWarning")
    run("train", cfg, "--dry-run", "algo.preset=dapo", check=True, cwd=tmp_path, py=py)
    res = run("train", cfg, "model.path=tiny:qwen2_5_vl", "model.lora.enabled=true", "max_steps=1", "save_every=0",
              "data.train_size=4", "rollout.group_size=2", "rollout.prompts_per_step=2", "rollout.max_new_tokens=4",
              "data.eval_size=2", "eval.k=2", "progress=false", "output_dir=run", cwd=tmp_path, py=py)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "FutureWarning" not in res.stderr
