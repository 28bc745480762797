"""``mmrlvr analyze prefix`` (ThoughtFold): the shortest sufficient thinking prefix, planted and on a tiny run.

The search is checked on planted monotone oracles ("correct from length ≥ m"): it must return m with at most
⌈log2 L⌉ + 1 oracle calls, the full length L when nothing is correct, and 0 when everything is. The summary
numbers are worked by hand. The assistant-prefix hook of the rollout engine is checked on the tiny model's real
chat template: the prompt ends with the prefix (both engines build prompts with ``prompt_texts``) and the model
continues after it. Then one CLI run on a tiny run, and the bad inputs (exit 2, one line).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from analysis_helpers import cli as _cli, one_line_exit_2 as _one_line_exit_2, train_tiny_run
from mmrlvr.analysis import prefix as px

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ the pure search
def _planted(m: int):
    calls: list[int] = []

    def oracle(k: int) -> bool:
        calls.append(k)
        return k >= m

    return oracle, calls


def test_planted_redundant_prefix_is_found_within_the_call_bound():
    for L in range(1, 70):
        bound = math.ceil(math.log2(L)) + 1
        for m in range(0, L + 1):
            oracle, calls = _planted(m)
            r = px.shortest_prefix(L, oracle)
            assert r.length == m, (L, m)
            assert len(calls) <= bound, (L, m, calls)
            assert len(set(calls)) == len(calls) and all(0 <= k < L for k in calls)  # L itself never asked
            assert r.verified == (m < L)
            assert r.cut_share == pytest.approx(1 - m / L)
            assert [k for k, _ in r.calls] == calls


def test_a_worked_search_asks_the_midpoints():
    # L = 10, correct from 7: lo,hi = 0,10 -> ask 5 (no) -> 6..10 ask 8 (yes) -> 6..8 ask 7 (yes) -> 6..7 ask 6 (no)
    oracle, calls = _planted(7)
    r = px.shortest_prefix(10, oracle)
    assert calls == [5, 8, 7, 6] and r.length == 7 and r.verified and r.cut_share == pytest.approx(0.3)


def test_never_correct_keeps_the_full_thinking_and_always_correct_cuts_it_all():
    r = px.shortest_prefix(12, lambda k: False)
    assert r.length == 12 and not r.verified and r.cut_share == 0.0
    assert [k for k, _ in r.calls] == [6, 9, 11]  # 0..12 -> 7..12 -> 10..12 -> 12..12
    r = px.shortest_prefix(12, lambda k: True)
    assert r.length == 0 and r.verified and r.cut_share == 1.0
    r = px.shortest_prefix(0, lambda k: pytest.fail("no call for an empty thinking"))
    assert r.length == 0 and r.calls == [] and r.cut_share == 0.0


def test_lockstep_searches_give_the_single_results_in_few_rounds():
    lengths, ms = [10, 1, 0, 33, 7], [7, 1, 0, 0, 8]  # the last: never correct within its 7 tokens
    rounds: list[list[tuple[int, int]]] = []

    def batch(asked):
        rounds.append(asked)
        return [k >= ms[i] for i, k in asked]

    out = px.lockstep(lengths, batch)
    assert [r.length for r in out] == [7, 1, 0, 0, 7]
    for L, m, r in zip(lengths, ms, out):
        single = px.shortest_prefix(L, lambda k, m=m: k >= m)
        assert r.calls == single.calls and r.total == L
    assert len(rounds) == math.ceil(math.log2(34))  # the longest search sets the number of rounds


def test_summary_numbers_by_hand():
    a = px.SearchResult(2, 8, [(4, True), (2, True), (1, False)])  # cut 0.75
    b = px.SearchResult(0, 4, [(2, True), (1, True), (0, True)])  # cut 1.0, no thinking needed
    c = px.SearchResult(10, 10, [(5, False), (8, False), (9, False)])  # cut 0.0, unverified
    s = px.summarize([a, b, c])
    mean = (0.75 + 1.0 + 0.0) / 3
    assert s["n"] == 3 and s["redundancy"] == pytest.approx(mean)
    assert s["redundancy_std"] == pytest.approx(math.sqrt(((0.75 - mean) ** 2 + (1 - mean) ** 2 + mean ** 2) / 3))
    assert s["no_thinking_needed"] == pytest.approx(1 / 3) and s["unverified"] == pytest.approx(1 / 3)
    assert s["mean_thinking_tokens"] == pytest.approx(22 / 3) and s["mean_prefix_tokens"] == pytest.approx(4.0)
    assert s["oracle_calls"] == 9
    assert px.summarize([])["redundancy"] is None


def test_split_thinking_and_the_probe_text():
    assert px.split_thinking("<think>I see 2 red.</think><answer>2</answer>") == ("<think>", "I see 2 red.")
    assert px.split_thinking(" ok <think>a</think>b</think>") == (" ok <think>", "a")
    assert px.split_thinking("<answer>2</answer>") is None and px.split_thinking("<think>open") is None
    assert px.assistant_prefix("<think>", "I see") == "<think>I see</think>"


# ------------------------------------------------------------------------------------ the engine hook
@pytest.fixture(scope="module")
def tiny_model():
    from mmrlvr.models import load_policy
    from mmrlvr.train.model_path import resolve_model_path

    model, processor = load_policy(resolve_model_path("tiny:qwen2_5_vl:warm"))
    model.eval()
    return model, processor


def _samples(n: int):
    from mmrlvr.config import DataConfig
    from mmrlvr.train.data import load_split

    return load_split("synth:count", DataConfig(train_size=n, eval_size=n), "test")[:n]


def test_the_templated_prompt_ends_with_the_assistant_prefix(tiny_model):
    from mmrlvr.rollout.hf import ASSISTANT_PREFIX, encode_prompt_batch, prompt_texts
    from mmrlvr.rollout.vllm import build_requests
    from mmrlvr.rollout.base import SamplingParams

    model, processor = tiny_model
    plain = _samples(2)
    probe = "<think>I see 2</think>"
    pre = [px.with_prefix(s, probe, "t") for s in plain]
    assert pre[0].meta[ASSISTANT_PREFIX] == probe and ASSISTANT_PREFIX not in plain[0].meta
    base_texts, texts = prompt_texts(processor, plain), prompt_texts(processor, pre)
    assert base_texts[0].endswith("<|im_start|>assistant\n")  # unchanged without the key (backward compatible)
    assert all(t == b + probe and t.endswith(probe) for t, b in zip(texts, base_texts))
    # the vLLM engine builds its prompts through prompt_texts too
    reqs = build_requests(processor, pre[:1], 2, SamplingParams(), seed=0, step=0)
    assert all(r.prompt.endswith(probe) for r in reqs)
    # the token ids the model sees end with the prefix's tokens
    tok = processor.tokenizer
    ids = encode_prompt_batch(processor, pre[:1])["input_ids"][0].tolist()
    tail = tok.encode(probe, add_special_tokens=False)
    assert ids[-len(tail):] == tail and tok.convert_ids_to_tokens(ids[-1]) == "</think>"


def test_generation_continues_after_the_prefix(tiny_model):
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.rollout.hf import HFEngine

    model, processor = tiny_model
    s = _samples(1)[0]
    out = HFEngine(model, processor).generate([px.with_prefix(s, "<think>I see 2 red.</think>", "t")], 1,
                                              SamplingParams(max_new_tokens=12, greedy=True), seed=0, step=0)
    text = out.completions[0].text
    assert text.startswith("<answer>") and "<think>" not in text  # the warm model answers at once


# ------------------------------------------------------------------------------------ CLI on a tiny run
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny full fine-tuning run: checkpoints at steps 2 and 4, rollouts logged at steps 1-4."""
    return train_tiny_run(tmp_path_factory.mktemp("prefix") / "run", "max_steps=4", "save_every=2")


