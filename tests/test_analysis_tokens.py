"""mmrlvr analyze tokens: the summary arithmetic by hand; the premise (recomputed log-probs reproduce the stored
ones under the checkpoint that sampled them); a CLI run on a tiny DelTA run; a run without rollouts is one line,
exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis_helpers import train_tiny_run
from mmrlvr.analysis.tokens import check_kinds, pick_steps, summarize_deltas
from mmrlvr.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_summary_by_hand():
    delta = torch.tensor([0.5, -0.5, 1.0, 2.0, -1.0])
    answer = torch.tensor([0, 0, 1, 1, -1])  # thinking, thinking, answer, answer, a row without an answer span
    weight = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    s = summarize_deltas(delta, answer, weight)
    # all: mean (0.5 − 0.5 + 1 + 2 − 1) / 5 = 0.4, mean |Δ| 5 / 5 = 1, Δ > 0 on 3 of 5
    assert s["all"] == pytest.approx({"n": 5, "mean": 0.4, "mean_abs": 1.0, "frac_up": 0.6})
    assert s["thinking"] == pytest.approx({"n": 2, "mean": 0.0, "mean_abs": 0.5, "frac_up": 0.5})
    assert s["answer"] == pytest.approx({"n": 2, "mean": 1.5, "mean_abs": 1.5, "frac_up": 1.0})
    assert s["no_answer_span"] == pytest.approx({"n": 1, "mean": -1.0, "mean_abs": 1.0, "frac_up": 0.0})
    # selected (w > 0): 0.5, 1, 2 -> mean 3.5 / 3; rest: −0.5, −1 -> −0.75
    assert s["credit"]["selected"]["mean"] == pytest.approx(3.5 / 3)
    assert s["credit"]["rest"]["mean"] == pytest.approx(-0.75)
    assert s["credit"]["all_weights_one"] is False and s["delta"] is None

    coef = torch.tensor([1.2, 0.8, 1.0, 1.2, 0.8])
    d = summarize_deltas(delta, answer, weight, coef)["delta"]
    # c − mean(c) = [.2, −.2, 0, .2, −.2]; Δ − 0.4 = [.1, −.9, .6, 1.6, −1.4]
    # Σ products = .02 + .18 + 0 + .32 + .28 = 0.8; Σ c² = 0.16; Σ Δ² = .01 + .81 + .36 + 2.56 + 1.96 = 5.7
    assert d["corr"] == pytest.approx(0.8 / (0.16 * 5.7) ** 0.5)
    # c > 1 on Δ = 0.5, 2 -> 1.25; c < 1 on Δ = −0.5, −1 -> −0.75
    assert d["up_weighted"]["mean"] == pytest.approx(1.25) and d["down_weighted"]["mean"] == pytest.approx(-0.75)

    # a token with c_t = 0 was filtered out of the loss, not down-weighted: left out of the DelTA rows
    d = summarize_deltas(delta, answer, weight, torch.tensor([1.2, 0.8, 1.0, 1.2, 0.0]))["delta"]
    assert d["down_weighted"]["n"] == 1 and d["up_weighted"]["n"] == 2

    s = summarize_deltas(delta, answer, torch.ones(5))
    assert s["credit"]["all_weights_one"] and s["credit"]["rest"] == {"n": 0, "mean": None, "mean_abs": None,
                                                                      "frac_up": None}


def test_default_steps_and_kinds():
    # the steps A -> B trained on: 3..8 of 1..10; three of them at positions 0, 2.5 -> 3, 5 -> steps 3, 6, 8
    assert pick_steps(list(range(1, 11)), 2, 8, 3) == [3, 6, 8]
    assert pick_steps([1, 2, 3], None, None, 5) == [1, 2, 3]
    assert pick_steps([1, 2, 3], 5, 9, 1) == [3]  # none between: all, then the last one
    check_kinds("lora", "model", "A", "B")
    with pytest.raises(UserError, match="B is a LoRA checkpoint and A a full"):
        check_kinds("full", "lora", "A", "B")


@pytest.fixture(scope="module")
def delta_run(tmp_path_factory) -> Path:
    """3 steps of the tiny demo with DelTA credit, a checkpoint after every step."""
    return train_tiny_run(tmp_path_factory.mktemp("tokens") / "run", "max_steps=3", "save_every=1",
                          "credit.scheme=delta")


def test_premise_recomputed_logprobs_match_the_stored_ones(delta_run):
    from mmrlvr.analysis.tokens import answer_labels, model_of, response_logprobs, run_samples
    from mmrlvr.config import load_config
    from mmrlvr.store.reader import RolloutReader

    cfg = load_config(delta_run / "config.yaml")
    records = RolloutReader(delta_run).read_step(3)  # the last step
    samples = run_samples(delta_run, cfg, {r.prompt_id for r in records})
    args = ([samples[r.prompt_id] for r in records], [r.response_token_ids for r in records])
    # step 3 was sampled by the weights after 2 updates: checkpoint 2 gives the stored log-probs back exactly
    sampler = model_of(delta_run / "checkpoints" / "step-00000002")
    for lp, r in zip(response_logprobs(sampler.model, sampler.processor, *args), records):
        torch.testing.assert_close(lp, torch.tensor(r.token_logprob), atol=1e-4, rtol=0)
    # the run's final checkpoint is one update (lr 1e-4) later: close, not equal
    final = model_of(delta_run)
    assert final.step == 3
    diffs = torch.cat([(lp - torch.tensor(r.token_logprob)).abs()
                       for lp, r in zip(response_logprobs(final.model, final.processor, *args), records)])
    assert 0 < float(diffs.mean()) < 0.05
    # the answer span of a stored response starts at its <answer> token
    tok = getattr(sampler.processor, "tokenizer", sampler.processor)
    r = next(r for r in records if "<answer>" in r.response_tokens)
    labels = answer_labels(tok, r.response_token_ids, ("<answer>", "</think>"))
    start = r.response_tokens.index("<answer>")
    assert labels == [0] * start + [1] * (len(labels) - start)
    plain = tok("no tags here", add_special_tokens=False)["input_ids"]
    assert answer_labels(tok, plain, ("<answer>", "</think>")) == [-1] * len(plain)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", "analyze", "tokens", *args], capture_output=True,
                          text=True, env=ENV, timeout=300)


def test_cli_on_a_tiny_delta_run(delta_run):
    res = _cli(str(delta_run / "checkpoints" / "step-00000001"), str(delta_run), "--limit", "8")
    assert res.returncode == 0, res.stderr
    out = delta_run / "analysis" / "tokens"
    n = json.loads((out / "results.json").read_text())
    assert n["steps"] == [2, 3] and n["rollouts"] == 8  # the steps the update 1 -> 3 trained on
    s = n["summary"]
    assert s["thinking"]["n"] + s["answer"]["n"] + s["no_answer_span"]["n"] == s["all"]["n"] == n["tokens"] > 0
    assert n["stored_check"]["A"]["rollout_step"] == 2 and n["stored_check"]["A"]["max_abs_diff"] < 1e-4
    assert n["credit_scheme"] == "delta" and -1 <= s["delta"]["corr"] <= 1
    assert set(n["delta_logged"]) == {"2", "3"}  # credit/delta_coef_* of those steps, from metrics.jsonl
    md = (out / "results.md").read_text()
    assert "DelTA coefficients (the stored weights)" in md and "reproduces the stored log-probs" in md
    assert (out / "delta_hist.png").stat().st_size > 1000


def test_a_run_without_rollouts_is_one_line_exit_2(delta_run, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(delta_run, bare, ignore=shutil.ignore_patterns("rollouts", "analysis"))
    res = _cli(str(bare / "checkpoints" / "step-00000001"), str(bare))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr and "rollouts: no rollout shards" in lines[0]
