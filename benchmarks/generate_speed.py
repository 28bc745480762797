"""Generation throughput: our HF rollout engine vs a bare ``model.generate`` at the same shapes.

Both generate the same B prompts x G rows with the same model in this one process, alternated, each a
fixed number of new tokens (the stand-ins' end-of-sequence logit is pinned at 0 among random ones, so
rows run to ``--new-tokens``; the toy's rows are padded after EOS on both sides, so tokens/s counts
``rows x new tokens`` of decoding work either way). What ours does on top of the bare call: one
vision-tower run per distinct prompt (not per row), a per-row seeded Gumbel-max sampler and the
full-vocabulary log-prob of each chosen token (``RowSampler``), and the ``RolloutBatch`` assembly. The
bare call: the processor on the B prompts, ``input_ids`` etc. repeated G times, ``do_sample=True``,
``temperature=1.0``, ``top_k=0``, KV cache on.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/generate_speed.py [--shape toy] [--rounds 3]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/generate_speed.py --shape qwen2_5_vl_3b --image-tokens 256 \
        --new-tokens 128 --rounds 2

Ends with ``generation tokens/s ratio (ours/bare): X`` (above 1: ours is faster).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from mmrlvr.models.standin import BENCH_POINTS as DEFAULTS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="toy", choices=list(DEFAULTS))
    p.add_argument("--image-tokens", type=int, default=None)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--group", type=int, default=None)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=None, help="model folder (default: build the --shape model)")
    a = p.parse_args()
    prompts, group, image_tokens, new_tokens = DEFAULTS[a.shape]
    prompts, group = a.prompts or prompts, a.group or group
    image_tokens, new_tokens = a.image_tokens or image_tokens, a.new_tokens or new_tokens

    from mmrlvr.data import rows_to_samples
    from mmrlvr.data.synth import make_rows
    from mmrlvr.models import load_policy
    from mmrlvr.models.standin import build_standin, image_side
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.rollout.hf import HFEngine, encode_prompt_batch

    tmp = tempfile.TemporaryDirectory()
    model_dir = a.model or str(build_standin(a.shape, Path(tmp.name) / a.shape, image_tokens=image_tokens,
                                             layers=a.layers))
    model, processor = load_policy(model_dir)
    model.eval()
    side = 112 if a.shape == "toy" else image_side(image_tokens)
    samples = rows_to_samples(make_rows("count", "train", prompts, seed=0, image_size=side))
    engine = HFEngine(model, processor)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    tok = getattr(processor, "tokenizer", processor)

    def ours(r: int) -> int:
        batch = engine.generate(samples, group, params, seed=r, step=0)
        return int(batch.response_ids.shape[0] * batch.response_ids.shape[1])

    @torch.no_grad()
    def bare(r: int) -> int:
        torch.manual_seed(r)
        inputs = encode_prompt_batch(processor, samples)
        inputs = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        out = model.generate(**inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=new_tokens, num_return_sequences=group, use_cache=True,
                             pad_token_id=tok.pad_token_id)
        return int(out.shape[0] * (out.shape[1] - inputs["input_ids"].shape[1]))

    print(f"== {a.shape}: {prompts} prompts x G {group}, {image_tokens} image tokens, {new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads", flush=True)
    ours(-1), bare(-1)  # warm-up (allocator, kernels)
    rates: dict[str, list[float]] = {"ours": [], "bare": []}
    for r in range(a.rounds):
        for name, fn in (("ours", ours), ("bare", bare)):
            t0 = time.perf_counter()
            tokens = fn(r)
            dt = time.perf_counter() - t0
            rates[name].append(tokens / dt)
            print(f"round {r + 1} {name:>4}: {tokens} tokens in {dt:.2f} s = {tokens / dt:.1f} tokens/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"ours: {med['ours']:.1f} tokens/s;  bare generate: {med['bare']:.1f} tokens/s")
    print(f"generation tokens/s ratio (ours/bare): {med['ours'] / med['bare']:.2f}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
