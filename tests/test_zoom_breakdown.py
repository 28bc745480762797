"""``benchmarks/zoom_breakdown.py``: the split of a zoom run's accuracy by whether its look hit the square, on
hand-built trajectories (numbers worked out below), and end to end on a real one-step run of configs/zoom-tiny.yaml
and its warm start (the control)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from mmrlvr.cli import main
from mmrlvr.types import Completion, Sample
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def zb():
    return load_script(ROOT / "benchmarks" / "zoom_breakdown.py")


def _trajectory(box: list[int] | None, answer: str) -> Completion:
    turns = [{"kind": "model"}]
    if box is not None:
        turns += [{"kind": "tool", "calls": [{"name": "zoom", "arguments": {"image": 0, "box": box}, "error": None}]},
                  {"kind": "model"}]
    return Completion(text=f"<think>I see {answer} red.</think><answer>{answer}</answer>", meta={"turns": turns})


def test_accuracy_splits_by_whether_the_zoom_hit_the_square(zb):
    sample = Sample(id="z", messages=[], images=[Image.new("RGB", (896, 896))], answer="2", answer_type="number",
                    meta={"region": [48, 48, 160, 160]})
    square, elsewhere = [48, 48, 160, 160], [736, 736, 848, 848]
    completions = [_trajectory(square, "2"),     # hit, right
                   _trajectory(square, "1"),     # hit, wrong
                   _trajectory(elsewhere, "0"),  # miss (IoU 0), "0": wrong
                   _trajectory(None, "2"),       # no call is a miss; a guess that happens to be right
                   _trajectory([60, 60, 172, 172], "3")]  # IoU 100^2 / (2*112^2 - 100^2) = 0.66: a hit, wrong
    got = zb.breakdown(completions, [sample] * len(completions))
    # 3 hits of 5; 2 right of 5; after a hit 1 of 3; after a miss 1 of 2; one answer "0" of 5
    assert got == pytest.approx({"responses": 5, "hit_rate": 3 / 5, "accuracy": 2 / 5, "accuracy_after_hit": 1 / 3,
                                 "accuracy_after_miss": 1 / 2, "answers_0": 1 / 5})


def test_breakdown_runs_on_a_real_run_and_its_control(tmp_path):
    run = tmp_path / "run"
    assert main(["train", str(ROOT / "configs" / "zoom-tiny.yaml"), f"output_dir={run}", "max_steps=1", "save_every=1",
                 "rollout.prompts_per_step=2", "rollout.group_size=2", "data.train_size=4", "data.eval_size=2",
                 "eval.every=0"]) == 0
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "zoom_breakdown.py"), str(run), "--control",
                           str(run), "--limit", "2", "--k", "2", "--out", str(out)],
                          check=True, cwd=tmp_path, capture_output=True, text=True)
    rows = json.loads(out.read_text())
    assert list(rows) == [f"control ({run})", str(run)] and "| control (" in done.stdout
    for r in rows.values():
        assert r["responses"] == 4  # 2 scenes x 2 samples
        assert 0 <= r["hit_rate"] <= 1 and 0 <= r["answers_0"] <= 1
        hits = r["hit_rate"] * r["responses"]
        parts = [(hits, r["accuracy_after_hit"]), (r["responses"] - hits, r["accuracy_after_miss"])]
        assert r["accuracy"] == pytest.approx(sum(n * a for n, a in parts if n) / r["responses"])
