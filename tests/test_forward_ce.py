"""Forward cross-entropy to an expert (rich-feedback DAgger) and the distillation horizon: the math by hand, the
privileged prompt, that the expert's context never reaches the student's inputs, and the config checks."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrlvr.algos.distill import (expert_top_k, forward_ce, horizon_columns, horizon_mask, horizon_share,
                                  logprobs_of_ids)
from mmrlvr.types import Sample

ROOT = Path(__file__).resolve().parents[1]


def test_forward_ce_two_token_example_by_hand():
    # vocabulary of 3, a response of 2 tokens. Student logits per position; expert top-2 with its probabilities.
    student = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]]])  # [1, 2, 3]
    expert_ids = torch.tensor([[[0, 1], [2, 0]]])  # [1, 2, 2]
    expert_p = torch.tensor([[[0.6, 0.3], [0.9, 0.05]]])
    z1 = math.log(math.e ** 2 + math.e ** 1 + 1)  # log-sum-exp of position 1
    z2 = math.log(1 + 1 + math.e ** 3)
    ce1 = -(0.6 * (2 - z1) + 0.3 * (1 - z1))
    ce2 = -(0.9 * (3 - z2) + 0.05 * (0 - z2))
    got = forward_ce(logprobs_of_ids(student, expert_ids), expert_p, torch.ones(1, 2))
    assert got.tolist()[0] == pytest.approx([ce1, ce2], rel=1e-6)
    # a token outside the horizon contributes nothing
    assert forward_ce(logprobs_of_ids(student, expert_ids), expert_p, torch.tensor([[1.0, 0.0]])).tolist()[0] == \
        pytest.approx([ce1, 0.0], rel=1e-6)
    # the gradient reaches the student's logits
    s = student.clone().requires_grad_(True)
    forward_ce(logprobs_of_ids(s, expert_ids), expert_p, torch.ones(1, 2)).sum().backward()
    assert s.grad is not None and s.grad.abs().sum() > 0


def test_expert_top_k_gives_the_full_distributions_probabilities():
    logits = torch.tensor([[[1.0, 3.0, 2.0, 0.0]]])
    ids, p = expert_top_k(logits, 2, temperature=1.0)
    full = torch.softmax(logits, -1)[0, 0]
    assert ids.tolist() == [[[1, 2]]]
    assert p[0, 0].tolist() == pytest.approx([full[1].item(), full[2].item()])  # not renormalised over the top k
    ids_t, p_t = expert_top_k(logits, 2, temperature=2.0)
    assert p_t[0, 0, 0].item() == pytest.approx(torch.softmax(logits / 2, -1)[0, 0, 1].item())


def test_horizon_share_and_mask():
    assert horizon_share("full", 5, 100) == 1.0
    assert horizon_share(0.25, 5, 100) == 0.25
    assert horizon_share("progressive", 0, 11, start=0.25) == pytest.approx(0.25)
    assert horizon_share("progressive", 10, 11, start=0.25) == pytest.approx(1.0)
    assert horizon_share("progressive", 5, 11, start=0.2) == pytest.approx(0.6)
    with pytest.raises(ValueError):
        horizon_share(1.5, 0, 10)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.float)
    # ceil(0.25 * [4, 6, 1]) = [1, 2, 1] tokens of each row
    got = horizon_mask(mask, 0.25)
    assert got.tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert horizon_columns(got) == 2 and horizon_columns(mask) == 6 and horizon_columns(torch.zeros(2, 3)) == 0
    assert horizon_mask(mask, 1.0).tolist() == mask.tolist()


def _sample(answer: str | None = "3", meta: dict | None = None) -> Sample:
    return Sample(id="row-7", messages=[{"role": "user", "content": [{"type": "image"},
                                                                       {"type": "text", "text": "How many?"}]}],
                  images=[], answer=answer, answer_type="number", meta=meta or {})


def test_privileged_sample_adds_the_context_to_a_copy_only():
    from mmrlvr.errors import UserError
    from mmrlvr.train.aux_losses import privileged_sample

    s = _sample()
    p = privileged_sample(s, "answer")
    assert s.messages[0]["content"][1]["text"] == "How many?"  # the student's prompt is untouched
    assert p.messages[0]["content"][1]["text"].startswith("How many?") and "answer, for checking your work: 3" in \
        p.messages[0]["content"][1]["text"]
    assert p.messages[0]["content"][0] == {"type": "image"}
    trace = privileged_sample(_sample(meta={"trace": "two red, one blue"}), "trace")
    assert "trace, for checking your work: two red, one blue" in trace.messages[0]["content"][1]["text"]
    with pytest.raises(UserError, match="sample 'row-7' has no a gold answer|sample 'row-7' has no"):
        privileged_sample(_sample(answer=None), "answer")
    with pytest.raises(UserError, match="'trace' value"):
        privileged_sample(_sample(), "trace")


def _contains(row: list[int], needle: list[int]) -> bool:
    return any(row[i:i + len(needle)] == needle for i in range(len(row) - len(needle) + 1))


def test_the_experts_context_never_reaches_the_students_inputs(tmp_path):
    """Every forward the policy runs during 2 training steps is recorded: the passes with gradient (the update)
    and the sampler's never hold the hint's tokens; the expert's pass holds them, followed by the student's own
    response tokens."""
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", overrides=[
        f"output_dir={tmp_path}/run", "max_steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=12", "data.train_size=8", "eval.at_start=false", "eval.at_end=false", "eval.every=0",
        "progress=false", "save_every=0", "log_rollouts=false", "tensorboard=false",
        "algo.micro_batch_size=3", "algo.aux_losses=[{name: forward_ce, weight: 0.1}]"])  # 3 cuts groups of 4
    trainer = Trainer(cfg)
    tok = getattr(trainer.rt.processor, "tokenizer", trainer.rt.processor)
    needle = tok.encode(", for checking your work:", add_special_tokens=False)
    seen: list[tuple[bool, list[list[int]]]] = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None:
            seen.append((torch.is_grad_enabled(), ids.tolist()))

    handle = trainer.rt.policy.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        trainer.train()
    finally:
        handle.remove()
    with_grad = [rows for grad, rows in seen if grad]
    hinted = [rows for _, rows in seen if any(_contains(r, needle) for r in rows)]
    assert with_grad, "the update's forward was not recorded"
    assert not any(_contains(r, needle) for rows in with_grad for r in rows)
    assert hinted and all(not grad for grad, rows in seen if any(_contains(r, needle) for r in rows))
    assert len(hinted) >= 2  # the expert ran once per step (one micro-batch each)


def test_forward_ce_config_problems_are_reported_before_the_model_loads(tmp_path):
    res = subprocess.run([sys.executable, "-m", "mmrlvr.cli", "train", "configs/demo-tiny.yaml", "--dry-run",
                          "--config-only", f"output_dir={tmp_path}/r",
                          "algo.aux_losses=[{name: forward_ce, weight: 0, params: {horizon: 2}}, {name: fwd_ce}, "
                          "{name: forward_ce, params: {top_kk: 3}}]"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 2, res.stderr
    for line in ("algo.aux_losses.0.weight: expected a number > 0, got 0",
                 "algo.aux_losses.1.name: unknown auxiliary loss 'fwd_ce'", "did you mean 'forward_ce'",
                 "algo.aux_losses.2.params.top_kk: unknown parameter of auxiliary loss 'forward_ce'"):
        assert line in res.stderr, res.stderr


def test_the_plan_names_the_stage_and_its_settings(tmp_path):
    res = subprocess.run([sys.executable, "-m", "mmrlvr.cli", "train", "configs/demo-tiny.yaml", "--dry-run",
                          "--config-only", f"output_dir={tmp_path}/r",
                          "algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {horizon: progressive}}]"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "aux_losses" in res.stdout and "algo.aux_losses.0.params.horizon" in res.stdout


# ------------------------------------------------------------------ truncated rollouts (TOPD / POPD, arXiv 2605.31490)


def _cfg(tmp_path, *overrides):
    from mmrlvr.config import load_config

    return load_config(ROOT / "configs" / "demo-tiny.yaml", overrides=[f"output_dir={tmp_path}/r", *overrides])


def test_the_rollout_cap_follows_the_horizon_by_hand(tmp_path):
    """max_new_tokens 32: a fixed share 0.25 caps every step at ceil(8) = 8 tokens; progressive from 0.25 over 4
    steps: shares 0.25, 0.5, 0.75, 1 -> caps 8, 16, 24, 32; the full rollout (the default) never cuts."""
    from mmrlvr.train.aux_losses import rollout_token_cap

    fixed = _cfg(tmp_path, "rollout.max_new_tokens=32",
                 "algo.aux_losses=[{name: forward_ce, params: {horizon: 0.25, rollout: truncated}}]")
    assert [rollout_token_cap(fixed, s) for s in range(3)] == [8, 8, 8]
    grow = _cfg(tmp_path, "rollout.max_new_tokens=32", "algo.aux_losses=[{name: forward_ce, params: {horizon: "
                "progressive, horizon_start: 0.25, horizon_steps: 4, rollout: truncated}}]")
    assert [rollout_token_cap(grow, s) for s in range(4)] == [8, 16, 24, 32]
    masked = _cfg(tmp_path, "rollout.max_new_tokens=32", "algo.aux_losses=[{name: forward_ce, params: {horizon: 0.25}}]")
    assert rollout_token_cap(masked, 0) == 32


def test_truncated_rollouts_generate_only_what_the_expert_scores(tmp_path):
    """2 steps at horizon 0.25 of 32 tokens: every response has at most 8 tokens and the expert scores all of them
    (teacher token share 1), where the masked horizon generates up to 32 and scores a quarter."""
    import json

    from analysis_helpers import train_tiny_run

    run = train_tiny_run(tmp_path / "t", "max_steps=2", "rollout.max_new_tokens=32",
                         "algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {horizon: 0.25, rollout: truncated}}]")
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]
    assert all(r["rollout/token_cap"] == 8 and r["distill/teacher_token_share"] == 1.0 for r in rows)
    import pandas as pd

    frame = pd.concat(pd.read_parquet(p) for p in sorted((run / "rollouts").glob("step-*.parquet")))
    lengths = frame["response_token_ids"].map(len)
    assert lengths.max() <= 8 and lengths.max() == 8


@pytest.mark.parametrize("opts, text", [
    (["algo.aux_losses=[{name: forward_ce, params: {rollout: truncated}}]"], "rollout: truncated needs a horizon"),
    (["rollout.strategy=tree", "algo.aux_losses=[{name: forward_ce, params: {horizon: 0.5, rollout: truncated}}]"],
     "rollout: truncated cuts flat groups' responses only; rollout.strategy: tree"),
    (["algo.aux_losses=[{name: forward_ce, params: {horizon: 0.5, rollout: cut}}]"], "must be one of full, truncated"),
])
def test_truncated_rollout_problems_are_named(tmp_path, opts, text):
    res = subprocess.run([sys.executable, "-m", "mmrlvr.cli", "train", "configs/demo-tiny.yaml", "--dry-run",
                          "--config-only", f"output_dir={tmp_path}/r", *opts],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 2 and text in res.stderr, res.stderr
