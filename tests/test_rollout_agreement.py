"""Rollout/trainer agreement: the statistics by hand, the tokens after an image, and every step of a real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmrlvr.algos.agreement import after_image_mask, agreement_metrics
from mmrlvr.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_statistics_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -3.0, -0.5], [-0.1, -0.2, 0.0, 0.0]])
    sampler = torch.tensor([[-1.05, -2.2, -9.0, -0.5], [-0.1, -0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    head = torch.tensor([[True, False, False, False], [True, True, False, False]])
    m = agreement_metrics(trainer, sampler, mask, head, threshold=0.1)
    # |delta| over the five sampled tokens: 0.05, 0.2, 0 (row 0), 0, 0.3 (row 1); the masked 6.0 never counts
    assert m["rollout/logprob_abs_diff"] == pytest.approx((0.05 + 0.2 + 0.0 + 0.0 + 0.3) / 5)
    assert m["rollout/logprob_abs_diff_max"] == pytest.approx(0.3)
    assert m["rollout/logprob_mismatch_share"] == pytest.approx(2 / 5)  # 0.2 and 0.3 exceed 0.1
    assert m["rollout/after_image/tokens"] == 3 and m["rollout/rest/tokens"] == 2
    assert m["rollout/after_image/logprob_abs_diff"] == pytest.approx((0.05 + 0.0 + 0.3) / 3)
    assert m["rollout/rest/logprob_abs_diff"] == pytest.approx((0.2 + 0.0) / 2)


def test_no_sampled_token_gives_no_statistics():
    z = torch.zeros(2, 3)
    assert agreement_metrics(z, z, z) == {}


def test_tokens_after_an_image_one_turn_and_tool_turns():
    mask = torch.zeros(3, 24)
    mask[0, :12] = 1  # one turn, image in the prompt
    mask[1, :12] = 1  # one turn, text only
    mask[2, :5] = 1  # model turn, tool turn (5..9: no loss), model turn 10..19
    mask[2, 10:20] = 1
    turns = [None, None, [{"kind": "model", "start": 0, "end": 5}, {"kind": "tool", "start": 5, "end": 10, "images": [1]},
                          {"kind": "model", "start": 10, "end": 20}]]
    head = after_image_mask(mask, [1, 0, 1], turns, first=8)
    assert head[0].nonzero().flatten().tolist() == list(range(8))
    assert not head[1].any()
    assert head[2].nonzero().flatten().tolist() == [0, 1, 2, 3, 4] + list(range(10, 18))
    # a tool turn that returned no image starts no "after the image" span
    turns[2][1]["images"] = []
    assert after_image_mask(mask, [1, 0, 1], turns, first=8)[2].nonzero().flatten().tolist() == [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


@pytest.mark.parametrize("recompute", [False, True])
def test_every_step_logs_the_agreement_with_the_hf_engine(tiny_dir, tmp_path, recompute):
    """The HF engine samples with the trainer's own model, so its gap is float rounding (KV-cached decoding against
    one teacher-forced pass): measured from the update's first pass, or from the recomputed pi_old, every step; the
    rollout records carry each token's gap."""
    from mmrlvr.store.reader import RolloutReader
    from mmrlvr.train.trainer import Trainer

    cfg = {"output_dir": str(tmp_path / "run"), "seed": 0, "max_steps": 2, "save_every": 0, "progress": False,
           "tensorboard": False, "model": {"path": tiny_dir},
           "data": {"train": "synth:count", "train_size": 16},
           "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 16},
           "algo": {"kl_coef": 0.0, "recompute_old_logprobs": recompute},
           "eval": {"at_start": False, "at_end": False},
           "rewards": [{"name": "format", "weight": 1.0}]}
    Trainer(load_config(data=cfg)).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 2
    for r in steps:
        assert 0 <= r["rollout/logprob_abs_diff"] < 1e-4
        assert r["rollout/logprob_abs_diff_max"] < 1e-3
        assert r["rollout/logprob_mismatch_share"] == 0.0
        assert r["rollout/after_image/tokens"] > 0 and r["rollout/rest/tokens"] > 0
    reader = RolloutReader(tmp_path / "run")
    records = [rec for step in reader.steps() for rec in reader.read_step(step)]
    assert records and all(len(rec.token_sampler_gap) == len(rec.response_token_ids) for rec in records)
    assert max(abs(v) for rec in records for v in rec.token_sampler_gap) < 1e-3
