"""The credit-overhead benchmark's train step runs for every arm on the tiny setting (keeps it from
rotting; the timing itself is run by hand: ``python benchmarks/credit_overhead.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "credit_overhead.py"


def test_train_step_runs_for_each_arm():
    spec = importlib.util.spec_from_file_location("credit_overhead", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    b = mod.build("tiny")
    assert b["inputs"]["input_ids"].shape == (32, b["P"] + 32)
    out = {arm: mod.train_step(b, arm, step=0, chunk_size=64) for arm in mod.ARMS}
    for arm, o in out.items():
        assert torch.isfinite(torch.tensor(o["loss"])) and o["grad_norm"] > 0, arm
    assert out["none"]["weighted_fraction"] == 1.0
    # VEPO keeps ceil(20%) and VPPO ceil(40%) of each response's tokens
    assert 0.2 <= out["vepo"]["weighted_fraction"] < 0.3
    assert 0.4 <= out["vppo"]["weighted_fraction"] < 0.5
