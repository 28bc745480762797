"""Trainer building blocks that need no model: data order, sharding, metrics file, checkpoint folders."""

import json

import pytest
import torch

from mmrlvr.errors import UserError
from mmrlvr.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from mmrlvr.train.data import DataOrder, shard
from mmrlvr.train.metrics import MetricsWriter, read_metrics


def test_data_order_is_a_function_of_seed_and_step():
    a, b = DataOrder(10, 4, seed=3), DataOrder(10, 4, seed=3)
    # a fresh object (as after a resume) gives the same prompts for the same step
    assert [a.indices(s) for s in range(6)] == [b.indices(s) for s in range(6)]
    assert DataOrder(10, 4, seed=4).indices(0) != a.indices(0)


def test_data_order_covers_each_epoch_exactly_once():
    order = DataOrder(12, 4, seed=0)
    epoch0 = sum((order.indices(s) for s in range(3)), [])
    assert sorted(epoch0) == list(range(12))
    epoch1 = sum((order.indices(s) for s in range(3, 6)), [])
    assert sorted(epoch1) == list(range(12)) and epoch1 != epoch0  # reshuffled


def test_shard_splits_contiguously_and_rejects_uneven():
    items = list(range(8))
    assert shard(items, 0, 2) == [0, 1, 2, 3] and shard(items, 1, 2) == [4, 5, 6, 7]
    with pytest.raises(UserError, match="divisible"):
        shard(list(range(5)), 0, 2)


def test_metrics_file_survives_a_torn_line_and_truncates_on_resume(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        w.log(step, {"loss": 0.5 * step, "kl": float("nan")})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "loss": 0.')  # a crash in the middle of a write
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["kl"] is None  # NaN is stored as null, the file stays valid JSON lines
    w.truncate_after(2)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def _tiny_training_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)  # frozen weights are not checkpointed
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def test_checkpoint_round_trip_and_pruning(tmp_path):
    model, opt, sched = _tiny_training_state()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, opt, sched, {"note": "x"}, keep=2)
    found = list_checkpoints(tmp_path)
    assert [p.name for p in found] == ["step-00000002", "step-00000003"]
    from safetensors.torch import load_file

    saved = load_file(found[-1] / "trainable.safetensors")
    assert "0.weight" not in saved and "1.weight" in saved
    model2, opt2, sched2 = _tiny_training_state()
    with torch.no_grad():
        model2[1].weight.zero_()
    torch.manual_seed(123)
    state = load_checkpoint(found[-1], model2, opt2, sched2)
    assert state["step"] == 3 and state["note"] == "x"
    torch.testing.assert_close(model2[1].weight, model[1].weight)
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_half_written_checkpoint_is_ignored(tmp_path):
    model, opt, sched = _tiny_training_state()
    save_checkpoint(tmp_path, 1, model, opt, sched, {})
    # a crash while writing step 2 leaves only a temporary folder
    partial = tmp_path / "checkpoints" / ".tmp-step-00000002-999"
    partial.mkdir()
    (partial / "trainable.pt").write_bytes(b"partial")
    # and a folder with the final name but no state.json is not complete either
    (tmp_path / "checkpoints" / "step-00000003").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000001"]
    assert json.loads((list_checkpoints(tmp_path)[0] / "state.json").read_text())["step"] == 1
