"""On a CUDA GPU: the trainer's whole step, the fused log-prob path at real vocabulary width, and bf16.

Marked ``gpu``: skipped where torch sees no CUDA device (CI), run by ``benchmarks/gpu_check.sh`` on a GPU
machine. Each test first asserts its premise -- the weights, the batch and the outputs really are on the GPU
and in the dtype asked for -- so that a silent fall-back to the CPU fails instead of passing.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.gpu

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_training_steps_run_on_the_gpu(tiny_dir, tmp_path, dtype, lora):
    from mmrlvr.config import load_config
    from mmrlvr.train.metrics import read_metrics
    from mmrlvr.train.trainer import Trainer

    model = {"path": tiny_dir, "dtype": dtype, "freeze_vision": True}
    if lora:
        model["lora"] = {"enabled": True, "r": 8, "alpha": 16}
    cfg = load_config(data={
        "output_dir": str(tmp_path / "run"), "max_steps": 2, "save_every": 2, "tensorboard": False,
        "progress": False, "model": model,
        "data": {"train": "synth:count", "train_size": 8, "image_size": 56},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 16},
        "algo": {"kl_coef": 0.05, "micro_batch_size": 4},
        # distinct_tokens varies between samples of a random policy: non-zero advantages, so the update moves
        "plugins": [str(ROOT / "tests" / "scripts" / "plugin_rewards.py")],
        "rewards": [{"name": "format", "weight": 0.2}, {"name": "distinct_tokens", "weight": 1.0}],
        "eval": {"at_start": False, "at_end": False},
    })
    trainer = Trainer(cfg)
    trainable = [p for p in trainer.policy.parameters() if p.requires_grad]
    assert trainable, "nothing to train"
    assert all(p.device.type == "cuda" for p in trainer.policy.parameters())  # the premise: on the GPU
    frozen = [p for p in trainer.policy.parameters() if not p.requires_grad]
    assert {p.dtype for p in frozen} == {DTYPES[dtype]}
    # peft keeps adapter weights in float32 over a bf16 base (its autocast_adapter_dtype default)
    assert {p.dtype for p in trainable} == {torch.float32 if lora else DTYPES[dtype]}
    before = [p.detach().clone() for p in trainable]
    torch.cuda.reset_peak_memory_stats()
    summary = trainer.train()
    assert torch.cuda.max_memory_allocated() > 0
    assert summary["skipped_steps"] == 0
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["kl"]) for r in rows)
    assert all(r["grad_norm"] > 0 and math.isfinite(r["grad_norm"]) for r in rows)
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, trainable))  # the update reached it
    assert (tmp_path / "run" / "checkpoints" / "step-00000002").is_dir()


#: every other path through the step, two steps each on the plain tiny model: the stage goldens' configs and
#: variants (tests/stage_goldens.py), the seed methods, prefix sharing and gradient checkpointing
PATHS: list[tuple[str, str, list[str]]] = [
    ("consistency", "configs/consistency-tiny.yaml", []),
    ("split-answer", "configs/consistency-tiny.yaml", ["consistency.split_advantage=true"]),
    ("vepo-deferred", "configs/credit-vepo-tiny.yaml", []),
    ("vppo", "configs/credit-vepo-tiny.yaml", ["credit.scheme=vppo"]),
    ("papo", "configs/credit-vepo-tiny.yaml", ["credit.scheme=papo"]),
    ("rsi", "configs/credit-vepo-tiny.yaml", ["credit.scheme=rsi"]),
    ("vepo-separate-2ep-mb", "configs/credit-vepo-tiny.yaml",
     ["credit.in_update=false", "algo.epochs=2", "algo.micro_batch_size=8"]),
    ("delta", "configs/demo-tiny.yaml", ["credit.scheme=delta"]),
    ("grounding", "configs/grounding-tiny.yaml", []),
    ("rubric", "configs/rubric-tiny.yaml", []),
    ("lora-dapo", "configs/demo-tiny.yaml", ["model.lora.enabled=true", "algo.preset=dapo"]),
    ("cispo-rpp", "configs/demo-tiny.yaml", ["algo.preset=cispo", "algo.advantage=reinforce_pp"]),
    ("popo", "configs/demo-tiny.yaml", ["algo.loss=popo", "algo.loss_params.threshold=0.5"]),
    ("poise", "configs/demo-tiny.yaml", ["algo.advantage=poise", "rollout.group_size=2"]),
    ("acpo", "configs/demo-tiny.yaml", ["algo.clip=acpo", "algo.epochs=2"]),
    ("prefix-sharing", "configs/demo-tiny.yaml", ["model.prefix_sharing=true"]),
    ("checkpointing-lora", "configs/demo-tiny.yaml", ["model.gradient_checkpointing=true", "model.lora.enabled=true"]),
]


@pytest.mark.parametrize("name,config,overrides", PATHS, ids=[p[0] for p in PATHS])
def test_every_step_path_runs_on_the_gpu(tiny_dir, tmp_path, name, config, overrides):
    from mmrlvr.config import load_config
    from mmrlvr.train.metrics import read_metrics
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(ROOT / config, [
        f"output_dir={tmp_path / 'run'}", f"model.path={tiny_dir}", "max_steps=2", "save_every=0", "eval.every=0",
        "eval.at_start=false", "eval.at_end=false", "rollout.prompts_per_step=4", "progress=false",
        "data.train_size=16", *overrides])
    trainer = Trainer(cfg)
    assert all(p.device.type == "cuda" for p in trainer.policy.parameters())  # the premise
    summary = trainer.train()
    assert summary["skipped_steps"] == 0
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]  # a random policy may leave no signal (DAPO, POPO): no loss then
    assert all(math.isfinite(r["loss"]) for r in rows if r.get("loss") is not None)


def _standin_batch(model, tok, side: int, rows: int = 4, length: int = 64):
    import numpy as np
    from PIL import Image

    from mmrlvr.models.tiny import make_processor

    cfg = model.config
    ip = make_processor("qwen2_5_vl", tok, cfg, image_size=side).image_processor
    img = Image.fromarray(np.random.RandomState(0).randint(0, 256, (side, side, 3), dtype=np.uint8))
    vis = ip([img] * rows, return_tensors="pt")
    n_img = int(vis["image_grid_thw"][0].prod()) // 4
    prompt = [5, 9, 11] + [cfg.vision_start_token_id] + [cfg.image_token_id] * n_img + [cfg.vision_end_token_id]
    resp = torch.randint(20, 500, (rows, length), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([torch.tensor([prompt] * rows), resp], 1)
    attn = torch.ones_like(ids)
    attn[1, -length // 2:] = 0  # one ragged row
    inputs = {"input_ids": ids, "attention_mask": attn, **vis}
    return {k: v.cuda() for k, v in inputs.items()}, resp.cuda()


def test_fused_logprobs_equal_the_logits_path_on_a_3b_standin_on_the_gpu():
    """Values, entropies and gradients of the fused (chunked) path against the full-logits path, float32, at
    Qwen2.5-VL-3B widths and the 151,936-token vocabulary (TF32 off, so both are float32 products)."""
    from mmrlvr.algos import entropy_from_logits, logprobs_from_logits
    from mmrlvr.models.standin import standin_model
    from mmrlvr.models.tiny import build_tokenizer
    from mmrlvr.train.forward import fusable_head, response_logits, token_logprobs

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok = build_tokenizer()
    model = standin_model("qwen2_5_vl_3b", tok, layers=1).cuda()
    assert model.config.text_config.vocab_size == 151936 and fusable_head(model) is not None
    inputs, resp = _standin_batch(model, tok, side=112)
    logp, ent = token_logprobs(model, inputs, resp, temperature=0.9, with_entropy=True)
    assert logp.is_cuda and logp.dtype == torch.float32
    logp.sum().backward()
    fused_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    logits = response_logits(model, inputs, resp.shape[1])
    ref = logprobs_from_logits(logits, resp, temperature=0.9)
    ref_ent = entropy_from_logits(logits.detach(), temperature=0.9)
    ref.sum().backward()
    assert_close(logp, ref, atol=1e-5, rtol=1e-5)
    assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert fused_grads
    for n, p in model.named_parameters():
        if n not in fused_grads:
            continue
        if ".visual." in f".{n}":  # cuDNN's convolution backward sums in its own order: compare by norm
            assert float((fused_grads[n] - p.grad).norm() / p.grad.norm().clamp_min(1e-30)) < 1e-4, n
        else:
            assert_close(fused_grads[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)
