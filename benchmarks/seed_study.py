"""Seed methods vs plain GRPO under the same budget (issue 19): held-out greedy / avg@k, time, KL and grad spikes.

Every arm is ``configs/demo-tiny.yaml`` (GRPO on the warm-started tiny Qwen2.5-VL) on ``--task`` with the
method's keys on top, for ``--steps`` steps and each seed in ``--seeds``; held-out greedy accuracy and avg@k
come from the trainer's own final evaluation. Per arm: wall and CPU seconds, mean KL, the largest KL, and
"spikes" = steps whose grad norm exceeds 3x the run's median. The LoRA inits run with LoRA on (r 16, α 32,
the paper's recipe), against a GRPO+LoRA default-init arm, at ``--lr`` and at 3x ``--lr`` (the paper's
instability claim). Writes ``<out>/results.md`` and ``results.json``; rows are written as arms finish.

    python benchmarks/seed_study.py --steps 60 --seeds 0 1 2 --out runs/seed_study

Interrupted? Run the same command again: arms already in ``<out>/results.json`` (same task, steps, seed) are
kept, not rerun. ``<out>/results.png`` plots held-out avg@k per arm (mean and each seed).
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
    "lr0": ["optim.lr=0"],  # the control: the warm start as it is, through the same steps (where every arm starts)
    "grpo": [],
    "acpo": ["algo.clip=acpo", "algo.epochs=2"],
    "grpo_epochs2": ["algo.epochs=2"],
    "delta": ["credit.scheme=delta"],
    "popo": ["algo.loss=popo", "algo.kl_coef=0"],
    "poise": ["algo.advantage=poise"],
    # issue 39: label-free rewards (no gold label reaches a reward), the pass@k advantage, the gated process reward
    "majority_vote": ["rewards.1.name=majority_vote"],
    "cocov": ["rewards.1.name=cocov"],
    # the verifier decides whenever fewer than 6 of 8 agree (the default gate hands it only share < 0.5)
    "cocov_verify": ["rewards.1.name=cocov", "rewards.1.params={low: 0.75, high: 1.0}"],
    "pass_at_k": ["algo.advantage=pass_at_k", "algo.advantage_params.k=4"],
    "gated_process": ["rewards.1.name=gated_process"],
    "forward_ce": ["algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {expert: privileged}}]"],
    # which prompts, how many samples, how a group is built: at the same 128 samples per step
    # (as the documented study ran them: before the learned selector and the probe, now the samplers' defaults)
    "disagreement": ["rollout.sampler=disagreement", "rollout.sampler_params={selector: entropy, probe_samples: 0}"],
    "budget": ["rollout.sampler=budget", "rollout.sampler_params={probe_samples: 0}"],
    "tree": ["rollout.strategy=tree", "rollout.strategy_params={depth: 3, branching: 2}"],  # 8 leaves per prompt
    "tree@2xprompts": ["rollout.strategy=tree", "rollout.strategy_params={depth: 3, branching: 2}",
                       "rollout.prompts_per_step=32"],  # twice the samples, about as many decoded tokens as flat
    "npo": [],  # + the guide: the grpo arm's final checkpoint of the same seed (GUIDED below)
    # the distillation horizon: the first quarter of each response, or a share growing from 0.25 to 1
    "forward_ce_h25": ["algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {horizon: 0.25}}]"],
    "forward_ce_prog": ["algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {horizon: progressive}}]"],
    # vision-sensitive credit (with --config configs/zoom-tiny.yaml: on multi-turn trajectories)
    "vepo": ["credit.scheme=vepo"],
}
#: arms whose final evaluation does not depend on the step count: lr 0 never moves the parameters (AdamW's step and
#: its weight decay both scale with lr), and the held-out evaluation is seeded by the run's seed alone, so the
#: control evaluated after 1 step is the control after --steps steps, at a fraction of the cost (--full-control
#: runs it the whole way)
FIXED_STEPS = {"lr0": 1}
#: arms guided by another arm's final checkpoint of the same seed (NPO's two-run recipe: that run is "ahead")
GUIDED = {"npo": "grpo"}
#: arms run for as many steps as fit in GRPO's training seconds (same seed), from the named arm's time per step
WALL_MATCHED = {"forward_ce@wall": "forward_ce"}
ARMS["forward_ce@wall"] = ARMS["forward_ce"]
LORA = ["model.lora.enabled=true", "model.lora.r=16", "model.lora.alpha=32"]
LORA_ARMS = {"lora_default": ["model.lora.init=default"], "lora_rlpo": ["model.lora.init=rlpo"],
             "lora_rlmo": ["model.lora.init=rlmo"], "lora_milora": ["model.lora.init=milora"]}


def run_arm(name: str, overrides: list[str], seed: int, steps: int, out: Path, task: str, k: int,
            eval_size: int, train_size: int | None = None, config: str = "configs/demo-tiny.yaml") -> dict[str, Any]:
    from mmrlvr.config import load_config
    from mmrlvr.train.metrics import read_metrics
    from mmrlvr.train.trainer import Trainer

    warm = "tiny:qwen2_5_vl:warm" + ("" if task == "count" else f":{task}")
    cfg = load_config(ROOT / config, overrides=[
        f"output_dir={out}", f"max_steps={steps}", f"seed={seed}", "save_every=0", "log_rollouts=false",
        "progress=false", "tensorboard=false", f"model.path={warm}", f"data.train=synth:{task}",
        f"data.eval=synth:{task}", f"data.eval_size={eval_size}", f"eval.k={k}", "eval.every=0",
        "eval.at_start=false", "eval.at_end=true", *([f"data.train_size={train_size}"] if train_size else []),
        *overrides])
    t0, c0 = time.perf_counter(), time.process_time()
    summary = Trainer(cfg).train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "grad_norm" in r]
    grads = [r["grad_norm"] for r in rows]
    kls = [r.get("kl", 0.0) for r in rows]
    med = statistics.median(grads) if grads else math.nan
    after = summary.get("after", {})
    train_s = sum(r.get("time/step_s", 0.0) for r in rows)
    extra = {key: sum(r[key] for r in rows if key in r) / max(sum(key in r for r in rows), 1)
             for key in ("majority/pseudo_label_accuracy", "cocov/low_share", "cocov/high_share",
                         "distill/teacher_token_share", "zero_std_group_fraction", "rollout/decoded_tokens",
                         "npo/groups_guided", "npo/guide_acceptance", "tools/calls_per_row") if any(key in r for r in rows)}
    for key in ("zoom_hit_rate", "tool_calls_per_response", "tool_error_rate"):  # multi-turn runs' held-out eval
        if key in after:
            extra[key] = after[key]
    all_rows = [r for r in read_metrics(out / "metrics.jsonl") if "reward/mean" in r]
    extra["samples_per_s"] = sum(r.get("rollout/samples", 0.0) for r in all_rows) / max(sum(
        r.get("time/step_s", 0.0) for r in all_rows), 1e-9)
    return {"arm": name, "seed": seed, "steps": steps, "wall_s": wall, "cpu_s": cpu, "train_s": train_s,
            "greedy": after.get("greedy_accuracy"), f"avg@{k}": after.get(f"avg@{k}"),
            f"pass@{k}": after.get(f"pass@{k}"), "kl_mean": sum(kls) / max(len(kls), 1), "kl_max": max(kls or [0]),
            "grad_spikes": sum(g > 3 * med for g in grads), "grad_max": max(grads or [0]), **extra,
            # each held-out prompt's outcome (same prompts, same order, in every arm): the paired comparison
            "per_prompt": [[p["greedy"], p["hits"]] for p in map(json.loads, (out / "eval" / f"step_{steps:06d}.jsonl")
                                                                   .read_text().splitlines())]}


def per_prompt_metric(run: dict[str, Any], metric: str, k: int) -> list[float]:
    """One run's per-prompt values of ``metric`` (greedy | avg@k | pass@k)."""
    if metric == "greedy":
        return [float(g) for g, _ in run["per_prompt"]]
    if metric.startswith("avg@"):
        return [h / k for _, h in run["per_prompt"]]
    return [float(h > 0) for _, h in run["per_prompt"]]


