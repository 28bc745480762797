"""Judges against a REAL local OpenAI-compatible server (mmrlvr.testing.judge_server) and a real tiny VLM.

Each failure kind a judge meets in practice - timeouts, HTTP 500, garbage, a non-JSON body, refusals,
a model that never writes a verdict - must end as an *unknown* verdict that is counted, never as a pass,
and must not stop the reward run.
"""

from __future__ import annotations

import json
import time

import pytest
from PIL import Image

from mmrlvr.rubric import LocalJudge, OpenAIJudge, RubricReward, load_rubric_text
from mmrlvr.rubric.routing import criterion_verdicts
from mmrlvr.testing.judge_server import JudgeServer
from mmrlvr.types import Sample

RUBRIC = load_rubric_text("""
criteria:
  - id: count
    text: The final answer is the right count.
    category: essential
    check: {type: number, expected: "{answer}"}
  - id: red
    text: The reasoning mentions the colour "red".
    category: important
    needs_image: true
    check: {type: judge, target: thinking}
  - id: blue
    text: The reasoning mentions the "blue" shapes.
    category: optional
    check: {type: judge, target: thinking}
""")
GOOD = "<think>I see 2 red and 1 blue.</think><answer>2</answer>"
MEH = "<think>I see 2 red.</think><answer>2</answer>"


def sample(sid: str = "s0", answer: str = "SECRET-2") -> Sample:
    return Sample(id=sid, messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many red shapes?"}]}],
                  images=[Image.new("RGB", (56, 56), (220, 40, 40))], answer=answer)


@pytest.fixture(scope="module")
def server():
    with JudgeServer(timeout_delay=3.0) as srv:
        yield srv


def judge(server, model, **kw):
    kw.setdefault("timeout", 2.0)
    kw.setdefault("max_retries", 2)
    return OpenAIJudge(model=model, base_url=server.base_url, **kw)


def verdicts(j, responses=(GOOD, MEH), answer="2"):
    s = sample(answer=answer)
    return criterion_verdicts([RUBRIC] * len(responses), list(responses), [s] * len(responses), j)


class TestRuleModes:
    @pytest.mark.parametrize("model", ["rule", "rule-json"])
    def test_verdicts(self, server, model):
        j = judge(server, model)
        out = verdicts(j)
        # GOOD mentions red and blue; MEH only red. Program: both answer 2 = the right count.
        assert [[v.met for v in row] for row in out] == [[True, True, True], [True, True, False]]
        assert out[1][2].status == "ok" and "does not mention blue" in out[1][2].rationale
        assert j.stats.requests == 4 and j.stats.unknown == 0
        j.close()

    def test_requests_run_concurrently(self):
        # the server answers each request after 0.4 s; 8 requests with concurrency 8 take ~0.4 s, not 3.2 s
        with JudgeServer(timeout_delay=0.4) as srv:
            j = OpenAIJudge(model="timeout", base_url=srv.base_url, timeout=5, concurrency=8)
            t0 = time.perf_counter()
            out = verdicts(j, responses=[GOOD, MEH, GOOD, MEH])   # 4 responses x 2 judge criteria = 8 calls
            elapsed = time.perf_counter() - t0
            j.close()
        assert all(v.known for row in out for v in row[1:])
        assert elapsed < 2.0, elapsed


