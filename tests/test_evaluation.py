"""evaluate(): judge table, metric arithmetic on a scripted engine, sane values on a real tiny model."""

from __future__ import annotations

import pytest
import torch

from mmrlvr.data import make_rows, rows_to_samples
from mmrlvr.evaluation import evaluate, normalise_answer, r1_judge
from mmrlvr.models import build_tiny, load_policy
from mmrlvr.rollout.base import RolloutBatch, SamplingParams
from mmrlvr.rollout.hf import HFEngine
from mmrlvr.types import Completion, Sample
from scripted_engine import ScriptedEngine  # noqa: E402  (tests/ is on sys.path under pytest)


def _sample(answer: str, sid: str = "s") -> Sample:
    return Sample(id=sid, messages=[{"role": "user", "content": "q"}], images=[], answer=answer)


@pytest.mark.parametrize("text, answer, expected", [
    ("<think>I see 2 red.</think><answer>2</answer>", "2", (True, True)),
    ("<think>x</think>\n<answer> 2.0 </answer>\n", "2", (True, True)),
    ("<think>x</think><answer>Red.</answer>", "red", (True, True)),
    ("<think>x</think><answer>[12,30, 56 ,80]</answer>", "[12, 30, 56, 80]", (True, True)),
    ("<think>x</think><answer>3</answer>", "2", (False, True)),
    ("<answer>2</answer>", "2", (False, False)),  # no thinking
    ("<think>x</think><answer>2</answer> extra", "2", (False, False)),  # text after the answer
    ("<think>x<answer>2</answer>", "2", (False, False)),  # unclosed think
    ("", "2", (False, False)),
])
def test_r1_judge_table(text, answer, expected):
    assert r1_judge(text, _sample(answer)) == expected


def test_normalise_answer():
    assert normalise_answer("  Left ") == "left"
    assert normalise_answer("7.50") == "7.5"
    assert normalise_answer("x y") == "x y"


def test_metric_arithmetic():
    ok, bad, unformatted = "<think>t</think><answer>1</answer>", "<think>t</think><answer>0</answer>", "1"
    engine = ScriptedEngine(
        greedy={"a": ok, "b": bad},
        sampled={"a": [ok, ok, bad, unformatted], "b": [bad, bad, bad, bad]},
    )
    samples = [_sample("1", "a"), _sample("1", "b")]
    m = evaluate(engine, samples, k=4, batch_size=4, progress=False)
    # greedy: a right, b wrong -> 1/2. avg@4: a 2/4, b 0/4 -> (0.5 + 0) / 2 = 0.25
    # pass@4: a yes, b no -> 0.5. format: a 3/4, b 4/4 -> (0.75 + 1) / 2 = 0.875
    assert m == {"n": 2, "k": 4, "greedy_accuracy": 0.5, "greedy_format_rate": 1.0, "avg@4": 0.25,
                 "pass@4": 0.5, "format_rate": 0.875}


def test_custom_judge_and_k_zero():
    engine = ScriptedEngine(greedy={"a": "anything"}, sampled={})
    m = evaluate(engine, [_sample("1", "a")], k=0, judge=lambda text, s: (True, False), progress=False)
    assert m == {"n": 1, "k": 0, "greedy_accuracy": 1.0, "greedy_format_rate": 0.0}


def test_evaluate_on_a_tiny_model(tmp_path):
    model, processor = load_policy(build_tiny("qwen2_5_vl", tmp_path / "m", seed=0))
    samples = rows_to_samples(make_rows("count", "test", 4, seed=0))
    m = evaluate(HFEngine(model, processor), samples, k=2, max_new_tokens=8, batch_size=4, progress=False)
    assert m["n"] == 4 and m["k"] == 2
    for key in ("greedy_accuracy", "greedy_format_rate", "avg@2", "pass@2", "format_rate"):
        assert 0.0 <= m[key] <= 1.0
    # an untrained model does not write "<think>...</think><answer>...</answer>" in 8 tokens
    assert m["format_rate"] == 0.0 and m["pass@2"] == 0.0
