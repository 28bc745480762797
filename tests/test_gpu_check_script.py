"""benchmarks/gpu_check.sh on a machine without CUDA: it says so and exits 2 (nothing is claimed as checked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_without_cuda_says_so_and_exits_2(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, "GPU_CHECK_OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "tests"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA device visible to torch; nothing checked" in proc.stderr
    assert "===" not in proc.stdout  # no part ran
