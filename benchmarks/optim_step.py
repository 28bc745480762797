"""Optimiser step at real scale: before (torch AdamW default + isfinite pass + clip_grad_norm_) vs after
(``mmrlvr.train.optim``: fused AdamW + one-pass clip and non-finite check).

Parameters have the shapes of the trainable part of the Qwen2.5-VL-3B stand-in (``mmrlvr.models.standin``,
vision frozen: 388 M parameters, float32), gradients random. Prints the median seconds per step of each
arm and their ratio.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/optim_step.py [--shape qwen2_5_vl_3b] [--steps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch


def trainable_shapes(shape: str, layers: int) -> list[torch.Size]:
    from mmrlvr.models.standin import standin_config
    from mmrlvr.models.tiny import build_tokenizer
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(standin_config(shape, build_tokenizer(), layers=layers))
    return [p.shape for n, p in model.named_parameters() if "visual" not in n]


def main() -> None:
    from mmrlvr.models.standin import fill_random
    from mmrlvr.train.optim import build_optimizer, clip_grad_norm_and_check

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2_5_vl_3b")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    params = torch.nn.ParameterList([torch.nn.Parameter(torch.empty(s)) for s in trainable_shapes(args.shape, args.layers)])
    fill_random(params)
    grads = torch.nn.ParameterList([torch.nn.Parameter(torch.empty(p.shape)) for p in params])
    fill_random(grads, seed=1, std=1e-3)
    n = sum(p.numel() for p in params)
    print(f"{n / 1e6:.0f} M trainable parameters ({args.shape}, {args.layers} layer(s)), float32")
    cfg = SimpleNamespace(lr=1e-6, betas=[0.9, 0.999], weight_decay=0.0)

    def before():
        opt = torch.optim.AdamW(list(params), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)

        def step():
            for p in params:
                if p.grad is not None and not torch.isfinite(p.grad).all():
                    raise RuntimeError("non-finite gradient")
            norm = torch.nn.utils.clip_grad_norm_(list(params), 1.0)
            opt.step()
            return norm
        return opt, step

    def after():
        opt = build_optimizer(list(params), cfg)

        def step():
            norm = clip_grad_norm_and_check(list(params), 1.0)
            opt.step()
            return norm
        return opt, step

    results = {}
    for name, make in (("before", before), ("after", after)):
        opt, step = make()
        times = []
        for _ in range(args.steps + 1):  # the first step allocates the moments: not timed
            for p, g in zip(params, grads):
                p.grad = g.detach()
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        results[name] = statistics.median(times[1:])
        print(f"{name:>6}: {results[name]:.3f} s/step ({type(opt).__name__}, fused={opt.defaults.get('fused')})")
        del opt, step
    print(f"optimiser step ratio (after/before): {results['after'] / results['before']:.2f}")


if __name__ == "__main__":
    main()
