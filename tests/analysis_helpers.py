"""Shared by the ``mmrlvr analyze`` tests: the CLI in a subprocess, and the one-line exit-2 check of bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def cli(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m mmrlvr.cli ARGV`` from the repository root."""
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=timeout)


def one_line_exit_2(res: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit 2, no traceback, one line on stderr holding every fragment."""
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


#: a tiny demo-tiny run in seconds: 2 prompts x 4 rollouts, 16 tokens, no eval, every checkpoint kept
FAST_RUN = ["rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=16", "data.train_size=16",
            "eval.at_start=false", "eval.at_end=false", "eval.every=0", "progress=false", "keep_checkpoints=0"]


def train_tiny_run(run: Path, *overrides: str) -> Path:
    """Train ``configs/demo-tiny.yaml`` into ``run`` with ``FAST_RUN`` and ``overrides`` (steps, saves, ...)."""
    res = cli("train", "configs/demo-tiny.yaml", f"output_dir={run}", *FAST_RUN, *overrides)
    assert res.returncode == 0, res.stderr[-2000:]
    return run


def interrupted_copy(run: Path, dest: Path, step: int) -> Path:
    """``run``'s folder as a run killed after its step-``step`` checkpoint: a copy without the later checkpoints.

    Resuming it is resuming after a crash: the trainer loads the newest checkpoint left, drops the metrics logged
    after it and writes the later steps' rollout shards again. What a resume test needs without training the first
    ``step`` steps a second time (the straight run already did, identically: its step-``step`` checkpoint is the one
    a separate partial run would have written)."""
    import shutil

    shutil.copytree(run, dest)
    for ckpt in (dest / "checkpoints").glob("step-*"):
        if int(ckpt.name.split("-")[1]) > step:
            shutil.rmtree(ckpt)
    assert (dest / "checkpoints" / f"step-{step:08d}").is_dir(), f"{run} saved no checkpoint at step {step}"
    return dest


def assert_same_final_state(run_a: Path, run_b: Path) -> None:
    """Two runs of the same steps end in the same place: every parameter of their newest checkpoints (applied to
    the base model) and every stage's saved state (a sampler's table, ...)."""
    import torch

    from multiproc import assert_same_params, final_params
    from mmrlvr.train.checkpoint import list_checkpoints
    from mmrlvr.train.model_path import resolve_model_path

    model = str(resolve_model_path("tiny:qwen2_5_vl:warm"))
    assert_same_params(final_params(run_a, model), final_params(run_b, model), atol=0)
    a, b = (list_checkpoints(r)[-1] / "training_state" / "stage_state.pt" for r in (run_a, run_b))
    assert a.exists() == b.exists()
    if a.exists():
        assert torch.load(a, weights_only=False) == torch.load(b, weights_only=False)
