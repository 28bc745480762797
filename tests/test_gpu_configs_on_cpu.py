"""The Qwen2.5-VL 3B/7B LoRA configs run their whole pipeline on CPU, with a tiny stand-in model.

What a GPU run of ``configs/qwen2_5_vl_*_geometry3k_lora.yaml`` needs besides the GPU is exercised here:
an EasyR1/Geometry3K-format Parquet file (problem with ``<image>``, answer, an image list), the ``boxed``
template, the math-verify accuracy and format rewards, a real peft LoRA adapter on the listed target
modules with the adapter-disabled reference, and the trainer's update and eval. Swapped for CPU: the
checkpoint (a tiny Qwen2.5-VL folder — the same loading code as a real one), the rollout engine (``hf``
instead of ``vllm``), dtype float32, and the batch sizes. The vLLM engine itself is checked on a GPU by
``benchmarks/gpu_check.sh``.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from mmrlvr.config import load_config

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if not load_config(p).model.path.startswith("tiny:"))


def _png(colour: tuple[int, int, int], size=(84, 84)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def geometry3k_like(tmp_path_factory) -> Path:
    """A Geometry3K-format Parquet (EasyR1's columns: problem, answer, images as an Image list)."""
    import datasets

    folder = tmp_path_factory.mktemp("geo3k")
    features = datasets.Features({"problem": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "images": datasets.List(datasets.Image())})
    problems = ["<image>Find x. The angle at A is 30.", "<image>Find the area of the triangle.",
                "<image>Find y so that the lines are parallel.", "<image>Find the measure of angle 2."]
    answers = ["60", "24", "\\frac{7}{2}", "110"]
    ds = datasets.Dataset.from_dict({
        "problem": problems, "answer": answers,
        "images": [[{"bytes": _png((40 * i, 90, 200)), "path": None}] for i in range(len(problems))],
    }, features=features)
    for split in ("train", "test"):
        ds.to_parquet(str(folder / f"{split}.parquet"))
    return folder


@pytest.fixture(scope="module")
def tiny_qwen2_5_vl(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def test_there_are_gpu_configs():
    assert {p.name for p in GPU_CONFIGS} >= {"qwen2_5_vl_3b_geometry3k_lora.yaml", "qwen2_5_vl_7b_geometry3k_lora.yaml"}


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.name)
def test_gpu_config_pipeline_runs_on_cpu(path, tmp_path, geometry3k_like, tiny_qwen2_5_vl):
    from mmrlvr.train.metrics import read_metrics
    from mmrlvr.train.trainer import Trainer

    full = load_config(path)
    assert full.rollout.engine == "vllm" and full.model.lora.enabled and full.data.preset == "easyr1"
    cfg = load_config(path, [
        f"output_dir={tmp_path / 'run'}", f"model.path={tiny_qwen2_5_vl}", "model.dtype=float32",
        f"data.train={geometry3k_like / 'train.parquet'}", f"data.eval={geometry3k_like / 'test.parquet'}",
        "rollout.engine=hf", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=16",
        "algo.micro_batch_size=2", "max_steps=2", "save_every=2", "eval.every=0", "eval.k=2", "eval.limit=2",
        "progress=false", "tensorboard=false"])
    trainer = Trainer(cfg)
    trainable = [n for n, p in trainer.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)  # real peft adapter, vision tower frozen
    for module in full.model.lora.target_modules:
        assert any(f".{module}." in n for n in trainable), module
    assert trainer.ref_model is None  # the reference is the adapter-disabled policy
    assert all("\\boxed" in str(s.messages) for s in trainer.train_samples)  # the boxed template
    summary = trainer.train()
    assert summary["skipped_steps"] == 0 and "after" in summary
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(k in rows[-1] for k in ("reward/format", "reward/accuracy", "kl"))
    assert (tmp_path / "run" / "checkpoints" / "step-00000002").is_dir()
