"""The trainer's passes with and without prefix sharing (``model.prefix_sharing``).

The G responses of a group share one prompt (image tokens included). "full": ``token_logprobs`` over the
whole (prompt + response) sequence of every row; "shared": the same call with ``prompt_length`` and
``rows_per_prompt`` (the prompt's KV cache computed once per group, repeated G times, only the responses run on
top). Both read the images from the step's ``VisionFeatureCache``, as the trainer's stages do. Same rows, random
responses. Default: the no-grad pass (reference / old policy); ``--grad``: the policy pass, forward + backward
(vision frozen, full fine-tuning of the language model), also counting the bytes autograd keeps for backward
(by storage, weights excluded). Prints the median seconds of each arm and the largest log-prob difference.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/prefix_sharing.py [--shape toy] [--prompts 16 --group 8] [--grad]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
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
    ap.add_argument("--layers", type=int, default=1, help="stand-ins: decoder layers")
    ap.add_argument("--grad", action="store_true", help="the policy pass: forward + backward")
    args = ap.parse_args()
    path = build_standin(args.shape, Path(tempfile.mkdtemp()) / args.shape, image_tokens=args.image_tokens,
                         layers=args.layers)
    model, processor = load_policy(path)
    model.eval()
    model.model.visual.requires_grad_(False)
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

    cache = VisionFeatureCache(model, vision, [1] * n, G)
    inputs = cache.inputs(ids, mask, slice(0, n)) if cache.ok else full_inputs
    share = {"full": {}, "shared": {"prompt_length": P, "rows_per_prompt": G}}
    times: dict[str, list[float]] = {"full": [], "shared": []}
    kept: dict[str, float] = {}
    out = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for _ in range(args.repeats):
        for name in ("full", "shared"):
            storages: dict[int, int] = {}

            def keep(t, storages=storages):  # what autograd keeps for backward, by storage (views once)
                st = t.untyped_storage()
                storages[st.data_ptr()] = st.nbytes()
                return t
            t0 = time.perf_counter()
            with torch.set_grad_enabled(args.grad), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
                logp = token_logprobs(model, inputs, resp, **share[name])[0]
            if args.grad:
                logp.mean().backward()
                model.zero_grad(set_to_none=True)
            times[name].append(time.perf_counter() - t0)
            out[name] = logp.detach()
            kept[name] = sum(b for ptr, b in storages.items() if ptr not in weights) / 2**20
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = float((out["full"] - out["shared"]).abs().max())
    what = "policy pass (forward + backward)" if args.grad else "no-grad pass"
    print(f"full {med['full']:.3f} s, shared {med['shared']:.3f} s, max |diff| {diff:.2e}")
    if args.grad:
        print(f"kept for backward: full {kept['full']:.0f} MiB, shared {kept['shared']:.0f} MiB "
              f"(ratio {kept['shared'] / max(kept['full'], 1e-9):.2f})")
    print(f"{what} time ratio (shared/full): {med['shared'] / med['full']:.2f}")


if __name__ == "__main__":
    main()