class TestFailures:
    @pytest.mark.parametrize("model, status, counter", [
        ("timeout", "timeout", "timeouts"),
        ("error500", "error", "errors"),
        ("badjson", "error", "errors"),
        ("garbage", "unparseable", "unparseable"),
        ("refuse", "refusal", "refusals"),
    ])
    def test_unknown_never_pass(self, server, model, status, counter):
        j = judge(server, model, timeout=0.2)
        out = verdicts(j)
        judged = [v for row in out for v in row[1:]]
        assert all(v.met is None and v.status == status for v in judged), [(v.met, v.status) for v in judged]
        assert getattr(j.stats, counter) == 4 and j.stats.unknown == 4
        # programs are unaffected
        assert [row[0].met for row in out] == [True, True]
        j.close()

    def test_retries_with_backoff(self, server):
        # flaky: 500 for the first 2 requests of each prompt, then an answer; 2 retries are enough
        j = judge(server, "flaky", max_retries=2)
        out = verdicts(j)
        assert all(v.known for row in out for v in row[1:])
        assert j.stats.retries == 8 and j.stats.errors == 0  # 4 calls x 2 retries
        j.close()
        # not enough retries: unknown, counted as an error
        j = judge(server, "flaky", max_retries=0)
        out = verdicts(j, responses=["<think>new prompt red</think><answer>2</answer>"])
        assert out[0][1].met is None and out[0][1].status == "error" and j.stats.errors == 2
        j.close()

    def test_timeouts_are_retried_then_given_up(self, server):
        j = judge(server, "timeout", timeout=0.2, max_retries=1)
        t0 = time.perf_counter()
        out = verdicts(j, responses=[GOOD])
        # 2 attempts x 0.2 s each (plus start-up), concurrently for the 2 criteria; never the 3 s delay
        assert time.perf_counter() - t0 < 2.5
        assert j.stats.timeouts == 2 and j.stats.retries == 2 and out[0][1].status == "timeout"
        j.close()


class TestVotesAndCache:
    def test_majority_of_k_votes_with_distinct_seeds(self, server):
        n0 = len(server.requests)
        j = judge(server, "coin", votes=5)
        out = verdicts(j, responses=[GOOD])
        seeds = sorted(r["seed"] for r in server.requests[n0:])
        assert seeds == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]       # 2 criteria x 5 votes
        for v in out[0][1:]:
            assert len(v.votes) == 5
            passes = sum(v.votes)
            assert v.met is (passes >= 3)
        # votes at k > 1 use the vote temperature
        assert {r["temperature"] for r in server.requests[n0:]} == {0.7}
        j.close()

    def test_disk_cache(self, server, tmp_path):
        db = tmp_path / "judge.sqlite"
        j = judge(server, "rule", cache=db)
        first = verdicts(j)
        j.close()
        n0 = len(server.requests)
        j = judge(server, "rule", cache=db)
        second = verdicts(j)
        assert len(server.requests) == n0                      # nothing asked again
        assert j.stats.cache_hits == 4 and j.stats.calls == 0
        assert [[v.met for v in r] for r in first] == [[v.met for v in r] for r in second]
        j.close()
        # a different judge identity (another model name) does not reuse the entries
        j = judge(server, "rule-json", cache=db)
        verdicts(j)
        assert j.stats.cache_hits == 0
        j.close()

    def test_failures_are_not_cached(self, server, tmp_path):
        db = tmp_path / "judge.sqlite"
        j = judge(server, "error500", cache=db, max_retries=0)
        verdicts(j)
        assert len(j.cache) == 0
        j.close()


class TestMinimalExposureOnTheWire:
    def test_server_sees_no_ground_truth_and_images_only_when_needed(self, server):
        n0 = len(server.requests)
        j = judge(server, "rule")
        verdicts(j, answer="SECRET-2")
        j.close()
        bodies = server.requests[n0:]
        assert len(bodies) == 4
        for body in bodies:
            text = json.dumps(body)
            assert "SECRET-2" not in text
            user = body["messages"][1]["content"]
            has_image = any(p["type"] == "image_url" for p in user)
            criterion = next(p["text"] for p in user if p["type"] == "text")
            assert has_image == ('"red"' in criterion), criterion   # only the needs_image criterion


