"""Held-out consistency metrics (score_completions, evaluate_consistency) and the noisy warm-start spec."""

from __future__ import annotations

import pytest
import torch

from mmrlvr.consistency.heldout import evaluate_consistency
from mmrlvr.consistency.metrics import score_completions
from mmrlvr.data import make_rows, rows_to_samples
from mmrlvr.errors import UserError
from mmrlvr.models import build_tiny, load_policy
from mmrlvr.rollout.base import RolloutBatch, SamplingParams
from mmrlvr.rollout.hf import HFEngine
from mmrlvr.train.heldout import evaluate_samples
from mmrlvr.train.model_path import tiny_spec
from mmrlvr.types import Completion, Sample
from scripted_engine import ScriptedEngine  # noqa: E402  (tests/ is on sys.path under pytest)


def _count_sample(sid: str, answer: str, colour: str = "red") -> Sample:
    return Sample(id=sid, messages=[{"role": "user", "content": f"How many {colour} shapes are there?"}], images=[],
                  answer=answer, answer_type="number", meta={"task": "count", "colour": colour})


def _r(think: str, answer: str) -> str:
    return f"<think>{think}</think><answer>{answer}</answer>"


# ground truth 2 red shapes; thinking states a red count, the answer may differ
TR_AR = _r("I see 2 red, 1 blue.", "2")   # think right, answer right, consistent
TR_AW = _r("I see 2 red, 1 blue.", "3")   # think right, answer wrong, inconsistent
TW_AR = _r("I see 1 red, 1 blue.", "2")   # think wrong, answer right, inconsistent
TW_AW_C = _r("I see 3 red.", "3")         # both wrong, consistent
TW_AW_I = _r("I see 1 red.", "0")         # both wrong, inconsistent
NO_THINK = "<answer>2</answer>"           # no thinking: no verdict, no thinking verdict


def test_score_completions_four_way_breakdown():
    s = _count_sample("q", "2")
    texts = [TR_AR, TR_AR, TR_AW, TW_AR, TW_AW_C, TW_AW_I, NO_THINK]
    m = score_completions(texts, [s] * len(texts))
    # 6 rollouts have a verdict: inconsistent = TR_AW, TW_AR, TW_AW_I = 3 -> 3/6
    assert m["inconsistency_rate"] == pytest.approx(0.5)
    assert m["consistency/unknown_rate"] == pytest.approx(1 / 7)
    # four-way over the 6 checkable: TR/AR 2, TR/AW 1, TW/AR 1, TW/AW 2
    assert m["consistency/think_right_answer_right"] == pytest.approx(2 / 6)
    assert m["consistency/think_right_answer_wrong"] == pytest.approx(1 / 6)
    assert m["consistency/think_wrong_answer_right"] == pytest.approx(1 / 6)
    assert m["consistency/think_wrong_answer_wrong"] == pytest.approx(2 / 6)
    assert m["consistency/both_wrong_consistent"] == pytest.approx(1 / 6)  # only TW_AW_C
    assert m["consistency/thinking_accuracy"] == pytest.approx(3 / 6)  # TR_AR x2, TR_AW
    assert m["consistency/verifiable_fraction"] == pytest.approx(6 / 7)


def test_score_completions_accepts_completions_and_checks_lengths():
    s = _count_sample("q", "2")
    assert score_completions([Completion(TR_AW)], [s])["inconsistency_rate"] == 1.0
    with pytest.raises(ValueError, match="2 completions for 1 samples"):
        score_completions([TR_AR, TR_AR], [s])


def test_evaluate_consistency_arithmetic():
    a, b = _count_sample("a", "2"), _count_sample("b", "1", colour="blue")
    b_right = _r("I see 1 blue.", "1")
    engine = ScriptedEngine(greedy={"a": TR_AW, "b": b_right},
                            sampled={"a": [TR_AR, TR_AW, TW_AW_C, TR_AR], "b": [b_right, b_right, b_right, "1"]})
    m = evaluate_consistency(engine, [a, b], k=4, batch_size=8)
    # greedy: a wrong (answer 3), b right -> 0.5; both formatted
    assert m["greedy_accuracy"] == 0.5 and m["greedy_format_rate"] == 1.0
    # greedy consistency: a inconsistent, b consistent -> IR 1/2; thinking right in both -> 1.0
    assert m["greedy/inconsistency_rate"] == 0.5 and m["greedy/thinking_accuracy"] == 1.0
    # sampled accuracy: a 2/4, b 3/4 -> avg@4 = 5/8; pass@4 = 1; format: a 4/4, b 3/4 -> 7/8
    assert m["avg@4"] == pytest.approx(5 / 8) and m["pass@4"] == 1.0 and m["format_rate"] == pytest.approx(7 / 8)
    # sampled consistency: 7 verdicts (b's bare "1" has none); inconsistent = one TR_AW -> 1/7
    assert m["sampled/inconsistency_rate"] == pytest.approx(1 / 7)
    # four-way over the 7: TR/AR = 2 (a) + 3 (b) = 5, TR/AW 1, TW/AW 1 (consistent)
    assert m["sampled/think_right_answer_right"] == pytest.approx(5 / 7)
    assert m["sampled/think_right_answer_wrong"] == pytest.approx(1 / 7)
    assert m["sampled/both_wrong_consistent"] == pytest.approx(1 / 7)
    assert m["sampled/thinking_accuracy"] == pytest.approx(6 / 7)
    assert m["sampled/unknown_rate"] == pytest.approx(1 / 8)


