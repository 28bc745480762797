"""Does GRPO learn the synthetic video task? avg@8 after training vs a learning-rate-0 control.

For each family (tiny Qwen2.5-VL, tiny Qwen3-VL): the supervised warm start on ``synth:video_count``
(``tiny:FAMILY:warm:video_count``, built once in ``$MMRLVR_CACHE`` with the video recipe of
``mmrlvr.models.warmstart.TASK_DEFAULTS``), then, per seed, two GRPO runs from it with the same seed, data
order and budget — ``optim.lr`` as given and ``optim.lr=0`` (the control: everything runs, nothing moves,
so its avg@8 is the warm start's, i.e. the "first" figure) — each evaluated on the same held-out prompts
(avg@8 at T = 1, greedy accuracy) after training. The claim is that the trained arm's avg@8 rises over
the control's by more than noise: the standard error is that of the paired per-prompt difference
(trained minus control, each prompt's share of 8 correct samples), over the eval prompts.
Video inputs go through the whole path: frames -> the numpy video processor -> HF engine -> trainer
forward -> update.

    MMRLVR_CACHE=/tmp/video/cache OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/video_study.py \
        [--families qwen2_5_vl qwen3_vl] [--steps 100] [--seeds 0 1 2] [--out runs/video-study]

Writes ``results.json`` to ``--out`` and prints one line per (family, seed): avg@8 control -> trained,
the delta with its standard error, greedy accuracy of both arms, wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any


def run_arm(model_dir: str, out: Path, lr: float, steps: int, eval_size: int, seed: int) -> dict[str, Any]:
    """One GRPO run and its held-out eval; ``per_prompt`` maps eval row id -> share of the k samples correct."""
    from mmrlvr.config import load_config
    from mmrlvr.train.heldout import evaluate_samples
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(None, [
        f"output_dir={out}", f"model.path={model_dir}", "data.train=synth:video_count",
        "data.eval=synth:video_count", "data.train_size=2000", f"data.eval_size={eval_size}", f"seed={seed}",
        "rollout.prompts_per_step=8", "rollout.group_size=8", "rollout.max_new_tokens=24",
        "algo.micro_batch_size=64", "algo.kl_coef=0.05", "algo.kl_estimator=k3", f"optim.lr={lr}",
        "optim.grad_clip=1.0", f"max_steps={steps}", "save_every=0", "eval.every=0", "eval.k=8",
        "eval.at_start=false", "eval.at_end=false", "progress=false", "tensorboard=false", "log_rollouts=false"])
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    trainer.train()
    train_s = time.perf_counter() - t0
    # the trainer's own eval (same engine, verifier, k, temperature, tokens, seed), observed per prompt
    per_prompt: dict[str, float] = {}
    k = cfg.eval.k

    def observe(kind: str, completions: list, samples: list) -> None:
        from mmrlvr.rewards import answer_judge

        if kind == "sampled":
            for c, s in zip(completions, samples):
                per_prompt[s.id] = per_prompt.get(s.id, 0.0) + float(answer_judge(c.text, s)[0]) / k

    trainer.rt.model.eval()
    after = evaluate_samples(trainer.rt.engine, trainer.eval_samples, k=k, temperature=cfg.eval.temperature,
                             max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed, progress=False,
                             observe=observe)
    assert abs(sum(per_prompt.values()) / len(per_prompt) - after[f"avg@{k}"]) < 1e-9, "per-prompt tally drifted"
    return {"lr": lr, "after": after, "per_prompt": per_prompt, "train_s": round(train_s, 1)}


def paired_delta(trained: dict[str, float], control: dict[str, float]) -> tuple[float, float]:
    """(mean, standard error) of trained - control over the prompts both arms were evaluated on."""
    d = [trained[i] - control[i] for i in trained]
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    return mean, math.sqrt(var / len(d))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=["qwen2_5_vl", "qwen3_vl"])
    ap.add_argument("--steps", type=int, default=100, help="GRPO steps per arm")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-size", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/video-study")
    args = ap.parse_args()

    from mmrlvr.train.model_path import resolve_model_path

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for family in args.families:
        model_dir = resolve_model_path(f"tiny:{family}:warm:video_count")
        warm = json.loads((Path(model_dir) / "warmstart.json").read_text())
        results[family] = {"warm_start": {k: warm[k] for k in ("greedy_accuracy", "avg@8", "pass@8", "format_rate",
                                                                "steps_run", "train_s", "n")}, "seeds": {}}
        for seed in args.seeds:
            arms = {name: run_arm(model_dir, out / f"{family}-s{seed}-{name}", lr, args.steps, args.eval_size, seed)
                    for name, lr in (("trained", args.lr), ("lr0", 0.0))}
            delta, se = paired_delta(arms["trained"]["per_prompt"], arms["lr0"]["per_prompt"])
            t, c = arms["trained"]["after"], arms["lr0"]["after"]
            results[family]["seeds"][seed] = {"arms": arms, "delta_avg@8": round(delta, 4), "se": round(se, 4)}
            print(f"{family} seed {seed}: avg@8 lr-0 control {c['avg@8']:.3f} -> trained {t['avg@8']:.3f} after "
                  f"{args.steps} GRPO steps (delta {delta:+.3f} +- {se:.3f} SE, n={len(arms['lr0']['per_prompt'])}); "
                  f"greedy {c['greedy_accuracy']:.3f} -> {t['greedy_accuracy']:.3f}; "
                  f"train {arms['trained']['train_s']:.0f} s / {arms['lr0']['train_s']:.0f} s", flush=True)
            (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
        deltas = [r["delta_avg@8"] for r in results[family]["seeds"].values()]
        if len(deltas) > 1:  # the seeds' spread: the noise of the whole recipe, not only of the eval sample
            mean = sum(deltas) / len(deltas)
            se = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1) / len(deltas))
            results[family]["delta_over_seeds"] = {"mean": round(mean, 4), "se": round(se, 4), "n": len(deltas)}
            print(f"{family}: delta avg@8 over {len(deltas)} seeds {mean:+.3f} +- {se:.3f} SE "
                  f"({', '.join(f'{d:+.3f}' for d in deltas)})", flush=True)
            (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
