"""Which consistency reward fixes thinking–answer inconsistency without rewriting correct thinking?

From the inconsistent warm start (``tiny:qwen2_5_vl:warm:noise0.9``: thinking mostly right, answers
mostly random), trains one arm per reward with the same seed, data order and budget, and measures on the
held-out set, before -> after, for greedy and sampled (T = 1, k = 8) completions: inconsistency rate,
thinking accuracy, the four-way breakdown (thinking right/wrong x answer right/wrong) and
"both wrong but consistent", plus greedy accuracy and avg@8.

Arms (``--arms``; all use ``configs/consistency-tiny.yaml`` and differ only in the consistency reward):
  accuracy       format + accuracy; the consistency reward at weight 0 (metrics only)
  plain          + consistency ``plain`` (the known failure: it rewrites correct thinking)
  accurate_only  + consistency ``accurate_only`` (the default variant)
  follow         + consistency ``follow_correct_thinking``
  cora           + ``accurate_only`` with CORA advantage splitting
  care           + consistency ``care`` (GRPO-CARE bonus) with the rule judge
  answer_plain   + ``plain`` as a split advantage on the answer's tokens only (``consistency.scope=answer``)
  answer_accurate + ``accurate_only`` as a split advantage on the answer's tokens only
  answer_plain_b1, answer_plain_b2   ``answer_plain`` with consistency.beta 1.0 / 2.0 (0.5 by default)

Acceptance (docs/consistency.md): the default arm lowers the sampled inconsistency rate vs the warm start,
loses at most 3 points of sampled thinking accuracy, and ends no lower than the accuracy arm in greedy
accuracy and avg@8.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/consistency_study.py \
        [--steps 200] [--seeds 0] [--arms accuracy plain accurate_only follow cora] [--out runs/consistency-study]
    # then, e.g., a second seed for two arms, added to the same table:
    ... --seeds 1 --arms accuracy accurate_only --keep

Writes ``results.json`` and ``results.md`` (the table) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ARM = "accurate_only"

ARMS: dict[str, list[str]] = {
    "accuracy": ["rewards.2.weight=0"],
    # sequence-level rewards: every token of a rollout gets the consistency reward through its advantage
    "plain": ["rewards.2.params.variant=plain", "consistency.split_advantage=false"],
    "accurate_only": ["rewards.2.params.variant=accurate_only", "consistency.split_advantage=false"],
    "follow": ["rewards.2.params.variant=follow_correct_thinking", "consistency.split_advantage=false"],
    "cora": ["rewards.2.params.variant=accurate_only", "consistency.split_advantage=true", "consistency.scope=all"],
    "care": ["rewards.2.params.variant=care", "rewards.2.params.judge=rule", "consistency.split_advantage=false"],
    # the consistency advantage on the answer's tokens only (split advantages, consistency.scope=answer):
    # the thinking gets the task advantage alone, so agreeing can only be earned by the answer moving
    "answer_plain": ["rewards.2.params.variant=plain", "consistency.split_advantage=true", "consistency.scope=answer"],
    "answer_accurate": ["rewards.2.params.variant=accurate_only", "consistency.split_advantage=true",
                        "consistency.scope=answer"],
    # the same with a stronger consistency advantage (consistency.beta 0.5 -> 1.0 / 2.0)
    "answer_plain_b1": ["rewards.2.params.variant=plain", "consistency.split_advantage=true",
                        "consistency.scope=answer", "consistency.beta=1.0"],
    "answer_plain_b2": ["rewards.2.params.variant=plain", "consistency.split_advantage=true",
                        "consistency.scope=answer", "consistency.beta=2.0"],
}

# the study does its own held-out eval (accuracy and consistency from the same draws): the trainer's is off
QUIET = ["eval.at_start=false", "eval.at_end=false", "eval.every=0", "log_rollouts=false", "tensorboard=false",
         "save_every=0", "progress=false"]

# (label, key in the evaluate_consistency result) for the table; "s/" = sampled, "g/" = greedy
COLUMNS = [
    ("IR s", "sampled/inconsistency_rate"),
    ("IR g", "greedy/inconsistency_rate"),
    ("think acc s", "sampled/thinking_accuracy"),
    ("think acc g", "greedy/thinking_accuracy"),
    ("TR/AR s", "sampled/think_right_answer_right"),
    ("TR/AW s", "sampled/think_right_answer_wrong"),
    ("TW/AR s", "sampled/think_wrong_answer_right"),
    ("TW/AW s", "sampled/think_wrong_answer_wrong"),
    ("both wrong cons s", "sampled/both_wrong_consistent"),
    ("greedy acc", "greedy_accuracy"),
    ("avg@k", "avg@k"),  # avg@{eval.k}; read through _avg below
]


def _avg(result: dict[str, Any]) -> float:
    """avg@k of one evaluation, whatever k (``eval.k``) it ran with."""
    return next(v for key, v in result.items() if key.startswith("avg@"))


def _cell(result: dict[str, Any], key: str) -> float:
    return _avg(result) if key == "avg@k" else result.get(key, float("nan"))


def load(config: str, seed: int, steps: int, out: Path, arm: str, extra: list[str]):
    from mmrlvr.config import load_config

    overrides = [f"output_dir={out}", f"seed={seed}", f"max_steps={steps}", *QUIET, *ARMS[arm], *extra]
    return load_config(config, overrides)


def held_out(trainer) -> dict[str, Any]:
    from mmrlvr.consistency.heldout import evaluate_consistency

    cfg = trainer.cfg
    return evaluate_consistency(trainer.engine, trainer.eval_samples, k=cfg.eval.k, temperature=cfg.eval.temperature,
                                max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed)


def tail_metrics(run_dir: Path, last: int = 20) -> dict[str, float]:
    """Mean of a few training metrics over the last ``last`` steps (KL to the warm start, train IR, ...)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "reward/mean" in r][-last:]
    out = {}
    for key in ("kl", "inconsistency_rate", "accuracy", "consistency/thinking_accuracy", "reward/consistency"):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if vals:
            out[key] = sum(vals) / len(vals)
    return out


