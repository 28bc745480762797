"""Transient memory of the fused log-prob head (``mmrlvr.algos.logits.logprobs_from_hidden``) at a model's widths.

One forward (with entropies, as the update stage asks) and one backward of ``--rows`` x ``--positions`` response
positions through a [V, H] head that is trained (its gradient is written, as in full fine-tuning); prints the peak
resident set above what was resident before each (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``). The
backward's figure includes the head's own [V, H] gradient, which is printed separately so that the transient on
top of it can be read off.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/fused_head_memory.py [--rows 8] [--positions 512] [--chunk 256]

``--chunk`` is the chunk size asked for; the head caps it by ``CHUNK_BUFFER_BYTES`` (printed).
Ends with ``backward transient above the head's gradient: X MiB``.
"""

from __future__ import annotations

import argparse
import time

import torch

from mmrlvr.algos.logits import CHUNK_BUFFER_BYTES, fit_chunk, logprobs_from_hidden


def _mib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024
    raise RuntimeError(f"{key} not in /proc/self/status (Linux only)")


def _reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _mib("VmRSS")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--hidden", type=int, default=2_048)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--positions", type=int, default=512, help="response positions per row")
    p.add_argument("--chunk", type=int, default=256)
    a = p.parse_args()
    torch.manual_seed(0)
    weight = (torch.randn(a.vocab, a.hidden) * 0.02).requires_grad_()
    hidden = torch.randn(a.rows, a.positions, a.hidden, requires_grad=True)
    ids = torch.randint(0, a.vocab, (a.rows, a.positions))
    grad_mib = weight.numel() * weight.element_size() / 2 ** 20
    print(f"head [{a.vocab}, {a.hidden}], {a.rows} x {a.positions} positions, chunk asked {a.chunk}, used "
          f"{fit_chunk(a.chunk, a.vocab)} (cap {CHUNK_BUFFER_BYTES >> 20} MiB per [chunk, V] buffer), "
          f"{torch.get_num_threads()} threads")
    base = _reset_peak()
    t0 = time.perf_counter()
    logp, _ent = logprobs_from_hidden(hidden, weight, ids, chunk_size=a.chunk, with_entropy=True)
    forward = _mib("VmHWM") - base
    t1 = time.perf_counter()
    base = _reset_peak()
    (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
    backward = _mib("VmHWM") - base
    t2 = time.perf_counter()
    print(f"forward: peak +{forward} MiB, {t1 - t0:.1f} s")
    print(f"backward: peak +{backward} MiB (the head's gradient {grad_mib:.0f} MiB of it), {t2 - t1:.1f} s")
    print(f"backward transient above the head's gradient: {backward - grad_mib:.0f} MiB")


if __name__ == "__main__":
    main()
