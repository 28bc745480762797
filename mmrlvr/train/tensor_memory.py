"""The peak of live tensor memory during a block of work: a memory figure that holds still between runs.

Why. The process's peak resident memory (Linux ``VmHWM``) is what the kernel's out-of-memory killer reads on a
CPU machine, but it is a poor measure of what a step *needs*: PyTorch's CPU allocator is glibc's ``malloc``,
and whether a freed buffer goes back to the OS or stays resident as a hole in the heap depends on glibc's
dynamic mmap threshold and on what was freed before (``mmrlvr.train.host_memory``). Two runs of the same step
can differ by hundreds of MiB. The bytes of tensors alive at each moment do not depend on the heap: given the
same code and inputs the allocator is asked for the same buffers in the same order, so their peak is the same
from run to run.

What. :class:`TensorPeak` is a context manager that records the largest amount of tensor memory alive at
once inside it, above what was alive when it was entered (``increment``), and the net change at its end
(``net``), in bytes, on the device given:

- **CUDA**: the caching allocator's own statistics (``torch.cuda.reset_peak_memory_stats`` /
  ``max_memory_allocated`` minus ``memory_allocated`` at entry). This is the number a GPU out-of-memory error
  depends on (plus the allocator's cached-but-free blocks, ``memory_reserved``, reported beside it).
- **CPU**: PyTorch's profiler with ``profile_memory=True``, whose memory events are every allocation and
  free of c10's CPU allocator (tensor storages, the intermediates inside an operator included) with its size;
  the running sum in time order is the live-byte count relative to entry, and its maximum is the peak.
  Allocations made outside c10 (oneDNN's scratch pads, Python objects, glibc's heap holes) are not
  tensors and are not counted: the CPU figure is a lower bound of the resident growth, the part the step's
  code controls. The profiler costs a few microseconds per operator; it sees allocations of the thread that
  entered the block and of the threads PyTorch starts for it (autograd, intra-op), not of other Python threads.

``TensorPeak(...).top`` (CPU, with ``detail=True``) names the operators enclosing the peak moment, innermost
last, to say *where* a step's peak is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._autograd import DeviceType

MEMORY_EVENT = "[memory]"  # the name the profiler gives allocation/free events


@dataclass
class TensorPeak:
    """Peak live tensor bytes inside a ``with`` block, above the live bytes at its entry.

    device:   where the tensors live ("cpu", "cuda", "cuda:1", or a ``torch.device``)
    detail:   CPU only: also record operator events to name the operators enclosing the peak (``top``)

    After the block: ``increment`` (bytes, ≥ 0), ``net`` (bytes alive at exit minus at entry), ``reserved``
    (CUDA: the allocator's peak reserved bytes above entry; None on CPU), ``top`` (names, outermost first).
    """

    device: Any = "cpu"
    detail: bool = False
    increment: int = 0
    net: int = 0
    reserved: int | None = None
    top: list[str] = field(default_factory=list)
    _prof: Any = None
    _base: int = 0
    _base_reserved: int = 0

    @property
    def on_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def __enter__(self) -> TensorPeak:
        if self.on_cuda:
            dev = torch.device(self.device)
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            self._base = torch.cuda.memory_allocated(dev)
            self._base_reserved = torch.cuda.memory_reserved(dev)
            return self
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False,
                             with_stack=False)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.on_cuda:
            dev = torch.device(self.device)
            torch.cuda.synchronize(dev)
            self.increment = max(0, torch.cuda.max_memory_allocated(dev) - self._base)
            self.net = torch.cuda.memory_allocated(dev) - self._base
            self.reserved = max(0, torch.cuda.max_memory_reserved(dev) - self._base_reserved)
            return
        self._prof.__exit__(*exc)
        events = self._prof.profiler.kineto_results.events()
        memory = sorted((e for e in events if e.name() == MEMORY_EVENT and e.device_type() == DeviceType.CPU),
                        key=lambda e: e.start_ns())
        live, peak, peak_ns = 0, 0, None
        for e in memory:
            live += e.nbytes()
            if live > peak:
                peak, peak_ns = live, e.start_ns()
        self.increment, self.net = peak, live
        if self.detail and peak_ns is not None:
            enclosing = [e for e in events if e.name() != MEMORY_EVENT and e.start_ns() <= peak_ns
                         <= e.start_ns() + e.duration_ns()]
            self.top = [e.name() for e in sorted(enclosing, key=lambda e: (e.start_ns(), -e.duration_ns()))]
        self._prof = None