def test_evaluate_consistency_matches_the_trainers_eval_on_a_real_tiny_model(tmp_path):
    model, processor = load_policy(build_tiny("qwen2_5_vl", tmp_path / "m", seed=0))
    model.eval()
    samples = rows_to_samples(make_rows("count", "test", 4, seed=0))
    engine = HFEngine(model, processor)
    ours = evaluate_consistency(engine, samples, k=2, max_new_tokens=8, batch_size=4, seed=3)
    theirs = evaluate_samples(engine, samples, k=2, max_new_tokens=8, batch_size=4, seed=3, progress=False)
    # same seeds per (seed, step, prompt, sample) and the same verifier: identical accuracy numbers
    assert {k: ours[k] for k in theirs} == theirs
    # an untrained model writes no "<think>..." in 8 tokens: every verdict unknown, no rate invented
    assert ours["greedy/unknown_rate"] == 1.0 and "greedy/inconsistency_rate" not in ours


@pytest.mark.parametrize("spec, expected", [
    ("tiny:qwen2_5_vl", ("qwen2_5_vl", False, 0.0, "qwen2_5_vl")),
    ("tiny:qwen2_5_vl:warm", ("qwen2_5_vl", True, 0.0, "qwen2_5_vl-warm")),
    ("tiny:qwen2_5_vl:warm:noise0.9", ("qwen2_5_vl", True, 0.9, "qwen2_5_vl-warm-noise0.9")),
    ("tiny:qwen3_vl:warm:noise.25", ("qwen3_vl", True, 0.25, "qwen3_vl-warm-noise0.25")),
    ("tiny:qwen2_vl:warm:noise0", ("qwen2_vl", True, 0.0, "qwen2_vl-warm")),  # noise 0 = the clean warm start
    ("tiny:qwen2_5_vl:warm:count_chatter", ("qwen2_5_vl", True, 0.0, "qwen2_5_vl-warm-count_chatter")),
    ("tiny:qwen2_5_vl:warm:count_chatter:noise0.5", ("qwen2_5_vl", True, 0.5, "qwen2_5_vl-warm-count_chatter-noise0.5")),
])
def test_tiny_spec_table(spec, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("MMRLVR_CACHE", str(tmp_path))
    family, warm, noise, folder = tiny_spec(spec)
    assert (family, warm, noise, folder.name) == expected
    assert folder.parent == tmp_path / "tiny"


def test_spec_task_names_the_warm_start_task():
    from mmrlvr.train.model_path import spec_task

    assert spec_task("tiny:qwen2_5_vl:warm:count_chatter") == "count_chatter"
    assert spec_task("tiny:qwen2_5_vl:warm:noise0.9") == "count"
    assert spec_task("tiny:qwen2_5_vl:warm", task="left_right") == "left_right"


def test_noise_in_the_spec_and_the_argument_share_one_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRLVR_CACHE", str(tmp_path))
    # the integrator's call (answer_noise=0.9) and the config spec must reuse the same built model
    assert tiny_spec("tiny:qwen2_5_vl:warm", answer_noise=0.9)[3] == tiny_spec("tiny:qwen2_5_vl:warm:noise0.9")[3]


@pytest.mark.parametrize("spec, message", [
    ("tiny:qwen2_5_vl:warm:noisy", "unknown option 'noisy'"),
    ("tiny:qwen2_5_vl:warm:noise1.5", "must be in \\[0, 1\\]"),
    ("tiny:qwen2_5_vl:cold", "expected tiny:FAMILY"),
    ("tiny:llava:warm", "unknown tiny family"),
])
def test_tiny_spec_errors_name_the_problem(spec, message):
    with pytest.raises(UserError, match=message):
        tiny_spec(spec)
