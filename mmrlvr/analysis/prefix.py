"""``mmrlvr analyze prefix RUN_DIR``: how much of a correct response's thinking the model actually needs.

The paper: ThoughtFold (arXiv 2606.03503) measures the redundancy of a reasoning model's thinking by cutting it
short: the shortest prefix of the thinking from which the model still reaches the right answer tells how much of
the rest was unnecessary. What we compute, per checkpoint of the run (all saved ones, or ``--step``):

- the rollouts: up to ``--limit`` *correct* rollouts stored in the run (``rollouts/``) with a thinking block,
  taken from the steps nearest to step s + 1 — the rollouts checkpoint s itself sampled (a rollout of step t is
  sampled by the weights after t − 1 updates) — then the neighbouring steps, round-robin over prompts within a
  step. "Correct" is the eval's judge (below) on the stored response; the run's accuracy reward component
  (``c:*accuracy`` ≥ 0.5) only pre-filters the rows read. The prompt is the training sample the rollout was drawn
  from (reloaded from the run's ``data.train`` by prompt id: the trainer's chat template, system prompt, images);
- the thinking: the text between the response's first ``<think>`` and the following ``</think>``, in **tokens**:
  the run's tokenizer's tokens of that text (the stored response tokens whenever the tokenizer round-trips the
  text, as byte-level BPE does); a prefix of k tokens is their decoded text;
- the oracle ``correct_from(k)``: ``--samples`` continuations (default 4) of the prompt = the sample's
  chat-templated prompt + the response's text up to and including ``<think>`` + the first k thinking tokens +
  ``</think>``, i.e. **the thinking is closed at the cut and the model must answer now** (our reading of the
  paper's early-exit probe: continuing the thinking from the prefix would let the model regenerate what was cut
  and measure nothing). They are sampled with the HF rollout engine (the prefix reaches it as
  ``Sample.meta["assistant_prefix"]``, appended to the templated prompt in ``mmrlvr.rollout.hf.prompt_texts``,
  which the vLLM engine builds its prompts with too) at the run's sampling temperature, each seeded by
  (``--seed``, prompt, k, sample), and judged on prefix + continuation with the eval's judge
  (``mmrlvr.rewards.answer_judge``, the R1 template; the same judge with the run's answer template when the run
  does not use R1). ``correct_from(k)`` is True when at least ``--threshold`` (0.7) of them are correct (with
  4 samples: 3 of 4);
- the search (``shortest_prefix``): binary search over k ∈ [0, L] for the smallest k with ``correct_from(k)``,
  assuming it is **monotone** (correct from k ⇒ correct from every k' ≥ k); it calls the oracle at most
  ⌈log2(L + 1)⌉ ≤ ⌈log2 L⌉ + 1 times and never at L itself: when no tested prefix is enough the answer is L
  (nothing can be cut), flagged ``verified: false``. Under a non-monotone oracle the result is still a boundary
  (the oracle is False at k − 1 and True at k where tested), not necessarily the smallest such k;
- per rollout the **cut share** 1 − k / L; the checkpoint's **redundancy score** is its mean over the rollouts
  (with its standard deviation, the share of rollouts answered right with no thinking at all, k = 0, and the
  share where no prefix shorter than the whole thinking sufficed — k = L, cut 0; the whole thinking itself is not
  re-tested, the rollout being correct already).

A run without rollouts or without checkpoints is a one-line error: the trainer always saves a final checkpoint,
so "the final model" of a run is its newest checkpoint, and a run with none has no trained weights to probe.
Ours, where the paper is not explicit to us: the close-the-thinking probe, token units, the nearest-step rollout
choice, the 0.7 threshold over 4 samples as defaults, and the monotone binary search (the cost is ⌈log2(L+1)⌉
oracle calls of ``--samples`` generations each instead of L).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator

from mmrlvr.errors import UserError

if TYPE_CHECKING:
    from mmrlvr.store.record import RolloutRecord
    from mmrlvr.types import Sample

NAME = "prefix"
DEFAULT_LIMIT = 8
DEFAULT_SAMPLES = 4
DEFAULT_THRESHOLD = 0.7
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


# ------------------------------------------------------------------------------------------ pure search
def prefix_search(length: int) -> Generator[int, bool, int]:
    """Binary search for the shortest sufficient prefix of ``length`` units, as a coroutine: it yields a prefix
    length k to test and is sent whether the model answers correctly from it; it returns the shortest k found.

    Invariant: the answer lies in [lo, hi], hi is either L (untested: nothing shorter found) or a tested
    success. Assumes monotonicity (see the module docstring). Driving many searches in lockstep lets one batched
    generate call answer every search's current question.
    """
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    lo, hi = 0, length
    while lo < hi:
        mid = (lo + hi) // 2
        if (yield mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class SearchResult:
    """The outcome of one search: ``length`` (k), ``total`` (L), the oracle calls made ([(k, verdict)]) and
    whether k was confirmed by a True verdict (False: nothing shorter than L sufficed; L itself untested)."""

    length: int
    total: int
    calls: list[tuple[int, bool]] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return any(k == self.length and ok for k, ok in self.calls)

    @property
    def cut_share(self) -> float:
        """1 − k / L (0.0 for an empty thinking)."""
        return 1.0 - self.length / self.total if self.total else 0.0


def shortest_prefix(length: int, correct_from: Callable[[int], bool]) -> SearchResult:
    """The shortest prefix length k ∈ [0, length] with ``correct_from(k)`` (monotone oracle), by binary search:
    at most ⌈log2(length + 1)⌉ oracle calls; ``length`` when no tested prefix is correct."""
    return lockstep([length], lambda asked: [bool(correct_from(k)) for _, k in asked])[0]


def lockstep(lengths: list[int], batch_oracle: Callable[[list[tuple[int, int]]], list[bool]]) -> list[SearchResult]:
    """Run one search per item in lockstep: each round asks ``batch_oracle`` every unfinished search's question at
    once as [(item, k)] and gets the verdicts in that order. Same results as ``shortest_prefix`` per item."""
    searches = [prefix_search(n) for n in lengths]
    results = [SearchResult(n, n) for n in lengths]
    pending: dict[int, int] = {}
    for i, s in enumerate(searches):
        try:
            pending[i] = next(s)
        except StopIteration as stop:  # L = 0: nothing to search
            results[i].length = int(stop.value)
    while pending:
        asked = list(pending.items())
        verdicts = batch_oracle(asked)
        for (i, k), ok in zip(asked, verdicts):
            results[i].calls.append((k, bool(ok)))
            try:
                pending[i] = searches[i].send(bool(ok))
            except StopIteration as stop:
                results[i].length = int(stop.value)
                del pending[i]
    return results


def summarize(results: list[SearchResult]) -> dict[str, Any]:
    """The redundancy numbers of one checkpoint's searches: mean / std of the cut share 1 − k/L, the share of
    rollouts needing no thinking (k = 0), the share not verified (no prefix shorter than L sufficed), mean L and
    k, and the oracle calls."""
    n = len(results)
    if n == 0:
        return {"n": 0, "redundancy": None, "redundancy_std": None, "no_thinking_needed": None,
                "unverified": None, "mean_thinking_tokens": None, "mean_prefix_tokens": None, "oracle_calls": 0}
    cuts = [r.cut_share for r in results]
    mean = sum(cuts) / n
    return {"n": n, "redundancy": mean, "redundancy_std": math.sqrt(sum((c - mean) ** 2 for c in cuts) / n),
            "no_thinking_needed": sum(r.length == 0 for r in results) / n,
            "unverified": sum(not r.verified for r in results) / n,
            "mean_thinking_tokens": sum(r.total for r in results) / n,
            "mean_prefix_tokens": sum(r.length for r in results) / n,
            "oracle_calls": sum(len(r.calls) for r in results)}


# ------------------------------------------------------------------------------------------ text pieces
def split_thinking(text: str) -> tuple[str, str] | None:
    """(head, thinking) of a response: head = the text up to and including the first ``<think>``, thinking =
    what follows up to the next ``</think>``; None when the response has no closed thinking block."""
    i = text.find(THINK_OPEN)
    if i < 0:
        return None
    start = i + len(THINK_OPEN)
    j = text.find(THINK_CLOSE, start)
    if j < 0:
        return None
    return text[:start], text[start:j]


def assistant_prefix(head: str, thinking_prefix: str) -> str:
    """What the assistant turn starts with for a probe: the head, the kept thinking, and the thinking closed."""
    return head + thinking_prefix + THINK_CLOSE


def with_prefix(sample: "Sample", prefix: str, tag: str) -> "Sample":
    """A copy of ``sample`` whose assistant turn starts with ``prefix`` (``meta["assistant_prefix"]``); ``tag``
    goes into the id, so its sampling seeds differ from the original's and between probes."""
    from mmrlvr.rollout.hf import ASSISTANT_PREFIX

    return dataclasses.replace(sample, id=f"{sample.id}#{tag}", meta={**sample.meta, ASSISTANT_PREFIX: prefix})