def paired(results: list[dict[str, Any]], arm: str, base: str, metric: str, k: int) -> dict[str, float] | None:
    """``arm − base`` on ``metric`` over the seeds both ran, paired by prompt and seed.

    ``diff``: the mean difference. ``se_prompt``: the standard error over held-out prompts of each prompt's
    difference averaged over seeds (the prompt-to-prompt noise of a finite eval set). ``se_seed``: the standard
    error over seeds of each seed's mean difference (run-to-run training noise; with 3 seeds a rough one).
    ``se`` is the larger, the one the study judges by."""
    runs = {(r["arm"], r["seed"]): r for r in results if r.get("per_prompt")}
    seeds = sorted({s for (a, s) in runs if a == arm} & {s for (a, s) in runs if a == base})
    if not seeds:
        return None
    diffs = [[x - y for x, y in zip(per_prompt_metric(runs[(arm, s)], metric, k),
                                    per_prompt_metric(runs[(base, s)], metric, k))] for s in seeds]
    n = min(len(d) for d in diffs)
    by_prompt = [statistics.mean(d[i] for d in diffs) for i in range(n)]
    by_seed = [statistics.mean(d[:n]) for d in diffs]
    se_prompt = statistics.stdev(by_prompt) / math.sqrt(n) if n > 1 else math.nan
    se_seed = statistics.stdev(by_seed) / math.sqrt(len(seeds)) if len(seeds) > 1 else math.nan
    se = max(x for x in (se_prompt, se_seed) if not math.isnan(x)) if not (math.isnan(se_prompt) and
                                                                          math.isnan(se_seed)) else math.nan
    return {"diff": statistics.mean(by_prompt), "se_prompt": se_prompt, "se_seed": se_seed, "se": se,
            "seeds": len(seeds), "prompts": n}


