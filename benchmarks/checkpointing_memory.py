"""Training-pass peak memory with and without gradient checkpointing on a shape-true stand-in.

One policy forward + backward through ``token_logprobs`` (the trainer's training pass: fused log-probs,
vision tower frozen, full fine-tuning of the language model) on ``--rows`` rows of ``--image-tokens`` image
tokens + prompt text + ``--new-tokens`` response tokens (``--lora``: a LoRA adapter, r 16 on q/k/v/o, instead
of full fine-tuning, so that the gradients are small and the pass is mostly activations). Each setting runs
in its own subprocess, inside the allocator setting the trainer's update stage uses (``--heap-mmap-threshold-mib``,
default 4 as ``model.heap_mmap_threshold_mib``); the figure is the peak RSS during the pass minus the RSS before it (weights loaded), i.e. what the pass
itself adds: activations kept for backward, gradients, logits-path buffers. On a GPU (``--device cuda``, the
default where torch sees one) the figure is exact: ``torch.cuda.max_memory_allocated`` during the pass minus
the memory allocated before it.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/checkpointing_memory.py [--shape qwen2_5_vl_3b] [--layers 2] [--rows 8] [--lora]

Ends with ``training-pass peak memory cut by gradient checkpointing: X %``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(args) -> None:
    import numpy as np
    import torch
    from PIL import Image

    from mmrlvr.models.lora import apply_lora, enable_gradient_checkpointing, freeze_vision
    from mmrlvr.models.standin import image_side, standin_model
    from mmrlvr.models.tiny import build_tokenizer, make_processor
    from mmrlvr.train.forward import token_logprobs
    from mmrlvr.train.host_memory import policy_pass_heap

    tok = build_tokenizer()
    device = torch.device(args.device)
    model = standin_model(args.shape, tok, layers=args.layers).to(device)
    freeze_vision(model)
    if args.lora:
        model = apply_lora(model, r=16, alpha=32)
    side = image_side(args.image_tokens)
    ip = make_processor("qwen2_5_vl", tok, model.config, image_size=side).image_processor
    img = Image.fromarray(np.random.RandomState(0).randint(0, 256, (side, side, 3), dtype=np.uint8))
    vis = ip([img] * args.rows, return_tensors="pt")
    cfg = model.config
    prompt = [5] * 40 + [cfg.vision_start_token_id] + [cfg.image_token_id] * args.image_tokens + [cfg.vision_end_token_id]
    resp = torch.randint(20, 500, (args.rows, args.new_tokens), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([torch.tensor([prompt] * args.rows), resp], 1)
    inputs = {k: v.to(device) for k, v in {"input_ids": ids, "attention_mask": torch.ones_like(ids), **vis}.items()}
    resp = resp.to(device)
    if args.checkpointing:
        enable_gradient_checkpointing(model)
    model.train()
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before_gpu = torch.cuda.memory_allocated() / 2**20
    before = _rss_mib()
    t0 = time.perf_counter()
    storages: dict[int, int] = {}

    def keep(t):  # every tensor autograd keeps for backward, by storage (views counted once)
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t
    # as the trainer's update stage runs it: buffers of >= model.heap_mmap_threshold_mib MiB mapped on their own
    with policy_pass_heap(args.heap_mmap_threshold_mib, on_cpu=not on_gpu):
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            logp, _ = token_logprobs(model, inputs, resp)
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved_mib = sum(n for ptr, n in storages.items() if ptr not in weights) / 2**20
        if not args.forward_only:
            logp.mean().backward()
    if on_gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if on_gpu:  # exact: the allocator's own peak, not the process's resident pages
        before, peak = before_gpu, torch.cuda.max_memory_allocated() / 2**20
        assert next(model.parameters()).is_cuda and logp.is_cuda
    grads_mib = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / 2**20
    print("RESULT " + json.dumps({"before_mib": before, "peak_mib": peak, "pass_mib": peak - before,
                                  "grads_mib": grads_mib, "saved_mib": saved_mib,
                                  "seconds": seconds, "tokens": ids.shape[1], "device": str(device),
                                  "gpu": torch.cuda.get_device_name() if on_gpu else None}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen2_5_vl_3b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--image-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--lora", action="store_true", help="LoRA r 16 on q/k/v/o instead of full fine-tuning")
    ap.add_argument("--forward-only", action="store_true",
                    help="skip the backward: report only what the forward keeps for it (fast)")
    ap.add_argument("--heap-mmap-threshold-mib", type=int, default=4,
                    help="CPU: the pass maps buffers of this many MiB or more on their own, as the trainer's update "
                         "stage does (model.heap_mmap_threshold_mib, default 4); 0 = glibc's default")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: a CUDA GPU when torch sees one (peak from its allocator), else the CPU (peak RSS)")
    ap.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        child(args)
        return
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    res = {}
    for ckpt in (False, True):
        cmd = [sys.executable, __file__, "--child", "--shape", args.shape, "--layers", str(args.layers),
               "--rows", str(args.rows), "--image-tokens", str(args.image_tokens), "--new-tokens", str(args.new_tokens),
               "--device", args.device, "--heap-mmap-threshold-mib", str(args.heap_mmap_threshold_mib)]
        cmd += ["--forward-only"] if args.forward_only else []
        cmd += ["--lora"] if args.lora else []
        proc = subprocess.run(cmd + (["--checkpointing"] if ckpt else []), env=env, capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"run failed (checkpointing={ckpt})")
        res[ckpt] = json.loads(line[len("RESULT "):])
        r = res[ckpt]
        print(f"checkpointing {'on ' if ckpt else 'off'}: forward keeps {r['saved_mib']:.0f} MiB of activations "
              f"for backward (weights excluded)", flush=True)
        if args.forward_only:
            continue
        where = f"GPU memory on {r['gpu']}" if r["gpu"] else "RSS"
        print(f"checkpointing {'on ' if ckpt else 'off'}: pass adds {r['pass_mib']:.0f} MiB over {r['before_mib']:.0f} MiB "
              f"loaded ({where}; {r['tokens']} tokens x {args.rows} rows, {r['seconds']:.2f} s)", flush=True)
    saved_cut = 1 - res[True]["saved_mib"] / res[False]["saved_mib"]
    print(f"activations kept for backward cut by gradient checkpointing: {100 * saved_cut:.0f} %")
    if args.forward_only:
        return
    grads = res[False]["grads_mib"]
    act = {k: r["pass_mib"] - grads for k, r in res.items()}
    print(f"of which gradients {grads:.0f} MiB (the same either way); the rest (activations, buffers): "
          f"off {act[False]:.0f} MiB, on {act[True]:.0f} MiB, cut {100 * (1 - act[True] / act[False]):.0f} %")
    cut = 1 - res[True]["pass_mib"] / res[False]["pass_mib"]
    print(f"training-pass peak memory cut by gradient checkpointing: {100 * cut:.0f} %")


if __name__ == "__main__":
    main()