def test_cli_on_a_tiny_run_writes_the_redundancy_per_checkpoint(tiny_run):
    from mmrlvr.models import load_policy
    from mmrlvr.store.reader import RolloutReader
    from mmrlvr.train.model_path import resolve_model_path

    res = _cli("analyze", "prefix", str(tiny_run), "--limit", "2", "--samples", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    out = tiny_run / "analysis" / "prefix"
    for name in ("results.json", "results.md", "redundancy.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    n = json.loads((out / "results.json").read_text())
    assert n["unit"] == "tokens" and n["samples"] == 2 and n["threshold"] == 0.7
    assert [c["step"] for c in n["checkpoints"]] == [2, 4]
    reader = RolloutReader(tiny_run)
    tok = load_policy(resolve_model_path("tiny:qwen2_5_vl:warm"))[1].tokenizer
    think_open, think_close = tok.convert_tokens_to_ids(["<think>", "</think>"])
    for c in n["checkpoints"]:
        assert c["n"] == 2
        rows = c["rollouts"]
        # the rollouts checkpoint s sampled come first (step s + 1), then the nearest steps
        dist = [abs(r["rollout_step"] - (c["step"] + 1)) for r in rows]
        assert dist == sorted(dist)
        for r in rows:
            rec = reader.record(r["rollout_step"], r["prompt_id"], r["sample_index"])
            assert rec.reward_components["auto_accuracy"] == 1.0  # a correct rollout
            ids = rec.response_token_ids
            assert r["thinking_tokens"] == ids.index(think_close) - ids.index(think_open) - 1  # tokens round-trip
            L, k = r["thinking_tokens"], r["prefix_tokens"]
            assert 0 <= k <= L and r["cut_share"] == pytest.approx(1 - k / L)
            assert len(r["calls"]) <= math.ceil(math.log2(L)) + 1
            assert r["verified"] == any(q == k and ok for q, ok in r["calls"])
            assert all(ok == (q >= k) for q, ok in r["calls"])  # binary search: yes above the answer, no below
        assert c["redundancy"] == pytest.approx(sum(r["cut_share"] for r in rows) / len(rows))
    assert "redundancy" in (out / "results.md").read_text()


def test_bad_inputs_exit_2_in_one_line(tiny_run, tmp_path):
    from mmrlvr.errors import UserError

    no_rollouts = tmp_path / "no_rollouts"
    no_rollouts.mkdir()
    shutil.copy2(tiny_run / "config.yaml", no_rollouts / "config.yaml")
    shutil.copytree(tiny_run / "checkpoints", no_rollouts / "checkpoints")
    _one_line_exit_2(_cli("analyze", "prefix", str(no_rollouts)), "no rollout shards", "log_rollouts")
    no_ckpt = tmp_path / "no_ckpt"
    no_ckpt.mkdir()
    shutil.copy2(tiny_run / "config.yaml", no_ckpt / "config.yaml")
    shutil.copytree(tiny_run / "rollouts", no_ckpt / "rollouts")
    _one_line_exit_2(_cli("analyze", "prefix", str(no_ckpt)), "no checkpoints/ folder")
    _one_line_exit_2(_cli("analyze", "prefix", str(tmp_path / "nope")), "no such run directory")
    with pytest.raises(UserError, match="no verified checkpoint at step 3"):
        px.analyse(tiny_run, steps=[3])
    with pytest.raises(UserError, match="--samples must be at least 1"):
        px.analyse(tiny_run, samples=0)
