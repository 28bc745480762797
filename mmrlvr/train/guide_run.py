"""NPO's automatic guide: the same run, trained Δ steps ahead in a second process.

``rollout.guide: {from: auto, delta: Δ}``. The main process of the run starts ``mmrlvr train`` on the run's own
resolved ``config.yaml`` with guides off, into ``RUN_DIR/guide_run/``, saving a checkpoint every step; at step t
the guided run loads that run's checkpoint t + Δ (waiting for it when the guide run is behind) as its guide. The
guide run is this run's configuration without guides [ours: the paper's near-future policy is the same training,
further on; the guided run itself cannot be ahead of itself], one process, resumed with the run (``--resume``).

Cost: a second training of the whole run (its own model, optimizer and generation: about the run's compute again,
on the same devices unless ``CUDA_VISIBLE_DEVICES`` is set for it), and one checkpoint per step on disk for the
guide run (all kept: the guided run may lag by more than Δ). Its log is ``RUN_DIR/guide_run.log``.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError

#: launcher variables the guide run must not inherit: it is one process of its own
DIST_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "ACCELERATE_USE_FSDP", "FSDP_VERSION")


class GuideRun:
    """The guide run's process (started by the main process only) and where its checkpoints appear."""

    def __init__(self, run_dir: Path, delta: int, max_steps: int, *, start: bool, timeout_s: float = 3600.0) -> None:
        self.dir = Path(run_dir) / "guide_run"
        self.delta, self.max_steps, self.timeout_s = int(delta), int(max_steps), float(timeout_s)
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(run_dir) / "guide_run.log"  # beside the guide run's folder (an mmrlvr run of its own)
        if start:
            self.start(Path(run_dir) / "config.yaml")

    def start(self, config: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
        cmd = [sys.executable, "-m", "mmrlvr.cli", "train", str(config), f"output_dir={self.dir}", "rollout.guide={}",
               "save_every=1", "keep_checkpoints=0", "log_rollouts=false", "eval.at_start=false", "eval.at_end=false",
               "eval.every=0", "progress=false", "tensorboard=false", "--resume"]
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def checkpoint(self, step: int) -> Path:
        """The guide for the policy after ``step`` updates: the guide run's checkpoint step + Δ (at most
        max_steps), waiting until its save is complete (its manifest is written last)."""
        target = min(step + self.delta, self.max_steps)
        folder = self.dir / "checkpoints" / f"step-{target:08d}"
        t0 = time.monotonic()
        while not (folder / "manifest.json").is_file():
            if self.proc is not None and self.proc.poll() not in (None, 0):
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise UserError(f"rollout.guide (auto): the guide run stopped (exit {self.proc.returncode}) before "
                                f"step {target}; its log {self.log_path} ends:\n{tail}")
            if time.monotonic() - t0 > self.timeout_s:
                raise UserError(f"rollout.guide (auto): waited {self.timeout_s:.0f} s for the guide run's checkpoint "
                                f"{folder}; see {self.log_path}")
            time.sleep(0.2)
        return folder


def load_guide_weights(model: Any, folder: Path) -> None:
    """Put a guide-run checkpoint's weights into the loaded guide model (no new model per step)."""
    from mmrlvr.train.checkpoint import load_trainable_into

    load_trainable_into(model, folder)