def run_arm(config: str, seed: int, steps: int, out: Path, arm: str, extra: list[str],
            before_cache: dict[int, dict[str, Any]]) -> dict[str, Any]:
    from mmrlvr.train.trainer import Trainer

    cfg = load(config, seed, steps, out, arm, extra)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    if seed not in before_cache:  # every arm of a seed starts from the same model and evaluates alike
        before_cache[seed] = held_out(trainer)
    trainer.train()
    train_s = time.perf_counter() - t0
    after = held_out(trainer)
    return {"arm": arm, "seed": seed, "steps": steps, "overrides": ARMS[arm] + extra, "before": before_cache[seed],
            "after": after, "train_tail": tail_metrics(out), "wall_s": time.perf_counter() - t0,
            "train_s": train_s}


def acceptance(results: dict[str, dict[str, Any]], default: str = DEFAULT_ARM) -> dict[str, Any]:
    """The default variant's bar, per seed (see the module docstring)."""
    checks: dict[str, Any] = {}
    for key, res in results.items():
        if res["arm"] != default:
            continue
        b, a = res["before"], res["after"]
        base = results.get(f"accuracy/seed{res['seed']}")
        c = {
            "ir_lowered": a["sampled/inconsistency_rate"] < b["sampled/inconsistency_rate"],
            "thinking_drop_pts": 100 * (b["sampled/thinking_accuracy"] - a["sampled/thinking_accuracy"]),
        }
        c["thinking_ok"] = c["thinking_drop_pts"] <= 3.0
        if base is not None:
            c["greedy_vs_accuracy_pts"] = 100 * (a["greedy_accuracy"] - base["after"]["greedy_accuracy"])
            c["avg8_vs_accuracy_pts"] = 100 * (_avg(a) - _avg(base["after"]))
            c["not_below_accuracy"] = c["greedy_vs_accuracy_pts"] >= 0 and c["avg8_vs_accuracy_pts"] >= 0
        c["pass"] = c["ir_lowered"] and c["thinking_ok"] and c.get("not_below_accuracy", True)
        checks[key] = c
    paired = [c for c in checks.values() if "greedy_vs_accuracy_pts" in c]
    if len(paired) > 1:  # one held-out prompt is 0.5 greedy points: the mean over seeds is the steadier read
        checks["mean_over_seeds"] = {
            k: sum(c[k] for c in paired) / len(paired)
            for k in ("thinking_drop_pts", "greedy_vs_accuracy_pts", "avg8_vs_accuracy_pts")
        } | {"seeds": len(paired), "passed_seeds": sum(c["pass"] for c in paired)}
    return checks


