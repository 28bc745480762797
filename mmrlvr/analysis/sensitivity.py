"""``mmrlvr analyze sensitivity RUN_DIR``: does the model's answer depend on the image, checkpoint by checkpoint?

The paper: arXiv 2606.09525 measures, for a VLM, how often the final answer changes when the image is perturbed
— a model that reasons from the picture flips its answer when the picture is destroyed, one that answers from the
text prior does not — and follows that sensitivity across RL training. What we compute, per checkpoint of the run
(all saved ones, or ``--step``), on the first ``--limit`` held-out prompts (the run's eval data exactly as ``mmrlvr
eval`` loads it: ``data.eval``, then ``eval.limit``):

- the **greedy** response on the clean image and on each perturbed image (``--perturbations``, default
  ``gaussian,zero,patch_blackout,blur``: ``mmrlvr.credit.perturb`` with its default parameters, applied to the
  processor's ``pixel_values`` by ``perturb_vision``, seeded by ``--seed`` and each image's content). The engine
  is the HF rollout engine unchanged: its processor is wrapped (``PerturbedProcessor``) so that every processor
  call returns the clean output with ``pixel_values`` replaced by the perturbed ones; the engine runs the vision
  tower on what the processor returned (no image cache), so the perturbed pixels are what the model sees (the
  tests check the engine's vision inputs and features);
- the **parsed answer** of each response: the final answer as the rewards locate it (``locate_answer`` with the
  run's answer template) normalised as the eval judge normalises (``mmrlvr.evaluation.normalise_answer``: case,
  spaces, trailing period, numbers as numbers); a response without an answer parses to "none", which is an answer
  like any other (none → "2" is a flip, none → none is not);
- **flip rate** = the share of prompts whose parsed answer under the perturbation differs from the clean one;
  **accuracy** clean and perturbed with the eval's judge (``mmrlvr.rewards.answer_judge``), plus the shares of
  prompts that went correct → wrong and wrong → correct (``flip_stats``).

A run without checkpoints is a one-line error (exit 2): the trainer always saves a final checkpoint, so a run with
none has no trained weights to test (we do not fall back to the base model, whose numbers would be mislabelled as
the run's). Ours, where the paper is not explicit to us: greedy decoding, the perturbations and their default
strengths (the credit module's: Gaussian noise std 2.0 in normalised units, a black image, half the 14-px patches
blacked out, a σ = 3 px blur), answer comparison after the judge's normalisation, and the held-out prompts.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mmrlvr.errors import UserError

if TYPE_CHECKING:
    from mmrlvr.types import Sample

NAME = "sensitivity"
DEFAULT_PERTURBATIONS = ("gaussian", "zero", "patch_blackout", "blur")
DEFAULT_LIMIT = 16
PIXEL_KEYS = ("pixel_values", "pixel_values_videos")


# ------------------------------------------------------------------------------------------ pure math
def flip_stats(clean: Sequence[str | None], perturbed: Sequence[str | None], clean_correct: Sequence[bool],
               perturbed_correct: Sequence[bool]) -> dict[str, Any]:
    """Flip rate and accuracies of one perturbation over n prompts.

    clean / perturbed: [n] parsed, normalised answers (None = no answer; None equals None);
    clean_correct / perturbed_correct: [n] the judge's verdicts.
    Returns ``{n, flips, flip_rate, accuracy_clean, accuracy_perturbed, accuracy_drop, correct_to_wrong,
    wrong_to_correct}`` (rates as shares of n; ``None`` when n = 0).
    """
    n = len(clean)
    if not (len(perturbed) == len(clean_correct) == len(perturbed_correct) == n):
        raise ValueError("clean, perturbed and verdict lists must have one entry per prompt")
    if n == 0:
        return {"n": 0, "flips": 0, "flip_rate": None, "accuracy_clean": None, "accuracy_perturbed": None,
                "accuracy_drop": None, "correct_to_wrong": None, "wrong_to_correct": None}
    flips = sum(a != b for a, b in zip(clean, perturbed))
    acc_c = sum(bool(c) for c in clean_correct) / n
    acc_p = sum(bool(c) for c in perturbed_correct) / n
    return {"n": n, "flips": flips, "flip_rate": flips / n, "accuracy_clean": acc_c, "accuracy_perturbed": acc_p,
            "accuracy_drop": acc_c - acc_p,
            "correct_to_wrong": sum(bool(c) and not p for c, p in zip(clean_correct, perturbed_correct)) / n,
            "wrong_to_correct": sum(p and not bool(c) for c, p in zip(clean_correct, perturbed_correct)) / n}


def parsed_answer(text: str, template: str = "r1") -> str | None:
    """The response's final answer (``locate_answer``) normalised like the eval judge; None when it has none."""
    from mmrlvr.evaluation import normalise_answer
    from mmrlvr.rewards.parsing import locate_answer

    answer, _ = locate_answer(text, template)
    return None if answer is None else normalise_answer(answer)


