"""What vision-sensitive token credit costs per training step: `vepo` and `vppo` against `none`.

    OMP_NUM_THREADS=1 python benchmarks/credit_overhead.py [--steps 7] [--settings tiny,large_vocab]

One train step here is what the credit scheme adds to: the policy's teacher-forced forward (logits of the
response positions only, as the trainer asks for them), chunked token log-probs, a clipped-ratio loss,
backward. `none` stops there. `vepo` / `vppo` also perturb the pixel values, run the extra no-grad
forward on the perturbed image (backbone, then lm_head chunk by chunk), compute the per-token signals
and apply the scheme's token weights / advantage scale inside the loss. VEPO compares full
distributions (JSD, entropy shift) of the policy's own (detached) clean logits and the perturbed pass;
VPPO reads only the sampled token's perturbed log-prob (``distribution=False``, no clean side). No optimiser step is
timed (it would only shrink the ratios).

Settings:
  tiny         STACK.md's study model (real Qwen2_5_VLForConditionalGeneration, text hidden 128, 2 layers,
               vision depth 2), 32 rows = 4 prompts x G 8, a 112x112 image per prompt (16 image tokens),
               45-token prompt, 32-token responses, the tiny tokenizer's vocabulary
  large_vocab  the same body with a 32,000-token vocabulary, 4 rows = 1 prompt x G 4, 512-token responses
  large_vocab_wide (optional, --settings) as large_vocab with text hidden 512, MLP 1024, 8 heads

The policy pass runs the vision tower on every row's copy of the image (as the trainer does when the
vision tower is trained); the perturbed pass runs it once per distinct image (``final_hidden_states``).

Time: all arms of a setting run in one process, interleaved step by step (none, vepo, vppo, none, ...)
after one warm-up step each. The figure is the median CPU time of the process per step
(``time.process_time``): with one compute thread it measures the work done, whatever else runs on a
shared machine; the median wall time is printed beside it (equal to CPU time on an idle machine). Memory: one fresh subprocess per (setting, arm) runs a warm-up step,
resets the kernel's RSS high-water mark (``echo 5 > /proc/self/clear_refs``, Linux), runs two steps and
reads ``VmHWM``: the peak resident memory of the whole process during the steps (Python, torch and the
model included, as a user sees it). It also prints the peak above the resident memory just before the
steps ("step increment"), a stricter view of the same peak. OMP_WAIT_POLICY=PASSIVE is set for every
process (STACK.md: busy-waiting OpenMP distorts timings on shared cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

ARMS = ("none", "vepo", "vppo")
SETTINGS = {
    "tiny": {"rows": 32, "group": 8, "prompt_text": 29, "response": 32, "vocab": None},
    "large_vocab": {"rows": 4, "group": 4, "prompt_text": 29, "response": 512, "vocab": 32000},
    # optional: the same with a 4x wider body, towards real models where the matmuls dominate
    "large_vocab_wide": {"rows": 4, "group": 4, "prompt_text": 29, "response": 512, "vocab": 32000,
                         "body": {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
                                  "num_key_value_heads": 4}},
}


def build(setting: str) -> dict[str, Any]:
    """The model, processor and one rollout-shaped batch (RolloutBatch layout: prompt then response)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from mmrlvr.models.tiny import build_tokenizer, make_config, make_processor

    spec = SETTINGS[setting]
    tok = build_tokenizer()
    config = make_config("qwen2_5_vl", tok, **spec.get("body", {}))
    if spec["vocab"]:
        config.text_config.vocab_size = spec["vocab"]
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.train()
    processor = make_processor("qwen2_5_vl", tok, config)
    rng = np.random.RandomState(0)
    n, P_text, L = spec["rows"], spec["prompt_text"], spec["response"]
    distinct = [Image.fromarray(rng.randint(0, 256, (112, 112, 3), dtype=np.uint8)) for _ in range(n // spec["group"])]
    images = [distinct[i // spec["group"]] for i in range(n)]  # group-contiguous: G rollouts share an image
    vision = processor.image_processor(images, return_tensors="pt")
    n_img = int(vision["image_grid_thw"][0].prod()) // 4  # 16 image tokens after the 2x2 merge
    V_text = min(len(tok), config.text_config.vocab_size)
    g = torch.Generator().manual_seed(0)
    text = torch.randint(20, len(tok) - 20, (n, P_text), generator=g)
    special = torch.tensor([config.vision_start_token_id] + [config.image_token_id] * n_img
                           + [config.vision_end_token_id]).expand(n, -1)
    prompt = torch.cat([text[:, :4], special, text[:, 4:]], 1)  # [n, P]
    resp = torch.randint(20, V_text - 20, (n, L), generator=g)
    mask = torch.ones(n, L)
    for i in range(n):  # ragged lengths, right-padded
        mask[i, L - (i * 7) % max(1, L // 4):] = 0
    resp[mask == 0] = tok.pad_token_id
    ids = torch.cat([prompt, resp], 1)
    attn = torch.cat([torch.ones_like(prompt), mask.long()], 1)
    inputs = {"input_ids": ids, "attention_mask": attn, **vision}
    return {"model": model, "processor": processor, "inputs": inputs, "resp": resp, "mask": mask,
            "P": prompt.shape[1], "old": -torch.rand(n, L, generator=g) * 3,
            "adv": torch.randn(n, generator=g)}


def train_step(b: dict[str, Any], arm: str, step: int, chunk_size: int) -> dict[str, float]:
    """Policy forward + (credit) + loss + backward, as the trainer would do them; returns the loss,
    the gradient norm and the fraction of tokens carrying weight (for the smoke test)."""
    from mmrlvr.algos import logprobs_from_logits
    from mmrlvr.credit import CREDIT_SCHEMES, perturb_vision, token_signals_from_model

    model, inputs, resp, mask, P = b["model"], b["inputs"], b["resp"], b["mask"], b["P"]
    L = resp.shape[1]
    logits = model(**inputs, logits_to_keep=L + 1, use_cache=False).logits[:, :-1]  # [N, L, V]
    logp = logprobs_from_logits(logits, resp)  # [N, L]
    weights, adv = mask, b["adv"]
    if arm != "none":
        scheme = CREDIT_SCHEMES.get(arm)
        name, params = scheme.perturbation
        pert = {**inputs, **perturb_vision(inputs, name, seed=step, processor=b["processor"], **params)}
        full = scheme.needs_distribution  # VEPO: JSD/entropy shift; VPPO: only the perturbed sampled log-prob
        signals = token_signals_from_model(model, None, pert, P, resp, mask,
                                           logits_clean=logits.detach() if full else None,
                                           old_logprobs=b["old"], chunk_size=chunk_size, distribution=full)
        credit = scheme(signals, mask, adv)
        weights, adv = mask * credit.token_weights, adv * credit.adv_scale
    ratio = torch.exp(logp - b["old"])
    per_token = -torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.28) * adv[:, None])
    loss = (per_token * weights).sum() / weights.sum().clamp(min=1.0)
    loss.backward()
    grad_norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None))
    model.zero_grad(set_to_none=True)
    return {"loss": float(loss.detach()), "grad_norm": float(grad_norm),
            "weighted_fraction": float((weights > 0).sum() / (mask > 0).sum())}


def _kib(field: str) -> int:
    return int(re.search(field + r":\s+(\d+)", open("/proc/self/status").read()).group(1))


def memory_worker(setting: str, arm: str, chunk_size: int) -> dict[str, float]:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    b = build(setting)
    train_step(b, arm, 0, chunk_size)  # warm-up: allocator pools, lazy inits
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _kib("VmRSS")
    for step in (1, 2):
        train_step(b, arm, step, chunk_size)
    peak = _kib("VmHWM")
    return {"peak_mib": peak / 1024, "increment_mib": (peak - before) / 1024}


def time_worker(setting: str, steps: int, chunk_size: int) -> dict[str, float]:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    b = build(setting)
    wall: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[float]] = {a: [] for a in ARMS}
    for a in ARMS:
        train_step(b, a, 0, chunk_size)
    for step in range(1, steps + 1):
        for a in ARMS:
            t0, c0 = time.perf_counter(), time.process_time()
            train_step(b, a, step, chunk_size)
            wall[a].append(time.perf_counter() - t0)
            cpu[a].append(time.process_time() - c0)
    return {a: {"cpu": statistics.median(cpu[a]), "wall": statistics.median(wall[a])} for a in ARMS}


def _run_child(args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=7, help="timed steps per arm (median reported)")
    ap.add_argument("--settings", default="tiny,large_vocab", help="comma list of: " + ", ".join(SETTINGS))
    ap.add_argument("--chunk-size", type=int, default=256, help="tokens per chunk in the credit signals")
    ap.add_argument("--worker", choices=["time", "memory"], help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker == "time":
        print(json.dumps(time_worker(a.setting, a.steps, a.chunk_size)))
        return 0
    if a.worker == "memory":
        print(json.dumps(memory_worker(a.setting, a.arm, a.chunk_size)))
        return 0

    settings = [s for s in a.settings.split(",") if s]
    print(f"credit overhead: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}, "
          f"OMP_WAIT_POLICY=PASSIVE, torch {torch.__version__}, chunk {a.chunk_size}, {a.steps} timed steps")
    ratios: dict[str, dict[str, tuple[float, float, float]]] = {}
    for s in settings:
        t = _run_child(["--worker", "time", "--setting", s, "--steps", str(a.steps),
                        "--chunk-size", str(a.chunk_size)])
        m = {arm: _run_child(["--worker", "memory", "--setting", s, "--arm", arm,
                              "--chunk-size", str(a.chunk_size)]) for arm in ARMS}
        spec = SETTINGS[s]
        print(f"\n[{s}] rows {spec['rows']} (G {spec['group']}), response {spec['response']} tokens, vocab "
              f"{spec['vocab'] or 'tiny tokenizer'}")
        print(f"  {'arm':6s} {'CPU s':>7s} {'wall s':>7s} {'peak RSS MiB':>13s} {'step increment MiB':>19s}")
        for arm in ARMS:
            print(f"  {arm:6s} {t[arm]['cpu']:7.3f} {t[arm]['wall']:7.3f} {m[arm]['peak_mib']:13.1f} "
                  f"{m[arm]['increment_mib']:19.1f}")
        for arm in ARMS[1:]:
            inc_base = max(m["none"]["increment_mib"], 1e-6)
            ratios.setdefault(arm, {})[s] = (t[arm]["cpu"] / t["none"]["cpu"], t[arm]["wall"] / t["none"]["wall"],
                                             m[arm]["peak_mib"] / m["none"]["peak_mib"],
                                             m[arm]["increment_mib"] / inc_base)
    print("\n(targets: time ratio <= 1.3, peak-memory ratio <= 1.15; time = median CPU time per step)")
    for arm, per in ratios.items():
        for s, (tr, tw, mr, ir) in per.items():
            print(f"{arm}/none [{s}]: time ratio {tr:.2f}, memory ratio {mr:.2f} "
                  f"(wall-time ratio {tw:.2f}, step increment ratio {ir:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
