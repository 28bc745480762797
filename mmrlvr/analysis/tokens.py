"""``mmrlvr analyze tokens A B``: which response tokens the update from checkpoint A to checkpoint B moved.

For a few stored rollouts of a run (``rollouts/``, a few steps, ``--limit`` rows), each response's token
log-probs are recomputed under A and under B by teacher forcing, through the trainer's own path: the prompt is
the training sample the rollout was drawn from (reloaded from the run's ``data.train`` by prompt id, so the
chat template, system prompt and images are exactly the trainer's), encoded by the HF rollout engine's
processor path (``mmrlvr.rollout.hf.encode_prompt_batch``), laid out as the trainer's ``RolloutBatch``
(``mmrlvr.rollout.batch.assemble_batch``) and scored with ``mmrlvr.train.forward.token_logprobs`` at the run's
sampling temperature. Then Δ_t = log π_B(o_t) − log π_A(o_t) per token, summarised (``summarize_deltas``) by:

- **thinking vs answer**: the answer span is located as the consistency advantage locates it
  (``mmrlvr.consistency.spans``: from ``<answer>``, or after ``</think>``; ``\\boxed`` for boxed runs); a row
  without an answer marker is its own group (``no_answer_span``), not counted as thinking;
- **credit**: the tokens the run's credit scheme selected (``token_credit_weight`` > 0) vs the rest; when every
  weight is 1 no scheme selected anything and the split is said to be empty (weights of 0 can also come from the
  truncation / overlong filters: the record keeps the product);
- **DelTA**: when the run trained with ``credit.scheme: delta`` the stored weights *are* DelTA's coefficients
  c_t (mean 1 over a batch): the correlation of Δ with c_t and Δ on up-weighted (c > 1) vs down-weighted tokens,
  plus the logged ``credit/delta_coef_*`` of those steps; "not logged" otherwise.

The premise, checked on every run: a rollout of step s was sampled by the weights after s − 1 updates, i.e. the
checkpoint of step s − 1; where A or B is that checkpoint, the recomputed log-probs must equal the stored
``token_logprob`` up to float rounding (``stored_check`` in the results; the tests assert it).

Default steps: the rollout steps that the update A → B trained on (s_A < s ≤ s_B) when both are checkpoints of
the run, else all; up to ``--max-steps`` of them, evenly spread. Rows are taken round-robin over (step, prompt).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mmrlvr.errors import UserError

if TYPE_CHECKING:
    import torch

NAME = "tokens"
DEFAULT_LIMIT = 24
DEFAULT_MAX_STEPS = 3
ONE_TOL = 1e-6  # a credit weight within this of 1 counts as "1" (no selection)


# ------------------------------------------------------------------------------------------ pure summary
def _stats(x: "torch.Tensor") -> dict[str, Any]:
    """n, mean Δ, mean |Δ| and the share of tokens B made likelier (Δ > 0) of a 1-D tensor (None when empty)."""
    n = int(x.numel())
    if n == 0:
        return {"n": 0, "mean": None, "mean_abs": None, "frac_up": None}
    return {"n": n, "mean": float(x.mean()), "mean_abs": float(x.abs().mean()),
            "frac_up": float((x > 0).float().mean())}


def summarize_deltas(delta: "torch.Tensor", answer: "torch.Tensor", weight: "torch.Tensor",
                     coef: "torch.Tensor | None" = None) -> dict[str, Any]:
    """Summary of per-token Δlog-probs over the valid tokens of all rows, concatenated.

    delta:  [T] float, log π_B − log π_A per token
    answer: [T] int, 1 = answer span, 0 = thinking (before the answer), −1 = a row without an answer span
    weight: [T] float, the stored ``token_credit_weight`` (> 0 = selected by the credit scheme)
    coef:   [T] float DelTA coefficients c_t (0 = filtered out of the loss, not counted), or None without DelTA
    Returns ``{all, thinking, answer, no_answer_span: stats, credit: {...}, delta: {...} | None}``, each stats
    ``{n, mean, mean_abs, frac_up}``.
    """
    import torch

    out: dict[str, Any] = {"all": _stats(delta), "thinking": _stats(delta[answer == 0]),
                           "answer": _stats(delta[answer == 1]), "no_answer_span": _stats(delta[answer < 0])}
    all_one = bool(weight.numel()) and bool(((weight - 1).abs() <= ONE_TOL).all())
    out["credit"] = {"all_weights_one": all_one, "selected": _stats(delta[weight > 0]),
                     "rest": _stats(delta[weight <= 0])}
    if coef is None:
        out["delta"] = None
    else:  # tokens with c_t = 0 were left out of the loss by a filter, not weighted by DelTA: not counted
        on = coef > 0
        c, d = coef[on].double(), delta[on].double()
        cs, ds = c - c.mean(), d - d.mean()
        den = float(torch.sqrt((cs ** 2).sum() * (ds ** 2).sum()))
        out["delta"] = {"corr": float((cs * ds).sum()) / den if den > 0 else None,
                        "up_weighted": _stats(delta[coef > 1]), "down_weighted": _stats(delta[on & (coef < 1)])}
    return out


# ------------------------------------------------------------------------------------------ models
@dataclass
class LoadedModel:
    """A model to score with: the module (a PeftModel for a LoRA checkpoint), its processor, and where it came
    from (kind ``lora`` | ``full`` | ``model``; the checkpoint's step and run directory when it has them)."""

    model: Any
    processor: Any
    kind: str
    step: int | None
    run_dir: Path | None
    folder: Path


def model_of(spec: str | Path) -> LoadedModel:
    """The model behind a run directory (its newest verified checkpoint), a checkpoint or a model folder, loaded
    as ``eval``/``export`` load it (``mmrlvr.train.export.load_checkpoint_model``)."""
    from mmrlvr.analysis.checkpoints import run_checkpoints
    from mmrlvr.train.checkpoint import STATE

    path = Path(spec)
    if not path.exists():
        raise UserError(f"{spec}: no such run directory, checkpoint or model folder")
    if (path / "checkpoints").is_dir():
        path = run_checkpoints(path).folders[-1]
    if (path / STATE).is_file():
        from mmrlvr.train.export import load_checkpoint_model, run_dir_of

        model, processor, state = load_checkpoint_model(path)
        kind = "lora" if (path / "adapter_config.json").is_file() else "full"
        return LoadedModel(model, processor, kind, int(state["step"]), run_dir_of(path), path)
    if (path / "config.json").is_file():
        from mmrlvr.models import load_policy

        model, processor = load_policy(str(path))
        return LoadedModel(model, processor, "model", None, None, path)
    raise UserError(f"{spec}: not a run directory (checkpoints/), a checkpoint (state.json) or a model folder "
                    f"(config.json)")


def _shapes(model: Any) -> dict[str, "torch.Tensor"]:
    """{base-model parameter name: meta tensor of its shape} (LoRA factors left out, ``base_layer`` unwrapped)."""
    import torch

    from mmrlvr.analysis.checkpoints import _plain_name

    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    out = {}
    for n, p in core.named_parameters():
        if "lora_" in n:
            continue
        out[_plain_name(n).replace(".base_layer.", ".")] = torch.empty(p.shape, device="meta")
    return out


def check_comparable(a: LoadedModel, b: LoadedModel, what_a: str, what_b: str) -> None:
    """``UserError`` for a LoRA checkpoint against a full one, or checkpoints of different models."""
    from mmrlvr.analysis.checkpoints import check_same_model

    check_kinds(a.kind, b.kind, what_a, what_b)
    check_same_model(_shapes(a.model), _shapes(b.model), what_a, what_b)


def check_kinds(kind_a: str, kind_b: str, what_a: str, what_b: str) -> None:
    """A LoRA run's checkpoint against a full fine-tuning one is refused (a model folder goes with either)."""
    if {kind_a, kind_b} == {"lora", "full"}:
        lora, full = (what_a, what_b) if kind_a == "lora" else (what_b, what_a)
        raise UserError(f"{lora} is a LoRA checkpoint and {full} a full fine-tuning one; compare checkpoints of "
                        f"one kind of run (or a run's checkpoint with its base model folder)")


# ------------------------------------------------------------------------------------------ teacher forcing
def teacher_forced_batch(processor: Any, model: Any, samples: list, responses: list[list[int]]):
    """The trainer's ``RolloutBatch`` layout for one response per sample (group size 1): prompts through the HF
    engine's processor path, left-padded, responses right-padded. Returns (batch, lengths)."""
    import torch

    from mmrlvr.rollout.batch import assemble_batch
    from mmrlvr.rollout.hf import HFEngine, expand_vision

    engine = HFEngine(model, processor)
    inputs = engine.encode_prompts(samples)
    vision = expand_vision(inputs, [len(s.images) for s in samples], 1,
                           [len(s.meta.get("videos") or []) for s in samples])
    lengths = [len(r) for r in responses]
    ids = torch.full((len(responses), max(max(lengths), 1)), engine.pad_id, dtype=torch.long)
    for i, r in enumerate(responses):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    batch = assemble_batch(samples, 1, inputs, vision, ids, torch.zeros(ids.shape), eos_ids=engine.eos_ids,
                           pad_id=engine.pad_id, tokenizer=engine.tokenizer)
    return batch, lengths


def response_logprobs(model: Any, processor: Any, samples: list, responses: list[list[int]], *,
                      temperature: float = 1.0, batch_size: int = 8) -> list["torch.Tensor"]:
    """log π(o_t) of each given response (a list of [n_i] tensors), teacher-forced without gradient with the
    trainer's ``token_logprobs`` at ``temperature``."""
    import torch

    from mmrlvr.train.forward import token_logprobs

    was_training = model.training
    model.eval()
    out: list[torch.Tensor] = []
    try:
        with torch.no_grad():
            for i in range(0, len(samples), batch_size):
                batch, lengths = teacher_forced_batch(processor, model, samples[i:i + batch_size],
                                                      responses[i:i + batch_size])
                logp, _ = token_logprobs(model, batch.model_inputs(), batch.response_ids, temperature=temperature)
                out.extend(logp[j, :n].float().cpu() for j, n in enumerate(lengths))
    finally:
        model.train(was_training)
    return out


def answer_labels(tokenizer: Any, ids: list[int], markers: Sequence[str]) -> list[int]:
    """Per token of one response: 1 in the answer span, 0 before it, all −1 when there is no answer marker
    (``mmrlvr.consistency.spans``' location of the final answer)."""
    from mmrlvr.consistency.spans import answer_char_start, first_token_past

    start = answer_char_start(tokenizer.decode(ids, skip_special_tokens=True), markers)
    if start is None:
        return [-1] * len(ids)
    j = first_token_past(tokenizer, ids, start)
    j = len(ids) if j is None else j
    return [0] * j + [1] * (len(ids) - j)


def answer_markers(data_cfg: Any) -> tuple[str, ...]:
    from mmrlvr.consistency.spans import ANSWER_MARKERS
    from mmrlvr.data.prompts import answer_format

    return ("\\boxed", "</think>") if answer_format(data_cfg) == "boxed" else tuple(ANSWER_MARKERS)


# ------------------------------------------------------------------------------------------ the run side
def pick_steps(available: list[int], a_step: int | None, b_step: int | None, max_steps: int) -> list[int]:
    """The default steps: those the update A → B trained on (s_A < s ≤ s_B) when both steps are known and some
    exist, else all; at most ``max_steps`` of them, evenly spread (first and last kept)."""
    steps = sorted(available)
    if a_step is not None and b_step is not None:
        lo, hi = min(a_step, b_step), max(a_step, b_step)
        between = [s for s in steps if lo < s <= hi]
        steps = between or steps
    if len(steps) <= max_steps:
        return steps
    if max_steps == 1:
        return [steps[-1]]
    return sorted({steps[int(i * (len(steps) - 1) / (max_steps - 1) + 0.5)] for i in range(max_steps)})


def run_samples(run: Path, cfg: Any, prompt_ids: set[str]) -> dict[str, Any]:
    """The run's training samples by id (as the trainer loads ``data.train``), for the given prompt ids."""
    from mmrlvr.train.data import load_split

    samples = {str(s.id): s for s in load_split(cfg.data.train, cfg.data, "train")}
    missing = sorted(prompt_ids - set(samples))
    if missing:
        raise UserError(f"{run}: prompt {missing[0]!r} of the stored rollouts is not in the run's training data "
                        f"{cfg.data.train!r} ({len(missing)} missing); the data changed since the run")
    return {k: samples[k] for k in prompt_ids}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="the earlier model: a run directory (newest checkpoint), checkpoint or "
                   "model folder")
    p.add_argument("b", metavar="B", help="the later model (same kinds as A)")
    p.add_argument("--run", default=None, metavar="RUN_DIR",
                   help="the run whose rollouts to score (default: B's run, else A's); results go to "
                        "RUN_DIR/analysis/tokens/")
    p.add_argument("--steps", type=int, nargs="+", default=None,
                   help="rollout steps to read (default: the steps the update A -> B trained on, at most "
                        "--max-steps, evenly spread)")
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="default steps: at most this many")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                   help=f"rollouts to score, round-robin over (step, prompt) (default {DEFAULT_LIMIT})")