# ------------------------------------------------------------------------------------------ the perturbed processor
class PerturbedProcessor:
    """A processor whose outputs carry perturbed pixels: ``proc(**kw)`` is the wrapped processor's output with
    ``pixel_values`` (and ``pixel_values_videos``) replaced by ``perturb_vision(..., name, seed=seed)``; every
    other attribute (chat template, tokenizer, image processor) is the wrapped one's. Hand it to ``HFEngine`` in
    place of the processor: everything the engine encodes then goes through the perturbation."""

    def __init__(self, processor: Any, perturbation: str, *, seed: int, **params: Any) -> None:
        from mmrlvr.credit.perturb import PERTURBATIONS

        PERTURBATIONS.get(perturbation)  # an unknown name fails here, before any model runs
        object.__setattr__(self, "_processor", processor)
        object.__setattr__(self, "_perturbation", perturbation)
        object.__setattr__(self, "_seed", int(seed))
        object.__setattr__(self, "_params", params)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from mmrlvr.credit.perturb import perturb_vision

        out = self._processor(*args, **kwargs)
        present = {k: out[k] for k in out.keys() if k in PIXEL_KEYS or k.endswith("_grid_thw")}
        if any(k in present for k in PIXEL_KEYS):
            perturbed = perturb_vision(present, self._perturbation, seed=self._seed, processor=self._processor,
                                       **self._params)
            for key in PIXEL_KEYS:
                if key in present:
                    out[key] = perturbed[key]
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_processor"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._processor, name, value)


# ------------------------------------------------------------------------------------------ the run side
def greedy_answers(model: Any, processor: Any, samples: list["Sample"], *, max_new_tokens: int, seed: int,
                   judge: Any, template: str, batch_size: int = 16) -> tuple[list[str | None], list[bool], list[str]]:
    """(parsed answers, correct, texts) of one greedy response per sample through the HF engine."""
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.rollout.hf import HFEngine

    engine = HFEngine(model, processor)
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    texts: list[str] = []
    for start in range(0, len(samples), batch_size):
        out = engine.generate(samples[start:start + batch_size], 1, params, seed=seed, step=0)
        texts.extend(c.text for c in out.completions)
    return ([parsed_answer(t, template) for t in texts], [bool(judge(t, s)[0]) for t, s in zip(texts, samples)],
            texts)


