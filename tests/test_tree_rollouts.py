"""Tree rollouts (``rollout.strategy: tree``, TreeRPO): sibling-normalised advantages on a hand-built tree, the
prompt and shared segments computed once (counted forward passes), the sampler's log-probs equal to a teacher-forced
recompute, 20 training steps with an exact resume, and two ranks (matrix)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from analysis_helpers import assert_same_final_state, cli, interrupted_copy, train_tiny_run
from mmrlvr.algos.advantages import grpo_advantages
from mmrlvr.algos.tree import tree_advantages

ROOT = Path(__file__).resolve().parents[1]


def test_sibling_normalised_advantages_on_a_hand_built_tree():
    # one prompt, depth 2, branching 2: leaves (A1, A2) under node A, (B1, B2) under B; rewards 1, 0, 1, 1.
    # V(A) = 0.5, V(B) = 1. Siblings A, B: mean 0.75, unbiased std sqrt(((0.25)^2 * 2) / 1) = 0.3536
    # -> A(A) = -0.25 / 0.3536 = -0.7071, A(B) = +0.7071. Under A: leaves 1, 0 -> +0.7071, -0.7071; under B no spread: 0.
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    node = torch.tensor([[0, 10], [0, 11], [1, 12], [1, 13]])
    parents = [torch.zeros(4, dtype=torch.long), node[:, 0]]
    adv, per_depth = tree_advantages(rewards, node, parents, starts=[0, 3], lengths=[3, 2], response_length=6,
                                     estimator=lambda v, g: grpo_advantages(v, g))
    s = math.sqrt(2 * 0.25 ** 2)
    a_top, a_leaf = 0.25 / s, 0.5 / math.sqrt(2 * 0.5 ** 2)
    expect = torch.tensor([
        [-a_top] * 3 + [a_leaf] * 2 + [0.0],
        [-a_top] * 3 + [-a_leaf] * 2 + [0.0],
        [a_top] * 3 + [0.0] * 2 + [0.0],
        [a_top] * 3 + [0.0] * 2 + [0.0],
    ])
    torch.testing.assert_close(adv, expect, rtol=1e-4, atol=1e-5)
    assert per_depth == pytest.approx([a_top, a_leaf / 2], rel=1e-4)


def test_depth_one_is_the_flat_group_advantage():
    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(12, generator=g) > 0.5).float()
    groups = torch.arange(3).repeat_interleave(4)
    node = torch.arange(12)[:, None]
    adv, _ = tree_advantages(rewards, node, [groups], [0], [5], 5, lambda v, gi: grpo_advantages(v, gi))
    torch.testing.assert_close(adv[:, 0], grpo_advantages(rewards, groups))
    assert torch.equal(adv, adv[:, :1].expand(-1, 5))


@pytest.fixture(scope="module")
def engine():
    from mmrlvr.models import load_policy
    from mmrlvr.rollout.hf import HFEngine
    from mmrlvr.train.model_path import resolve_model_path

    model, processor = load_policy(resolve_model_path("tiny:qwen2_5_vl:warm"))
    return HFEngine(model, processor)


def _samples(n: int):
    from mmrlvr.data import make_rows, rows_to_samples

    return rows_to_samples(make_rows("count", "train", n, seed=3))


def test_prompt_and_shared_segments_are_computed_once_and_logprobs_match_a_recompute(engine):
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.rollout.tree import generate_tree
    from mmrlvr.train.forward import token_logprobs

    model = engine.model
    core = model.model
    positions, vision_calls = [], []
    h1 = core.language_model.register_forward_pre_hook(
        lambda m, a, k: positions.append(int((k.get("inputs_embeds") if k.get("inputs_embeds") is not None
                                              else a[0]).shape[0] * (k.get("inputs_embeds") if k.get("inputs_embeds")
                                                                     is not None else a[0]).shape[1])),
        with_kwargs=True)
    h2 = core.visual.register_forward_pre_hook(lambda m, a: vision_calls.append(1))
    samples = _samples(2)
    try:
        batch, tree = generate_tree(engine, samples, SamplingParams(max_new_tokens=24), depth=2, branching=3,
                                    segment_length=8, seed=0, step=0)
    finally:
        h1.remove()
        h2.remove()
    B, N, P = 2, 3, batch.prompt_length
    assert batch.num_rows == B * N ** 2 and tree.node.shape == (18, 2)
    assert len(vision_calls) == 1  # the images once, for both prompts' trees
    # the prompt once (all but its last token), then one position per row per decoding step: depth 1 decodes
    # B*N rows (the first step also feeds the prompt's last token), depth 2 B*N^2 rows
    l1, l2 = tree.lengths
    assert sum(positions) == B * (P - 1) + B * N * l1 + B * N ** 2 * l2
    # flat groups of N^2 samples would run every prompt N^2 times and both segments for every leaf
    assert sum(positions) < B * N ** 2 * (P + l1 + l2)
    # leaves under one depth-1 node share its segment, token for token
    r = batch.response_ids
    assert torch.equal(r[0, :l1], r[1, :l1]) and torch.equal(r[0, :l1], r[2, :l1])
    # the sampler's log-probs are the model's, teacher-forced over the whole leaf (the cache's positions are right)
    lp, _ = token_logprobs(model, batch.model_inputs(), batch.response_ids, 1.0)
    m = batch.response_mask
    assert float(((lp.detach() - batch.old_logprobs) * m).abs().max()) < 1e-4


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"reward/mean"' in ln]


def test_tree_trains_20_steps_and_resumes_exactly(tmp_path):
    opts = ["rollout.strategy=tree", "rollout.strategy_params={depth: 2, branching: 2}", "rollout.max_new_tokens=24",
            "save_every=10"]
    straight = _metrics(train_tiny_run(tmp_path / "a", "max_steps=20", *opts))
    interrupted_copy(tmp_path / "a", tmp_path / "b", 10)
    resumed = _metrics(train_tiny_run(tmp_path / "b", "max_steps=20", "--resume", *opts))
    clean = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in straight[10:]]
    assert clean == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed[-10:]]
    assert all(r["group_size/mean"] == 4 and "tree/abs_advantage_depth2" in r for r in straight)
    assert_same_final_state(tmp_path / "a", tmp_path / "b")


def test_tree_config_problems(tmp_path):
    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/r",
              "rollout.strategy=tree", "rollout.strategy_params={depth: 0, branching: 1, width: 3}",
              "rollout.sampler=budget")
    assert res.returncode == 2
    for text in ("rollout.strategy_params.depth: an integer >= 1", "rollout.strategy_params.branching: an integer >= 2",
                 "unknown key(s) width", "rollout.sampler: budget sizes groups"):
        assert text in res.stderr, res.stderr
    ok = cli("train", "configs/demo-tiny.yaml", "--dry-run", f"output_dir={tmp_path}/r2", "rollout.strategy=tree")
    assert ok.returncode == 0 and "generate" in ok.stdout and "tree" in ok.stdout, ok.stderr


@pytest.mark.matrix
def test_tree_on_two_ranks_trains_what_one_process_trains(tmp_path):
    from multiproc import assert_two_ranks_train_what_one_process_trains

    assert_two_ranks_train_what_one_process_trains(tmp_path, "rollout.strategy=tree",
                                                   "rollout.strategy_params={depth: 2, branching: 2}")
