"""``mmrlvr eval``: greedy accuracy, avg@k and pass@k of a model folder on a dataset, as JSON.

The protocol papers in this field report: avg@k at temperature 1.0 (mean accuracy over k samples per
prompt) with the answer verified like the training reward, plus greedy accuracy and pass@k.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError


def evaluate_samples(engine, samples, *, k: int = 8, temperature: float = 1.0, max_new_tokens: int = 64,
                     seed: int = 0, progress: bool = True, batch_size: int = 32, observe=None) -> dict[str, Any]:
    """Evaluate with the project's answer verifiers (same normalisation as the accuracy reward)."""
    from mmrlvr.evaluation import evaluate
    from mmrlvr.rewards import answer_judge

    return evaluate(engine, samples, k=k, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                    judge=answer_judge, batch_size=batch_size, progress=progress, observe=observe)


class EvalExtras:
    """Collects eval responses to add the inconsistency rate (rule analysis: thinking's conclusion vs the
    answer) and, when given a rubric reward, the mean rubric score of the sampled responses."""

    def __init__(self, rubric=None, group_size: int = 8) -> None:
        self.rubric = rubric
        self.group_size = group_size
        self.seen: dict[str, tuple[list, list]] = {"greedy": ([], []), "sampled": ([], [])}
        self.rubric_scores: list[float] = []

    def __call__(self, kind: str, completions: list, samples: list) -> None:
        comps, samps = self.seen[kind]
        comps.extend(completions)
        samps.extend(samples)
        if kind == "sampled" and self.rubric is not None:
            from mmrlvr.rewards.base import score_batch

            self.rubric_scores.extend(r.score for r in score_batch(self.rubric, completions, samples))

    def metrics(self) -> dict[str, float]:
        from mmrlvr.consistency.metrics import score_completions

        out: dict[str, float] = {}
        for kind, (comps, samps) in self.seen.items():
            if not comps:
                continue
            m = score_completions(comps, samps)
            prefix = "" if kind == "sampled" else "greedy_"
            for key in ("inconsistency_rate", "consistency/thinking_accuracy"):
                if key in m:
                    out[prefix + key.removeprefix("consistency/")] = m[key]
        if self.rubric_scores:
            out["rubric"] = sum(self.rubric_scores) / len(self.rubric_scores)
        return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmrlvr eval", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model folder (checkpoint or `mmrlvr tiny build` output)")
    p.add_argument("--adapter", default=None, help="optional LoRA adapter folder / checkpoint to apply")
    p.add_argument("--data", required=True, help="dataset (dir, Parquet, JSON/JSONL) or synth:TASK")
    p.add_argument("--preset", default=None, help="column preset (easyr1, virl, grounding, choice, mmrlvr)")
    p.add_argument("--template", default="r1", choices=["r1", "boxed"])
    p.add_argument("--k", type=int, default=8, help="samples per prompt for avg@k / pass@k")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--limit", type=int, default=None, help="first N samples only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the result JSON here")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from mmrlvr.config import DataConfig
    from mmrlvr.models import load_policy
    from mmrlvr.rollout.hf import HFEngine
    from mmrlvr.train.data import load_split

    if not Path(args.model).exists():
        raise UserError(f"--model {args.model}: no such folder")
    model, processor = load_policy(args.model)
    if args.adapter:
        from mmrlvr.train.checkpoint import load_trainable_into

        model = load_trainable_into(model, Path(args.adapter))
    model.eval()
    dc = DataConfig(preset=args.preset, template=args.template)
    samples = load_split(args.data, dc, "test")
    if args.limit:
        samples = samples[: args.limit]
    result = evaluate_samples(HFEngine(model, processor), samples, k=args.k, temperature=args.temperature,
                              max_new_tokens=args.max_new_tokens, seed=args.seed)
    text = json.dumps(result, indent=2, default=float)
    print(text)
    if args.out:
        from mmrlvr.store.atomic import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    return 0