def run(args: argparse.Namespace) -> Path:
    from mmrlvr.train.checkpoint import quiet_progress  # no "Loading weights" bars: an error stays one line

    with quiet_progress():
        return _run(args)


def _run(args: argparse.Namespace) -> Path:
    import torch

    from mmrlvr.analysis.report import write_report

    run_dir, reader, cfg = _locate_run(args)
    if args.limit < 1:
        raise UserError(f"--limit must be at least 1, got {args.limit}")
    a = model_of(args.a)
    b_kind, b_step = kind_and_step(args.b)
    check_kinds(a.kind, b_kind, "A", "B")
    steps = args.steps or pick_steps(reader.steps(), a.step, b_step, max(1, args.max_steps))
    records = _select_records(reader, run_dir, steps, args.limit)
    samples_by_id = run_samples(run_dir, cfg, {r.prompt_id for r in records})
    samples = [samples_by_id[r.prompt_id] for r in records]
    responses = [list(r.response_token_ids) for r in records]
    temperature = float(cfg.rollout.temperature)

    logp_a = response_logprobs(a.model, a.processor, samples, responses, temperature=temperature)
    tokenizer = getattr(a.processor, "tokenizer", a.processor)
    b = model_of(args.b)
    check_comparable(a, b, "A", "B")
    a.model = None  # one model in memory at a time
    logp_b = response_logprobs(b.model, b.processor, samples, responses, temperature=temperature)

    markers = answer_markers(cfg.data)
    labels = [torch.tensor(answer_labels(tokenizer, ids, markers)) for ids in responses]
    weights = [torch.tensor(r.token_credit_weight or [1.0] * len(r.response_token_ids)) for r in records]
    deltas = [lb - la for la, lb in zip(logp_a, logp_b)]
    w = torch.cat(weights)
    summary = summarize_deltas(torch.cat(deltas), torch.cat(labels), w, w if cfg.credit.scheme == "delta" else None)
    per_step = {str(s): _stats(torch.cat([d for d, r in zip(deltas, records) if r.step == s] or [torch.zeros(0)]))
                for s in steps}
    check = {name: c for name, m, lps in (("A", a, logp_a), ("B", b, logp_b))
             if (c := stored_check(m, lps, records, run_dir)) is not None}
    numbers = {"a": str(args.a), "b": str(args.b), "a_step": a.step, "b_step": b.step, "run": str(run_dir),
               "steps": steps, "rollouts": len(records), "tokens": summary["all"]["n"], "temperature": temperature,
               "credit_scheme": cfg.credit.scheme, "answer_markers": list(markers), "summary": summary,
               "per_step": per_step, "delta_logged": _delta_logged(run_dir, steps) or "not logged",
               "stored_check": check}
    return write_report(run_dir, NAME, numbers, _markdown(numbers), {"delta_hist.png": lambda: _plot(deltas, labels)})


