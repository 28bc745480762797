"""Pinned CPU kernels: the same float bits across x86-64 CPUs as far as they reach, for what must not vary.

Bit-exact float results follow the kernels a CPU picks: ATen dispatches its vectorised kernels by instruction set
(AVX2, AVX-512), MKL takes a code path per CPU, oneDNN generates its kernels for the CPU it finds, and a
multi-threaded reduction sums in an order set by the thread count. A training run inherits the first rounding
difference, so the same code and seed gave other values from the first step on an "AMD EPYC" with AVX-512 than
on the machines before it (2026-12-04: every stage golden differed).

Pinned, none of that depends on the CPU: ATen runs its baseline (non-dispatched) build
(``ATEN_CPU_CAPABILITY=default``), MKL its Conditional Numerical Reproducibility branch (``MKL_CBWR=COMPATIBLE``,
documented to give the same results on every Intel and compatible x86-64 CPU), oneDNN is off and one thread does
every reduction. Checked here (2026-12-04): a pinned training run gives the same digest of every metric and record
when MKL is restricted to SSE4.2 and when glibc is told the CPU has no AVX, AVX2, AVX-512 or FMA -- the values do
not follow the instruction sets the machine reports. Pinned kernels are slower on large matrices; they are used
for the offline tiny models' warm starts and the stage goldens, never for a user's run.

They do not reach every bit. 2026-12-06, an "Intel(R) Xeon(R) Processor" with AVX-512, AVX512-FP16 and AMX
against the AMD EPYC: most pinned runs agree bit for bit (10 of the 18 stage goldens, the RL step on the shipped
warm start for 20 steps), but runs with rubric rewards or LoRA part in the last bits after a few steps, and a warm
start built from scratch parts after ~100 SFT steps. Which kernel differs was not found. What depends on it keeps
a reference per kind of machine (the tests' ``machine_variants``), and the demo's warm start ships as bytes.

The environment variables are read when torch and MKL start, so a pinned computation runs in a child process
started with ``PINNED_ENV`` that calls ``pin_in_process()`` first; ``kernel_state()`` lets it prove it.
"""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

PINNED_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}
#: what ``kernel_state()`` reports in a pinned process
PINNED_STATE = {"capability": "DEFAULT", "mkl_cbwr": "COMPATIBLE", "mkldnn": False, "threads": 1}
#: a name for the pinning, stored with what was computed on it (a change of pinning changes every value)
LABEL = "x86-64 pinned: ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE, oneDNN off, 1 thread"


def pin_in_process() -> None:
    """The part of the pinning that is set inside the process (the rest is PINNED_ENV, read at start-up)."""
    torch.backends.mkldnn.enabled = False
    torch.set_num_threads(1)


def kernel_state() -> dict[str, Any]:
    """How this process's CPU kernels are set, in PINNED_STATE's keys."""
    return {"capability": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": os.environ.get("MKL_CBWR"),
            "mkldnn": bool(torch.backends.mkldnn.enabled), "threads": torch.get_num_threads()}


def env_pinned() -> bool:
    """Whether this process was started with the pinned environment (then ``pin_in_process`` completes it)."""
    return (torch.backends.cpu.get_cpu_capability() == PINNED_STATE["capability"]
            and os.environ.get("MKL_CBWR") == PINNED_STATE["mkl_cbwr"])


def check_pinned(state: dict[str, Any]) -> None:
    """Raise unless ``state`` (a ``kernel_state()``) is the pinned one, naming each setting that is not."""
    wrong = {k: (state.get(k), v) for k, v in PINNED_STATE.items() if state.get(k) != v}
    if wrong:
        raise RuntimeError(f"not on the pinned CPU kernels (got, wanted): {wrong}")


def pinned_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the pinning added, for a child process."""
    return {**(os.environ if base is None else base), **PINNED_ENV}


def comparable_here() -> tuple[bool, str]:
    """Whether pinned values written on another machine can be compared here (x86-64 with MKL), and if not why."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return False, f"pinned values are x86-64 values (MKL_CBWR) and this machine is {machine!r}"
    if not torch.backends.mkl.is_available():
        return False, "pinned values need torch built with MKL (MKL_CBWR pins its kernels); this torch has no MKL"
    return True, ""
