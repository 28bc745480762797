"""``model.heap_mmap_threshold_mib``: the policy pass maps its large buffers on their own, so freeing them gives
memory back to the OS (mmrlvr/train/host_memory.py). Each allocator check runs in a fresh interpreter: glibc's
thresholds are process state that earlier tests would have moved."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from mmrlvr.train import host_memory

pytestmark = pytest.mark.skipif(host_memory.glibc() is None, reason="glibc's mallopt only")

_CHURN = r"""
import json, sys, torch
from mmrlvr.train.host_memory import policy_pass_heap

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmRSS"))

def churn():
    # activations of ~6 MiB, each followed by a small block that outlives it (as autograd's bookkeeping does)
    big, small = [], []
    for _ in range(40):
        big.append(torch.ones(6 << 18))
        small.append(torch.ones(16))
    before = rss()
    big.clear()
    return before - rss()

x = torch.ones(30 << 18); del x   # a freed 30 MiB mapping raises glibc's dynamic threshold, as a long run does
mode = sys.argv[1]
if mode == "default":
    print(json.dumps({"applied": None, "freed": churn()}))
elif mode == "pass":
    with policy_pass_heap(4) as applied:
        freed = churn()
    print(json.dumps({"applied": applied, "freed": freed}))
elif mode == "after":
    with policy_pass_heap(4) as applied:
        pass
    print(json.dumps({"applied": applied, "freed": churn()}))
elif mode == "cuda":
    with policy_pass_heap(4, on_cpu=False) as applied:
        freed = churn()
    print(json.dumps({"applied": applied, "freed": freed}))
"""


def _run(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


_DEFAULT: list[dict] = []


def _default_keeps_holes() -> dict:
    """The premise of the checks below: with glibc's own (risen) threshold, freed 6 MiB activations stay
    resident. Whether they do depends on the heap's layout, which depends on what the interpreter loaded before
    (seen here: a checkout at another path gave 180 MiB back by itself, at the commit that added these tests
    too). Where the premise does not hold there is nothing to show: skip, saying so."""
    if not _DEFAULT:
        _DEFAULT.append(_run("default"))
    default = _DEFAULT[0]
    if default["freed"] >= 60:
        pytest.skip(f"this heap layout returns freed 6 MiB blocks by itself ({default['freed']} MiB of 240): the "
                    f"resident-holes premise does not hold here")
    return default


def test_freed_activations_stay_resident_by_default_and_go_back_in_the_policy_pass():
    default, in_pass = _default_keeps_holes(), _run("pass")
    # 40 x 6 MiB = 240 MiB freed: with glibc's risen threshold they are holes in the heap, still resident ...
    assert default["freed"] < 60, default
    # ... inside the pass each was its own mapping, unmapped on free
    assert in_pass["applied"] is True and in_pass["freed"] >= 200, in_pass


def _like_default(mode: str) -> dict:
    """``mode``'s result, which should keep the freed blocks resident as the default does. The kernel may also take
    cold pages back by itself (this machine runs a DAMON reclaimer, ``kdamond``), which looks like freed memory: a
    run that frees much is repeated beside a fresh default run, and where that default frees as much the premise
    does not hold at this moment — skip, saying so."""
    _default_keeps_holes()
    out = _run(mode)
    if out["freed"] >= 60:
        control = _run("default")
        if control["freed"] >= 60:
            pytest.skip(f"the default run just returned {control['freed']} MiB by itself (the kernel reclaims cold "
                        f"pages here): nothing to compare")
        out = _run(mode)
    return out


def test_after_the_pass_the_heap_serves_buffers_under_32_mib_again():
    after = _like_default("after")  # generation's per-token buffers are cheaper from the heap than from fresh mappings
    assert after["applied"] is True and after["freed"] < 60, after


def test_zero_or_a_cuda_model_leaves_the_allocator_alone():
    cuda = _like_default("cuda")
    assert cuda["applied"] is False and cuda["freed"] < 60, cuda
    with host_memory.policy_pass_heap(0) as applied:
        assert applied is False


def test_a_pass_computes_the_same_bits_with_mapped_buffers():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    x = torch.randn(256, 512)  # activations of 256 x 2048 floats = 2 MiB, above the 1 MiB threshold below

    def grads():
        net.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
        return [p.grad.clone() for p in net.parameters()]

    plain = grads()
    with host_memory.policy_pass_heap(1) as applied:
        mapped = grads()
    assert applied
    for a, b in zip(plain, mapped, strict=True):
        assert torch.equal(a, b)


def test_the_update_stage_runs_inside_it_with_the_configured_threshold(tmp_path, monkeypatch):
    from mmrlvr.config import load_config
    from mmrlvr.models.tiny import build_tiny
    from mmrlvr.train.stages import update
    from mmrlvr.train.trainer import Trainer
    from tests.test_train_loop import small_config

    seen: list[tuple[int, bool, bool]] = []
    real = update.policy_pass_heap

    def spy(mib, *, on_cpu=True):
        cm = real(mib, on_cpu=on_cpu)

        class Recording:
            def __enter__(self):
                applied = cm.__enter__()
                seen.append((mib, on_cpu, applied))
                return applied

            def __exit__(self, *exc):
                return cm.__exit__(*exc)

        return Recording()

    monkeypatch.setattr(update, "policy_pass_heap", spy)
    tiny = build_tiny("qwen2_5_vl", tmp_path / "m")
    cfg = small_config(str(tiny), tmp_path / "run", max_steps=2, log_rollouts=False, model__heap_mmap_threshold_mib=8)
    Trainer(load_config(data=cfg)).train()
    assert seen == [(8, True, True), (8, True, True)], seen