class TestRewardRunContinues:
    def test_counts_per_failure_kind(self, server):
        rubric = [
            {"id": "count", "text": "The final answer is the right count.", "category": "essential",
             "check": {"type": "number", "expected": "{answer}"}},
            {"id": "ok", "text": 'Mentions "red" (mode: rule)', "category": "important", "check": "judge"},
            {"id": "slow", "text": 'Mentions "red" (mode: timeout)', "category": "important", "check": "judge"},
            {"id": "broken", "text": 'Mentions "red" (mode: error500)', "category": "optional", "check": "judge"},
            {"id": "noise", "text": 'Mentions "red" (mode: garbage)', "category": "optional", "check": "judge"},
        ]
        samples = [Sample(id=f"s{i}", messages=[{"role": "user", "content": "How many red?"}], images=[],
                          answer="2", rubric=rubric) for i in range(3)]
        reward = RubricReward(judge={"name": "openai", "model": "mixed", "base_url": server.base_url,
                                     "timeout": 0.3, "max_retries": 1}, group_size=1)
        results = reward.score_batch([GOOD, "<think>nothing</think><answer>3</answer>", ""], samples)
        m = reward.metrics()
        # 3 rollouts x 4 judge criteria = 12 judge verdicts; 3 x 3 failing kinds = 9 unknown
        assert m["judge/requests"] == 12 and m["judge/unknown_rate"] == pytest.approx(9 / 12)
        assert (m["judge/timeouts"], m["judge/errors"], m["judge/unparseable"]) == (3, 3, 3)
        assert m["judge/retries"] == 6   # timeout and 500 are retried once each: 2 x 3
        # scores use only known verdicts: count (1.0) and ok (0.7)
        # GOOD: (1 + 0.7) / 1.7 = 1; wrong count, no red: 0 / 1.7 = 0; empty: 0
        assert [r.score for r in results] == pytest.approx([1.0, 0.0, 0.0])
        crit = {c["id"]: c for c in results[0].parsed["rubric"]}
        assert crit["slow"]["verdict"] == "unknown" and crit["slow"]["status"] == "timeout"
        assert "crit/slow" not in results[0].components and results[0].components["crit/ok"] == 1.0
        assert results[0].parsed["judge_unknown"] == 3
        reward.close()


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    from mmrlvr.models.tiny import build_tiny

    return build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny-judge"))


class TestRealTinyModel:
    def test_server_model_mode(self, tiny_vlm):
        # a random-weight VLM answers through the HTTP server; its text is never a strict verdict
        with JudgeServer(model_dir=tiny_vlm, default_mode="model") as srv:
            j = OpenAIJudge(model="model", base_url=srv.base_url, timeout=60, max_tokens=24, concurrency=2)
            out = verdicts(j, responses=[GOOD])
            assert len(srv.requests) == 2
            j.close()
        for v in out[0][1:]:
            assert v.met is None and v.status in ("unparseable", "contradiction", "refusal")
            assert v.raw != ""                      # a real generation arrived
        assert out[0][0].met is True

    def test_local_judge(self, tiny_vlm):
        j = LocalJudge(tiny_vlm, max_new_tokens=16, batch_size=2, votes=2)
        out = verdicts(j, responses=[GOOD, MEH])
        assert j.stats.calls == 8 and j.stats.unknown == 4   # 2 responses x 2 criteria x 2 votes
        assert all(v.met is None and len(v.votes) == 2 for row in out for v in row[1:])
        assert j.identity.startswith("local:") and ":t0.7:" in j.identity
        j.close()


@pytest.fixture(scope="module")
def tiny_text_lm(tmp_path_factory):
    """A text-only Qwen2 causal LM built from a config (random weights) with the tiny BPE tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmrlvr.models.tiny import build_tokenizer

    tok = build_tokenizer()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
    out = tmp_path_factory.mktemp("tiny-text-judge")
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_local_text_only_judge(tiny_text_lm):
    from mmrlvr.errors import UserError

    j = LocalJudge(tiny_text_lm, max_new_tokens=8)
    assert not j.generator.is_vlm
    text_only = load_rubric_text("criteria:\n  - {id: a, text: 'Mentions \"red\"', category: important}\n")
    out = criterion_verdicts([text_only], ["red"], [sample()], j)
    assert out[0][0].met is None and out[0][0].raw != ""
    # a criterion that needs the image cannot go to a text-only judge: a clear error, not a silent unknown
    with pytest.raises(UserError, match="text-only"):
        criterion_verdicts([RUBRIC], [GOOD], [sample()], j)
    j.close()
