"""Seed methods vs plain GRPO under the same budget (issue 19): held-out greedy / avg@k, time, KL and grad spikes.

Every arm is ``configs/demo-tiny.yaml`` (GRPO on the warm-started tiny Qwen2.5-VL) on ``--task`` with the
method's keys on top, for ``--steps`` steps and each seed in ``--seeds``; held-out greedy accuracy and avg@k
come from the trainer's own final evaluation. Per arm: wall and CPU seconds, mean KL, the largest KL, and
"spikes" = steps whose grad norm exceeds 3x the run's median. The LoRA inits run with LoRA on (r 16, α 32,
the paper's recipe), against a GRPO+LoRA default-init arm, at ``--lr`` and at 3x ``--lr`` (the paper's
instability claim). Writes ``<out>/results.md`` and ``results.json``; rows are written as arms finish.

    python benchmarks/seed_study.py --steps 60 --seeds 0 1 2 --out runs/seed_study
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: arm -> overrides on top of the base config
ARMS: dict[str, list[str]] = {
    "grpo": [],
    "acpo": ["algo.clip=acpo", "algo.epochs=2"],
    "grpo_epochs2": ["algo.epochs=2"],
    "delta": ["credit.scheme=delta"],
    "popo": ["algo.loss=popo", "algo.kl_coef=0"],
    "poise": ["algo.advantage=poise"],
}
LORA = ["model.lora.enabled=true", "model.lora.r=16", "model.lora.alpha=32"]
LORA_ARMS = {"lora_default": ["model.lora.init=default"], "lora_rlpo": ["model.lora.init=rlpo"],
             "lora_rlmo": ["model.lora.init=rlmo"], "lora_milora": ["model.lora.init=milora"]}


def run_arm(name: str, overrides: list[str], seed: int, steps: int, out: Path, task: str, k: int,
            eval_size: int) -> dict[str, Any]:
    from mmrlvr.config import load_config
    from mmrlvr.train.metrics import read_metrics
    from mmrlvr.train.trainer import Trainer

    warm = "tiny:qwen2_5_vl:warm" + ("" if task == "count" else f":{task}")
    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", overrides=[
        f"output_dir={out}", f"max_steps={steps}", f"seed={seed}", "save_every=0", "log_rollouts=false",
        "progress=false", "tensorboard=false", f"model.path={warm}", f"data.train=synth:{task}",
        f"data.eval=synth:{task}", f"data.eval_size={eval_size}", f"eval.k={k}", "eval.every=0",
        "eval.at_start=false", "eval.at_end=true", *overrides])
    t0, c0 = time.perf_counter(), time.process_time()
    summary = Trainer(cfg).train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "grad_norm" in r]
    grads = [r["grad_norm"] for r in rows]
    kls = [r.get("kl", 0.0) for r in rows]
    med = statistics.median(grads) if grads else math.nan
    after = summary.get("after", {})
    return {"arm": name, "seed": seed, "wall_s": wall, "cpu_s": cpu, "greedy": after.get("greedy_accuracy"),
            f"avg@{k}": after.get(f"avg@{k}"), "kl_mean": sum(kls) / max(len(kls), 1), "kl_max": max(kls or [0]),
            "grad_spikes": sum(g > 3 * med for g in grads), "grad_max": max(grads or [0])}


def table(results: list[dict[str, Any]], k: int) -> str:
    arms: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        arms.setdefault(r["arm"], []).append(r)
    lines = [f"| arm | seeds | greedy (mean ± sd) | avg@{k} (mean ± sd) | wall s | CPU s | KL mean | KL max | "
             "grad spikes |", "|---|---|---|---|---|---|---|---|---|"]

    def ms(xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "–"
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return f"{statistics.mean(xs):.3f} ± {sd:.3f}"

    for arm, rs in arms.items():
        lines.append(f"| {arm} | {len(rs)} | {ms([r['greedy'] for r in rs])} | {ms([r[f'avg@{k}'] for r in rs])} | "
                     f"{statistics.mean(r['wall_s'] for r in rs):.0f} | {statistics.mean(r['cpu_s'] for r in rs):.0f} | "
                     f"{statistics.mean(r['kl_mean'] for r in rs):.4f} | {max(r['kl_max'] for r in rs):.4f} | "
                     f"{sum(r['grad_spikes'] for r in rs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--task", default="count", help="count | count_chatter (each from its own warm start)")
    p.add_argument("--arms", nargs="+", default=[*ARMS, *LORA_ARMS], help="subset of the arms")
    p.add_argument("--lr", type=float, default=1e-4, help="nominal learning rate (LoRA arms also run at 3x)")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--eval-size", type=int, default=100)
    p.add_argument("--out", default="runs/seed_study")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan: list[tuple[str, list[str]]] = []
    for arm in args.arms:
        if arm in ARMS:
            plan.append((arm, [f"optim.lr={args.lr}", *ARMS[arm]]))
        elif arm in LORA_ARMS:
            for mult in (1, 3):
                plan.append((f"{arm}@{mult}xlr", [*LORA, f"optim.lr={args.lr * mult}", *LORA_ARMS[arm]]))
        else:
            raise SystemExit(f"unknown arm {arm!r}; known: {', '.join([*ARMS, *LORA_ARMS])}")
    results: list[dict[str, Any]] = []
    for seed in args.seeds:
        for name, overrides in plan:
            res = run_arm(name, overrides, seed, args.steps, out / f"{name}-seed{seed}", args.task, args.k,
                          args.eval_size)
            results.append(res)
            print(f"[{name} seed {seed}] greedy {res['greedy']} avg@{args.k} {res[f'avg@{args.k}']} "
                  f"({res['wall_s']:.0f} s)", flush=True)
            (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
            (out / "results.md").write_text(table(results, args.k) + "\n")
    print(table(results, args.k))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
