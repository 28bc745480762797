"""``mmrlvr eval``: greedy accuracy, avg@k and pass@k of a model folder on a dataset, as JSON.

The protocol papers in this field report: avg@k at temperature 1.0 (mean accuracy over k samples per
prompt) with the answer verified like the training reward, plus greedy accuracy and pass@k.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError


def evaluate_samples(engine, samples, *, k: int = 8, temperature: float = 1.0, max_new_tokens: int = 64,
                     seed: int = 0, progress: bool = True, batch_size: int = 32, observe=None,
                     per_prompt: bool = False) -> dict[str, Any]:
    """Evaluate with the project's answer verifiers (same normalisation as the accuracy reward)."""
    from mmrlvr.evaluation import heldout_accuracy
    from mmrlvr.rewards import answer_judge

    return heldout_accuracy(engine, samples, k=k, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                    judge=answer_judge, batch_size=batch_size, progress=progress, observe=observe,
                    per_prompt=per_prompt)


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

            # responses the judge left undetermined (judge down) never enter the mean as a score
            self.rubric_scores.extend(r.score for r in score_batch(self.rubric, completions, samples)
                                      if not (r.parsed or {}).get("undetermined"))

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
        from mmrlvr.evaluation import tool_metrics

        out.update(tool_metrics(*self.seen["sampled"]))
        return out


def load_eval_samples(cfg, data: str | None = None) -> list:
    """The run's held-out samples exactly as the trainer takes them (``data.eval``, then ``eval.limit``)."""
    from mmrlvr.train.data import load_split

    spec = data or cfg.data.eval
    if not spec:
        raise UserError("no evaluation data: the run has no data.eval; pass --data DATASET")
    samples = load_split(spec, cfg.data, "test")
    return samples[: cfg.eval.limit] if cfg.eval.limit else samples


def build_rewards(cfg) -> list:
    """The run's reward functions in config order (as the trainer builds them), for the rubric eval score."""
    from mmrlvr.train.reward_setup import build_run_reward

    reward = build_run_reward(cfg)
    return list(getattr(reward, "fns", [reward]))


def eval_rubric(cfg, fns: list, reward_state: dict | None = None):
    """The static-weight copy of the run's rubric reward the trainer scores eval responses with (None if none).

    ``reward_state``: the checkpoint's adaptive reward state (POW3R weights), applied first so the copy
    carries the weights the run had at that step.
    """
    for i, fn in enumerate(fns):
        saved = (reward_state or {}).get(str(i))
        if saved is not None and hasattr(fn, "load_state_dict"):
            fn.load_state_dict(saved)
    for spec, fn in zip(cfg.rewards, fns):
        if spec.name == "rubric":
            copy_for_eval = getattr(fn, "for_evaluation", None)
            return copy_for_eval(cfg.eval.k) if copy_for_eval else fn
    return None


