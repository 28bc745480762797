"""Does vision-aware token credit beat entropy-only selection? `none`, `entropy_topk`, `vepo`, `vppo` on one task.

One command, same start, same data order per seed, same budget for every arm:

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/credit_study.py \
        [--steps 60] [--seeds 0 1 2] [--schemes none entropy_topk vepo vppo] [--out runs/credit-study]

Base: ``configs/demo-tiny.yaml`` (GRPO on a warm-started tiny Qwen2.5-VL) on ``--task`` (default
``count_chatter``, with its own warm start ``tiny:qwen2_5_vl:warm:count_chatter``, built once and cached);
each arm only sets ``credit.scheme`` (every scheme with its defaults and its paper's perturbation — nothing
is tuned). Why ``count_chatter``: on plain ``count`` the answer-deciding count digits are the
*highest*-entropy tokens of a response, so entropy top-20% already selects them and the premise of
vision-aware credit does not hold. ``count_chatter``'s reference thinking opens with five random filler
words: now the fillers are the most uncertain tokens, and the image-reading digits are visual and
lower-entropy — the case VEPO / VPPO are built for (the token probe below checks it on the warm start).

What it measures, in order:

1. **Token probe** on the warm start (before any training): G = 8 rollouts of a few training prompts, the
   per-token entropy and the JSD between the clean and perturbed image (gaussian = VEPO's default,
   patch_blackout p 0.5 = VPPO's, zero image) per token class (answer token, digit / colour-or-shape /
   filler word in the thinking, tags, other), and which share of each class every scheme would select. This checks
   the premise VEPO argues from (docs/credit.md): the tokens that read the image are low-entropy, so
   entropy top-20% misses them.
2. **Held-out eval of the start**, once (every arm starts from the same model): greedy accuracy and
   avg@k (T = 1) on ``--eval-size`` prompts. Every eval uses the same sampling seed (``--eval-seed``), so
   before/after and arm/arm differences are not sampling noise of the eval.
3. **Training**: every (seed, scheme) run for ``--steps`` steps; then the same held-out eval. The
   trainer's own evals are off (the study does them).

Writes to ``--out``: ``results.json`` (everything), ``results.md`` (the tables), ``credit_study.png``
(the plot), and one run directory per arm (``<scheme>-seed<k>/metrics.jsonl``). Results are rewritten
after every run, so an interrupted study keeps what it measured. Std is over seeds (sample std, ddof 1).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ("none", "entropy_topk", "vepo", "vppo")

# the study evaluates itself; no rollout store, TensorBoard, progress bars or intermediate checkpoints
QUIET = ["eval.at_start=false", "eval.at_end=false", "eval.every=0", "log_rollouts=false", "tensorboard=false",
         "save_every=0", "keep_checkpoints=1", "progress=false"]

# training metrics averaged over the last TAIL steps, and credit metrics averaged over the whole run
TAIL = 20
TRAIN_KEYS = ("reward/mean", "accuracy", "kl", "entropy/mean", "time/step_s")

# token classes of the probe, in table order
CLASSES = ("answer token", "think digit", "think colour/shape word", "think filler word", "tag", "other")
PERTURBATIONS = (("gaussian", {}), ("patch_blackout", {"p": 0.5}), ("zero", {}))


def load(config: str, scheme: str, seed: int, steps: int, out: Path, extra: list[str]):
    from mmrlvr.config import load_config

    overrides = [f"output_dir={out}", f"seed={seed}", f"max_steps={steps}", f"credit.scheme={scheme}", *QUIET,
                 *extra]
    return load_config(config, overrides)


# ------------------------------------------------------------------------------------------ token probe

def token_class(token: str, in_answer: bool, words: set[str], fillers: frozenset[str] = frozenset()) -> str:
    """Class of one decoded response token (``in_answer``: between ``<answer>`` and ``</answer>``).

    >>> token_class("Ġ3", False, {"red"}), token_class("Ġred", False, {"red"}), token_class("2", True, set())
    ('think digit', 'think colour/shape word', 'answer token')
    """
    word = token.replace("Ġ", "").strip()
    if re.fullmatch(r"</?\w+>|<\|[a-z_]+\|>", token):
        return "tag"
    if in_answer:
        return "answer token"
    if word.isdigit():
        return "think digit"
    if word.lower() in words:
        return "think colour/shape word"
    if word.lower() in fillers:
        return "think filler word"
    return "other"


def token_probe(trainer, n_prompts: int = 8, seed: int = 12345) -> dict[str, Any]:
    """Entropy, vision sensitivity and each scheme's selection per token class, on the warm start.

    Samples G rollouts for ``n_prompts`` training prompts (their own sampling seed, not a training step),
    computes the clean signals once and the perturbed ones per perturbation, and applies every scheme to
    the signals it would see in training (VEPO: gaussian; VPPO: patch_blackout p 0.5)."""
    import torch

    from mmrlvr.credit import build_scheme, perturb_vision, token_signals_from_model
    from mmrlvr.data import synth
    from mmrlvr.rollout.base import SamplingParams

    cfg = trainer.cfg
    tok = getattr(trainer.processor, "tokenizer", trainer.processor)
    words = {w.lower() for w in (*synth.COLOURS, *synth.SHAPES)}
    samples = trainer.train_samples[:n_prompts]
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature)
    trainer.model.eval()
    batch = trainer.engine.generate(samples, cfg.rollout.group_size, params, seed=seed, step=0)
    mask = batch.response_mask
    clean = batch.model_inputs()
    signals = {}
    for name, kw in PERTURBATIONS:
        vision = perturb_vision(batch.vision, name, seed=seed, processor=trainer.processor, **kw)
        pert = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, **vision}
        signals[name] = token_signals_from_model(trainer.policy, clean, pert, batch.prompt_length,
                                                 batch.response_ids, mask, temperature=cfg.rollout.temperature,
                                                 old_logprobs=batch.old_logprobs)
    zero_adv = torch.zeros(mask.shape[0])
    scheme_signals = {"entropy_topk": "gaussian", "vepo": "gaussian", "vppo": "patch_blackout"}
    results = {name: build_scheme(name)(signals[src], mask, zero_adv, old_logprobs=batch.old_logprobs)
               for name, src in scheme_signals.items()}
    ent = signals["gaussian"].entropy  # [N, L], the same clean pass for every perturbation
    valid = mask > 0
    med = torch.where(valid, ent, torch.full_like(ent, math.nan)).nanmedian(-1, keepdim=True).values  # [N, 1]
    below = ent < med  # [N, L] below the response's median entropy
    # entropy percentile within the response: 0 = its lowest-entropy token, 1 = its highest
    masked = torch.where(valid, ent, torch.full_like(ent, -math.inf))
    rank = masked.argsort(-1).argsort(-1).float() - (~valid).sum(-1, keepdim=True)  # [N, L] 0.. among valid
    pct = rank / (valid.sum(-1, keepdim=True) - 1).clamp(min=1)

    rows: dict[str, dict[str, list[float]]] = {c: {} for c in CLASSES}
    for i in range(batch.num_rows):
        in_answer = False
        for j in range(mask.shape[1]):
            if not valid[i, j]:
                continue
            t = tok.convert_ids_to_tokens(int(batch.response_ids[i, j]))
            if t == "</answer>":
                in_answer = False
            cls = token_class(t, in_answer, words, frozenset(synth.FILLERS))
            if t == "<answer>":
                in_answer = True
            r = rows[cls]
            r.setdefault("entropy", []).append(float(ent[i, j]))
            r.setdefault("below_median", []).append(float(below[i, j]))
            r.setdefault("entropy_percentile", []).append(float(pct[i, j]))
            for name, _ in PERTURBATIONS:
                r.setdefault(f"jsd/{name}", []).append(float(signals[name].jsd[i, j]))
            for name, res in results.items():
                r.setdefault(f"selected/{name}", []).append(float(res.selected[i, j]))
    n_tokens = int(valid.sum())
    classes = {}
    for cls, r in rows.items():
        if not r:
            continue
        classes[cls] = {"n": len(r["entropy"]), "share_of_tokens": len(r["entropy"]) / n_tokens,
                        "entropy_mean": statistics.fmean(r["entropy"]),
                        "entropy_median": statistics.median(r["entropy"]),
                        **{k: statistics.fmean(v) for k, v in r.items() if k != "entropy"}}
    return {"prompts": len(samples), "rollouts": batch.num_rows, "tokens": n_tokens,
            "scheme_stats": {name: res.stats for name, res in results.items()}, "classes": classes,
            "examples": [c.text for c in batch.completions[:: cfg.rollout.group_size][:3]]}


# ---------------------------------------------------------------------------------------------- runs

def held_out(trainer, k: int, seed: int) -> dict[str, Any]:
    from mmrlvr.train.heldout import evaluate_samples

    cfg = trainer.cfg
    trainer.model.eval()
    return evaluate_samples(trainer.engine, trainer.eval_samples, k=k, temperature=cfg.eval.temperature,
                            max_new_tokens=cfg.rollout.max_new_tokens, seed=seed, progress=False)


def summarise_metrics(run_dir: Path) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(tail means of TRAIN_KEYS + whole-run means of ``credit/*``, per-step curves of a few keys)."""
    from mmrlvr.train.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    out: dict[str, float] = {}
    for key in TRAIN_KEYS:
        vals = [r[key] for r in rows[-TAIL:] if isinstance(r.get(key), (int, float))]
        if vals:
            out[key] = statistics.fmean(vals)
    for key in sorted({k for r in rows for k in r if k.startswith("credit/")}):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        out[key] = statistics.fmean(vals)
    curves = {key: [float(r.get(key, math.nan)) for r in rows] for key in ("accuracy", "reward/mean")}
    return out, curves


