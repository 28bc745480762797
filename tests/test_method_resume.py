"""POPO and POISE resume exactly: their learned state (POPO's predictor, its optimizer and the EMA target; POISE's
online probe, its optimizer, feature statistics and replay buffer) travels in checkpoints as stage state.

For each method: 4 uninterrupted steps (``save_every=2``) against a run stopped after step 2 (``max_steps=2``) and
resumed to step 4 in the same folder. Steps 3-4 log exactly the same metrics, the final trainable weights are
bit-identical (``torch.equal``, as tests/test_checkpoint.py holds its resumes), and so is the stage's own state.
The checkpoints hold ``training_state/stage_state.pt`` with the stage's key. Negative control: the same resume
from a checkpoint whose stage state was removed logs different step-3/4 metrics, so the comparison can fail.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from mmrlvr.config import load_config
from mmrlvr.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
#: demo-tiny's warm-started tiny VLM and rewards (format + accuracy: it answers some prompts right), made small
FAST = ["eval.every=0", "eval.at_start=false", "eval.at_end=false", "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=16", "data.train_size=8", "progress=false", "tensorboard=false",
        "log_rollouts=false", "save_every=2", "keep_checkpoints=0"]

METHODS = {
    # POPO: positive = reward >= 1.0 (a right answer); kl 0 as docs/methods.md runs it
    "popo": (["algo.loss=popo", "algo.kl_coef=0", "rollout.group_size=4"], "update/popo", "popo/sim_loss"),
    # POISE needs at least two rollouts per prompt (the baseline comes from the *other* rollouts)
    "poise": (["algo.advantage=poise", "rollout.group_size=2"], "advantages/poise", "poise/probe_mse"),
}


def _cfg(out: Path, overrides: list[str], steps: int):
    return load_config(ROOT / "configs" / "demo-tiny.yaml", [f"output_dir={out}", *FAST, *overrides,
                                                             f"max_steps={steps}"])


def _train(out: Path, overrides: list[str], steps: int, resume: bool = False):
    from mmrlvr.train.trainer import Trainer

    trainer = Trainer(_cfg(out, overrides, steps), resume=resume)
    trainer.train()
    return trainer


def _steps(run: Path) -> dict[int, dict]:
    """Step metrics by step, without the wall-clock timings."""
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("time/")}
            for r in read_metrics(run / "metrics.jsonl") if "loss" in r}


def _trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}


def _assert_same(x, y, where: str = "state") -> None:
    """Nested dicts / lists / tensors / numbers equal exactly."""
    if isinstance(x, torch.Tensor):
        assert isinstance(y, torch.Tensor) and x.shape == y.shape and torch.equal(x, y), where
    elif isinstance(x, dict):
        assert isinstance(y, dict) and x.keys() == y.keys(), where
        for k in x:
            _assert_same(x[k], y[k], f"{where}.{k}")
    elif isinstance(x, (list, tuple)):
        assert isinstance(y, (list, tuple)) and len(x) == len(y), where
        for i, (a, b) in enumerate(zip(x, y)):
            _assert_same(a, b, f"{where}[{i}]")
    else:
        assert x == y, where


def _stage_state(ckpt: Path) -> dict:
    return torch.load(ckpt / "training_state" / "stage_state.pt", map_location="cpu", weights_only=False)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_resume_is_exact_and_needs_the_stage_state(method, tmp_path, capsys):
    from mmrlvr.train.checkpoint import write_manifest

    overrides, key, metric = METHODS[method]
    straight = _train(tmp_path / "a", overrides, 4)
    _train(tmp_path / "b", overrides, 2)  # stopped after step 2 (its last checkpoint: step 2)
    # the negative control starts from a copy of that run whose checkpoint lost the stage state
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    ckpt_c = tmp_path / "c" / "checkpoints" / "step-00000002"
    (ckpt_c / "training_state" / "stage_state.pt").unlink()
    write_manifest(ckpt_c, 2)  # re-signed: the checkpoint verifies, it simply has no stage state
    resumed = _train(tmp_path / "b", overrides, 4, resume=True)

    # the checkpoints carry the stage's state under its key, in the interrupted and the uninterrupted run
    for run in ("a", "b"):
        ckpt = tmp_path / run / "checkpoints" / "step-00000002"
        assert key in _stage_state(ckpt), (run, _stage_state(ckpt).keys())

    a, b = _steps(tmp_path / "a"), _steps(tmp_path / "b")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]  # no step lost or repeated by the resume
    assert all(math.isfinite(a[s]["loss"]) and metric in a[s] for s in a)
    for step in (3, 4):
        assert b[step] == a[step], step  # exactly: every metric of the resumed steps
    want, got = _trainable(straight), _trainable(resumed)
    assert want.keys() == got.keys()
    for n in want:
        assert torch.equal(got[n], want[n]), n
    # the method's own state ends equal too (predictor + optimizer + EMA target / probe + optimizer + buffer)
    _assert_same(resumed.pipeline.state_dict()[key], straight.pipeline.state_dict()[key], key)

    # negative control: without the stage state the resumed run starts the predictor / probe afresh and differs
    capsys.readouterr()
    _train(tmp_path / "c", overrides, 4, resume=True)
    assert f"has no state for the {key.split('/')[0]} stage {key.split('/')[1]!r}" in capsys.readouterr().out
    c = _steps(tmp_path / "c")
    assert c[1] == a[1] and c[2] == a[2]  # the same first two steps (copied)...
    assert c[3][metric] != a[3][metric] and c[3] != a[3] and c[4] != a[4]  # ...then another trajectory
