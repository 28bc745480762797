"""docs/examples/group_agreement.py: a group-aware reward written from the docs — hand-worked scores, the run's
template reaching it, two training steps, and an exact resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmrlvr.rewards.base import REWARDS, build_reward, run_settings, score_batch
from mmrlvr.types import Completion, Sample

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "docs/examples/group_agreement.py"


@pytest.fixture(scope="module")
def reward_cls():
    if "group_agreement" not in REWARDS:
        from mmrlvr.plugins import load_plugins

        load_plugins([str(PLUGIN)])
    return REWARDS.get("group_agreement")


def _s(i: str) -> Sample:
    return Sample(id=i, messages=[], images=[], answer="never read", answer_type="number")


def _r1(answer: str | None) -> Completion:
    return Completion("<think>count</think>" + (f"<answer>{answer}</answer>" if answer is not None else "no tags"))


def test_hand_worked_groups(reward_cls):
    # group 0: answers 3, 3.0, 4, (none) -> "3" has 2 votes (3 == 3.0 by value) -> [1, 1, 0, 0], share 2/4
    # group 1: dog, cat, cat, dog -> a 2-2 tie, "dog" appears first -> [1, 0, 0, 1], share 2/4
    # group 2: (none) x2 -> no votes, no majority -> [0, 0]
    texts = ["3", " 3.0 ", "4", None, "dog", "Cat", "cat ", "DOG", None, None]
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    fn = build_reward("group_agreement")
    out = score_batch(fn, [_r1(t) for t in texts], [_s(str(g)) for g in groups], group_index=groups)
    assert [r.score for r in out] == [1, 1, 0, 0, 1, 0, 0, 1, 0, 0]
    assert out[0].parsed["majority"] == repr(3.0) and out[0].parsed["majority_share"] == 0.5
    assert out[4].parsed["majority"] == "dog" and out[8].parsed["majority"] is None


def test_the_runs_answer_template_reaches_it(reward_cls):
    boxed = [Completion("so \\boxed{7}"), Completion("\\boxed{7}"), Completion("\\boxed{8}")]
    with run_settings(template="boxed"):
        fn = build_reward("group_agreement")
    assert [r.score for r in score_batch(fn, boxed, [_s("a")] * 3, group_index=[0, 0, 0])] == [1, 1, 0]


def _train(out: Path, *extra: str) -> None:
    cmd = [sys.executable, "-m", "mmrlvr.cli", "train", str(ROOT / "configs/demo-tiny.yaml"), f"output_dir={out}",
           f"plugins=[{PLUGIN}]", "rewards.1.name=group_agreement",
           "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=16", "data.train_size=16",
           "eval.at_start=false", "eval.at_end=false", "eval.every=0", "progress=false", "save_every=1", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]


def test_trains_two_steps_and_resumes_exactly(reward_cls, tmp_path):
    _train(tmp_path / "straight", "max_steps=2")
    _train(tmp_path / "resumed", "max_steps=1")
    _train(tmp_path / "resumed", "max_steps=2", "--resume")
    a, b = _metrics(tmp_path / "straight"), _metrics(tmp_path / "resumed")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    assert all("reward/group_agreement" in r for r in a)
    drop = ("time/",)
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if not k.startswith(drop)} == \
               {k: v for k, v in rb.items() if not k.startswith(drop)}
    plan = json.loads((tmp_path / "straight" / "plan.json").read_text())
    score = next(s for s in plan["stages"] if s["kind"] == "score")
    assert score["settings"]["rewards[1]"]["name"] == "group_agreement"