def _locate_run(args: argparse.Namespace):
    """(run directory, its RolloutReader, its config) of ``--run`` or of B / A; one-line errors for what is missing."""
    from mmrlvr.config import load_config
    from mmrlvr.store.reader import RolloutReader

    for spec in (args.a, args.b):
        if not Path(spec).exists():
            raise UserError(f"{spec}: no such run directory, checkpoint or model folder")
    run_dir = Path(args.run) if args.run else run_of(args.b) or run_of(args.a)
    if run_dir is None:
        raise UserError(f"neither {args.a} nor {args.b} is part of a run; pass --run RUN_DIR (the run whose "
                        f"rollouts to score)")
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: no config.yaml (not a run directory)")
    reader = RolloutReader(run_dir)
    if not reader.steps():
        raise UserError(f"{run_dir}/rollouts: no rollout shards (step-*.parquet); train with log_rollouts: true")
    return run_dir, reader, load_config(run_dir / "config.yaml")


def _select_records(reader: Any, run_dir: Path, steps: list[int], limit: int) -> list:
    """Up to ``limit`` records of ``steps``, round-robin over (step, prompt), with at least one response token."""
    from mmrlvr.store.reader import round_robin

    available = reader.steps()
    unknown = [s for s in steps if s not in available]
    if unknown:
        raise UserError(f"{run_dir}/rollouts: no shard for step {unknown[0]} (steps with rollouts: "
                        f"{available[0]}..{available[-1]})")
    index = reader.index
    records = [r for r in reader.records(round_robin(index[index["step"].isin(steps)], limit))
               if r.response_token_ids]
    if not records:
        raise UserError(f"{run_dir}/rollouts: the chosen steps hold no response tokens")
    return records