def evaluate_run(engine, samples: list, *, k: int, temperature: float, max_new_tokens: int, seed: int,
                 rubric=None, progress: bool = True, per_prompt: bool = False) -> dict[str, Any]:
    """What the trainer's ``evaluate`` computes: the eval metrics plus the extras on the same responses."""
    extras = EvalExtras(rubric=rubric, group_size=k)
    result = evaluate_samples(engine, samples, k=k, temperature=temperature, max_new_tokens=max_new_tokens,
                              seed=seed, progress=progress, observe=extras, per_prompt=per_prompt)
    result.update(extras.metrics())
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mmrlvr eval", description=__doc__.splitlines()[0],
        epilog="With RUN_DIR the run's config.yaml supplies the model, data, prompt format, sampling, rewards, "
               "eval k and max new tokens (so the numbers match the run's own final eval); any flag overrides "
               "one setting. RUN_DIR may also be a checkpoint folder or an `mmrlvr export` folder.")
    p.add_argument("run", nargs="?", default=None, metavar="RUN_DIR",
                   help="run directory, checkpoint folder, export folder or model folder")
    p.add_argument("--step", type=int, default=None, help="checkpoint step of RUN_DIR (default: the newest)")
    p.add_argument("--model", default=None,
                   help="model: a folder (checkpoint, export, `mmrlvr tiny build` output) or a tiny:... spec")
    p.add_argument("--adapter", default=None, help="optional LoRA adapter folder / checkpoint to apply")
    p.add_argument("--data", default=None, help="dataset (dir, Parquet, JSON/JSONL) or synth:TASK")
    p.add_argument("--preset", default=None, help="column preset (easyr1, virl, grounding, choice, mmrlvr)")
    p.add_argument("--template", default=None, choices=["r1", "boxed"], help="prompt template (default: the run's, else r1)")
    p.add_argument("--k", type=int, default=None, help="samples per prompt for avg@k / pass@k (default: run's, else 8)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: run's, else 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="(default: the run's rollout.max_new_tokens, else 64)")
    p.add_argument("--limit", type=int, default=None,
                   help="first N samples only (default: the run's eval.limit); a synth: set is drawn up to N")
    p.add_argument("--seed", type=int, default=None, help="(default: the run's seed, else 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--out", default=None, help="write the result JSON here")
    return p


def _run_dir_for(path: Path) -> Path | None:
    """The run directory behind a run dir, a checkpoint folder or an export folder (None: a plain model)."""
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        return path
    if (path / "state.json").is_file() and (path.parent.parent / "config.yaml").is_file():
        return path.parent.parent
    info = path / "mmrlvr_export.json"
    if info.is_file():
        ckpt = Path(json.loads(info.read_text()).get("checkpoint") or "")
        if (ckpt.parent.parent / "config.yaml").is_file():
            return ckpt.parent.parent
    return None


def load_model_folder(folder: str, dtype: str, attn: str | None):
    """(model, processor, state) of a checkpoint folder, or (model, processor, {}) of a model/export folder: what
    ``mmrlvr eval`` loads, for scripts that evaluate the same way (``benchmarks/zoom_breakdown.py``)."""
    from mmrlvr.models import load_policy
    from mmrlvr.train.export import load_checkpoint_model

    if (Path(folder) / "state.json").is_file():
        return load_checkpoint_model(Path(folder), dtype=dtype)
    model, processor = load_policy(folder, dtype=dtype, attn_implementation=attn)
    return model, processor, {}


def main(argv: list[str]) -> int:
    import dataclasses

    args = build_parser().parse_args(argv)
    from mmrlvr.config import RunConfig, load_config
    from mmrlvr.rollout.hf import HFEngine
    from mmrlvr.train.model_path import resolve_model_path

    target = args.run or args.model
    if target is None:
        raise UserError("give a RUN_DIR (or --model MODEL --data DATASET)")
    run_dir = None
    if args.run is not None:
        if not Path(args.run).exists():
            raise UserError(f"{args.run}: no such run directory, checkpoint or model folder")
        run_dir = _run_dir_for(Path(args.run))
    cfg = load_config(Path(run_dir) / "config.yaml") if run_dir is not None else RunConfig()
    if run_dir is not None:
        from mmrlvr.plugins import load_run_plugins

        load_run_plugins(run_dir, cfg.plugins)  # plugin rewards the run's config names (the run's copy if gone)
    # the model: --model wins; then RUN_DIR (its newest verified checkpoint, or the folder itself)
    if args.model is not None:
        folder = resolve_model_path(args.model) if args.model.startswith("tiny:") else args.model
        if not Path(folder).exists():
            raise UserError(f"--model {args.model}: no such folder (or a tiny:FAMILY[:warm] spec)")
    elif (Path(args.run) / "checkpoints").is_dir():
        from mmrlvr.train.export import find_checkpoint

        folder = str(find_checkpoint(args.run, args.step))
    else:
        folder = args.run
    model, processor, state = load_model_folder(folder, cfg.model.dtype if run_dir else "float32",
                                                cfg.model.attn_implementation if run_dir else None)
    if args.adapter:
        from mmrlvr.train.checkpoint import load_trainable_into

        model = load_trainable_into(model, Path(args.adapter))
    model.eval()
    data_over = {k: v for k, v in (("preset", args.preset), ("template", args.template)) if v is not None}
    eval_over = {"limit": args.limit} if args.limit is not None else {}
    from mmrlvr.train.data import SYNTH_PREFIX

    if args.limit is not None and str(args.data or cfg.data.eval or "").startswith(SYNTH_PREFIX):
        # synthetic rows are drawn by index: a larger set starts with the run's own, so --limit can go past it
        data_over["eval_size"] = max(cfg.data.eval_size, args.limit)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data_over),
                              eval=dataclasses.replace(cfg.eval, **eval_over))
    if args.data is None and run_dir is None:
        raise UserError("--data DATASET is needed when evaluating a model folder that is not part of a run")
    samples = load_eval_samples(cfg, args.data)
    if args.limit is not None and len(samples) < args.limit:  # a file holds what it holds: say so, do not pad
        print(f"mmrlvr eval: warning: --limit {args.limit}, but {args.data or cfg.data.eval} has "
              f"{len(samples)} held-out row(s); evaluating {len(samples)}", file=sys.stderr)
    k = args.k if args.k is not None else cfg.eval.k
    temperature = args.temperature if args.temperature is not None else cfg.eval.temperature
    max_new = args.max_new_tokens if args.max_new_tokens is not None else (cfg.rollout.max_new_tokens if run_dir else 64)
    seed = args.seed if args.seed is not None else cfg.seed
    rubric = eval_rubric(cfg, build_rewards(cfg), state.get("reward_state")) if run_dir is not None else None
    from mmrlvr.train.tool_setup import with_tools

    engine = with_tools(HFEngine(model, processor), cfg) if run_dir is not None else HFEngine(model, processor)
    result = evaluate_run(engine, samples, k=k, temperature=temperature, max_new_tokens=max_new,
                          seed=seed, rubric=rubric, progress=not args.no_progress)
    result["model"] = str(folder)
    if state.get("step") is not None:
        result["step"] = state["step"]
    text = json.dumps(result, indent=2, default=float)
    print(text)
    if args.out:
        from mmrlvr.store.atomic import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    return 0
