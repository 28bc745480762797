"""Every CPU config in configs/ runs: two training steps each, with a tiny held-out eval.

(The Qwen2.5-VL 3B/7B configs need a GPU and real checkpoints; tests/test_gpu_configs_on_cpu.py runs their
pipeline with a tiny stand-in model, and tests/test_config.py validates them and builds their rewards.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrlvr.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CPU_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if load_config(p).model.path.startswith("tiny:"))
#: configs whose own warm start costs more than the suite can spend: their pipeline (every other key as shipped)
#: runs here from the count warm start. zoom-tiny's two-turn warm start takes ~50 min on 2 cores; it is built and
#: measured by benchmarks/zoom_no_tool.py and the zoom study (docs/multiturn.md), and its machinery is tested in
#: tests/test_models_warmstart.py.
MODEL_STAND_INS = {"zoom-tiny.yaml": ["model.path=tiny:qwen2_5_vl:warm:count"]}


@pytest.mark.parametrize("path", CPU_CONFIGS, ids=lambda p: p.name)
def test_cpu_config_trains_two_steps(path, tmp_path):
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(path, [f"output_dir={tmp_path / 'run'}", "max_steps=2", "save_every=0", "eval.every=0",
                             "eval.k=2", "data.eval_size=4", "rollout.prompts_per_step=4", "progress=false",
                             *MODEL_STAND_INS.get(path.name, [])])
    summary = Trainer(cfg).train()
    assert summary["skipped_steps"] == 0
    assert summary["last"]["loss"] is not None and "after" in summary