def stored_check(model: LoadedModel, logps: list, records: list, run_dir: Path) -> dict[str, Any] | None:
    """The premise: a checkpoint of step s of this run sampled step s + 1's rollouts, so its recomputed log-probs
    equal their stored ``token_logprob``. {rollout_step, rows, max_abs_diff}, or None when no row applies."""
    import torch

    if model.step is None or model.run_dir is None or Path(model.run_dir).resolve() != Path(run_dir).resolve():
        return None
    diffs = [float((lp - torch.tensor(r.token_logprob)).abs().max()) for lp, r in zip(logps, records)
             if r.step == model.step + 1 and r.token_logprob]
    return {"rollout_step": model.step + 1, "rows": len(diffs), "max_abs_diff": max(diffs)} if diffs else None


def _delta_logged(run_dir: Path, steps: list[int]) -> dict[int, dict[str, float]]:
    """``credit/delta_coef_{mean,min,max}`` of metrics.jsonl at ``steps`` (empty when DelTA never ran)."""
    from mmrlvr.store.reader import read_metrics

    keys = ("credit/delta_coef_mean", "credit/delta_coef_min", "credit/delta_coef_max")
    return {int(m["step"]): {k: m[k] for k in keys if k in m} for m in read_metrics(run_dir / "metrics.jsonl")
            if m.get("step") in steps and any(k in m for k in keys)}


