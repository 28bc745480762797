"""Checkpoints: the ecosystem's format, a manifest that catches any damaged file, fallback on resume."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from mmrlvr.config import load_config
from mmrlvr.train.checkpoint import (
    list_checkpoints,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
    verify_checkpoint,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def run_config(model: str, out: Path, *, lora: bool = False, **extra) -> dict:
    cfg = {
        "output_dir": str(out), "seed": 0, "max_steps": 3, "save_every": 1, "keep_checkpoints": 0,
        "progress": False, "tensorboard": False, "log_rollouts": False,
        "model": {"path": model, "lora": {"enabled": lora, "r": 4, "alpha": 8}},
        "data": {"train": "synth:count", "eval": "synth:count", "train_size": 32, "eval_size": 4},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 8},
        "algo": {"kl_coef": 0.05, "micro_batch_size": 8},
        "optim": {"lr": 1e-3, "schedule": "linear"},
        "eval": {"at_start": False, "at_end": False},
        "plugins": [str(ROOT / "tests" / "scripts" / "plugin_rewards.py")],
        "rewards": [{"name": "format", "weight": 0.2}, {"name": "distinct_tokens", "weight": 1.0}],
    }
    cfg.update(extra)
    return cfg


def train(cfg: dict, resume: bool = False):
    from mmrlvr.train.trainer import Trainer

    trainer = Trainer(load_config(data=cfg), resume=resume)
    trainer.train()
    return trainer


def trainable(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def full_run(tiny_dir, tmp_path_factory):
    """An uninterrupted 3-step full fine-tuning run, a checkpoint after every step; its final weights."""
    out = tmp_path_factory.mktemp("full") / "run"
    cfg = run_config(tiny_dir, out)
    trainer = train(cfg)
    return cfg, out, trainable(trainer.policy)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_full_checkpoint_is_a_save_pretrained_folder_with_manifest(full_run):
    from transformers import AutoModelForImageTextToText

    from mmrlvr.models.compat import load_processor

    _, out, final = full_run
    ckpt = out / "checkpoints" / "step-00000003"
    names = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "chat_template.jinja", "tokenizer.json", "state.json",
            "manifest.json", "training_state/optimizer.bin", "training_state/scheduler.bin",
            "training_state/random_states_0.pkl"} <= names
    assert "trainable.pt" not in names
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert set(manifest["files"]) == names - {"manifest.json"}
    for rel, meta in manifest["files"].items():  # sizes and SHA-256 recomputed here, independently
        assert meta["size"] == (ckpt / rel).stat().st_size and meta["sha256"] == sha256(ckpt / rel)
    state = json.loads((ckpt / "state.json").read_text())
    assert state["step"] == 3 and state["weights"] == "transformers"
    model = AutoModelForImageTextToText.from_pretrained(str(ckpt))
    params = dict(model.named_parameters())
    for n, t in final.items():
        assert torch.equal(params[n], t), n
    processor = load_processor(ckpt, "qwen2_5_vl")
    assert processor.chat_template


def test_lora_checkpoint_is_a_peft_adapter_folder(tiny_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    trainer = train(run_config(tiny_dir, tmp_path / "run", lora=True, max_steps=1))
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000001"
    assert (ckpt / "adapter_config.json").is_file() and (ckpt / "adapter_model.safetensors").is_file()
    assert not (ckpt / "model.safetensors").exists()  # the base is not copied into every checkpoint
    assert json.loads((ckpt / "state.json").read_text())["weights"] == "peft"
    base = AutoModelForImageTextToText.from_pretrained(tiny_dir)
    loaded = PeftModel.from_pretrained(base, str(ckpt))
    got = dict(loaded.named_parameters())
    want = trainable(trainer.policy)
    assert want and all("lora_" in n for n in want)
    for n, t in want.items():
        assert torch.equal(got[n], t), n


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.unlink()


def test_any_damaged_file_of_the_newest_checkpoint_is_skipped_with_the_reason(full_run, tmp_path, capsys):
    _, out, _ = full_run
    newest = out / "checkpoints" / "step-00000003"
    files = sorted(p.relative_to(newest).as_posix() for p in newest.rglob("*") if p.is_file())
    assert len(files) >= 10
    for i, rel in enumerate(files):
        for how in ("flip", "truncate", "delete"):
            run = tmp_path / f"r{i}-{how}"
            shutil.copytree(out / "checkpoints", run / "checkpoints")
            _corrupt(run / "checkpoints" / "step-00000003" / rel, how)
            capsys.readouterr()
            found = list_checkpoints(run)
            assert [p.name for p in found][-1] == "step-00000002", (rel, how)
            err = capsys.readouterr().err
            assert "skipping" in err and "step-00000003" in err, (rel, how)
            if rel != "manifest.json":
                assert rel in err, (rel, how, err)  # the reason names the damaged file
            shutil.rmtree(run)


@pytest.mark.parametrize("victim", ["model.safetensors", "training_state/optimizer.bin",
                                    "training_state/random_states_0.pkl", "state.json"])
def test_resume_past_a_corrupt_newest_checkpoint_matches_the_uninterrupted_run(full_run, tmp_path, capsys, victim):
    cfg, out, final = full_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    shutil.rmtree(run / "checkpoints" / "step-00000003")  # killed after the step-2 save...
    _corrupt(run / "checkpoints" / "step-00000002" / victim, "flip")  # ...whose file was then damaged
    (run / "checkpoints" / ".tmp-step-00000003-999999999").mkdir()  # and a killed save's leftovers
    capsys.readouterr()
    trainer = train({**cfg, "output_dir": str(run)}, resume=True)
    out_err = capsys.readouterr()
    assert "step-00000002" in out_err.err and victim in out_err.err
    assert "step-00000001" in out_err.out  # continued from the previous checkpoint
    assert not (run / "checkpoints" / ".tmp-step-00000003-999999999").exists()
    got = trainable(trainer.policy)
    for n, t in final.items():
        assert torch.equal(got[n], t), n


def _tiny_training_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def test_first_format_trainable_pt_checkpoints_still_resume(tmp_path):
    import random

    import numpy as np

    model, opt, sched = _tiny_training_state()
    folder = tmp_path / "checkpoints" / "step-00000004"
    folder.mkdir(parents=True)
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, folder / "trainable.pt")
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    torch.save(sched.state_dict(), folder / "scheduler.pt")
    torch.manual_seed(7)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
               folder / "rng.pt")
    expected_draw = torch.rand(3)
    (folder / "state.json").write_text(json.dumps({"step": 4, "lora": None}))
    assert list_checkpoints(tmp_path) == [folder]
    model2, opt2, sched2 = _tiny_training_state()
    with torch.no_grad():
        model2[1].weight.zero_()
    state = load_checkpoint(folder, model2, opt2, sched2)
    assert state["step"] == 4
    assert torch.equal(model2[1].weight, model[1].weight)
    assert sched2.state_dict()["last_epoch"] == sched.state_dict()["last_epoch"]
    assert torch.equal(torch.rand(3), expected_draw)


def test_plain_module_round_trip_restores_weights_optimizer_scheduler_and_rng(tmp_path):
    model, opt, sched = _tiny_training_state()
    torch.manual_seed(11)
    path = save_checkpoint(tmp_path, 5, model, opt, sched, {"note": "x"})
    expected_draw = torch.rand(2)
    assert verify_checkpoint(path) is None
    model2, opt2, sched2 = _tiny_training_state()
    with torch.no_grad():
        for p in model2.parameters():
            p.zero_()
    state = load_checkpoint(path, model2, opt2, sched2)
    assert state["step"] == 5 and state["note"] == "x"
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert torch.equal(torch.rand(2), expected_draw)


def test_load_checkpoint_refuses_a_damaged_folder_naming_the_file(tmp_path):
    from mmrlvr.errors import UserError

    model, opt, sched = _tiny_training_state()
    path = save_checkpoint(tmp_path, 1, model, opt, sched, {})
    _corrupt(path / "training_state" / "optimizer.bin", "flip")
    with pytest.raises(UserError, match="optimizer.bin"):
        load_checkpoint(path, model, opt, sched)


def test_only_temporaries_of_dead_writers_are_removed(tmp_path):
    import os

    root = tmp_path / "checkpoints"
    dead, alive = root / ".tmp-step-00000002-999999999", root / f".tmp-step-00000003-{os.getpid()}"
    for p in (dead, alive):
        p.mkdir(parents=True)
    assert remove_stale_temporaries(tmp_path) == [dead]
    assert alive.exists() and not dead.exists()
