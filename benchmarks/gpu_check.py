"""GPU check of the vLLM rollout engine against the HF model (run on a CUDA machine with vLLM).

    benchmarks/gpu_check.sh            # or: python benchmarks/gpu_check.py [--family qwen2_5_vl] [--lora]

What it does, and prints:
1. builds the tiny model offline, loads it in HF (fp32, CUDA) and in vLLM (fp32, eager);
2. samples G responses per prompt through ``VLLMEngine`` and compares vLLM's sampled-token log-probs with a
   teacher-forced HF forward of the same tokens: max |diff| over counted tokens (expect ~1e-5..1e-3 in fp32);
3. checks that a stopped row's token ids end with an EOS id (the mask counts through the EOS);
4. same (seed, step) twice -> identical responses (vLLM per-request seeds);
5. weight sync: perturbs the HF weights, compares before/after ``sync_weights`` (the diff must drop back);
6. with --lora: the same through a LoRA adapter and ``LoRARequest``.
Ends with one JSON line of the figures and PASS/FAIL; exit status 0 only if every check passed.
Nothing here is run by the CPU test suite; no figure from it is claimed until someone runs it on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch


def teacher_forced_diff(model, batch, temperature: float) -> float:
    device = next(model.parameters()).device
    inputs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.model_inputs().items()}
    with torch.no_grad():
        logits = model(**inputs).logits.float()
    p, length = batch.prompt_length, batch.response_ids.shape[1]
    logp = torch.log_softmax(logits[:, p - 1:p - 1 + length] / temperature, -1)
    logp = logp.gather(-1, batch.response_ids.to(device)[..., None]).squeeze(-1).cpu()
    return float(((logp - batch.old_logprobs) * batch.response_mask).abs().max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen2_5_vl", choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tol", type=float, default=2e-3, help="max |log-prob diff| to pass (fp32)")
    parser.add_argument("--lora", action="store_true", help="also check LoRA sync through LoRARequest")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing checked")
        return 2

    from mmrlvr.data import make_rows, rows_to_samples
    from mmrlvr.models import apply_lora, build_tiny, load_policy
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.rollout.hf import HFEngine
    from mmrlvr.rollout.vllm import VLLMEngine

    figures: dict[str, object] = {"family": args.family}
    ok = True
    folder = Path(tempfile.mkdtemp(prefix="mmrlvr-gpu-check-")) / args.family
    build_tiny(args.family, folder, seed=0)
    model, processor = load_policy(folder, dtype="float32", device="cuda")
    eos = HFEngine(model, processor).eos_ids
    samples = rows_to_samples(make_rows("count", "test", args.prompts, seed=0))
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    llm_kwargs = dict(dtype="float32", enforce_eager=True, gpu_memory_utilization=0.25, max_model_len=512,
                      limit_mm_per_prompt={"image": 2}, seed=0)

    t0 = time.perf_counter()
    engine = VLLMEngine(folder, processor, eos_ids=eos, **llm_kwargs)
    figures["vllm_start_s"] = round(time.perf_counter() - t0, 1)
    batch = engine.generate(samples, args.group, params, seed=0, step=0)
    figures["rows"] = batch.num_rows
    figures["max_abs_logprob_diff"] = diff = teacher_forced_diff(model, batch, params.temperature)
    print(f"[1] vLLM vs HF teacher-forced log-probs: max |diff| = {diff:.3e} over {int(batch.response_mask.sum())} tokens")
    ok &= diff < args.tol

    stopped = [c for c in batch.completions if c.finish_reason == "stop"]
    eos_included = all(c.token_ids and c.token_ids[-1] in eos for c in stopped)
    figures["stopped_rows"], figures["eos_in_token_ids"] = len(stopped), eos_included
    print(f"[2] {len(stopped)} rows stopped; EOS id is the last response token in all of them: {eos_included}")
    ok &= eos_included

    again = engine.generate(samples, args.group, params, seed=0, step=0)
    same = torch.equal(again.response_ids, batch.response_ids)
    other = engine.generate(samples, args.group, params, seed=0, step=1)
    figures["same_seed_same_batch"] = same
    figures["other_step_differs"] = not torch.equal(other.response_ids[:, :4], batch.response_ids[:, :4])
    print(f"[3] same (seed, step) -> same responses: {same}; another step differs: {figures['other_step_differs']}")
    ok &= same

    with torch.no_grad():  # a perturbation big enough to change the log-probs
        for name, p in model.named_parameters():
            if "language_model" in name and name.endswith("q_proj.weight"):
                p.add_(0.05 * torch.randn_like(p))
    stale = teacher_forced_diff(model, engine.generate(samples, args.group, params, seed=0, step=2), 1.0)
    engine.sync_weights(model)
    synced = teacher_forced_diff(model, engine.generate(samples, args.group, params, seed=0, step=3), 1.0)
    figures["diff_before_sync"], figures["diff_after_sync"] = stale, synced
    print(f"[4] weight sync: max |diff| before sync {stale:.3e}, after sync {synced:.3e}")
    ok &= synced < args.tol < stale
    engine.close()
    torch.cuda.empty_cache()

    if args.lora:
        peft_model = apply_lora(model, r=8, alpha=16)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
        lora_engine = VLLMEngine(folder, processor, eos_ids=eos, sync="lora", policy=peft_model, **llm_kwargs)
        lora_engine.policy = None  # synced explicitly below
        lora_engine.sync_weights(peft_model)
        lora_diff = teacher_forced_diff(peft_model, lora_engine.generate(samples, args.group, params, seed=0,
                                                                        step=4), 1.0)
        figures["lora_diff"] = lora_diff
        print(f"[5] LoRA adapter through LoRARequest: max |diff| = {lora_diff:.3e}")
        ok &= lora_diff < args.tol

    figures["pass"] = bool(ok)
    print("gpu_check: " + json.dumps(figures))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
