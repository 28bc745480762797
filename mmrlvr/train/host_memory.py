"""Host memory on CPU runs: stop glibc's heap from keeping freed tensor memory resident.

Why: glibc serves an allocation from ``mmap`` (returned to the system on ``free``) only above its mmap
threshold, and it *raises* that threshold, up to 32 MiB on 64-bit, each time a larger mmapped block is
freed (glibc ``mallopt(3)``, "M_MMAP_THRESHOLD"). A training step frees large tensors all the time, so
after the first step every activation, logit chunk and KV-cache block under 32 MiB comes from the heap,
and a heap only shrinks from its top: one live block above a freed region keeps that region resident.
On the toy step (`benchmarks/step_vs_trl.py`, 128 rows in one micro-batch) that is ~90 MiB of peak RSS
and ~250 MiB held between steps for nothing (measured with ``/proc/self/status`` VmHWM per stage:
peak 880 -> 790 MiB, between steps 750 -> 530 MiB).

``tune_malloc()`` fixes the threshold at glibc's own starting value (128 KiB), which turns the dynamic
raise off, so blocks of 128 KiB and more go back to the system when freed. PyTorch's CPU performance
guide suggests swapping the allocator (jemalloc / tcmalloc via ``LD_PRELOAD``) for the same reason; this
is the in-process form of the part that matters here, with nothing to install.

Left alone: a user's own ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_TOP_PAD_``
environment (glibc already applied it), an allocator preloaded with ``LD_PRELOAD``, non-glibc systems, and
``MMRLVR_MALLOC_TUNING=0`` (opt out). GPU memory is not affected (CUDA has its own caching allocator).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
DEFAULT_THRESHOLD = 128 * 1024  # glibc's initial mmap threshold (DEFAULT_MMAP_THRESHOLD_MIN)
USER_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
OPT_OUT_ENV = "MMRLVR_MALLOC_TUNING"

_applied: str | None = None


def tune_malloc(threshold: int = DEFAULT_THRESHOLD) -> str:
    """Fix glibc's mmap threshold at ``threshold`` bytes (once per process). Returns what was done:
    ``"applied"``, ``"already"``, or why not (``"opted out"``, ``"user environment"``, ``"preloaded
    allocator"``, ``"not glibc"``, ``"mallopt failed"``)."""
    global _applied
    if _applied == "applied":
        return "already"
    if os.environ.get(OPT_OUT_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return "opted out"
    if any(k in os.environ for k in USER_ENV):
        return "user environment"
    if any(name in os.environ.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc")):
        return "preloaded allocator"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "not glibc"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(int(threshold))) != 1:
        return "mallopt failed"
    _applied = "applied"
    return _applied
