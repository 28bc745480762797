"""The credit-overhead benchmark's timed trainer steps run for every arm (keeps it from rotting; the timing
itself is run by hand: ``python benchmarks/credit_overhead.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_module import load_script

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "credit_overhead.py"


def test_every_arm_runs_the_same_rollouts_with_its_credit(tmp_path):
    mod = load_script(BENCH)
    mod.SETTINGS["tiny"]["overrides"] = ["rollout.prompts_per_step=2"]  # 16 rollouts: a quick check
    trainers = {arm: mod.make_trainer("tiny", arm, tmp_path) for arm in mod.ARMS}
    assert trainers["vepo"].pipeline.names["credit"] == ["in_update"]
    assert trainers["vppo"].pipeline.names["credit"] == ["separate"]
    steps = {arm: [mod.timed_step(t, s) for s in range(2)] for arm, t in trainers.items()}
    for arm, runs in steps.items():
        for r in runs:
            assert r["cpu"] > 0 and 0 < r["train_cpu"] < r["cpu"], arm  # generation time is split off
    # lr 0: every arm samples the same rollouts at every step, so only the credit work differs
    lengths = {arm: [r["tokens"] for r in runs] for arm, runs in steps.items()}
    assert lengths["none"] == lengths["vepo"] == lengths["vppo"]
    rows = {arm: [json.loads(x) for x in (tmp_path / f"tiny-{arm}" / "metrics.jsonl").read_text().splitlines()]
            for arm in mod.ARMS}
    assert all(len(r) == 2 for r in rows.values())
    assert "credit/selected_fraction" not in rows["none"][-1]
    # VEPO keeps ceil(20%) and VPPO ceil(40%) of each response's tokens
    assert 0.2 <= rows["vepo"][-1]["credit/selected_fraction"] < 0.3
    assert 0.4 <= rows["vppo"][-1]["credit/selected_fraction"] < 0.5


def test_a_measured_step_reports_the_tensor_peak_and_where_it_was(tmp_path):
    """The memory worker's figures for one arm: the tensor peak above the step's start (MiB), its spread over the
    steps, the resident high-water mark, and the stage where the peak was reached."""
    mod = load_script(BENCH)
    mod.SETTINGS["tiny"]["overrides"] = ["rollout.prompts_per_step=2"]
    trainer = mod.make_trainer("tiny", "vepo", tmp_path)
    mod.timed_step(trainer, 0)
    runs = [mod.measured_step(trainer, s) for s in (1, 2)]
    for r in runs:
        assert r["tensor_mib"] > 0 and r["peak_mib"] > 0 and r["cpu"] > 0
        assert r["where"].startswith("stage ")  # e.g. "stage update/policy_gradient > ..."
    summary = mod.median_spread(runs)
    a, b = (r["tensor_mib"] for r in runs)
    assert summary["tensor_mib"] == pytest.approx((a + b) / 2)
    assert summary["tensor_spread"] == pytest.approx(abs(a - b) / ((a + b) / 2))
