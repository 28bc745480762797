"""glibc heap tuning on CPU runs (mmrlvr.train.host_memory): freed tensors give their memory back.

The premise is shown in a fresh process each way: after glibc has raised its mmap threshold (a 24 MiB
tensor freed), 8 MiB tensors come from the heap, and keeping every tenth alive pins the freed ones in
between; with ``tune_malloc()`` they are mmapped and freeing them returns the memory.
"""

import json
import os
import platform
import subprocess
import sys

import pytest

from mmrlvr.train import host_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

SCRIPT = r"""
import json, sys
import torch
from mmrlvr.train.host_memory import tune_malloc
result = tune_malloc() if sys.argv[1] == "tuned" else "untuned"
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
big = torch.ones(3 * 1024 * 1024, dtype=torch.float64)  # 24 MiB, mmapped; freeing it raises the threshold
del big
before = rss_mib()
blocks = [torch.ones(1024 * 1024, dtype=torch.float64) for _ in range(60)]  # 60 x 8 MiB
keep = blocks[9::10]
del blocks
print(json.dumps({"result": result, "held_mib": rss_mib() - before, "kept_mib": 8 * len(keep)}))
"""


def _run(mode: str, **env) -> dict:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "MMRLVR_MALLOC_TUNING"}
    full_env.update(env)
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env=full_env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_tuned_process_returns_freed_tensor_memory():
    untuned, tuned = _run("untuned"), _run("tuned")
    assert tuned["result"] == "applied"
    assert untuned["held_mib"] > untuned["kept_mib"] + 200, untuned  # the premise: the heap keeps freed blocks
    assert tuned["held_mib"] < tuned["kept_mib"] + 60, tuned


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_opt_out_and_user_environment_are_respected():
    assert _run("tuned", MMRLVR_MALLOC_TUNING="0")["result"] == "opted out"
    assert _run("tuned", MALLOC_TRIM_THRESHOLD_="0")["result"] == "user environment"
    assert _run("tuned", LD_PRELOAD="/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")["result"] in (
        "preloaded allocator",)


def test_not_glibc_is_a_no_op(monkeypatch):
    monkeypatch.setattr(host_memory, "_applied", None)
    for k in host_memory.USER_ENV + (host_memory.OPT_OUT_ENV, "LD_PRELOAD"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert host_memory.tune_malloc() == "not glibc"
