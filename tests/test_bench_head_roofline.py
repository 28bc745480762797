"""benchmarks/head_roofline.py runs and its floor arithmetic follows from the two figures it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_small_shapes_print_the_floors_from_the_measured_figures():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/head_roofline.py"), "--vocab", "1000", "--hidden",
                          "32", "--rows", "2", "--chunk", "16", "--new-tokens", "4", "8"],
                         capture_output=True, text=True, check=True).stdout
    decode_ms = float(re.search(r"decode: .* ([0-9.]+) ms/token", out).group(1))
    product_s = float(re.search(r"teacher-forced: .* ([0-9.]+) s \(", out).group(1))
    lines = [ln for ln in out.splitlines() if "new tokens:" in ln]
    assert [ln.split()[0] for ln in lines] == ["4", "8"]
    for n, line in zip((4, 8), lines):
        gen = float(re.search(r"generation >= ([0-9.]+) s", line).group(1))
        one = float(re.search(r"positions ([0-9.]+) s", line).group(1))
        assert abs(gen - decode_ms / 1e3 * n) <= 0.05 + 1e-9
        assert abs(one - product_s * 2 * n / 16) <= 0.05 + 1e-3
