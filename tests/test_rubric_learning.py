"""The rubric reward trains the tiny VLM: configs/rubric-tiny.yaml on synth:rubric_count.

Fast checks: the data spec yields samples with instance rubrics, and the config's reward gives the
hand-worked scores that docs/rubric-rewards.md quotes. The slow check trains the warm-started tiny
Qwen2.5-VL with the rubric reward (hierarchical, POW3R) and a learning-rate-0 control with the same seed:

* held-out: the rubric score of the trained policy on 200 held-out prompts x 8 samples (T = 1, fixed
  sampling seed, static weights) rises over the start policy's; the control's equals the start exactly;
* in training: on the same steps (same seed = same prompts, same sampling streams) the trained run's
  logged ``reward/rubric`` exceeds the control's over the second half of the run.

Budget: about 2.5 minutes of CPU time single-threaded (see docs/rubric-rewards.md), plus the
one-off build of the cached warm start (``tiny:qwen2_5_vl:warm``) when no earlier test or run made it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from mmrlvr.config import DataConfig, load_config
from mmrlvr.errors import UserError
from mmrlvr.rubric import RubricReward
from mmrlvr.train.data import load_split

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "rubric-tiny.yaml"


def config_reward(group_size: int = 1) -> RubricReward:
    """The rubric reward exactly as configs/rubric-tiny.yaml configures it."""
    cfg = load_config(CONFIG)
    (spec,) = [s for s in cfg.rewards if s.name == "rubric"]
    return RubricReward(**{**spec.params, "group_size": group_size})


def test_synth_rubric_count_gives_samples_with_instance_rubrics():
    samples = load_split("synth:rubric_count", DataConfig(train_size=12), "train")
    assert len(samples) == 12
    for s in samples:
        ids = [c["id"] for c in s.rubric]
        assert ids[:5] == ["count", "asked_colour", "asked_count", "colour_counts", "absent_colour"][:len(ids)]
        assert len(s.images) == 1 and s.answer in {"0", "1", "2", "3"}
    # the reference solution meets every criterion: score 1 under the config's reward
    results = config_reward().score_batch([s.meta["solution"] for s in samples], samples)
    assert [r.score for r in results] == [1.0] * 12
    test = load_split("synth:rubric_count", DataConfig(eval_size=5), "test")
    assert len(test) == 5 and not {s.id for s in test} & {s.id for s in samples}


def test_unknown_synthetic_task_lists_the_rubric_task():
    with pytest.raises(UserError, match="rubric_count"):
        load_split("synth:nope", DataConfig(), "train")


def test_config_reward_gives_the_hand_worked_scores():
    # scene: "How many yellow shapes?", 1 red + 3 yellow; green and blue absent
    (sample,) = [s for s in load_split("synth:rubric_count", DataConfig(eval_size=3), "test")[2:3]]
    assert sample.meta["counts"] == {"red": 1, "yellow": 3} and sample.answer == "3"
    responses = {
        "reference": "<think>I see 3 yellow, 1 red.</think><answer>3</answer>",
        # additional: asked_colour 0.7 + asked_count 0.7 met, colour_counts 0.3 missed: 0.5 + 0.5 * 1.4/1.7
        "no_red": "<think>I see 3 yellow.</think><answer>3</answer>",
        # ... and the absent colour green named: - 0.9 / (1.0 + 1.7)
        "green": "<think>I see 3 yellow, 0 green.</think><answer>3</answer>",
        # essential count failed: 0 whatever the rest; the absent colour still subtracts 0.9 / 2.7
        "wrong": "<think>I see 2 yellow, 1 red.</think><answer>2</answer>",
        "wrong_green": "<think>I see 2 yellow, 1 green.</think><answer>2</answer>",
        # the asked colour named without its count: asked_colour only, 0.5 + 0.5 * 0.7/1.7
        "vague": "<think>Some yellow shapes.</think><answer>3</answer>",
    }
    # group_size=1: POW3R needs >= 2 known verdicts per group to move alpha, so these are static weights
    scores = dict(zip(responses, (r.score for r in config_reward().score_batch(
        list(responses.values()), [sample] * len(responses)))))
    assert scores["reference"] == pytest.approx(1.0)
    assert scores["no_red"] == pytest.approx(0.5 + 0.5 * 1.4 / 1.7)            # 0.912
    assert scores["green"] == pytest.approx(0.5 + 0.5 * 1.4 / 1.7 - 0.9 / 2.7)  # 0.578
    assert scores["wrong"] == 0.0
    assert scores["wrong_green"] == pytest.approx(-0.9 / 2.7)                  # -0.333
    assert scores["vague"] == pytest.approx(0.5 + 0.5 * 0.7 / 1.7)             # 0.706


def test_evaluation_view_leaves_pow3r_state_alone_and_uses_static_weights():
    sample = load_split("synth:rubric_count", DataConfig(eval_size=3), "test")[2]  # 3 yellow, 1 red; yellow asked
    # one group of 4: asked_colour is met by all (saturated), asked_count by half -> POW3R shifts weight to it
    texts = ["<think>I see 3 yellow, 1 red.</think><answer>3</answer>"] * 2 + \
            ["<think>Some yellow shapes.</think><answer>3</answer>"] * 2
    train = config_reward(group_size=4)
    train.score_batch(texts, [sample] * 4)
    alphas = dict(train.alphas)
    by_id = {k.split("#")[0]: a for k, a in alphas.items()}
    assert by_id["asked_count"] > 1.0 > by_id["asked_colour"]  # important category: variance 0.25 vs 0
    view = train.for_evaluation(group_size=2)
    scores = [r.score for r in view.score_batch(texts, [sample] * 4)]
    assert train.alphas == alphas and view.alphas == {} and view.pow3r is None and train.group_size == 4
    # static hierarchical weights: 1.0, and 0.5 + 0.5 * 0.7 / 1.7 for the vague answer (asked_colour only)
    assert scores == pytest.approx([1.0, 1.0, 0.5 + 0.5 * 0.7 / 1.7, 0.5 + 0.5 * 0.7 / 1.7])


# ------------------------------------------------------------------------------------------ learning
# Measured (seeds 0 and 1, this budget): held-out 0.308 -> 0.395 / 0.360; late-half gain over the
# control +0.106 / +0.108 (SE ~0.015). 16 prompts x 60 steps (same compute) gained less (+0.04 late-half),
# lr 1e-4 about half as much, lr 6e-4 lost ground.
# The config (8 prompts x G 8 per step, k3 KL 0.05, hierarchical + POW3R), compressed: 120 steps at lr 3e-4
# instead of 300 at 1e-4 (3e-4 is stable for 120 steps on both seeds; over 300 it broke the format once).
STEPS = 120          # optimisation steps per arm
LR = 3.0e-4
HELD_OUT = 200       # held-out prompts, 8 samples each at T = 1
MIN_HELD_OUT_GAIN = 0.03
MIN_TRAIN_GAIN = 0.05


def held_out_rubric_score(trainer, samples) -> float:
    """Mean rubric score (hierarchical, static weights) of 8 samples per held-out prompt at T = 1."""
    from mmrlvr.rollout.base import SamplingParams

    reward = RubricReward(aggregation="hierarchical", group_size=8)
    params = SamplingParams(max_new_tokens=32, temperature=1.0)
    trainer.model.eval()
    scores = []
    with torch.no_grad():
        for start in range(0, len(samples), 25):
            batch = trainer.engine.generate(samples[start:start + 25], 8, params, seed=1234, step=start)
            scores += [r.score for r in reward.score_batch(batch.completions, batch.samples)]
    return sum(scores) / len(scores)


def run_arm(out: Path, lr: float, seed: int, held_out, eval_start: bool) -> tuple[dict[str, float], list[dict]]:
    """Train with the config at ``lr``; held-out rubric score at the start (optional) and the end."""
    from mmrlvr.train.metrics import read_metrics
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(CONFIG, [
        f"output_dir={out}", f"seed={seed}", f"max_steps={STEPS}", "save_every=0", "eval.at_start=false",
        "eval.at_end=false", "eval.every=0", "progress=false", "log_rollouts=false", "tensorboard=false",
        f"optim.lr={lr}"])
    trainer = Trainer(cfg)
    scores = {"start": held_out_rubric_score(trainer, held_out)} if eval_start else {}
    trainer.train()
    scores["end"] = held_out_rubric_score(trainer, held_out)
    return scores, read_metrics(out / "metrics.jsonl")


@pytest.mark.slow
def test_rubric_reward_raises_the_rubric_score_over_start_and_lr0_control(tmp_path):
    torch.set_num_threads(1)
    seed = int(os.environ.get("MMRLVR_TEST_SEED", "0"))  # the budget was checked with seeds 0 and 1
    held_out = load_split("synth:rubric_count", DataConfig(eval_size=HELD_OUT), "test")
    t0 = time.perf_counter()
    trained, trained_log = run_arm(tmp_path / "trained", LR, seed, held_out, eval_start=True)
    control, control_log = run_arm(tmp_path / "control", 0.0, seed, held_out, eval_start=False)
    late = lambda log, key: sum(x[key] for x in log[STEPS // 2:]) / (STEPS - STEPS // 2)  # noqa: E731
    print(f"\nseed {seed}, {time.perf_counter() - t0:.0f} s: held-out rubric {trained['start']:.3f} -> "
          f"{trained['end']:.3f} (control {control['end']:.3f}); late-half reward/rubric trained "
          f"{late(trained_log, 'reward/rubric'):.3f} vs control {late(control_log, 'reward/rubric'):.3f}; "
          f"accuracy {late(trained_log, 'accuracy'):.3f} vs {late(control_log, 'accuracy'):.3f}")

    # the learning-rate-0 control changes nothing: its held-out score is the start's, to the last bit
    assert control["end"] == trained["start"], (control, trained)
    # held-out: the trained policy's rubric score rises over the start policy's
    assert trained["end"] - trained["start"] >= MIN_HELD_OUT_GAIN, trained

    # training: same steps, same prompts, same sampling streams; second half, trained minus control
    assert len(trained_log) == len(control_log) == STEPS
    half = STEPS // 2
    diff = [t["reward/rubric"] - c["reward/rubric"] for t, c in zip(trained_log[half:], control_log[half:])]
    assert sum(diff) / len(diff) >= MIN_TRAIN_GAIN, f"mean late-half gain {sum(diff) / len(diff):.3f}"
    # the first step's rollouts come from identical weights: identical rewards
    assert trained_log[0]["reward/rubric"] == control_log[0]["reward/rubric"]
    # the response format survives (no collapse), and POW3R moved the criterion weights in both runs
    assert sum(t["format_rate"] for t in trained_log[half:]) / half >= 0.9
    for log in (trained_log, control_log):
        assert log[-1]["rubric/pow3r_alpha_min"] < 1.0 < log[-1]["rubric/pow3r_alpha_max"]
