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

``--engine vllm`` (run it with the Python of the environment ``bash .ci/vllm-env DIR`` builds) times three arms on
the same requests in one process, alternated: our ``VLLMEngine`` (requests, sampling, the prompt check, the
``RolloutBatch`` with the HF processor's tensors), a bare ``vllm.LLM.generate`` on the very same prompts and sampling
parameters (what our wrapper adds is the difference), and our ``HFEngine``. Tokens/s counts the tokens each arm
sampled (rows run to ``--new-tokens`` unless they end).

    OMP_WAIT_POLICY=PASSIVE DIR/bin/python benchmarks/generate_speed.py --engine vllm [--shape qwen2_5_vl_3b]

Ends with ``vllm/hf tokens/s ratio: X`` and ``ours/bare vLLM tokens/s ratio: Y``.
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
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"],
                   help="hf: ours against a bare model.generate; vllm: our vLLM engine against a bare vllm.LLM.generate "
                        "and our HF engine")
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
    if a.engine == "vllm":
        vllm_arms(a, model_dir, processor, engine, samples, group, params)
        tmp.cleanup()
        return
    med = timed({"ours": ours, "bare": bare}, a.rounds)
    print(f"ours: {med['ours']:.1f} tokens/s;  bare generate: {med['bare']:.1f} tokens/s")
    print(f"generation tokens/s ratio (ours/bare): {med['ours'] / med['bare']:.2f}")
    tmp.cleanup()


def timed(arms: dict, rounds: int) -> dict[str, float]:
    """Each arm once to warm up (allocator, kernels), then ``rounds`` rounds of every arm in turn; the median
    tokens/s of each (``fn(round)`` returns the tokens it generated)."""
    for fn in arms.values():
        fn(-1)
    rates: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        for name, fn in arms.items():
            t0 = time.perf_counter()
            tokens = fn(r)
            dt = time.perf_counter() - t0
            rates[name].append(tokens / dt)
            print(f"round {r + 1} {name:>12}: {tokens} tokens in {dt:.2f} s = {tokens / dt:.1f} tokens/s", flush=True)
    return {k: statistics.median(v) for k, v in rates.items()}


def vllm_arms(a, model_dir, processor, hf_engine, samples, group, params) -> None:
    """Our VLLMEngine, a bare vllm.LLM.generate on the same requests, and our HFEngine; tokens/s of each."""
    from mmrlvr.rollout.vllm import VLLMEngine, build_requests, to_vllm_prompt

    t0 = time.perf_counter()
    engine = VLLMEngine(model_dir, processor, eos_ids=hf_engine.eos_ids, dtype="float32", seed=0)
    print(f"vLLM engine started in {time.perf_counter() - t0:.1f} s", flush=True)

    def ours(r: int) -> int:
        return int(engine.generate(samples, group, params, seed=r, step=0).response_mask.sum())

    def bare(r: int) -> int:
        requests = build_requests(processor, samples, group, params, seed=r, step=0, stop_token_ids=engine.eos_ids)
        prompts = [to_vllm_prompt(q) for q in requests]
        sampling = [engine._sampling(q.sampling) for q in requests]
        outs = engine.llm.generate(prompts, sampling, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def hf(r: int) -> int:
        return int(hf_engine.generate(samples, group, params, seed=r, step=0).response_mask.sum())

    arms = {"vllm (ours)": ours, "vllm (bare)": bare, "hf (ours)": hf}
    med = timed(arms, a.rounds)
    print("; ".join(f"{k}: {v:.1f} tokens/s" for k, v in med.items()))
    print(f"vllm/hf tokens/s ratio: {med['vllm (ours)'] / med['hf (ours)']:.2f}")
    print(f"ours/bare vLLM tokens/s ratio: {med['vllm (ours)'] / med['vllm (bare)']:.2f}")
    engine.close()


if __name__ == "__main__":
    main()
