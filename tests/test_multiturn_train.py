"""Training on multi-turn trajectories: a run with ``rollout.tools`` resumes exactly, and two ranks train what one
process trains (matrix). ``tests/forced_zoom_plugin.py`` makes every trajectory's first turn a zoom call (a tiny
model never learnt one), so the sequences hold real tool turns with returned images; later turns are sampled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis_helpers import assert_same_final_state, cli, interrupted_copy, train_tiny_run

TOOLS = ["rollout.tools=[zoom]", "plugins=[tests/forced_zoom_plugin.py]", "rollout.max_new_tokens=80",
         "rollout.max_turns=2"]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_a_run_with_tools_trains_on_tool_turns_and_resumes_exactly(tmp_path):
    straight = _metrics(train_tiny_run(tmp_path / "a", "max_steps=4", "save_every=2", *TOOLS))
    interrupted_copy(tmp_path / "a", tmp_path / "b", 2)
    resumed = _metrics(train_tiny_run(tmp_path / "b", "max_steps=4", "save_every=2", "--resume", *TOOLS))
    assert all(r["tools/calls"] == 8 and r["tools/turns_mean"] == 2 for r in straight)  # 2 prompts x 4 rows, called
    clean = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in straight[2:]]
    assert clean == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed[-2:]]
    assert_same_final_state(tmp_path / "a", tmp_path / "b")

    import pandas as pd

    rows = pd.read_parquet(tmp_path / "a" / "rollouts" / "step-00000004.parquet")
    extra = json.loads(rows["extra"].iloc[0])
    assert [t["kind"] for t in extra["turns"]][:2] == ["model", "tool"] and len(extra["turn_images"]) == 1
    assert extra["turns"][1]["calls"][0]["name"] == "zoom"
    # `mmrlvr eval RUN_DIR` samples with the run's tools (its plug-in loaded from the run), like the trainer's eval
    res = cli("eval", str(tmp_path / "a"), "--k", "2", "--limit", "4", "--no-progress")
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(res.stdout[res.stdout.index("{"):])
    assert result["tool_calls_per_response"] == 1.0 and result["tool_error_rate"] == 0.0


@pytest.mark.matrix
def test_two_ranks_train_multi_turn_trajectories_like_one_process(tmp_path):
    from multiproc import assert_two_ranks_train_what_one_process_trains

    two = assert_two_ranks_train_what_one_process_trains(tmp_path, *TOOLS)
    assert all(r["tools/calls"] > 0 for r in _metrics(two))


RESUM = ["rollout.summarize={at_tokens: 1000}", "rollout.max_turns=3", "rollout.max_new_tokens=14"]


def test_resum_trains_segments_and_resumes_exactly(tmp_path):
    """14 tokens cut some of the warm start's answers: those trajectories summarise and restart, so steps hold more
    rows than trajectories, every segment of a trajectory trains with its advantage, and a resumed run continues
    exactly."""
    straight = _metrics(train_tiny_run(tmp_path / "a", "max_steps=4", "save_every=2", *RESUM))
    interrupted_copy(tmp_path / "a", tmp_path / "b", 2)
    resumed = _metrics(train_tiny_run(tmp_path / "b", "max_steps=4", "save_every=2", "--resume", *RESUM))
    assert any(r["rollout/samples"] > 8 for r in straight)  # 2 prompts x 4 trajectories, some in 2 segments
    clean = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in straight[2:]]
    assert clean == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed[-2:]]
    assert_same_final_state(tmp_path / "a", tmp_path / "b")

    import pandas as pd

    for step in range(1, 5):
        rows = pd.read_parquet(tmp_path / "a" / "rollouts" / f"step-{step:08d}.parquet")
        for _, group in rows.groupby(["prompt_id", "sample_index"]):
            # the segments of one trajectory: the same reward and advantage, the last one holds the finish
            assert group["reward"].nunique() == 1 and group["advantage"].round(6).nunique() == 1
            assert list(group["finish_reason"])[:-1] == ["summarized"] * (len(group) - 1)
