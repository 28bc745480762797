"""1 vs 2 processes, DDP vs FSDP2: step time, per-rank peak memory, per-rank parameter + optimizer-state bytes,
and decode tokens/s sharded vs unsharded, on a shape-true stand-in (issue 25).

Arms (each its own launch, so peak RSS is that arm's alone): ``1proc`` (plain, one process), ``ddp`` (2
ranks, ``torch.nn.parallel.DistributedDataParallel``, what accelerate's MULTI_CPU/MULTI_GPU wraps),
``fsdp2`` (2 ranks, ``mmrlvr.train.distributed.shard_model``: torch's ``fully_shard`` per block, root
last). The 2-rank arms start with ``torchrun --nproc_per_node 2`` over gloo on loopback.

Each arm trains ``--steps`` update steps of full fine-tuning, vision tower frozen (the policy-update part of
our step: forward,
token-mean loss, backward, ``clip_grad_norm_and_check``, AdamW from ``mmrlvr.train.optim``) on a fixed
global batch of ``--rows`` x ``--seq`` text tokens split over the ranks, then decodes ``--new-tokens``
greedily from one prompt per rank: plain (1proc, DDP's module), FSDP2 under ``gathered`` (one all-gather
per block per ``generate``: what the trainer does) and FSDP2 without it (an all-gather per block per
decoded token: what a naive sharded ``generate`` does).

The model is ``mmrlvr.models.standin``'s Qwen2.5-VL stand-in (``--shape qwen2_5_vl_3b``: real hidden,
intermediate, head and vision widths; ``--layers`` decoder layers, one vision block; ``--vocab`` tokens,
smaller than the real 151,936 so that two full-fine-tuning ranks fit in a shared machine's memory) or
``--shape toy`` (the 0.64 M tiny model).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/scaling.py --shape qwen2_5_vl_3b --layers 1 --vocab 8192 --steps 3
    OMP_WAIT_POLICY=PASSIVE python benchmarks/scaling.py --shape toy --steps 3
    OMP_WAIT_POLICY=PASSIVE python benchmarks/scaling.py --prefix-sharing --steps 8 [--strategy fsdp2]

``--prefix-sharing``: the trainer's whole step (``mmrlvr train``, configs/demo-tiny.yaml with VEPO credit; a stand-in with
``--shape``) on 2 processes with ``model.prefix_sharing`` on and off, alternated; ends with
``2-process step time ratio (prefix sharing on / off)``.

Ends with:
    step time ratio (ddp 2 ranks / 1 process): A
    step time ratio (fsdp2/ddp): B
    peak memory per rank (fsdp2/ddp): C
    per-rank state bytes (fsdp2/ddp): X        (parameters + AdamW state held by one rank; <= 0.55 expected)
    decode tokens/s (fsdp2 gathered / unsharded): D
    decode tokens/s (fsdp2 per-token gather / gathered): E
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ARMS = ("1proc", "ddp", "fsdp2")

# --------------------------------------------------------------------------------- on paper (--paper)
# published config.json of Qwen/Qwen2.5-VL-{3B,7B,32B}-Instruct: text widths, depth, KV heads, vocabulary;
# the vision tower (32 blocks of 1280, MLP 3420, merger to the text width) is the same for all three
PAPER_MODELS = {
    "3B": dict(h=2048, layers=36, inter=11008, heads=16, kv=2, vocab=151936, tied=True),
    "7B": dict(h=3584, layers=28, inter=18944, heads=28, kv=4, vocab=152064, tied=False),
    "32B": dict(h=5120, layers=64, inter=27648, heads=40, kv=8, vocab=152064, tied=False),
}
GIB = 2 ** 30


def paper_params(m: dict) -> dict[str, float]:
    """Parameter counts: decoder layers (q/k/v with bias, o, gate/up/down, 2 norms), embeddings, vision."""
    h, kvd = m["h"], m["kv"] * (m["h"] // m["heads"])
    layer = h * h + h + 2 * (h * kvd + kvd) + h * h + 3 * h * m["inter"] + 2 * h
    embed = m["vocab"] * h * (1 if m["tied"] else 2)
    vh, vi = 1280, 3420
    vblock = vh * 3 * vh + 3 * vh + vh * vh + vh + 3 * vh * vi + 2 * vi + vh + 2 * vh
    vision = 32 * vblock + 3 * 2 * 14 * 14 * vh + (4 * vh) * (4 * vh) + 4 * vh + (4 * vh) * h + h + vh
    lora = m["layers"] * 16 * ((h + h) + (h + kvd) * 2 + (h + h))  # r 16 on q, k, v, o
    return {"layers": m["layers"] * layer, "embed": embed, "vision": vision, "total": m["layers"] * layer + embed + vision,
            "lora": lora, "layer": layer}


def paper_memory(size: str, gpus: int, strategy: str, lora: bool, ckpt: bool, vllm: bool, kl: bool = True,
                 tokens: int = 8192, kv_tokens: int = 131072) -> dict[str, float]:
    """Per-GPU GiB, computed (not measured). Assumptions (docs/scaling.md): bf16 weights and gradients,
    float32 AdamW moments (optim.state_dtype: float32), frozen vision tower, a micro-batch of ``tokens``
    tokens, flash/sdpa attention (activations ~34 bytes x hidden per token per layer, Korthikanti et al.
    2022; with gradient checkpointing 2 bytes x hidden per token per layer kept plus one layer recomputed),
    our chunked log-probs (no full-vocabulary logits), a frozen reference copy for full fine-tuning with
    KL (LoRA: the adapter-off policy), and for a colocated vLLM its own bf16 weights plus a KV cache of
    ``kv_tokens`` tokens per GPU."""
    m = PAPER_MODELS[size]
    p = paper_params(m)
    n = gpus if strategy == "fsdp2" else 1
    trainable = p["lora"] if lora else p["total"] - p["vision"]
    weights = 2 * p["total"] / n
    grads = 2 * trainable / n
    adam = 8 * trainable / n
    ref = 0.0 if lora or not kl else 2 * p["total"] / n
    gathered = 0.0
    if strategy == "fsdp2" and gpus > 1:  # the root (embeddings, head) gathered + two blocks in flight
        gathered = 2 * p["embed"] + 2 * 2 * p["layer"]
    act_layer = (2 if ckpt else 34) * tokens * m["h"]
    acts = m["layers"] * act_layer + (34 * tokens * m["h"] if ckpt else 0)
    vllm_b = (2 * p["total"] + kv_tokens * 2 * m["layers"] * m["kv"] * (m["h"] // m["heads"]) * 2) if vllm else 0.0
    parts = {"weights": weights, "grads": grads, "adam": adam, "ref": ref, "gathered": gathered,
             "activations": acts, "vllm": vllm_b}
    parts = {k: v / GIB for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def print_paper() -> None:
    for size in PAPER_MODELS:
        p = paper_params(PAPER_MODELS[size])
        print(f"Qwen2.5-VL-{size}: {p['total'] / 1e9:.2f} B parameters ({p['vision'] / 1e9:.2f} B vision), "
              f"LoRA r16 q/k/v/o {p['lora'] / 1e6:.1f} M")
    print("| model | tuning | strategy | GPUs | grad ckpt | + vLLM | per-GPU GiB (computed) | fits 80 GB | fits 141 GB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in PAPER_MODELS:
        for lora in (True, False):
            for strategy, gpus in (("ddp", 1), ("ddp", 8), ("fsdp2", 8), ("fsdp2", 32)):
                for ckpt in (False, True):
                    for vllm in (False, True):
                        t = paper_memory(size, gpus, strategy, lora, ckpt, vllm)["total"]
                        print(f"| {size} | {'LoRA' if lora else 'full'} | {strategy} | {gpus} | "
                              f"{'yes' if ckpt else 'no'} | {'yes' if vllm else 'no'} | {t:.0f} | "
                              f"{'yes' if t < 74.5 else 'no'} | {'yes' if t < 131 else 'no'} |")


def build_model(shape: str, out: Path, layers: int, vocab: int) -> Path:
    if shape == "toy":
        from mmrlvr.models.tiny import build_tiny

        return build_tiny("qwen2_5_vl", out)
    from mmrlvr.models.standin import standin_model
    from mmrlvr.models.tiny import _finish_processor_files, build_tokenizer, make_processor

    tok = build_tokenizer()
    model = standin_model(shape, tok, layers=layers, vision_depth=1, vocab_size=max(vocab, len(tok)))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    make_processor("qwen2_5_vl", tok, model.config, image_size=448).save_pretrained(out)  # as build_standin
    _finish_processor_files(out, "qwen2_5_vl", model.config)
    return out


def child(arm: str, model_dir: str, a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from mmrlvr.models import load_policy
    from mmrlvr.train import distributed as D
    from mmrlvr.train.optim import build_optimizer, clip_grad_norm_and_check

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    model, _ = load_policy(model_dir, dtype="float32", device="cpu")
    from mmrlvr.models.lora import freeze_vision

    freeze_vision(model)  # text-only batches: the vision tower gets no gradient (frozen, as in our runs by default)
    model.train()
    plain = model
    if arm == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
        plain = model.module
    elif arm == "fsdp2":
        D.shard_model(model)
    opt = build_optimizer(model.parameters(), SimpleNamespace(lr=1e-5, betas=[0.9, 0.999], weight_decay=0.0))
    vocab = plain.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, min(vocab, 5000), (a.rows, a.seq), generator=gen)
    per = a.rows // world
    mine = ids[rank * per:(rank + 1) * per]
    count = float(a.rows * (a.seq - 1))
    times = []
    for _ in range(a.steps):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        logits = model(input_ids=mine).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), mine[:, 1:].reshape(-1),
                                                reduction="sum")
        (nll / count * world).backward()
        clip_grad_norm_and_check(list(model.parameters()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del logits, nll
        times.append(time.perf_counter() - t0)
    state = D.state_bytes(plain, opt)  # before decoding: afterwards FSDP2 may hold the root gathered
    local_params = D.local_numel(plain)
    plain.eval()
    prompt = ids[rank:rank + 1, :16]

    def decode(ctx) -> float:
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        with torch.no_grad(), ctx:
            out = plain.generate(input_ids=prompt, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                                 do_sample=False)
        return (out.shape[1] - prompt.shape[1]) / (time.perf_counter() - t0)

    import contextlib

    decode_plain = decode(D.gathered(plain))  # a no-op for unsharded models
    decode_pertoken = decode(contextlib.nullcontext()) if arm == "fsdp2" else None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mine_res = {"rank": rank, "step_s": times, "state_bytes": state, "peak_rss_mib": peak,
                "decode_tok_s": decode_plain, "decode_pertoken_tok_s": decode_pertoken,
                "local_params": local_params}
    every = [mine_res]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, mine_res)
        dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps(every), flush=True)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_arm(arm: str, model_dir: str, a: argparse.Namespace, env: dict[str, str]) -> list[dict]:
    args = [__file__, "--child", arm, "--model", model_dir, "--steps", str(a.steps), "--rows", str(a.rows),
            "--seq", str(a.seq), "--new-tokens", str(a.new_tokens)]
    if arm == "1proc":
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_port()), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit(f"{arm} arm failed (exit {proc.returncode})")
    return json.loads(line[len("RESULT "):])


def prefix_sharing_on_two_processes(a: argparse.Namespace) -> None:
    """``mmrlvr train`` under ``torchrun --nproc_per_node 2`` with prefix sharing on and off (alternated, each its
    own run folder); the median of ``time/step_s`` and ``time/train_s`` (the passes and the update, without
    generation) over the steps after the first, and the paths the first step's passes took (``topology.json``)."""
    root = Path(__file__).resolve().parents[1]
    work = Path(tempfile.mkdtemp(prefix="scaling-prefix-"))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = ["configs/demo-tiny.yaml", f"max_steps={a.steps}", "eval.at_start=false", "eval.at_end=false",
            "eval.every=0", "save_every=0", "progress=false", "log_rollouts=false", "tensorboard=false",
            f"distributed.strategy={a.strategy}", "credit.scheme=vepo"]
    if a.shape != "toy":
        model_dir = a.model or str(build_model(a.shape, work / a.shape, a.layers, a.vocab))
        args += [f"model.path={model_dir}", "data.image_size=448", "rollout.prompts_per_step=2",
                 "rollout.group_size=4", f"rollout.max_new_tokens={a.new_tokens}"]
    print(f"== 2 processes ({a.strategy}), {a.shape}, demo-tiny + VEPO credit, {a.steps} steps per run x {a.rounds} "
          f"rounds; OMP_NUM_THREADS={env['OMP_NUM_THREADS']} per process", flush=True)
    times: dict[str, dict[str, list[float]]] = {arm: {"step": [], "train": []} for arm in ("on", "off")}
    for r in range(a.rounds):
        for arm in ("on", "off"):
            out = work / f"{arm}-{r}"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                   str(_port()), "-m", "mmrlvr.cli", "train", *args, f"output_dir={out}",
                   f"model.prefix_sharing={'true' if arm == 'on' else 'false'}"]
            proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"prefix sharing {arm}: the 2-process run failed\n{proc.stderr[-3000:]}")
            lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
            rows = lines[1:] or lines
            times[arm]["step"] += [m["time/step_s"] for m in rows]
            times[arm]["train"] += [m["time/train_s"] for m in rows]
            topo = json.loads((out / "topology.json").read_text())
            print(f"round {r + 1} prefix sharing {arm:>3}: world size {topo['world_size']}, first step's passes "
                  f"{topo.get('passes')}, median step {statistics.median([m['time/step_s'] for m in rows]):.3f} s",
                  flush=True)
    med = {arm: {k: statistics.median(v) for k, v in t.items()} for arm, t in times.items()}
    for arm in ("on", "off"):
        print(f"prefix sharing {arm:>3}: step {med[arm]['step']:.3f} s, update part {med[arm]['train']:.3f} s (median)")
    print(f"2-process step time ratio (prefix sharing on / off): {med['on']['step'] / med['off']['step']:.2f}")
    print(f"2-process update time ratio (prefix sharing on / off): {med['on']['train'] / med['off']['train']:.2f}",
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="toy", choices=["toy", "qwen2_5_vl_3b", "qwen2_5_vl_7b"])
    p.add_argument("--layers", type=int, default=1, help="stand-ins: decoder layers")
    p.add_argument("--vocab", type=int, default=8192, help="stand-ins: vocabulary size")
    p.add_argument("--steps", type=int, default=3, help="update steps per arm; the first is warm-up, not timed")
    p.add_argument("--rows", type=int, default=4, help="global batch rows (split over the ranks)")
    p.add_argument("--seq", type=int, default=128, help="tokens per row")
    p.add_argument("--new-tokens", type=int, default=16, help="decoded tokens")
    p.add_argument("--model", default=None, help="model folder (default: build the --shape model)")
    p.add_argument("--paper", action="store_true",
                   help="print the computed per-GPU memory table of docs/scaling.md (Qwen2.5-VL 3B/7B/32B) and exit")
    p.add_argument("--prefix-sharing", action="store_true",
                   help="instead: the trainer's whole step (configs/demo-tiny.yaml with VEPO credit) on 2 processes with model.prefix_sharing "
                        "on and off, alternated; prints both step times and their ratio")
    p.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp2"], help="with --prefix-sharing")
    p.add_argument("--rounds", type=int, default=2, help="with --prefix-sharing: alternations of (on, off)")
    p.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.paper:
        print_paper()
        return
    if a.prefix_sharing:
        prefix_sharing_on_two_processes(a)
        return
    if a.child:
        child(a.child, a.model, a)
        return
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "OMP_WAIT_POLICY": "PASSIVE",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    model_dir = a.model
    if model_dir is None:
        t0 = time.perf_counter()
        model_dir = str(build_model(a.shape, Path(tempfile.mkdtemp()) / a.shape, a.layers, a.vocab))
        print(f"== {a.shape}: built in {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"== {a.shape} ({a.layers} layer(s), vocab {a.vocab if a.shape != 'toy' else 'tiny'}): full fine-tuning, "
          f"{a.rows} rows x {a.seq} tokens per step, {a.steps} steps; decode {a.new_tokens} tokens; "
          f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']} per process", flush=True)
    res = {}
    for arm in ARMS:
        res[arm] = run_arm(arm, model_dir, a, env)
        for r in res[arm]:
            timed = r["step_s"][1:] or r["step_s"]
            extra = (f", decode per-token gather {r['decode_pertoken_tok_s']:.1f} tok/s"
                     if r["decode_pertoken_tok_s"] else "")
            print(f"{arm:>6} rank {r['rank']}: step {statistics.median(timed):.3f} s, peak RSS {r['peak_rss_mib']:.0f} "
                  f"MiB, params+optimizer state {r['state_bytes'] / 2**20:.1f} MiB ({r['local_params']:,} parameter "
                  f"elements), decode {r['decode_tok_s']:.1f} tok/s{extra}", flush=True)

    def step(arm: str) -> float:  # the slowest rank's median step
        return max(statistics.median(r["step_s"][1:] or r["step_s"]) for r in res[arm])

    def worst(arm: str, key: str) -> float:
        return max(r[key] for r in res[arm])

    decode_unsharded = statistics.median([r["decode_tok_s"] for r in res["ddp"]])
    decode_gathered = statistics.median([r["decode_tok_s"] for r in res["fsdp2"]])
    decode_pertoken = statistics.median([r["decode_pertoken_tok_s"] for r in res["fsdp2"]])
    print(f"step time ratio (ddp 2 ranks / 1 process): {step('ddp') / step('1proc'):.2f}")
    print(f"step time ratio (fsdp2/ddp): {step('fsdp2') / step('ddp'):.2f}")
    print(f"peak memory per rank (fsdp2/ddp): {worst('fsdp2', 'peak_rss_mib') / worst('ddp', 'peak_rss_mib'):.2f}")
    print(f"per-rank state bytes (fsdp2/ddp): {worst('fsdp2', 'state_bytes') / worst('ddp', 'state_bytes'):.3f}")
    print(f"decode tokens/s (fsdp2 gathered / unsharded): {decode_gathered / decode_unsharded:.2f}")
    print(f"decode tokens/s (fsdp2 per-token gather / gathered): {decode_pertoken / decode_gathered:.2f}", flush=True)


if __name__ == "__main__":
    main()
