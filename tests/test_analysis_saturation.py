"""mmrlvr analyze saturation: planted reward curves give the saturation step worked out by hand; the CLI writes its
files on a handmade and on a real tiny run; a folder without metrics (or without reward rows) is one line, exit 2."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from mmrlvr.analysis.saturation import (analyse, default_window, plateau, saturation_curve, smooth,
                                        start_faithfulness)
from mmrlvr.errors import UserError

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def ramp(t: int) -> float:
    """0 up to step 20, then linear to 1 at step 120, then flat: r(t) = clip((t − 20) / 100, 0, 1)."""
    return min(max((t - 20) / 100, 0.0), 1.0)


STEPS = list(range(1, 301))


def test_centred_moving_average_by_hand():
    # window 3: [0, 3, 6, 3] -> [(0+3)/2, (0+3+6)/3, (3+6+3)/3, (6+3)/2] (the window cut at the ends)
    assert smooth([0.0, 3.0, 6.0, 3.0], 3) == [1.5, 3.0, 4.0, 4.5]
    assert smooth([1.0, 2.0], 1) == [1.0, 2.0]
    assert default_window(300) == 15 and default_window(39) == 1 and default_window(40) == 3
    assert plateau([0.0] * 18 + [1.0, 3.0]) == 2.0  # last 10% of 20 steps = 2 steps


def test_planted_ramp_saturates_where_worked_out_by_hand():
    rewards = [ramp(t) for t in STEPS]
    # 300 steps -> window 15 (h = 7). Start: the first 8 steps are all 0 -> 0. Plateau: last 30 steps = 1.
    # On the linear stretch the centred mean equals the curve while the window stays inside it (t + 7 <= 120).
    # fraction 0.9: threshold 0.9, r(110) = 0.9 and 110 + 7 <= 120 -> exactly step 110.
    c = saturation_curve(STEPS, rewards, fraction=0.9)
    assert c["window"] == 15 and c["start"] == 0.0 and c["plateau"] == 1.0
    assert c["saturation_step"] == 110 and c["pre_saturation_steps"] == 109
    assert c["pre_saturation_share"] == pytest.approx(109 / 299)
    # fraction 0.95 (default): threshold 0.95; the window now reaches the flat part:
    #   t = 115: (0.88 + ... + 1.00 [steps 108..120, 13 values, sum 12.22] + 1 + 1) / 15 = 14.22 / 15 = 0.948 < 0.95
    #   t = 116: (0.89 + ... + 1.00 [12 values, sum 11.34] + 3) / 15 = 14.34 / 15 = 0.956 >= 0.95
    # -> step 116, one step after the raw curve's 115 (r(115) = 0.95), inside the window.
    c = saturation_curve(STEPS, rewards)
    assert c["threshold"] == pytest.approx(0.95)
    assert c["saturation_step"] == 116


def test_planted_exponential_saturates_within_the_window():
    tau = 30
    rewards = [0.0 if t <= 20 else 1 - math.exp(-(t - 20) / tau) for t in STEPS]
    # start 0; plateau = 1 − mean(exp(−(t − 20)/30), t = 271..300) = 1 − 1.49e-4; threshold = 0.95 · plateau
    # = 0.949858. The raw curve crosses it at t − 20 = ceil(30 · ln(1 / (1 − 0.949858))) = ceil(89.79) = 90, step 110;
    # the curve is concave there, so the centred mean lies below it and crosses later, by at most h = 7 steps.
    c = saturation_curve(STEPS, rewards)
    assert c["plateau"] == pytest.approx(1 - 1.49e-4, abs=1e-6)
    assert 110 <= c["saturation_step"] <= 117


def test_a_reward_that_never_rises_has_no_saturation_step():
    c = saturation_curve([1, 2, 3, 4], [0.5, 0.4, 0.3, 0.2])
    assert c["no_rise"] and c["saturation_step"] is None and c["threshold"] is None


def test_faithfulness_prefers_the_training_judge_then_the_first_eval():
    rows = [{"step": s, "reward/mean": 0.1, "inconsistency_rate": r} for s, r in [(1, 0.5), (2, 0.2), (3, 0.2),
                                                                                   (4, 0.9)]]
    f = start_faithfulness(rows + [{"step": 0, "eval/n": 4, "eval/inconsistency_rate": 0.0}])
    assert f["faithfulness"] == pytest.approx(1 - 0.3) and f["steps"] == [1, 2, 3]  # mean of the first 3 steps
    f = start_faithfulness([{"step": 5, "eval/n": 4, "eval/inconsistency_rate": 0.25},
                            {"step": 0, "eval/n": 4, "eval/inconsistency_rate": 0.5}])
    assert f["faithfulness"] == 0.5 and f["steps"] == [0] and "eval" in f["source"]
    assert start_faithfulness([{"step": 1, "reward/mean": 0.2}]) is None


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", "analyze", "saturation", *args], capture_output=True,
                          text=True, env=ENV, timeout=120)


def test_cli_on_a_planted_run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": t, "reward/mean": ramp(t)} for t in STEPS]
    rows += [{"step": s, "eval/n": 8, "eval/accuracy": a} for s, a in [(0, 0.25), (100, 0.5), (300, 0.75)]]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = _cli(str(run))
    assert res.returncode == 0, res.stderr
    out = run / "analysis" / "saturation"
    numbers = json.loads((out / "results.json").read_text())
    assert numbers["saturation_step"] == 116
    assert numbers["eval_at_saturation"] == {"step": 100, "accuracy": 0.5}
    assert numbers["start_faithfulness"] == "not logged"
    assert "| saturation step | 116 |" in (out / "results.md").read_text()
    assert (out / "saturation.png").stat().st_size > 1000


def test_cli_on_a_tiny_run(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mmrlvr.cli", "train", "configs/demo-tiny.yaml", f"output_dir={run}", "max_steps=4",
           "save_every=0", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=16",
           "data.train_size=16", "data.eval_size=4", "eval.k=2", "eval.at_start=true", "eval.at_end=true",
           "eval.every=0", "progress=false", "log_rollouts=false"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert res.returncode == 0, res.stderr[-2000:]
    res = _cli(str(run))
    assert res.returncode == 0, res.stderr
    numbers = json.loads((run / "analysis" / "saturation" / "results.json").read_text())
    assert numbers["steps"] == [1, 2, 3, 4] and numbers["window"] == 1
    assert numbers["saturation_step"] in (None, 1, 2, 3, 4)
    assert [e["step"] for e in numbers["eval_accuracy"]] == [0, 4]  # before training and at the end
    assert numbers["start_faithfulness"]["steps"] == [0]  # the eval before any update: the paper's "before RL"
    assert (run / "analysis" / "saturation" / "saturation.png").is_file()


@pytest.mark.parametrize("case", ["no_dir", "no_metrics", "no_reward"])
def test_bad_run_folders_are_one_line_exit_2(tmp_path, case):
    run = tmp_path / "run"
    if case != "no_dir":
        run.mkdir()
    if case == "no_reward":
        (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/n": 4, "eval/accuracy": 0.5}) + "\n")
    res = _cli(str(run))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    expected = {"no_dir": "no such run directory", "no_metrics": "metrics.jsonl: no such file",
                "no_reward": "metrics.jsonl: no row has reward/mean"}[case]
    assert expected in lines[0]
    with pytest.raises(UserError):
        analyse(run)
