"""benchmarks/fused_head_memory.py runs at small shapes and prints its figures (Linux: it reads /proc)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_small_shapes_print_the_transient():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/fused_head_memory.py"), "--vocab", "3000",
                          "--hidden", "64", "--rows", "2", "--positions", "40", "--chunk", "16"],
                         capture_output=True, text=True, check=True).stdout
    assert "chunk asked 16, used 16" in out
    backward = int(re.search(r"backward: peak \+(-?\d+) MiB", out).group(1))
    transient = float(re.search(r"transient above the head's gradient: (-?[0-9.]+) MiB", out).group(1))
    assert abs(backward - 3000 * 64 * 4 / 2 ** 20 - transient) <= 1
