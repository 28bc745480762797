"""``model.prefix_sharing`` in the trainer: the reference, old-policy and policy passes run each group's prompt
once, and a step computes what the whole-row passes compute (up to float rounding)."""

from __future__ import annotations

import pytest

from mmrlvr.config import load_config
from mmrlvr.train.metrics import read_metrics
from tests.test_train_loop import small_config


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def _step_one(tiny_dir, out, monkeypatch, share: bool, **extra) -> tuple[dict, list[tuple[int, bool]]]:
    import mmrlvr.credit.signals as signals
    from mmrlvr.train.trainer import Trainer

    calls: list[tuple[int, bool]] = []
    real = getattr(signals.shared_prefix_states, "real", signals.shared_prefix_states)  # not an earlier spy

    def spy(backbone, inputs, P, L, G, **kw):
        states = real(backbone, inputs, P, L, G, **kw)
        if states is not None:
            calls.append((G, kw.get("grad", False)))
        return states

    spy.real = real
    monkeypatch.setattr(signals, "shared_prefix_states", spy)
    cfg = small_config(tiny_dir, out, max_steps=1, model__prefix_sharing=share, algo__recompute_old_logprobs=True,
                       log_rollouts=False, **extra)
    Trainer(load_config(data=cfg)).train()
    row = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r][0]
    return row, calls


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_step_with_shared_prefixes_equals_the_whole_row_step(tiny_dir, tmp_path, monkeypatch, lora):
    extra = {"model__lora__enabled": True} if lora else {}
    whole, none = _step_one(tiny_dir, tmp_path / "whole", monkeypatch, False, **extra)
    shared, calls = _step_one(tiny_dir, tmp_path / "shared", monkeypatch, True, **extra)
    assert not none
    # 16 rows in micro-batches of 8 (two groups of 4 each): old policy + reference without gradient, the
    # policy pass with it, each on both micro-batches
    assert calls.count((4, False)) == 4 and calls.count((4, True)) == 2, calls
    for key in ("loss", "kl", "grad_norm", "ratio/mean", "entropy/mean", "reward/mean"):
        assert shared[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
    # the recomputed pi_old reproduces the sampler's log-probs as closely as the whole-row pass does
    assert shared["rollout/logprob_abs_diff"] == pytest.approx(whole["rollout/logprob_abs_diff"], abs=1e-6)


def test_gradient_checkpointing_keeps_the_policy_pass_whole(tiny_dir, tmp_path, monkeypatch):
    _, calls = _step_one(tiny_dir, tmp_path / "ckpt", monkeypatch, True, model__gradient_checkpointing=True)
    assert calls and all(not grad for _, grad in calls)  # no-grad passes share; the checkpointed one does not


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_the_other_qwen_families_share_and_equal_the_whole_row_step(tmp_path_factory, tmp_path, monkeypatch, family):
    """Qwen2-VL (no window attention in the tower) and Qwen3-VL (deepstack features merged into early layers)
    reach the shared path too, with the whole-row step's numbers."""
    from mmrlvr.models.tiny import build_tiny

    model_dir = str(build_tiny(family, tmp_path_factory.mktemp(family) / "m"))
    whole, none = _step_one(model_dir, tmp_path / "whole", monkeypatch, False)
    shared, calls = _step_one(model_dir, tmp_path / "shared", monkeypatch, True)
    assert not none and calls.count((4, False)) == 4 and calls.count((4, True)) == 2, calls
    for key in ("loss", "kl", "grad_norm", "ratio/mean", "entropy/mean", "reward/mean"):
        assert shared[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
    assert shared["rollout/logprob_abs_diff"] == pytest.approx(whole["rollout/logprob_abs_diff"], abs=1e-6)


def test_a_step_computes_each_rows_positions_once(tiny_dir, tmp_path, monkeypatch):
    """The old-policy, reference and policy passes share each micro-batch's rows: the model's own position
    computation runs for the rows the step has not seen yet, not once per pass."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    from mmrlvr.models import positions

    positions.clear()
    rows: list[int] = []
    real = Qwen2_5_VLModel.compute_3d_position_ids

    def counting(self, *a, **kw):
        out = real(self, *a, **kw)
        if kw.get("cache") is None and kw.get("input_ids") is not None and kw["input_ids"].shape[1] > 1:
            rows.append(kw["input_ids"].shape[0])  # a teacher-forced pass's call (generation steps pass a cache)
        return out

    monkeypatch.setattr(Qwen2_5_VLModel, "compute_3d_position_ids", counting)
    _, calls = _step_one(tiny_dir, tmp_path / "shared", monkeypatch, True)
    assert len(calls) == 6  # six shared passes ran (old policy, reference, policy on two micro-batches)
    assert 0 < sum(rows) <= 16, rows  # at most the step's 16 rows, once each
