"""Our GRPO step vs TRL's GRPOTrainer on the same tiny VLM, data, group size and lengths.

Each arm runs in its own subprocess (so peak RSS is that arm's alone), the two alternate twice, and the
script prints per-arm medians and the ratios ours/TRL. Settings matched on both sides (STACK.md, "Peers"):
the tiny Qwen2.5-VL (full fine-tuning, float32), 16 prompts x 8 generations = 128 completions per step,
32 new tokens, T = 1.0, k3 KL to the reference with beta 0.05, AdamW lr 1e-4 constant, grad clip 1.0, one
optimisation pass per generation batch, no gradient checkpointing, no bf16, no eval, no checkpoints.
Ours also writes its rollout store (a background thread) unless --no-rollout-log.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/step_vs_trl.py [--steps 5] [--rounds 2]

Ends with:
    step time ratio (ours/TRL): X
    peak memory ratio (ours/TRL): Y
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, GROUP, NEW_TOKENS, BETA, LR = 16, 8, 32, 0.05, 1e-4


def _samples(n: int):
    from mmrlvr.data import rows_to_samples
    from mmrlvr.data.synth import make_rows

    return rows_to_samples(make_rows("count", "train", n, seed=0))


def run_ours(model_dir: str, steps: int, out: str, rollout_log: bool) -> dict:
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(data={
        "output_dir": out, "max_steps": steps, "save_every": 0, "log_rollouts": rollout_log,
        "tensorboard": False, "progress": False,
        "model": {"path": model_dir, "freeze_vision": True},
        "data": {"train": "synth:count", "train_size": PROMPTS * steps},
        "rollout": {"group_size": GROUP, "prompts_per_step": PROMPTS, "max_new_tokens": NEW_TOKENS},
        "algo": {"kl_coef": BETA, "kl_estimator": "k3", "micro_batch_size": PROMPTS * GROUP},
        "optim": {"lr": LR, "grad_clip": 1.0},
        "rewards": [{"name": "format", "weight": 0.2}, {"name": "auto_accuracy", "weight": 1.0}],
        "eval": {"at_start": False, "at_end": False},
    })
    trainer = Trainer(cfg)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        trainer.run_step(step)
        times.append(time.perf_counter() - t0)
    if trainer.writer is not None:
        trainer.writer.close()
    return {"step_s": times}


def run_trl(model_dir: str, steps: int, out: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mmrlvr.models import load_policy
    from mmrlvr.rewards.base import build_reward
    from mmrlvr.types import Completion

    samples = _samples(PROMPTS * steps)
    fmt, acc = build_reward("format"), build_reward("auto_accuracy")

    def reward(completions, idx, **_):
        out = []
        for c, i in zip(completions, idx):
            text = c[0]["content"] if isinstance(c, list) else c
            comp, s = Completion(text=text), samples[i]
            out.append(0.2 * fmt(comp, s).score + acc(comp, s).score)
        return out

    ds = Dataset.from_list([{"prompt": s.messages, "image": s.images[0], "idx": i} for i, s in enumerate(samples)])
    model, processor = load_policy(model_dir)
    args = GRPOConfig(
        output_dir=out, max_steps=steps, per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
        max_completion_length=NEW_TOKENS, temperature=1.0, beta=BETA, learning_rate=LR, max_grad_norm=1.0,
        lr_scheduler_type="constant", bf16=False, gradient_checkpointing=False, use_cpu=True,
        logging_steps=1, report_to=[], save_strategy="no", num_iterations=1, steps_per_generation=1,
        shuffle_dataset=False, seed=0, disable_dropout=True,
    )
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                          processing_class=processor, callbacks=[Timer()])
    torch.manual_seed(0)
    trainer.train()
    return {"step_s": times}


def child(arm: str, model_dir: str, steps: int, rollout_log: bool) -> None:
    with tempfile.TemporaryDirectory() as out:
        res = run_ours(model_dir, steps, out, rollout_log) if arm == "ours" else run_trl(model_dir, steps, out)
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(res))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="steps per arm; the first is warm-up and not timed")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of (ours, TRL)")
    p.add_argument("--model", default=None, help="model folder (default: build the tiny Qwen2.5-VL)")
    p.add_argument("--no-rollout-log", action="store_true", help="ours: do not write the rollout store")
    p.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.model, args.steps, not args.no_rollout_log)
        return
    model_dir = args.model
    if model_dir is None:
        from mmrlvr.models.tiny import build_tiny

        model_dir = str(build_tiny("qwen2_5_vl", Path(tempfile.mkdtemp()) / "tiny"))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    results: dict[str, list[dict]] = {"ours": [], "trl": []}
    for r in range(args.rounds):
        for arm in ("ours", "trl"):
            cmd = [sys.executable, __file__, "--child", arm, "--model", model_dir, "--steps", str(args.steps)]
            if args.no_rollout_log:
                cmd.append("--no-rollout-log")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
                raise SystemExit(f"{arm} arm failed (exit {proc.returncode})")
            res = json.loads(line[len("RESULT "):])
            results[arm].append(res)
            timed = res["step_s"][1:] or res["step_s"]
            print(f"round {r + 1} {arm:>4}: median step {statistics.median(timed):.3f} s, "
                  f"peak RSS {res['peak_rss_mib']:.0f} MiB")
    med = {a: statistics.median([t for res in rs for t in (res["step_s"][1:] or res["step_s"])])
           for a, rs in results.items()}
    mem = {a: max(res["peak_rss_mib"] for res in rs) for a, rs in results.items()}
    print(f"ours: {med['ours']:.3f} s/step, {mem['ours']:.0f} MiB;  TRL: {med['trl']:.3f} s/step, {mem['trl']:.0f} MiB")
    print(f"step time ratio (ours/TRL): {med['ours'] / med['trl']:.2f}")
    print(f"peak memory ratio (ours/TRL): {mem['ours'] / mem['trl']:.2f}")


if __name__ == "__main__":
    main()
