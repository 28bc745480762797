"""What the LM head alone costs at a stand-in's shapes: the floor that both arms of step_vs_trl.py pay.

At a 151,936-token vocabulary the head dominates what the long-response points do on a CPU: each decoded
token reads the whole [V, H] weight (memory-bound: the figure is the bandwidth the matmul gets), and each
teacher-forced pass multiplies the response positions by it (compute-bound: the figure is GFLOP/s). From the
two measurements it prints, per response length, the seconds one head-sized product over the step's
response positions takes, and how many of them each phase needs:

- generation: one [rows, H] x [H, V] product per token (both arms; ``model.generate`` or ours);
- reference pass: one product (both arms);
- policy pass: ours (trainable head) four: forward, the backward's recompute, dL/dhidden, dL/dW; a path that
  keeps the logits (TRL) three; ours with a frozen head (LoRA) two, TRL's two.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/head_roofline.py [--hidden 2048] [--rows 8] [--kernel ours|aten]

``--kernel ours`` (default) multiplies as the trainer and engine do (``mmrlvr.algos.cpu_linear``: oneDNN for
float32 on the CPU); ``aten`` as ``torch.nn.functional.linear`` does (MKL's sgemm), which is what TRL's arm pays.
"""

from __future__ import annotations

import argparse
import time

import torch

from mmrlvr.algos import cpu_linear


def _seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first-touch page faults and kernel selection
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--hidden", type=int, default=2_048, help="2,048 for the 3B stand-in, 3,584 for the 7B")
    p.add_argument("--rows", type=int, default=8, help="rows decoded together (B x G)")
    p.add_argument("--chunk", type=int, default=256, help="positions per teacher-forced product")
    p.add_argument("--new-tokens", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--kernel", choices=["ours", "aten"], default="ours",
                   help="ours: mmrlvr.algos.cpu_linear (oneDNN where it applies); aten: torch.nn.functional.linear")
    args = p.parse_args()
    linear = cpu_linear.linear if args.kernel == "ours" else torch.nn.functional.linear
    torch.manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden) * 0.02
    rows = torch.randn(args.rows, args.hidden)
    decode = _seconds(lambda: linear(rows, weight), 20)
    gbs = weight.numel() * weight.element_size() / decode / 1e9
    print(f"decode: [{args.rows}, {args.hidden}] x [{args.hidden}, {args.vocab}] {decode * 1e3:.1f} ms/token "
          f"({gbs:.1f} GB/s of weight read), {torch.get_num_threads()} threads, kernel {args.kernel}"
          f"{' (oneDNN)' if args.kernel == 'ours' and cpu_linear.onednn_applies(rows, weight) else ''}")
    chunk = torch.randn(args.chunk, args.hidden)
    product = _seconds(lambda: linear(chunk, weight), 3)
    print(f"teacher-forced: [{args.chunk}, {args.hidden}] x [{args.hidden}, {args.vocab}] {product:.3f} s "
          f"({2 * args.chunk * args.hidden * args.vocab / product / 1e9:.0f} GFLOP/s)")
    for n in args.new_tokens:
        one = product * args.rows * n / args.chunk
        print(f"{n} new tokens: generation >= {decode * n:.1f} s; one product over the {args.rows * n} response "
              f"positions {one:.1f} s -> reference {one:.1f} s, policy {4 * one:.1f} s (ours, trainable head) / "
              f"{3 * one:.1f} s (logits kept) / {2 * one:.1f} s (frozen head); "
              f"head floor of a step (ours, trainable): {decode * n + 5 * one:.1f} s")


if __name__ == "__main__":
    main()
