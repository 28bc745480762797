"""Host (CPU) memory of the policy pass: return freed activation buffers to the OS, not to the heap.

Why. PyTorch's CPU allocator is glibc's ``malloc``. glibc serves a request from ``mmap`` (given back to the
OS on ``free``) only above its *mmap threshold*, and that threshold is dynamic: each time an mmap'd block is
freed, the threshold rises to that block's size, up to 32 MiB on 64-bit. After the first few passes every
buffer under 32 MiB therefore lives in the heap, and the policy pass's activations (a row's hidden states,
its MLP intermediate, attention inputs: 1-30 MiB each at 3B widths) leave holes between longer-lived small
blocks when they are freed. The holes stay resident, so the pass's peak RSS carries them: measured with
``benchmarks/stage_memory.py`` at Qwen2.5-VL-3B widths (256 image tokens, 128 new tokens, 8 rows), the
forward + backward peak is 8,855 MiB with glibc's default, 8,608 MiB with a fixed 4 MiB threshold in the
pass, 8,592 MiB at 1 MiB (which costs ~2 s of page faults per pass; 4 MiB did not show a cost).

What. :func:`policy_pass_heap` fixes the threshold at ``threshold_mib`` MiB for the pass, so a buffer of
that size or more is mapped on its own and unmapped when freed, and afterwards sets 32 MiB (the dynamic
threshold's ceiling, where a long run sits anyway), so generation and the no-grad passes keep serving their
per-token buffers from the heap (a 1 MiB threshold for the whole step slowed generation by ~20 %). It
changes where buffers live, never what is computed. The update stage (``PolicyGradient.__call__``, and
every update stage built on it) enters it once per step.

Only glibc (``mallopt(M_MMAP_THRESHOLD)``; the trim threshold is left where glibc has it); elsewhere (macOS,
musl) and for CUDA models it does nothing. ``model.heap_mmap_threshold_mib = 0`` leaves glibc's own behaviour.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
CEILING_MIB = 32  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: where glibc's dynamic threshold stops rising


@functools.lru_cache(maxsize=1)
def glibc() -> ctypes.CDLL | None:
    """The process's glibc, or None where the C library is another (``mallopt`` would not exist or differ)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()  # only glibc has it
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def set_mmap_threshold(mib: int) -> bool:
    """Fix glibc's mmap threshold at ``mib`` MiB (this also ends its dynamic rise); False where not glibc."""
    libc = glibc()
    return libc is not None and libc.mallopt(M_MMAP_THRESHOLD, mib << 20) == 1


@contextlib.contextmanager
def policy_pass_heap(threshold_mib: int, *, on_cpu: bool = True) -> Iterator[bool]:
    """Inside, buffers of ``threshold_mib`` MiB or more are mmap'd (freed ones go back to the OS); after, 32 MiB.

    Yields whether the setting applied (glibc, a CPU model, ``threshold_mib > 0``)."""
    applied = bool(threshold_mib > 0 and on_cpu and set_mmap_threshold(threshold_mib))
    try:
        yield applied
    finally:
        if applied:
            set_mmap_threshold(CEILING_MIB)
