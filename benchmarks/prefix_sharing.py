"""No-grad passes (reference / old policy) with and without prefix sharing.

The G responses of a group share one prompt (image tokens included). "full": today's reference pass,
``token_logprobs`` over the whole (prompt + response) sequence of every row, images from the step's
``VisionFeatureCache``. "shared": ``mmrlvr.credit.signals.response_hidden(rows_per_prompt=G)`` (the
prompt's KV cache computed once per group, repeated G times, only the responses run on top; the group
heads' images encoded inside) + the fused chunked log-probs. Same rows, random responses; prints the
median seconds of each and the largest log-prob difference.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/prefix_sharing.py [--shape toy] [--prompts 16 --group 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    from mmrlvr.algos.logits import logprobs_from_hidden
    from mmrlvr.credit.signals import response_hidden
    from mmrlvr.data import make_rows, rows_to_samples
    from mmrlvr.models import load_policy
    from mmrlvr.models.standin import build_standin, image_side
    from mmrlvr.rollout.hf import HFEngine, expand_vision
    from mmrlvr.train.forward import VisionFeatureCache, token_logprobs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="toy")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--image-tokens", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    path = build_standin(args.shape, Path(tempfile.mkdtemp()) / args.shape, image_tokens=args.image_tokens)
    model, processor = load_policy(path)
    model.eval()
    side = 112 if args.shape == "toy" else image_side(args.image_tokens)
    samples = rows_to_samples(make_rows("count", "train", args.prompts, seed=0, image_size=side))
    engine = HFEngine(model, processor)
    enc = engine.encode_prompts(samples)
    G, L = args.group, args.new_tokens
    vision = expand_vision(enc, [1] * len(samples), G)
    prompt_ids = enc["input_ids"].repeat_interleave(G, 0)
    prompt_mask = enc["attention_mask"].repeat_interleave(G, 0)
    n, P = prompt_ids.shape
    resp = torch.randint(100, 400, (n, L), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([prompt_ids, resp], 1)
    mask = torch.cat([prompt_mask, torch.ones_like(resp)], 1)
    for key, value in list(vision.items()):  # per-token processor outputs (mm_token_type_ids): response = text
        if torch.is_tensor(value) and value.dim() == 2 and value.shape == (n, P):
            vision[key] = torch.cat([value, torch.zeros_like(resp, dtype=value.dtype)], 1)
    full_inputs = {"input_ids": ids, "attention_mask": mask, **vision}
    print(f"{args.shape}: {n} rows = {args.prompts} prompts x G {G}, P = {P}, L = {L}")

    def full():
        cache = VisionFeatureCache(model, vision, [1] * n, G)
        inputs = cache.inputs(ids, mask, slice(0, n)) if cache.ok else full_inputs
        return token_logprobs(model, inputs, resp)[0]

    def shared():
        h = response_hidden(model, full_inputs, P, L, rows_per_prompt=G)
        return logprobs_from_hidden(h.states, h.head.weight, resp)[0]

    times = {"full": [], "shared": []}
    out = {}
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, fn in (("full", full), ("shared", shared)):
                t0 = time.perf_counter()
                out[name] = fn()
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = float((out["full"] - out["shared"]).abs().max())
    print(f"full {med['full']:.3f} s, shared {med['shared']:.3f} s, max |diff| {diff:.2e}")
    print(f"no-grad pass time ratio (shared/full): {med['shared'] / med['full']:.2f}")


if __name__ == "__main__":
    main()
