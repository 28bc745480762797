"""TensorPeak, the memory figure of benchmarks/credit_overhead.py: a buffer of known size alive during the work
moves the peak by exactly that size, inside an operator-heavy block and inside a real trainer step; the same
step measured in two trainers gives the same figure."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from script_module import load_script

from mmrlvr.train.tensor_memory import TensorPeak

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "credit_overhead.py"
MIB = 2**20


def _work(planted_bytes: int = 0) -> torch.Tensor:
    x = torch.randn(256, 256)  # 256 KiB
    y = x @ x  # another 256 KiB, both alive at the peak
    planted = torch.empty(planted_bytes, dtype=torch.uint8) if planted_bytes else None
    z = torch.relu(y).sum()
    del planted
    return z


def test_a_planted_buffer_moves_the_peak_by_its_size_and_is_gone_at_the_end():
    with TensorPeak() as base:
        _work()
    with TensorPeak() as planted:
        _work(3 * MIB + 17)
    assert base.increment >= 3 * 256 * 1024  # x, y and relu(y) alive at once
    assert planted.increment - base.increment == 3 * MIB + 17
    assert base.net == planted.net  # what the block returned (a 0-d tensor) and nothing of the planted buffer


def test_tensors_alive_before_the_block_are_not_counted():
    held = torch.ones(8 * MIB // 4)
    with TensorPeak() as m:
        held.add_(1)  # in place: no new buffer
    assert m.increment < MIB and m.net == 0


def test_detail_names_the_operator_at_the_peak():
    with TensorPeak(detail=True) as m:
        with torch.profiler.record_function("stage update/policy_gradient"):
            torch.zeros(4 * MIB // 4).exp()
    assert "stage update/policy_gradient" in m.top and m.top[-1].startswith("aten::")


def test_a_planted_tensor_moves_a_real_trainer_steps_peak_by_its_size(tmp_path):
    """Two trainers on the same config with learning rate 0 run the same step; in one of them a 32 MiB tensor
    lives through the step. The step's increments differ by 32 MiB, and without the plant agree."""
    mod = load_script(BENCH)
    mod.SETTINGS["tiny"]["overrides"] = ["rollout.prompts_per_step=2"]
    trainers = [mod.make_trainer("tiny", "vepo", tmp_path / str(i)) for i in range(3)]
    planted_bytes = 32 * MIB
    run = trainers[1].pipeline.run

    def with_plant(step, *args, **kwargs):
        plant = torch.empty(planted_bytes, dtype=torch.uint8)
        try:
            return run(step, *args, **kwargs)
        finally:
            del plant

    trainers[1].pipeline.run = with_plant
    for t in trainers:
        t.run_step(0)  # warm-up, as the benchmark does
    peaks = []
    for t in trainers:
        with TensorPeak(next(t.policy.parameters()).device) as m:
            t.run_step(1)
        peaks.append(m.increment)
    assert peaks[0] > 0
    # the same step in another trainer: the same figure (the process's first trainer allocates ~23 KB more)
    assert abs(peaks[2] - peaks[0]) <= 0.005 * peaks[0]
    assert peaks[1] - peaks[2] == pytest.approx(planted_bytes, abs=0.001 * peaks[2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_figure_is_the_allocators_peak():
    torch.cuda.synchronize()
    with TensorPeak("cuda") as base:
        torch.randn(1024, 1024, device="cuda").relu()
    with TensorPeak("cuda") as planted:
        extra = torch.empty(16 * MIB, dtype=torch.uint8, device="cuda")
        torch.randn(1024, 1024, device="cuda").relu()
        del extra
    assert planted.increment - base.increment == 16 * MIB
    assert planted.reserved is not None and planted.reserved >= 0
