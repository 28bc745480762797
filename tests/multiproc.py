"""Helpers for tests that start real process groups (torchrun / accelerate) on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}


def torchrun_cmd(*args: str, nproc: int = 2, port: int | None = None, nnodes: int = 1,
                 node_rank: int | None = None) -> list[str]:
    """``torchrun`` (as ``python -m torch.distributed.run``) on 127.0.0.1, as docs/scaling.md writes it."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes > 1:
        cmd += ["--nnodes", str(nnodes), "--node_rank", str(node_rank)]
    cmd += ["--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(port or free_port())]
    return cmd + list(args)


def train_cli(config: Path | str, *extra: str) -> list[str]:
    return ["-m", "mmrlvr.cli", "train", str(config), *extra]


def run(cmd: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)


def final_params(run_dir: Path, model_dir: str) -> dict[str, torch.Tensor]:
    """Every parameter of the run's newest checkpoint applied to the base model (any checkpoint format)."""
    from mmrlvr.models import load_policy
    from mmrlvr.train.checkpoint import list_checkpoints, load_trainable_into

    model, _ = load_policy(model_dir, dtype="float32", device="cpu")
    model = load_trainable_into(model, list_checkpoints(run_dir)[-1])
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    """Every element of every parameter within ``atol``: runs that should be the same computation (a resume)."""
    assert a.keys() == b.keys() and a
    for n in a:
        torch.testing.assert_close(b[n], a[n], rtol=0, atol=atol, msg=n)


#: how far an element may end up when Adam stepped on a gradient that is rounding noise (the tests' lr is <= 1e-3)
ADAM_NOISE_STEP = 1e-3


def assert_trains_like(one: dict[str, torch.Tensor], many: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    """A run on several processes (``many``) trained like one process (``one``), up to float rounding.

    Several ranks sum a gradient in another order than one process, which moves it by rounding. For an element
    whose gradient is itself rounding noise (terms that cancel to ~1e-9), Adam divides by that noise's own size and
    steps up to the learning rate, so such an element can end further apart than ``atol`` (measured: 1 element of
    32,768 at 3.8e-5 after 2 steps at lr 1e-3 on one CPU; 0 on another). Allowed: at most one element in 10,000 of a
    tensor (at least one) beyond ``atol``, none beyond ``ADAM_NOISE_STEP``. A rank that trains its own copy, or
    gradients that are not averaged, move most elements apart: still caught."""
    assert one.keys() == many.keys() and one
    for n in one:
        diff = (many[n] - one[n]).abs()
        over = int((diff > atol).sum())
        allowed = max(1, diff.numel() // 10_000)
        assert over <= allowed and float(diff.max()) <= ADAM_NOISE_STEP, (
            f"{n}: {over} of {diff.numel()} elements differ by more than {atol} (at most {allowed} may), "
            f"the largest by {float(diff.max()):.3g}")


def topology(run_dir: Path) -> dict:
    """The run's own statement of its processes (``topology.json``, written by rank 0)."""
    return json.loads((Path(run_dir) / "topology.json").read_text())


#: a short demo-tiny run shared by the two-rank equality tests of single options (20 steps, 4 prompts x 4 rollouts)
TWO_RANK_RUN = ["configs/demo-tiny.yaml", "max_steps=20", "rollout.prompts_per_step=4", "rollout.group_size=4",
                "rollout.max_new_tokens=16", "data.train_size=16", "eval.at_start=false", "eval.at_end=false",
                "eval.every=0", "progress=false", "save_every=0", "log_rollouts=false", "tensorboard=false",
                "model.prefix_sharing=false"]


def assert_two_ranks_train_what_one_process_trains(out: Path, *overrides: str) -> Path:
    """``TWO_RANK_RUN`` + ``overrides`` in one process and under torchrun with 2 DDP ranks: both finish, the second
    states world size 2, and their final parameters agree within 1e-5. Returns the two-rank run folder."""
    from mmrlvr.train.model_path import resolve_model_path

    args = [*TWO_RANK_RUN, *overrides]
    one = run([sys.executable, "-m", "mmrlvr.cli", "train", *args, f"output_dir={out / 'one'}"], timeout=1200)
    assert one.returncode == 0, one.stderr[-3000:]
    two = run(torchrun_cmd("-m", "mmrlvr.cli", "train", *args, f"output_dir={out / 'two'}"), timeout=1200)
    assert two.returncode == 0, two.stderr[-3000:]
    assert topology(out / "two")["world_size"] == 2
    model = str(resolve_model_path("tiny:qwen2_5_vl:warm"))
    assert_trains_like(final_params(out / "one", model), final_params(out / "two", model))
    return out / "two"
