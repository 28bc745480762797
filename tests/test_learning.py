"""It learns: GRPO from the warm-started tiny VLM raises held-out accuracy; a learning-rate-0 control does not.

A shorter version of ``benchmarks/learning.py`` (which runs the full demo config on 2 seeds). Held-out
evaluation is deterministic (per-row seeded sampling), so the lr-0 control must reproduce its starting
numbers exactly, and any gain of the trained run is the policy's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrlvr.config import load_config

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(tmp: Path, name: str, steps: int, lr: float, *overrides: str) -> dict:
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", [
        f"output_dir={tmp / name}", f"max_steps={steps}", f"optim.lr={lr}", "save_every=0", "eval.every=0",
        "progress=false", "log_rollouts=false", "tensorboard=false", "data.eval_size=200", *overrides,
    ])
    return Trainer(cfg).train()


def test_grpo_raises_heldout_accuracy_and_the_lr0_control_stays_flat(tmp_path):
    trained = _run(tmp_path, "trained", steps=100, lr=1e-4)
    # the control starts from the same weights, so the trained run's "before" is its start: evaluating it
    # again (200 prompts x 9 generations, about a quarter of this test's CPU) would only repeat those numbers
    control = _run(tmp_path, "control", 3, 0.0, "eval.at_start=false")
    b, a = trained["before"], trained["after"]
    # the control's policy never changes, so its held-out numbers are the start's, exactly
    assert control["after"]["avg@8"] == pytest.approx(b["avg@8"], abs=1e-9)
    assert control["after"]["greedy_accuracy"] == pytest.approx(b["greedy_accuracy"], abs=1e-9)
    gain = a["avg@8"] - b["avg@8"]
    print(f"avg@8 {b['avg@8']:.3f} -> {a['avg@8']:.3f}; greedy {b['greedy_accuracy']:.3f} -> "
          f"{a['greedy_accuracy']:.3f}; format {a['format_rate']:.3f}")
    assert gain >= 0.03, f"avg@8 rose only {gain:+.3f} in 100 steps"
    assert a["greedy_accuracy"] >= b["greedy_accuracy"] - 0.03
    assert a["format_rate"] >= 0.95