def run_of(spec: str | Path) -> Path | None:
    """The run directory of a run dir or of one of its checkpoints (None for a model folder)."""
    from mmrlvr.train.export import run_dir_of

    path = Path(spec)
    if (path / "checkpoints").is_dir() and (path / "config.yaml").is_file():
        return path
    if (path / "state.json").is_file():
        return run_dir_of(path)
    return None


def kind_and_step(spec: str | Path) -> tuple[str, int | None]:
    """(lora | full | model, checkpoint step) of a spec, without loading weights."""
    from mmrlvr.analysis.checkpoints import run_checkpoints
    from mmrlvr.train.checkpoint import STATE, read_state

    path = Path(spec)
    if (path / "checkpoints").is_dir():
        path = run_checkpoints(path).folders[-1]
    if (path / STATE).is_file():
        kind = "lora" if (path / "adapter_config.json").is_file() else "full"
        return kind, int(read_state(path)["step"])
    return "model", None


def _fmt(stats: dict[str, Any]) -> list[Any]:
    return [stats["n"], stats["mean"] if stats["mean"] is not None else "–",
            stats["mean_abs"] if stats["mean_abs"] is not None else "–",
            stats["frac_up"] if stats["frac_up"] is not None else "–"]


def _markdown(n: dict[str, Any]) -> str:
    from mmrlvr.analysis.report import markdown_table

    s = n["summary"]
    head = ["tokens", "n", "mean Δ", "mean abs Δ", "share Δ > 0"]
    rows = [["all", *_fmt(s["all"])], ["thinking", *_fmt(s["thinking"])], ["answer", *_fmt(s["answer"])],
            ["rows without an answer span", *_fmt(s["no_answer_span"])]]
    credit = s["credit"]
    if s["delta"] is not None:
        credit_text = "DelTA scales every token (no 0/1 selection): see its coefficients below."
    elif credit["all_weights_one"]:
        credit_text = "Every stored credit weight is 1: no credit scheme selected tokens (no split)."
    else:
        credit_text = markdown_table(head, [["selected (weight > 0)", *_fmt(credit["selected"])],
                                            ["rest (weight 0)", *_fmt(credit["rest"])]])
    if s["delta"] is None:
        delta_text = "DelTA coefficients: not logged (the run's credit scheme is " f"`{n['credit_scheme']}`)."
    else:
        d = s["delta"]
        delta_text = (f"DelTA coefficients (the stored weights): corr(c_t, Δ) = "
                      f"{format(d['corr'], '.4g') if d['corr'] is not None else '–'}\n\n"
                      + markdown_table(head, [["c_t > 1", *_fmt(d["up_weighted"])],
                                              ["c_t < 1", *_fmt(d["down_weighted"])]])
                      + f"\n\nLogged per step: {n['delta_logged']}")
    check = n["stored_check"]
    check_text = ("; ".join(f"{k} (step {v['rollout_step'] - 1}) reproduces the stored log-probs of step "
                            f"{v['rollout_step']}'s rollouts within {v['max_abs_diff']:.2g}" for k, v in check.items())
                  or "neither checkpoint sampled the chosen rollouts (no stored-log-prob check)")
    return "\n".join([
        "# Per-token Δlog-prob between two checkpoints", "",
        f"A = `{n['a']}` (step {n['a_step']}), B = `{n['b']}` (step {n['b_step']}); run `{n['run']}`, rollout steps "
        f"{n['steps']}, {n['rollouts']} rollouts, {n['tokens']} tokens, temperature {n['temperature']}. "
        "Δ = log π_B(o_t) − log π_A(o_t), recomputed by teacher forcing with the trainer's `token_logprobs`.", "",
        markdown_table(head, rows), "",
        f"Answer span: from the first of {n['answer_markers']} found (mmrlvr.consistency.spans).", "",
        "## Credit", "", credit_text, "", delta_text, "",
        "## Premise", "", check_text + ".",
    ])


def _plot(deltas: list, labels: list):
    import matplotlib.pyplot as plt
    import torch

    d, lab = torch.cat(deltas), torch.cat(labels)
    lo, hi = float(d.min()), float(d.max())
    bins = torch.linspace(lo, hi if hi > lo else lo + 1e-6, 41).numpy()  # the same bins for every group
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for value, name in ((0, "thinking"), (1, "answer"), (-1, "no answer span")):
        x = d[lab == value]
        if x.numel():
            ax.hist(x.numpy(), bins=bins, alpha=0.6, label=f"{name} ({x.numel()})")
    ax.set_yscale("log")
    ax.set_xlabel("Δ log-prob per token (B − A)")
    ax.set_ylabel("tokens (log scale)")
    ax.legend()
    return fig
