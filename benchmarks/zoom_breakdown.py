"""Where a ``synth:zoom`` run's held-out accuracy comes from: looking in the right place, or counting what it saw.

For each run (its newest checkpoint, or ``--model`` for the warm start itself) this samples ``--k`` responses per
held-out scene at the run's temperature, with the run's tools, and splits them by whether their zoom hit the
square (IoU >= 0.5, as the ``zoom_iou`` reward and the eval's "zoom hits" count it):

- hit rate, accuracy;
- accuracy after a hit and after a miss (a look elsewhere sees none of the asked shapes, so it is rarely right);
- the share of answers "0" (never right on this task: the answer is 1-3).

So a rise in accuracy splits into "more hits" x "right after a hit" and "counting better after a hit".

    python benchmarks/zoom_breakdown.py runs/zoom_study/grpo-seed0 [RUN ...] [--control RUN] [--limit 400] [--k 4]

``--control RUN`` evaluates the warm start through RUN's config (as the study's lr-0 control is evaluated).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path


def breakdown(completions: list, samples: list) -> dict[str, float]:
    """Per-response split of accuracy by zoom hit, from the responses and their samples."""
    from mmrlvr.evaluation import normalise_answer
    from mmrlvr.rewards import answer_judge
    from mmrlvr.rewards.parsing import extract_final_answer
    from mmrlvr.rewards.tool_use import ZoomIoUReward

    zoom = ZoomIoUReward()
    rows = []
    for c, s in zip(completions, samples):
        hit = bool(zoom(c, s).parsed["zoom_hit"])
        correct, _ = answer_judge(c.text, s)
        answer = extract_final_answer(c.text)  # the answer the accuracy reward reads ("0", " 0.0 " alike)
        rows.append((hit, bool(correct), answer is not None and normalise_answer(answer) == "0"))
    hits = [r for r in rows if r[0]]
    misses = [r for r in rows if not r[0]]

    def share(items: list, i: int) -> float:
        return sum(r[i] for r in items) / len(items) if items else float("nan")

    return {"responses": len(rows), "hit_rate": len(hits) / len(rows), "accuracy": share(rows, 1),
            "accuracy_after_hit": share(hits, 1), "accuracy_after_miss": share(misses, 1),
            "answers_0": share(rows, 2)}


def run_one(run: Path, limit: int, k: int, control: bool) -> dict[str, float]:
    from mmrlvr.config import load_config
    from mmrlvr.rollout.hf import HFEngine
    from mmrlvr.train.heldout import evaluate_samples, load_eval_samples, load_model_folder
    from mmrlvr.train.export import find_checkpoint
    from mmrlvr.train.model_path import resolve_model_path
    from mmrlvr.train.tool_setup import with_tools

    cfg = load_config(run / "config.yaml")
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval_size=max(cfg.data.eval_size, limit)),
                              eval=dataclasses.replace(cfg.eval, limit=limit))
    folder = resolve_model_path(cfg.model.path) if control else str(find_checkpoint(run, None))
    model, processor, _ = load_model_folder(folder, cfg.model.dtype, cfg.model.attn_implementation)
    model.eval()
    seen: tuple[list, list] = ([], [])

    def observe(kind: str, completions: list, samples: list) -> None:
        if kind == "sampled":
            seen[0].extend(completions)
            seen[1].extend(samples)

    evaluate_samples(with_tools(HFEngine(model, processor), cfg), load_eval_samples(cfg), k=k,
                     temperature=cfg.eval.temperature, max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed,
                     observe=observe)
    return breakdown(*seen)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", type=Path)
    p.add_argument("--control", type=Path, help="evaluate this run's starting model (the lr-0 control)")
    p.add_argument("--limit", type=int, default=400)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--out", type=Path, help="also write the rows as JSON")
    args = p.parse_args(argv)
    todo = ([("control (" + str(args.control) + ")", args.control, True)] if args.control else []) + \
        [(str(r), r, False) for r in args.runs]
    rows = {}
    print("| model | responses | zoom hits | accuracy | after a hit | after a miss | answers \"0\" |")
    print("|---|---|---|---|---|---|---|")
    for name, run, control in todo:
        r = rows[name] = run_one(run, args.limit, args.k, control)
        print(f"| {name} | {r['responses']} | {r['hit_rate']:.3f} | {r['accuracy']:.3f} | "
              f"{r['accuracy_after_hit']:.3f} | {r['accuracy_after_miss']:.3f} | {r['answers_0']:.3f} |", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