# ------------------------------------------------------------------------------------------ the run side
def run_config(run_dir: Path) -> Any:
    from mmrlvr.config import load_config

    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: no config.yaml (not a run directory)")
    return load_config(run_dir / "config.yaml")


def pick_checkpoints(run_dir: Path, steps: list[int] | None) -> list[tuple[int, Path]]:
    """(step, folder) of the run's verified checkpoints, all or those of ``steps`` (one-line errors)."""
    from mmrlvr.analysis.checkpoints import run_checkpoints

    ck = run_checkpoints(run_dir)
    pairs = list(zip(ck.steps, ck.folders))
    if not steps:
        return pairs
    have = dict(pairs)
    missing = [s for s in steps if s not in have]
    if missing:
        raise UserError(f"{run_dir}: no verified checkpoint at step {missing[0]} (saved steps: "
                        f"{', '.join(map(str, ck.steps))})")
    return [(s, have[s]) for s in sorted(set(steps))]


def eval_judge(cfg: Any) -> Callable[[Any, "Sample"], tuple[bool, bool]]:
    """The eval's judge (``answer_judge``, R1), or the same judge with the run's answer template if not R1."""
    from mmrlvr.data.prompts import answer_format
    from mmrlvr.rewards import answer_judge, make_answer_judge

    fmt = answer_format(cfg.data)
    return answer_judge if fmt == "r1" else make_answer_judge(template=fmt)


