"""Reference results kept per kind of machine, and the rule tests use to compare with them.

The pinned kernels (``mmrlvr.models.kernels``) were meant to give the same float bits on every x86-64 CPU. They do
for most of what the tests compute, but not for all of it: on 2026-12-06 an "Intel(R) Xeon(R) Processor" with
AVX-512, AVX512-FP16 and AMX reproduced 10 of the 18 stage goldens written on an "AMD EPYC" with AVX-512 bit for
bit, and differed in the last bits of the rest — a step-1 loss in its 8th digit (the demo), a step-8 loss after
seven identical steps (rubric-tiny), the LoRA path from step 2 — and a warm start built there had other bytes than
the shipped one (whose build the AMD machine reproduced). Those cases share rubric rewards, LoRA or a warm start
built from scratch; the plain RL step on the shipped warm start (demo-tiny, credit-vepo-tiny, ...) matched in
every bit. The machine-dependent kernel was not found, so a reference result that must match *exactly* is kept per
kind of machine: a "variant" records what one machine computed, with ``written_on`` = ``machine_signature()``.

``judge`` compares a result with the variants:

- equal to one of them, bit for bit: the result is reproduced (the normal case on a machine kind that has one);
- a variant written on this kind of machine, and the result differs from it: it is a changed result -- fail;
- no variant from this kind of machine: the strongest claim left is that the run behaves like the recorded
  ones up to rounding, which ``alike`` (given by the caller) checks; a pass says which rule it passed by, and
  the way to add an exact variant for this machine is ``python tests/stage_goldens.py --add-machine``.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from typing import Any, Callable

#: CPU features that can change which code a numeric library runs; the signature digests the ones present
_FEATURE_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512cd",
                  "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx512ifma", "avx512vbmi", "avx512_vbmi2",
                  "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def machine_signature() -> str:
    """The kind of machine a reference was computed on: CPU model, torch's native kernel level, feature digest.

    Two machines with the same signature are assumed to compute the same bits; the feature digest keeps, say, an
    AVX-512 Xeon with AMX apart from one without (their model names are often the same generic string)."""
    import torch

    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    present = ",".join(f for f in _FEATURE_FLAGS if f in flags)
    digest = hashlib.sha256(present.encode()).hexdigest()[:8]
    name = model or platform.processor() or platform.machine()
    return f"{name} | {torch.backends.cpu.get_cpu_capability()} | {digest}"


@dataclass
class Verdict:
    ok: bool
    how: str  # "exact" | "alike" | "differs"
    message: str


def judge(got: Any, variants: list[dict[str, Any]], here: str, *,
          differences: Callable[[Any, dict[str, Any]], list[str]],
          unlike: Callable[[Any, dict[str, Any]], list[str]]) -> Verdict:
    """Compare ``got`` with the recorded variants (see the module docstring for the rule).

    ``differences(got, variant)`` lists every way the result is not bit-identical to the variant (empty: equal);
    ``unlike(got, variant)`` lists the ways it does not behave like it up to rounding (empty: alike)."""
    if not variants:
        return Verdict(False, "differs", "no reference recorded")
    diffs = [differences(got, v) for v in variants]
    for v, diff in zip(variants, diffs):
        if not diff:
            return Verdict(True, "exact", f"equal, bit for bit, to the variant written on {v['written_on']!r}")
    mine = [diff for v, diff in zip(variants, diffs) if v["written_on"] == here]
    if mine:
        diff = mine[0]
        return Verdict(False, "differs", f"differs from the variant written on this kind of machine ({here!r}): "
                       + "; ".join(diff[:5]))
    problems = {v["written_on"]: unlike(got, v) for v in variants}
    for written_on, found in problems.items():
        if not found:
            return Verdict(True, "alike", f"no variant from this kind of machine ({here!r}); behaves like the "
                           f"one written on {written_on!r} up to rounding (not compared bit for bit)")
    detail = " | ".join(f"vs {w!r}: " + "; ".join(p[:5]) for w, p in problems.items())
    return Verdict(False, "differs", f"no variant from this kind of machine ({here!r}) and unlike every recorded "
                   f"one: {detail}")