def paired_table(results: list[dict[str, Any]], k: int) -> str:
    """GRPO against the lr-0 control, then every other arm against GRPO, with paired standard errors."""
    metrics = ("greedy", f"avg@{k}", f"pass@{k}")
    lines = ["| comparison | seeds × prompts | " + " | ".join(f"Δ {m} ± SE (z)" for m in metrics) + " |",
             "|---|---|" + "---|" * len(metrics)]
    arms = list(dict.fromkeys(r["arm"] for r in results))
    pairs = [("grpo", "lr0")] + [(a, "grpo") for a in arms if a not in ("grpo", "lr0")]
    for arm, base in pairs:
        cells, size = [], ""
        for m in metrics:
            d = paired(results, arm, base, m, k)
            if d is None:
                cells.append("–")
                continue
            size = f"{d['seeds']} × {d['prompts']}"
            z = d["diff"] / d["se"] if d["se"] and not math.isnan(d["se"]) else math.nan
            cells.append(f"{d['diff']:+.3f} ± {d['se']:.3f} ({z:+.1f})")
        if size:
            lines.append(f"| {arm} − {base} | {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(results: list[dict[str, Any]], k: int) -> str:
    arms: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        arms.setdefault(r["arm"], []).append(r)
    lines = [f"| arm | seeds | steps | greedy (mean ± sd) | avg@{k} (mean ± sd) | pass@{k} (mean ± sd) | train s | "
             "KL mean | KL max | grad spikes |", "|---|---|---|---|---|---|---|---|---|---|"]

    def ms(xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "–"
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return f"{statistics.mean(xs):.3f} ± {sd:.3f}"

    for arm, rs in arms.items():
        lines.append(f"| {arm} | {len(rs)} | {rs[0].get('steps', '–')} | {ms([r['greedy'] for r in rs])} | "
                     f"{ms([r[f'avg@{k}'] for r in rs])} | {ms([r.get(f'pass@{k}') for r in rs])} | "
                     f"{statistics.mean(r.get('train_s', r['wall_s']) for r in rs):.0f} | "
                     f"{statistics.mean(r['kl_mean'] for r in rs):.4f} | {max(r['kl_max'] for r in rs):.4f} | "
                     f"{sum(r['grad_spikes'] for r in rs)} |")
    return "\n".join(lines)


#: the settings every part of a merged study shares (``--merge`` reads them from the parts)
STUDY_KEYS = ("task", "config", "steps", "lr", "k", "eval_size", "train_size", "full_control")


def plot(results: list[dict[str, Any]], k: int, path: Path, title: str) -> None:
    """Held-out avg@k, greedy and pass@k per arm: a bar at the seeds' mean, a dot per seed (matplotlib, if present)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is optional for the benchmark
        print("matplotlib not installed: no plot")
        return
    arms: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        arms.setdefault(r["arm"], []).append(r)
    names = list(arms)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(names) + 2) + 1.8, 4.2))
    keys = [(f"avg@{k}", "tab:blue"), ("greedy", "tab:orange"), (f"pass@{k}", "tab:green")]
    if any(r.get("zoom_hit_rate") is not None for r in results):  # multi-turn study: the zoom's hit rate too
        keys.append(("zoom_hit_rate", "tab:purple"))
    width = 0.8 / len(keys)
    bars = [((j - (len(keys) - 1) / 2) * width, key, colour) for j, (key, colour) in enumerate(keys)]
    for offset, key, colour in bars:
        for i, name in enumerate(names):
            vals = [r[key] for r in arms[name] if r.get(key) is not None]
            if not vals:
                continue
            ax.bar(i + offset, statistics.mean(vals), width=width - 0.01, color=colour, alpha=0.45,
                   label=key if i == 0 else None)
            ax.scatter([i + offset] * len(vals), vals, color=colour, s=10, zorder=3)
    base = [r[f"avg@{k}"] for r in arms.get("grpo", []) if r.get(f"avg@{k}") is not None]
    if base:
        ax.axhline(statistics.mean(base), color="tab:blue", lw=0.8, ls="--", label=f"GRPO avg@{k} (mean)")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, 1.08)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: never over a bar
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--task", default="count", help="count | count_chatter | zoom (each from its own warm start)")
    p.add_argument("--config", default="configs/demo-tiny.yaml",
                   help="the base config every arm starts from (configs/zoom-tiny.yaml for the zoom study)")
    p.add_argument("--arms", nargs="+", default=[*ARMS, *LORA_ARMS], help="subset of the arms")
    p.add_argument("--lr", type=float, default=1e-4, help="nominal learning rate (LoRA arms also run at 3x)")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--eval-size", type=int, default=100)
    p.add_argument("--out", default="runs/seed_study")
    p.add_argument("--full-control", action="store_true", help="run the lr0 arm for --steps steps too")
    p.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                   help="only write the report and plot of --out from the results.json of these study folders (the "
                        "same study run in parallel processes, e.g. one per seed)")
    p.add_argument("--train-size", type=int, default=None,
                   help="training prompts (default: the config's 800); a smaller set makes prompts recur, which "
                        "the samplers that learn per prompt need")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        parts = [json.loads((Path(d) / "results.json").read_text()) for d in args.merge]
        merged = [r for part in parts for r in part["results"]]
        for key in STUDY_KEYS:  # the merged study's settings are its parts' (which must agree), not this call's
            seen = {json.dumps(part["args"].get(key)): d for part, d in zip(parts, args.merge)}
            if len(seen) > 1:
                raise SystemExit(f"--merge: the folders ran different studies: {key} is "
                                 + ", ".join(f"{v} in {d}" for v, d in seen.items()))
            setattr(args, key, parts[0]["args"].get(key, getattr(args, key)))
        args.seeds = sorted({r["seed"] for r in merged})
        args.arms = list(dict.fromkeys(r["arm"] for r in merged))
        (out / "results.json").write_text(json.dumps({"args": vars(args), "results": merged}, indent=1))
        (out / "results.md").write_text(report(merged, args.k))
        plot(merged, args.k, out / "results.png", title=f"synth:{args.task}, {args.steps} steps, "
             f"{len({r['seed'] for r in merged})} seed(s), held-out avg@{args.k}, greedy and pass@{args.k}")
        print(report(merged, args.k))
        return 0
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
    done_file = out / "results.json"
    if done_file.exists():  # resume: keep finished (arm, seed) rows of the same study
        old = json.loads(done_file.read_text())
        same = {key: old.get("args", {}).get(key)
                for key in ("task", "steps", "lr", "k", "eval_size", "train_size", "config")}
        if same == {key: getattr(args, key) for key in same}:
            results = [r for r in old.get("results", [])]
            print(f"resuming: {len(results)} finished runs kept from {done_file}")
    finished = {(r["arm"], r["seed"]) for r in results}
    for seed in args.seeds:
        for name, overrides in plan:
            if (name, seed) in finished:
                continue
            steps = args.steps if args.full_control else FIXED_STEPS.get(name, args.steps)
            if name in WALL_MATCHED:  # as many steps as fit in GRPO's training time of the same seed
                base, arm = (next((r for r in results if r["arm"] == a and r["seed"] == seed), None)
                             for a in ("grpo", WALL_MATCHED[name]))
                if base is None or arm is None:
                    raise SystemExit(f"{name} needs the grpo and {WALL_MATCHED[name]} arms of seed {seed} first: "
                                     "list them before it in --arms")
                steps = max(1, round(args.steps * base["train_s"] / arm["train_s"]))
            if name in GUIDED:
                ahead = out / f"{GUIDED[name]}-seed{seed}" / "checkpoints" / f"step-{args.steps:08d}"
                if not ahead.is_dir():
                    raise SystemExit(f"{name} needs the {GUIDED[name]} arm of seed {seed} first (its final checkpoint "
                                     f"{ahead} guides it): list it before {name} in --arms")
                overrides = [*overrides, f"rollout.guide={{from: {ahead}}}"]
            res = run_arm(name, overrides, seed, steps, out / f"{name}-seed{seed}", args.task, args.k,
                          args.eval_size, args.train_size, args.config)
            results.append(res)
            print(f"[{name} seed {seed}] greedy {res['greedy']} avg@{args.k} {res[f'avg@{args.k}']} "
                  f"({res['wall_s']:.0f} s)", flush=True)
            (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
            (out / "results.md").write_text(report(results, args.k))
    (out / "results.md").write_text(report(results, args.k))
    plot(results, args.k, out / "results.png", title=f"synth:{args.task}, {args.steps} steps, "
         f"{len(args.seeds)} seed(s), held-out avg@{args.k}, greedy and pass@{args.k}")
    print(report(results, args.k))
    return 0


def rollout_table(results: list[dict[str, Any]]) -> str:
    """Per arm, what its rollouts cost and carried: samples per second of training, decoded positions per step,
    the share of zero-variance groups (no gradient), NPO's guided groups per step."""
    arms: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        arms.setdefault(r["arm"], []).append(r)

    def mean(rs, key, fmt):
        xs = [r[key] for r in rs if r.get(key) is not None]
        return format(statistics.mean(xs), fmt) if xs else "–"

    lines = ["| arm | samples / s | decoded tokens / step | zero-variance groups | guided groups / step |",
             "|---|---|---|---|---|"]
    for arm, rs in arms.items():
        lines.append(f"| {arm} | {mean(rs, 'samples_per_s', '.1f')} | {mean(rs, 'rollout/decoded_tokens', '.0f')} | "
                     f"{mean(rs, 'zero_std_group_fraction', '.3f')} | {mean(rs, 'npo/groups_guided', '.2f')} |")
    return "\n".join(lines)


def tools_table(results: list[dict[str, Any]]) -> str:
    """Multi-turn arms: held-out share of responses whose zoom hit the gold region (IoU >= 0.5), calls per
    response and the share of calls that failed, each mean ± sd over seeds; '' when no arm used tools."""
    arms: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if "zoom_hit_rate" in r or "tool_calls_per_response" in r:
            arms.setdefault(r["arm"], []).append(r)
    if not arms:
        return ""

    def ms(rs, key):
        xs = [r[key] for r in rs if r.get(key) is not None]
        if not xs:
            return "–"
        return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"

    lines = ["| arm | seeds | zoom hits the region | calls / response | failed calls |", "|---|---|---|---|---|"]
    for arm, rs in arms.items():
        lines.append(f"| {arm} | {len(rs)} | {ms(rs, 'zoom_hit_rate')} | {ms(rs, 'tool_calls_per_response')} | "
                     f"{ms(rs, 'tool_error_rate')} |")
    per_seed = ["", "Per seed (zoom hit rate, greedy accuracy):", ""]
    for arm, rs in arms.items():
        per_seed.append(f"- {arm}: " + ", ".join(f"seed {r['seed']}: {r.get('zoom_hit_rate', float('nan')):.3f} / "
                                                 f"{r['greedy']:.3f}" for r in sorted(rs, key=lambda r: r["seed"])))
    return "\n".join(lines + per_seed)


def report(results: list[dict[str, Any]], k: int) -> str:
    tools = tools_table(results)
    return (table(results, k) + ("\n\nTools (held-out):\n\n" + tools if tools else "")
            + "\n\nRollouts:\n\n" + rollout_table(results)
            + "\n\nPaired differences (same prompts, same seeds):\n\n" + paired_table(results, k) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