def run_arm(config: str, scheme: str, seed: int, steps: int, out: Path, extra: list[str], k: int,
            eval_seed: int, state: dict[str, Any], probe_prompts: int) -> dict[str, Any]:
    from mmrlvr.train.trainer import Trainer

    t0 = time.perf_counter()
    trainer = Trainer(load(config, scheme, seed, steps, out, extra))
    if "start" not in state:  # the same model.path for every arm: measure the start once
        state["probe"] = token_probe(trainer, probe_prompts) if probe_prompts else {}
        state["start"] = held_out(trainer, k, eval_seed)
    t1 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t1
    after = held_out(trainer, k, eval_seed)
    train, curves = summarise_metrics(out)
    return {"scheme": scheme, "seed": seed, "steps": steps, "after": after, "train": train, "curves": curves,
            "train_s": train_s, "wall_s": time.perf_counter() - t0}


# ------------------------------------------------------------------------------------------ reporting

def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (ddof 1; 0 for a single value)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate(results: dict[str, dict[str, Any]], k: int) -> dict[str, dict[str, Any]]:
    """Per scheme: mean/std over seeds of the held-out numbers, training tails and credit stats."""
    by_scheme: dict[str, list[dict[str, Any]]] = {}
    for res in results.values():
        by_scheme.setdefault(res["scheme"], []).append(res)
    agg: dict[str, dict[str, Any]] = {}
    for scheme, runs in by_scheme.items():
        a: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
        for key in ("greedy_accuracy", f"avg@{k}", "format_rate"):
            a[key] = mean_std([r["after"][key] for r in runs if key in r["after"]])
        keys = sorted({key for r in runs for key in r["train"]})
        for key in keys:
            a[key] = mean_std([r["train"][key] for r in runs if key in r["train"]])
        a["train_min"] = mean_std([r["train_s"] / 60 for r in runs])
        agg[scheme] = a
    return agg