def train_samples(run_dir: Path, cfg: Any) -> dict[str, "Sample"]:
    """The run's training samples by id, as the trainer loads ``data.train``."""
    from mmrlvr.train.data import load_split

    return {str(s.id): s for s in load_split(cfg.data.train, cfg.data, "train")}


@dataclass
class Probe:
    """One correct rollout to search: its record, its training sample, and its split response."""

    record: "RolloutRecord"
    sample: "Sample"
    head: str
    thinking: str


def _accuracy_columns(columns: list[str]) -> list[str]:
    return [c for c in columns if c.startswith("c:") and c.split("/")[-1].endswith("accuracy")]


def select_probes(reader: Any, samples: dict[str, "Sample"], judge: Callable, near: int, limit: int,
                  run_dir: Path, data: str = "data.train") -> list[Probe]:
    """Up to ``limit`` correct rollouts with a non-empty thinking block, from the steps nearest to ``near``
    (ties: the earlier step), round-robin over prompts within a step."""
    from mmrlvr.store.reader import PASS_THRESHOLD, round_robin

    index = reader.index
    acc = _accuracy_columns(list(index.columns))
    out: list[Probe] = []
    for step in sorted(reader.steps(), key=lambda t: (abs(t - near), t)):
        rows = index[index["step"] == step]
        if acc:
            rows = rows[(rows[acc].fillna(0.0) >= PASS_THRESHOLD).any(axis=1)]
        rows = round_robin(rows)
        for start in range(0, len(rows), max(limit, 1) * 4):
            for rec in reader.records(rows.iloc[start:start + max(limit, 1) * 4]):
                sample = samples.get(rec.prompt_id)
                if sample is None:
                    raise UserError(f"{run_dir}: prompt {rec.prompt_id!r} of the stored rollouts is not in the "
                                    f"run's training data {data!r}; the data changed since the run")
                parts = split_thinking(rec.response_text)
                if parts is None or not parts[1].strip() or not judge(rec.response_text, sample)[0]:
                    continue
                out.append(Probe(rec, sample, parts[0], parts[1]))
                if len(out) >= limit:
                    return out
    return out