def parse_perturbations(spec: str | Sequence[str]) -> list[str]:
    from mmrlvr.credit.perturb import PERTURBATIONS

    names = [x.strip() for x in (spec.split(",") if isinstance(spec, str) else spec) if x.strip()]
    if not names:
        raise UserError("--perturbations: give at least one name")
    for name in names:
        PERTURBATIONS.get(name)  # unknown: a one-line UserError naming the known ones
    return list(dict.fromkeys(names))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN_DIR", help="a run directory with checkpoints/")
    p.add_argument("--perturbations", default=",".join(DEFAULT_PERTURBATIONS),
                   help=f"comma-separated perturbations of mmrlvr.credit.perturb (default "
                        f"{','.join(DEFAULT_PERTURBATIONS)})")
    p.add_argument("--step", type=int, nargs="+", default=None, metavar="N",
                   help="checkpoint steps (default: every saved checkpoint)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                   help=f"held-out prompts (default {DEFAULT_LIMIT})")
    p.add_argument("--data", default=None, help="held-out data (default: the run's data.eval)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="(default: the run's rollout.max_new_tokens)")
    p.add_argument("--seed", type=int, default=None, help="perturbation seed (default: the run's seed)")


def analyse(run_dir: str | Path, *, perturbations: str | Sequence[str] = DEFAULT_PERTURBATIONS,
            steps: list[int] | None = None, limit: int = DEFAULT_LIMIT, data: str | None = None,
            max_new_tokens: int | None = None, seed: int | None = None) -> dict[str, Any]:
    """The flip rates of a run (the function behind the sub-command)."""
    from mmrlvr.analysis.prefix import eval_judge, pick_checkpoints, run_config
    from mmrlvr.data.prompts import answer_format
    from mmrlvr.train.heldout import load_eval_samples
    from mmrlvr.train.export import load_checkpoint_model

    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"{run}: no such run directory")
    if limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")
    names = parse_perturbations(perturbations)
    cfg = run_config(run)
    checkpoints = pick_checkpoints(run, steps)
    samples = load_eval_samples(cfg, data)[:limit]
    if not samples:
        raise UserError(f"{run}: the held-out data {data or cfg.data.eval!r} has no samples")
    if not any(s.images for s in samples):
        raise UserError(f"{run}: the held-out prompts have no images; nothing to perturb")
    judge, template = eval_judge(cfg), answer_format(cfg.data)
    max_new = int(max_new_tokens or cfg.rollout.max_new_tokens)
    seed = int(cfg.seed if seed is None else seed)

    per_checkpoint = []
    for step, folder in checkpoints:
        model, processor, _ = load_checkpoint_model(folder)
        model.eval()
        kw = {"max_new_tokens": max_new, "seed": seed, "judge": judge, "template": template}
        clean, clean_ok, _ = greedy_answers(model, processor, samples, **kw)
        entry: dict[str, Any] = {"step": step, "folder": str(folder), "accuracy_clean": sum(clean_ok) / len(clean_ok),
                                 "answers_clean": clean, "perturbations": {}}
        for name in names:
            answers, ok, _ = greedy_answers(model, PerturbedProcessor(processor, name, seed=seed), samples, **kw)
            entry["perturbations"][name] = {**flip_stats(clean, answers, clean_ok, ok), "answers": answers}
        per_checkpoint.append(entry)
        del model
    return {"run": str(run), "data": data or cfg.data.eval, "prompts": len(samples), "decoding": "greedy",
            "max_new_tokens": max_new, "seed": seed, "perturbations": names, "answer_template": template,
            "checkpoints": per_checkpoint}


def run(args: argparse.Namespace) -> Path:
    from mmrlvr.analysis.report import write_report

    numbers = analyse(args.run, perturbations=args.perturbations, steps=args.step, limit=args.limit, data=args.data,
                      max_new_tokens=args.max_new_tokens, seed=args.seed)
    return write_report(args.run, NAME, numbers, _markdown(numbers), {"sensitivity.png": lambda: _plot(numbers)})


def _markdown(n: dict[str, Any]) -> str:
    from mmrlvr.analysis.report import markdown_table

    rows = [[c["step"], name, p["flip_rate"], c["accuracy_clean"], p["accuracy_perturbed"], p["correct_to_wrong"],
             p["wrong_to_correct"]] for c in n["checkpoints"] for name, p in c["perturbations"].items()]
    table = markdown_table(["checkpoint step", "perturbation", "flip rate", "accuracy clean", "accuracy perturbed",
                            "correct → wrong", "wrong → correct"], rows)
    return (f"# Answer sensitivity to the image (arXiv 2606.09525)\n\n"
            f"Greedy answers on {n['prompts']} held-out prompts ({n['data']}), clean image vs perturbed pixel values "
            f"(seed {n['seed']}). Flip rate = share of prompts whose parsed answer (normalised as the eval judge "
            f"does; no answer counts as an answer) changes.\n\n{table}\n")


def _plot(n: dict[str, Any]):
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    steps = [c["step"] for c in n["checkpoints"]]
    for name in n["perturbations"]:
        ax1.plot(steps, [c["perturbations"][name]["flip_rate"] for c in n["checkpoints"]], "o-", label=name)
        ax2.plot(steps, [c["perturbations"][name]["accuracy_perturbed"] for c in n["checkpoints"]], "o--", label=name)
    ax2.plot(steps, [c["accuracy_clean"] for c in n["checkpoints"]], "ks-", lw=2, label="clean")
    ax1.set(xlabel="checkpoint step", ylabel="answer flip rate", ylim=(-0.05, 1.05), title="flip rate")
    ax2.set(xlabel="checkpoint step", ylabel="greedy accuracy", ylim=(-0.05, 1.05), title="accuracy")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    return fig
