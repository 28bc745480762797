"""The training loop on the real tiny Qwen2.5-VL: smoke, LoRA reference, kill + resume, two processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmrlvr.config import load_config
from mmrlvr.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def small_config(model: str, out: Path, **extra) -> dict:
    cfg = {
        "output_dir": str(out), "seed": 0, "max_steps": 2, "save_every": 0, "progress": False,
        "tensorboard": False,
        "model": {"path": model},
        "data": {"train": "synth:count", "eval": "synth:count", "train_size": 64, "eval_size": 8},
        "rollout": {"group_size": 4, "prompts_per_step": 4, "max_new_tokens": 12},
        "algo": {"kl_coef": 0.05, "micro_batch_size": 8},
        "optim": {"lr": 1e-3},
        "eval": {"at_start": False, "at_end": False},
        # an untrained model never earns format/accuracy; this plugin reward varies within groups
        "plugins": [str(ROOT / "tests" / "scripts" / "plugin_rewards.py")],
        "rewards": [{"name": "format", "weight": 0.2}, {"name": "auto_accuracy", "weight": 1.0},
                    {"name": "distinct_tokens", "weight": 1.0}],
    }
    for key, value in extra.items():
        node = cfg
        *parents, last = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return cfg


def trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}


def test_smoke_every_trainable_parameter_changes_and_files_are_written(tiny_dir, tmp_path):
    from mmrlvr.store.reader import RolloutReader
    from mmrlvr.train.trainer import Trainer

    trainer = Trainer(load_config(data=small_config(tiny_dir, tmp_path / "run")))
    before = trainable(trainer)
    summary = trainer.train()
    after = trainable(trainer)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, f"parameters that did not change: {unchanged[:5]}"
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(k in r for k in ("reward/mean", "accuracy", "kl", "loss", "grad_norm", "clip_fraction",
                                    "ratio/mean", "response_length/mean", "entropy/mean",
                                    "zero_std_group_fraction", "time/step_s", "time/generate_s"))
        # on-policy first pass: the trainer's log-probs reproduce the sampler's
        assert r["loss"] is not None and abs(r["ratio/mean"] - 1.0) < 1e-3 and abs(r["ratio/max"] - 1.0) < 1e-3
    reader = RolloutReader(tmp_path / "run")
    assert reader.steps() == [1, 2]
    recs = reader.read_step(1)
    assert len(recs) == 16 and recs[0].image_refs and (tmp_path / "run" / recs[0].image_refs[0]).is_file()
    assert (tmp_path / "run" / "checkpoints" / "step-00000002" / "state.json").is_file()
    assert summary["skipped_steps"] == 0


def test_lora_reference_is_the_adapter_disabled_model(tiny_dir, tmp_path):
    from mmrlvr.train.trainer import Trainer

    cfg = small_config(tiny_dir, tmp_path / "run", model__lora__enabled=True, max_steps=1)
    trainer = Trainer(load_config(data=cfg))
    assert trainer.ref_model is None  # no second copy in memory
    names = [n for n, p in trainer.policy.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert not any("visual" in n for n in names)
    trainer.train()


def _final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    """Weights of the newest checkpoint, read with safetensors alone (full model or peft adapter)."""
    from safetensors.torch import load_file

    from mmrlvr.train.checkpoint import list_checkpoints

    newest = list_checkpoints(run_dir)[-1]
    name = "adapter_model.safetensors" if (newest / "adapter_config.json").exists() else "model.safetensors"
    return load_file(newest / name)


def _write_cfg(path: Path, data: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data))
    return path


def test_kill_and_resume_matches_an_uninterrupted_run(tiny_dir, tmp_path):
    steps = 6
    base = dict(max_steps=steps, save_every=2, log_rollouts=False)
    straight = _write_cfg(tmp_path / "a.yaml", small_config(tiny_dir, tmp_path / "a", **base))
    killed = _write_cfg(tmp_path / "b.yaml", small_config(tiny_dir, tmp_path / "b", **base))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "mmrlvr.cli", "train"]
    subprocess.run(cli + [str(straight)], check=True, env=env, capture_output=True)
    proc = subprocess.Popen(cli + [str(killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = tmp_path / "b" / "checkpoints" / "step-00000002" / "state.json"
    deadline = time.time() + 300
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    done = sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("step-*"))
    assert done and done[-1] < f"step-{steps:08d}"
    subprocess.run(cli + [str(killed), "--resume"], check=True, env=env, capture_output=True)
    a, b = _final_params(tmp_path / "a"), _final_params(tmp_path / "b")
    assert a.keys() == b.keys()
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=1e-6, msg=n)
    steps_logged = [r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if "loss" in r]
    assert steps_logged == list(range(1, steps + 1))  # no duplicated or missing step after the resume


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_processes_match_one_process(tiny_dir, tmp_path, lora):
    """2 DDP processes over gloo (torchrun) train what 1 process trains; the run itself says it had 2."""
    from multiproc import assert_trains_like, final_params, run, topology, torchrun_cmd, train_cli

    # prefix sharing steps aside in several processes: the 1-process run takes the same whole-row passes
    cfg = dict(max_steps=2, log_rollouts=False, algo__micro_batch_size=4, model__lora__enabled=lora,
               model__lora__r=4, model__lora__alpha=8, model__prefix_sharing=False)
    one = _write_cfg(tmp_path / "one.yaml", small_config(tiny_dir, tmp_path / "one", **cfg))
    two = _write_cfg(tmp_path / "two.yaml", small_config(tiny_dir, tmp_path / "two", **cfg))
    res = run([sys.executable, *train_cli(one)])
    assert res.returncode == 0, res.stderr[-4000:]
    res = run(torchrun_cmd(*train_cli(two)))
    assert res.returncode == 0, res.stderr[-4000:]
    topo = topology(tmp_path / "two")
    assert topo["world_size"] == 2 and topo["prompts_per_rank"] == [2, 2], topo  # fails with 1 process
    assert "world size 2 (1 node(s) x 2 process(es)), strategy ddp" in res.stderr  # the log line
    assert topology(tmp_path / "one")["world_size"] == 1
    assert_trains_like(final_params(tmp_path / "one", tiny_dir), final_params(tmp_path / "two", tiny_dir))
    m1 = [r for r in read_metrics(tmp_path / "one" / "metrics.jsonl") if "loss" in r]
    m2 = [r for r in read_metrics(tmp_path / "two" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in m2] == [1, 2]  # one row per step, not one per process
    assert m1[-1]["reward/mean"] == pytest.approx(m2[-1]["reward/mean"], abs=1e-6)