def probe_checkpoint(model: Any, processor: Any, probes: list[Probe], *, samples: int, threshold: float,
                     temperature: float, max_new_tokens: int, seed: int, judge: Callable,
                     batch_rows: int = 64) -> list[SearchResult]:
    """The searches of ``probes`` under one model: lockstep binary searches, each round one batched generate of
    ``samples`` continuations per open question (rows chunked by ``batch_rows``)."""
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.rollout.hf import ASSISTANT_PREFIX, HFEngine

    tokenizer = getattr(processor, "tokenizer", processor)
    token_ids = [tokenizer.encode(p.thinking, add_special_tokens=False) for p in probes]
    engine = HFEngine(model, processor, batch_size=batch_rows)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)

    def batch_oracle(asked: list[tuple[int, int]]) -> list[bool]:
        prefixes = [assistant_prefix(probes[i].head, tokenizer.decode(token_ids[i][:k])) for i, k in asked]
        rows = [with_prefix(probes[i].sample, text, f"prefix{k}") for (i, k), text in zip(asked, prefixes)]
        verdicts: list[bool] = []
        per_call = max(1, batch_rows // samples)
        for start in range(0, len(rows), per_call):
            part = rows[start:start + per_call]
            out = engine.generate(part, samples, params, seed=seed, step=0)
            for j, sample in enumerate(part):  # the judge reads the whole response: prefix + continuation
                text = sample.meta[ASSISTANT_PREFIX]
                group = out.completions[j * samples:(j + 1) * samples]  # group-contiguous rows
                hits = sum(bool(judge(text + c.text, sample)[0]) for c in group)
                verdicts.append(hits / samples >= threshold - 1e-12)
        return verdicts

    return lockstep([len(t) for t in token_ids], batch_oracle)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN_DIR", help="a run directory with rollouts/ and checkpoints/")
    p.add_argument("--step", type=int, nargs="+", default=None, metavar="N",
                   help="checkpoint steps to probe (default: every saved checkpoint)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                   help=f"correct rollouts per checkpoint (default {DEFAULT_LIMIT})")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                   help=f"continuations per tested prefix (default {DEFAULT_SAMPLES})")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"share of correct continuations for a prefix to suffice (default {DEFAULT_THRESHOLD})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per continuation (default: the run's rollout.max_new_tokens)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: the run's seed)")


def analyse(run_dir: str | Path, *, steps: list[int] | None = None, limit: int = DEFAULT_LIMIT,
            samples: int = DEFAULT_SAMPLES, threshold: float = DEFAULT_THRESHOLD, max_new_tokens: int | None = None,
            seed: int | None = None) -> dict[str, Any]:
    """The redundancy numbers of a run (the function behind the sub-command)."""
    from mmrlvr.store.reader import RolloutReader
    from mmrlvr.train.export import load_checkpoint_model

    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"{run}: no such run directory")
    if limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")
    if samples < 1:
        raise UserError(f"--samples must be at least 1, got {samples}")
    if not 0 < threshold <= 1:
        raise UserError(f"--threshold must be in (0, 1], got {threshold}")
    cfg = run_config(run)
    reader = RolloutReader(run)
    if not reader.steps():
        raise UserError(f"{run}/rollouts: no rollout shards (step-*.parquet); train with log_rollouts: true")
    checkpoints = pick_checkpoints(run, steps)
    judge = eval_judge(cfg)
    by_id = train_samples(run, cfg)
    max_new = int(max_new_tokens or cfg.rollout.max_new_tokens)
    seed = int(cfg.seed if seed is None else seed)
    temperature = float(cfg.rollout.temperature)

    per_checkpoint = []
    for step, folder in checkpoints:
        probes = select_probes(reader, by_id, judge, step + 1, limit, run, cfg.data.train)
        model, processor, _ = load_checkpoint_model(folder)
        model.eval()
        results = probe_checkpoint(model, processor, probes, samples=samples, threshold=threshold,
                                   temperature=temperature, max_new_tokens=max_new, seed=seed, judge=judge)
        del model
        rows = [{"rollout_step": p.record.step, "prompt_id": p.record.prompt_id,
                 "sample_index": p.record.sample_index, "thinking_tokens": r.total, "prefix_tokens": r.length,
                 "cut_share": r.cut_share, "verified": r.verified, "calls": [list(c) for c in r.calls]}
                for p, r in zip(probes, results)]
        per_checkpoint.append({"step": step, "folder": str(folder), **summarize(results), "rollouts": rows})
    if not any(c["n"] for c in per_checkpoint):
        raise UserError(f"{run}/rollouts: no correct rollout with a <think>...</think> block to probe")
    return {"run": str(run), "unit": "tokens", "probe": "thinking closed at the cut, answer sampled",
            "samples": samples, "threshold": threshold, "temperature": temperature, "max_new_tokens": max_new,
            "seed": seed, "limit": limit, "checkpoints": per_checkpoint}


def run(args: argparse.Namespace) -> Path:
    from mmrlvr.analysis.report import write_report

    numbers = analyse(args.run, steps=args.step, limit=args.limit, samples=args.samples, threshold=args.threshold,
                      max_new_tokens=args.max_new_tokens, seed=args.seed)
    return write_report(args.run, NAME, numbers, _markdown(numbers), {"redundancy.png": lambda: _plot(numbers)})


def _cell(v: Any) -> Any:
    return "–" if v is None else v


def _markdown(n: dict[str, Any]) -> str:
    from mmrlvr.analysis.report import markdown_table

    rows = [[c["step"], c["n"], _cell(c["redundancy"]), _cell(c["redundancy_std"]), _cell(c["mean_thinking_tokens"]),
             _cell(c["mean_prefix_tokens"]), _cell(c["no_thinking_needed"]), _cell(c["unverified"]), c["oracle_calls"]]
            for c in n["checkpoints"]]
    table = markdown_table(["checkpoint step", "rollouts", "redundancy (mean cut share)", "std",
                            "thinking tokens", "kept tokens", "no thinking needed", "nothing cut",
                            "oracle calls"], rows)
    return (f"# Thinking redundancy (ThoughtFold, arXiv 2606.03503)\n\n"
            f"Shortest thinking prefix (in tokens) from which the checkpoint still answers correctly in at least "
            f"{n['threshold']:g} of {n['samples']} sampled continuations (temperature {n['temperature']:g}), the "
            f"thinking closed at the cut; binary search assuming monotonicity. Redundancy = mean of "
            f"1 − kept / thinking tokens over correct stored rollouts (those nearest to the step each checkpoint "
            f"sampled).\n\n{table}\n")


def _plot(n: dict[str, Any]):
    import matplotlib.pyplot as plt

    pts = [c for c in n["checkpoints"] if c["redundancy"] is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.errorbar([c["step"] for c in pts], [c["redundancy"] for c in pts], yerr=[c["redundancy_std"] for c in pts],
                fmt="o-", capsize=3, label="mean cut share ± std")
    ax.set_xlabel("checkpoint step")
    ax.set_ylabel("redundancy (1 − kept / thinking)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8)
    return fig