def _fmt(ms: tuple[float, float] | None, digits: int = 3) -> str:
    if ms is None or ms[0] != ms[0]:
        return "–"
    return f"{ms[0]:.{digits}f} ± {ms[1]:.{digits}f}"


def tables(payload: dict[str, Any]) -> str:
    """The markdown report: budget line, results table, credit table, token-probe table."""
    k, agg, start, meta = payload["k"], payload["aggregate"], payload.get("start", {}), payload["meta"]
    lines = [f"Budget: {meta['steps']} steps per run, {meta['prompts_per_step']} prompts × G {meta['group_size']}, "
             f"seeds {meta['seeds']}, base `configs/demo-tiny.yaml` (+ `credit.scheme`); held-out eval on "
             f"{start.get('n', '?')} prompts, greedy + avg@{k} at T = 1, eval seed {meta['eval_seed']}; "
             f"study wall time {meta.get('wall_min', math.nan):.1f} min on a shared 2-core CPU. "
             "Mean ± sample std over seeds.", ""]
    lines += ["| scheme | held-out greedy | held-out avg@%d | train acc (last %d) | KL (last %d) | "
              "s/step | min/run |" % (k, TAIL, TAIL), "|---|---|---|---|---|---|---|"]
    if start:
        lines.append(f"| warm start (step 0) | {start['greedy_accuracy']:.3f} | {start[f'avg@{k}']:.3f} | – | – | – | – |")
    for scheme, a in agg.items():
        lines.append(f"| {scheme} | {_fmt(a.get('greedy_accuracy'))} | {_fmt(a.get(f'avg@{k}'))} | "
                     f"{_fmt(a.get('accuracy'))} | {_fmt(a.get('kl'), 4)} | {_fmt(a.get('time/step_s'), 2)} | "
                     f"{_fmt(a.get('train_min'), 1)} |")
    lines += ["", "Credit statistics logged during training (mean over all steps, then over seeds; – = not "
              "logged: VPPO's training pass has no clean distribution, see the probe table):", "",
              "| scheme | selected fraction | low-entropy share of selected | Jaccard with entropy top-20% | "
              "JSD mean (vision sensitivity) |", "|---|---|---|---|---|"]
    for scheme, a in agg.items():
        if scheme == "none":  # the trainer skips the credit pass: every token counts
            lines.append("| none | 1 (all tokens) | – | – | – |")
            continue
        lines.append(f"| {scheme} | {_fmt(a.get('credit/selected_fraction'))} | "
                     f"{_fmt(a.get('credit/selected_low_entropy_share'))} | {_fmt(a.get('credit/entropy_topk_jaccard'))} | "
                     f"{_fmt(a.get('credit/vision_sensitivity_mean'), 5)} |")
    probe = payload.get("probe") or {}
    if probe.get("classes"):
        schemes = list(probe["scheme_stats"])
        lines += ["", f"Token probe on the warm start ({probe['rollouts']} rollouts of {probe['prompts']} training "
                  f"prompts, {probe['tokens']} tokens): share of all tokens, entropy H (nats), mean percentile "
                  "of H within its response (0 = lowest, 1 = highest), share below the response's median H, "
                  "mean JSD(clean, perturbed) per perturbation, and the share of each class each scheme "
                  "selects:", "",
                  "| token class | share | H mean | H median | H percentile | below median | JSD gaussian | JSD blackout | "
                  "JSD zero | " + " | ".join(f"sel {s}" for s in schemes) + " |",
                  "|---" * (9 + len(schemes)) + "|"]
        for cls, c in probe["classes"].items():
            sel = " | ".join(f"{c[f'selected/{s}']:.2f}" for s in schemes)
            lines.append(f"| {cls} | {c['share_of_tokens']:.2f} | {c['entropy_mean']:.3f} | {c['entropy_median']:.3f} | "
                         f"{c['entropy_percentile']:.2f} | {c['below_median']:.2f} | {c['jsd/gaussian']:.5f} | {c['jsd/patch_blackout']:.4f} | "
                         f"{c['jsd/zero']:.4f} | {sel} |")
    return "\n".join(lines) + "\n"