def table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row for the warm start per seed, then one row per arm (after training)."""
    head = "| run | " + " | ".join(label for label, _ in COLUMNS) + " | KL (last 20) | min |"
    sep = "|" + "---|" * (len(COLUMNS) + 3)
    lines = [head, sep]
    seen: set[int] = set()
    for res in sorted(results.values(), key=lambda r: (r["seed"], list(ARMS).index(r["arm"]))):
        if res["seed"] not in seen:
            seen.add(res["seed"])
            vals = " | ".join(f"{_cell(res['before'], k):.3f}" for _, k in COLUMNS)
            lines.append(f"| warm start (seed {res['seed']}) | {vals} | 0 | - |")
        vals = " | ".join(f"{_cell(res['after'], k):.3f}" for _, k in COLUMNS)
        kl = res["train_tail"].get("kl", float("nan"))
        lines.append(f"| {res['arm']} (seed {res['seed']}, {res['steps']} steps) | {vals} | {kl:.4f} | "
                     f"{res['wall_s'] / 60:.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "consistency-tiny.yaml"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--arms", nargs="+", default=["accuracy", "plain", "accurate_only", "follow", "cora"],
                   choices=list(ARMS))
    p.add_argument("--out", default="runs/consistency-study")
    p.add_argument("--keep", action="store_true",
                   help="add to OUT/results.json (other arms/seeds of a finished study) instead of starting afresh")
    p.add_argument("--default", default=DEFAULT_ARM, choices=list(ARMS), help="arm checked against the acceptance bar")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every arm")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    before: dict[int, dict[str, Any]] = {}
    if args.keep and (out / "results.json").exists():
        results = json.loads((out / "results.json").read_text())["results"]
        before = {res["seed"]: res["before"] for res in results.values()}
    for seed in args.seeds:
        for arm in args.arms:
            key = f"{arm}/seed{seed}"
            res = run_arm(args.config, seed, args.steps, out / f"{arm}-seed{seed}", arm, args.overrides, before)
            results[key] = res
            b, a = res["before"], res["after"]
            print(f"[{key}] {res['wall_s'] / 60:.1f} min: IR(s) {b['sampled/inconsistency_rate']:.3f} -> "
                  f"{a['sampled/inconsistency_rate']:.3f}, thinking acc(s) {b['sampled/thinking_accuracy']:.3f} -> "
                  f"{a['sampled/thinking_accuracy']:.3f}, greedy {b['greedy_accuracy']:.3f} -> "
                  f"{a['greedy_accuracy']:.3f}, avg@k {_avg(b):.3f} -> {_avg(a):.3f}", flush=True)
            # rewrite after every arm: a long study interrupted keeps what it measured
            checks = acceptance(results, args.default)
            (out / "results.json").write_text(json.dumps({"results": results, "acceptance": checks}, indent=2,
                                                         default=float))
            (out / "results.md").write_text(table(results) + "\n")
    print()
    print(table(results))
    print(f"\nacceptance of the default variant ({args.default}):")
    for key, c in acceptance(results, args.default).items():
        print(f"  {key}: {json.dumps(c, default=float)}")


if __name__ == "__main__":
    main()
