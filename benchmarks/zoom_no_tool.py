"""Can the tiny VLM answer ``synth:zoom`` without looking again? The same SFT recipe, one turn, no tool.

Builds (once, cached like every warm start) the tiny model fine-tuned on ``synth:zoom``'s final answers straight
after the prompt — the same scenes, learning rate and starting model (the count warm start) as
``tiny:FAMILY:warm:zoom``, minus the call, for ``--steps``
(300, all of them: one-turn examples are learnt in far fewer steps than two-turn ones; the validation accuracy has
flattened by then) — and prints its held-out accuracy (200 test scenes, greedy and avg@8 at T = 1) beside
chance (1/3: the answer is 1-3) and the two-turn warm start's.

    python benchmarks/zoom_no_tool.py [--family qwen2_5_vl] [--steps 300]
"""

from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="qwen2_5_vl")
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args(argv)
    from mmrlvr.models.warmstart import BASE_TASKS, build_lock, warm_start
    from mmrlvr.train.model_path import cache_dir, resolve_model_path

    out = cache_dir() / "tiny" / f"{args.family}-warm-zoom-no_tool-{args.steps}"
    base = resolve_model_path(f"tiny:{args.family}:warm:{BASE_TASKS['zoom']}")  # the tool warm start's base too
    with build_lock(out):
        direct = warm_start(out, family=args.family, task="zoom", tools=False, steps=args.steps, stop_at=None,
                            base=base)
    with_tool = json.loads((__import__("pathlib").Path(resolve_model_path(f"tiny:{args.family}:warm:zoom"))
                            / "warmstart.json").read_text())
    rows = [("no tool (one turn)", direct), ("zoom warm start (two turns)", with_tool)]
    print("| model | greedy | avg@8 | pass@8 | format | steps |\n|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['greedy_accuracy']:.3f} | {r['avg@8']:.3f} | {r['pass@8']:.3f} | {r['format_rate']:.3f} | "
              f"{r['steps_run']} |")
    print(f"chance: {direct['chance']:.3f}")  # recorded by the build: uniform guessing over the task's answers
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