def plot(payload: dict[str, Any], path: Path) -> Path:
    """Three panels: held-out accuracy per scheme (bars = mean, dots = seeds, dashed = start); training
    accuracy curves (mean over seeds, moving average); the probe's per-class selection shares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k, agg, start, results = payload["k"], payload["aggregate"], payload.get("start", {}), payload["results"]
    schemes = list(agg)
    colours = dict(zip(SCHEMES + tuple(s for s in schemes if s not in SCHEMES),
                       ["#777777", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e"]))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))

    ax = axes[0]
    width = 0.38
    for m, (key, label) in enumerate((("greedy_accuracy", "greedy"), (f"avg@{k}", f"avg@{k}"))):
        xs = [i + (m - 0.5) * width for i in range(len(schemes))]
        means = [agg[s][key][0] for s in schemes]
        stds = [agg[s][key][1] for s in schemes]
        ax.bar(xs, means, width * 0.95, yerr=stds, capsize=3, label=label,
               color=[colours[s] for s in schemes], alpha=0.55 if m else 0.9, edgecolor="black", linewidth=0.5)
        for x, s in zip(xs, schemes):
            pts = [r["after"][key] for r in results.values() if r["scheme"] == s]
            ax.scatter([x] * len(pts), pts, color="black", s=10, zorder=3)
        if start:
            ax.axhline(start[key], color="black", linestyle="--" if m == 0 else ":", linewidth=1,
                       label=f"start {label}")
    ax.set_xticks(range(len(schemes)), schemes)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"held-out: greedy (solid) and avg@{k} (light)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    lo = min([start.get("greedy_accuracy", 1), start.get(f"avg@{k}", 1)]
             + [r["after"][key] for r in results.values() for key in ("greedy_accuracy", f"avg@{k}")])
    ax.set_ylim(max(0.0, lo - 0.1), None)
    ax.grid(axis="y", alpha=0.3)

    ax = axes[1]
    window = 10
    for s in schemes:
        curves = [r["curves"]["accuracy"] for r in results.values() if r["scheme"] == s]
        n = min(len(c) for c in curves)
        mean = [statistics.fmean(c[i] for c in curves) for i in range(n)]
        smooth = [statistics.fmean(mean[max(0, i - window + 1): i + 1]) for i in range(n)]
        ax.plot(range(1, n + 1), smooth, label=s, color=colours[s], linewidth=1.4)
    ax.set_xlabel("step")
    ax.set_ylabel(f"train accuracy (T = 1), moving avg {window}")
    ax.set_title("training: sampled accuracy (mean over seeds)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

    ax = axes[2]
    probe = payload.get("probe") or {}
    if probe.get("classes"):
        classes = list(probe["classes"])
        pschemes = list(probe["scheme_stats"])
        w = 0.8 / len(pschemes)
        for m, s in enumerate(pschemes):
            xs = [i + (m - (len(pschemes) - 1) / 2) * w for i in range(len(classes))]
            ax.bar(xs, [probe["classes"][c][f"selected/{s}"] for c in classes], w * 0.95, label=f"{s} selects",
                   color=colours.get(s, None))
        ax2 = ax.twinx()
        ax2.plot(range(len(classes)), [probe["classes"][c]["entropy_mean"] for c in classes], "ko-",
                 label="mean entropy (right)")
        ax2.plot(range(len(classes)), [probe["classes"][c]["jsd/patch_blackout"] for c in classes], "s--",
                 color="#1f78b4", label="JSD, patch blackout (right)")
        ax2.set_ylabel("nats")
        ax.set_xticks(range(len(classes)), [c.replace("think ", "think\n").replace("/", "/\n") for c in classes],
                      fontsize=7)
        ax.set_ylabel("share of class selected")
        ax.set_ylim(0, 1.05)
        ax.set_title("warm start: which tokens each scheme selects", fontsize=10)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper right")
    else:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(out: Path, payload: dict[str, Any]) -> None:
    from mmrlvr.store.atomic import atomic_write_text

    payload["aggregate"] = aggregate(payload["results"], payload["k"])
    atomic_write_text(out / "results.json", json.dumps(payload, indent=2, default=float) + "\n")
    atomic_write_text(out / "results.md", tables(payload))
    if payload["results"]:
        plot(payload, out / "credit_study.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "demo-tiny.yaml"))
    p.add_argument("--task", default="count_chatter",
                   help="synthetic task to train and evaluate on, from its own warm start (count_chatter: the "
                        "image-reading count digits are less uncertain than the filler words around them)")
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--eval-size", type=int, default=200, help="held-out prompts (data.eval_size)")
    p.add_argument("--k", type=int, default=8, help="samples per held-out prompt for avg@k")
    p.add_argument("--eval-seed", type=int, default=0, help="sampling seed of every held-out eval")
    p.add_argument("--probe-prompts", type=int, default=8, help="prompts in the token probe (0 = skip)")
    p.add_argument("--out", default="runs/credit-study")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every arm")
    args = p.parse_args(argv)
    from mmrlvr.credit import CREDIT_SCHEMES

    for s in args.schemes:
        CREDIT_SCHEMES.get(s)  # unknown names fail before any run
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    warm = "tiny:qwen2_5_vl:warm" + ("" if args.task == "count" else f":{args.task}")
    extra = [f"model.path={warm}", f"data.train=synth:{args.task}", f"data.eval=synth:{args.task}",
             f"data.eval_size={args.eval_size}", f"eval.k={args.k}", *args.overrides]
    base = load(args.config, args.schemes[0], args.seeds[0], args.steps, out, extra)
    meta = {"steps": args.steps, "seeds": args.seeds, "schemes": args.schemes, "eval_seed": args.eval_seed,
            "prompts_per_step": base.rollout.prompts_per_step, "group_size": base.rollout.group_size,
            "overrides": extra}
    state: dict[str, Any] = {}
    payload: dict[str, Any] = {"k": args.k, "results": {}, "meta": meta}
    t0 = time.perf_counter()
    for seed in args.seeds:
        for scheme in args.schemes:
            key = f"{scheme}/seed{seed}"
            res = run_arm(args.config, scheme, seed, args.steps, out / f"{scheme}-seed{seed}", extra, args.k,
                          args.eval_seed, state, args.probe_prompts)
            payload["results"][key] = res
            payload.update(start=state["start"], probe=state.get("probe", {}))
            meta["wall_min"] = (time.perf_counter() - t0) / 60
            a, s0 = res["after"], state["start"]
            print(f"[{key}] {res['wall_s'] / 60:.1f} min ({res['train'].get('time/step_s', math.nan):.2f} s/step): "
                  f"greedy {s0['greedy_accuracy']:.3f} -> {a['greedy_accuracy']:.3f}, avg@{args.k} "
                  f"{s0[f'avg@{args.k}']:.3f} -> {a[f'avg@{args.k}']:.3f}", flush=True)
            write_outputs(out, payload)
    print()
    print(tables(payload))
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'credit_study.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
