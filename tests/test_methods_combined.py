"""Methods where they meet: each test here failed on the code before the fix it names, and checks the effect of the
combination (what a sampler learned, which advantages are non-zero), not only that a run finishes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis_helpers import train_tiny_run

ROOT = Path(__file__).resolve().parents[1]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"reward/mean"' in ln]


def _stage_state(run: Path, step: int) -> dict:
    import torch

    path = run / "checkpoints" / f"step-{step:08d}" / "training_state" / "stage_state.pt"
    return torch.load(path, weights_only=False)["generate/groups"]


# ------------------------------------------------------------------ samplers see every group dynamic sampling drew


@pytest.mark.parametrize("sampler, table", [("disagreement", "entropy"), ("budget", "pass_rate")])
def test_a_sampler_observes_every_group_of_every_refill_round(tmp_path, sampler, table):
    """Dynamic sampling with refill rounds rebuilds the batch from kept groups (and fill); the sampler must still
    learn from every group generated, kept or dropped: after one step its table holds every prompt of every round.
    Two-token responses never parse, so every group agrees (all wrong), every round is dropped and the step runs
    all three rounds (the test's premise, asserted)."""
    from mmrlvr.train.samplers import build_sampler

    run = train_tiny_run(tmp_path / "r", "max_steps=1", "save_every=1", f"rollout.sampler={sampler}",
                         "algo.dynamic_sampling=true", "algo.dynamic_sampling_max_rounds=3", "rollout.group_size=2",
                         "rollout.max_new_tokens=2", "log_rollouts=false")
    (row,) = _metrics(run)
    assert row["dynamic_sampling/rounds"] == 3.0 and row["dynamic_sampling/kept_groups"] == 0.0
    replay = build_sampler(sampler, 16, 2, 0, {}, group_size=2)  # FAST_RUN: 16 prompts, 2 per step; seed 0
    drawn = {i for r in range(3) for i in replay.indices(0, r)}
    assert len(drawn) > 2  # the refill rounds drew other prompts than round 0's
    seen = _stage_state(run, 1)[table]
    assert set(seen) == drawn  # before the fix: only the 2 groups of the rebuilt batch
    if table == "entropy":
        assert all(v == 0.0 and str(v) == "0.0" for v in seen.values())  # all agree: entropy 0 (never -0.0)
    else:
        assert all(v == 0.0 for v in seen.values())  # none right: pass rate 0
