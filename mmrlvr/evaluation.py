"""Evaluate a policy on Samples: greedy accuracy, avg@k and pass@k at a temperature, format rate.

avg@k (the MathVista / EasyR1 protocol) is the mean accuracy over k samples per prompt at
temperature T; pass@k is the fraction of prompts with at least one correct sample among the k. Both come
from the same k draws. Greedy accuracy is one argmax decode per prompt.

The judge is pluggable: ``judge(completion_text, sample) -> (correct, formatted)``. The default is the
strict R1 format ``<think>...</think><answer>X</answer>`` with X matched to ``sample.answer`` after light
normalisation (case, spaces, trailing period, numbers compared as numbers). Reward-grade verifiers
(math-verify, IoU for boxes) plug in the same way.

Runs through any ``RolloutEngine``; ``batch_size`` counts response rows per ``generate`` call.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from tqdm.auto import tqdm

from mmrlvr.rollout.base import RolloutEngine, SamplingParams
from mmrlvr.types import Sample

Judge = Callable[[str, Sample], "tuple[bool, bool]"]

R1_PATTERN = re.compile(r"^\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*$", re.DOTALL)


def normalise_answer(text: str) -> str:
    """Lower-case, collapse spaces, drop a trailing period and spaces inside brackets; numbers canonical.

    >>> normalise_answer(" Red. "), normalise_answer("2.0"), normalise_answer("[1,  2, 3 ,4]")
    ('red', '2', '[1,2,3,4]')
    """
    t = " ".join(text.strip().lower().split()).rstrip(".").strip()
    t = re.sub(r"\s*([\[\],()])\s*", r"\1", t)
    try:
        value = float(t)
    except ValueError:
        return t
    if math.isfinite(value) and value == int(value):
        return str(int(value))
    return repr(value)


def r1_judge(completion: str, sample: Sample) -> tuple[bool, bool]:
    """(correct, formatted) under the strict R1 format; no answer is correct without the format."""
    match = R1_PATTERN.match(completion)
    if match is None:
        return False, False
    if sample.answer is None:
        return False, True
    return normalise_answer(match.group(2)) == normalise_answer(sample.answer), True


def _batches(items: list[Sample], size: int) -> list[list[Sample]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def heldout_accuracy(engine: RolloutEngine, samples: list[Sample], *, k: int = 8, temperature: float = 1.0,
             max_new_tokens: int = 64, seed: int = 0, judge: Judge | None = None, batch_size: int = 32,
             progress: bool = True, observe: Callable[[str, list, list], None] | None = None,
             per_prompt: bool = False) -> dict[str, Any]:
    """Metrics over ``samples`` (each value in [0, 1] except the counts).

    Returns ``{"n", "k", "greedy_accuracy", "greedy_format_rate", f"avg@{k}", f"pass@{k}", "format_rate"}``
    (``format_rate`` over the k sampled responses). ``k=0`` skips sampling. With ``per_prompt`` also
    ``"per_prompt"``: one ``{"id", "greedy", "hits"}`` per sample, in order (``greedy`` 0/1, ``hits`` correct samples
    of k) — what a paired comparison of two runs on the same prompts needs.
    ``observe(kind, completions, samples)`` (kind "greedy" or "sampled") sees every generated batch, so a
    caller can compute more metrics (inconsistency rate, rubric score) on the same responses.
    """
    if not samples:
        raise ValueError("heldout_accuracy() needs at least one sample")
    judge = judge or r1_judge
    greedy_batches = _batches(samples, max(1, batch_size))
    sampled_batches = _batches(samples, max(1, batch_size // max(k, 1))) if k > 0 else []
    bar = tqdm(total=len(greedy_batches) + len(sampled_batches), desc="eval", unit="batch", disable=not progress,
               leave=False)
    greedy_correct = greedy_formatted = 0
    rows: list[dict[str, Any]] = [{"id": s.id, "greedy": 0, "hits": 0} for s in samples]
    at = 0
    for batch in greedy_batches:
        out = engine.generate(batch, 1, SamplingParams(max_new_tokens=max_new_tokens, greedy=True), seed=seed, step=0)
        if observe is not None:
            observe("greedy", out.completions, out.samples)
        for completion, sample in zip(out.completions, out.samples):
            correct, formatted = judge(completion.text, sample)
            greedy_correct += int(correct)
            greedy_formatted += int(formatted)
            rows[at]["greedy"] = int(correct)
            at += 1
        bar.update(1)
    n = len(samples)
    result: dict[str, Any] = {"n": n, "k": k, "greedy_accuracy": greedy_correct / n,
                              "greedy_format_rate": greedy_formatted / n}
    if k > 0:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
        acc_sum = passed = formatted_sum = 0.0
        at = 0
        for batch in sampled_batches:
            out = engine.generate(batch, k, params, seed=seed, step=0)
            if observe is not None:
                observe("sampled", out.completions, out.samples)
            verdicts = [judge(c.text, s) for c, s in zip(out.completions, out.samples)]
            for g in range(len(batch)):
                group = verdicts[g * k:(g + 1) * k]
                hits = sum(int(c) for c, _ in group)
                rows[at]["hits"] = hits
                at += 1
                acc_sum += hits / k
                passed += float(hits > 0)
                formatted_sum += sum(int(f) for _, f in group) / k
            bar.update(1)
        result.update({f"avg@{k}": acc_sum / n, f"pass@{k}": passed / n, "format_rate": formatted_sum / n})
    if per_prompt:
        result["per_prompt"] = rows
    bar.close()
    return result


class EvalSeen:
    """An ``observe`` callback for ``heldout_accuracy`` that keeps the greedy completions and their samples."""

    def __init__(self) -> None:
        self.completions: list = []
        self.samples: list = []

    def __call__(self, kind: str, completions: list, samples: list) -> None:
        if kind == "greedy":
            self.completions.extend(completions)
            self.samples.extend(samples)


def tool_metrics(completions: list, samples: list) -> dict[str, float]:
    """Multi-turn responses: tool calls per response, the share of calls that failed and, where samples have a gold
    region (``synth:zoom``), the share of responses whose zoom hit it (IoU >= 0.5: ``zoom_iou``). {} otherwise."""
    from mmrlvr.rewards.tool_use import ZoomIoUReward, trajectory_calls

    if not completions or not any((c.meta or {}).get("turns") for c in completions):
        return {}
    calls = [trajectory_calls(c) for c in completions]
    n_calls = sum(len(c) for c in calls)
    out = {"tool_calls_per_response": n_calls / len(completions),
           "tool_error_rate": sum(1 for cs in calls for c in cs if c.get("error")) / n_calls if n_calls else 0.0}
    with_region = [(c, s) for c, s in zip(completions, samples) if (s.meta or {}).get("region")]
    if with_region:
        zoom = ZoomIoUReward()
        out["zoom_hit_rate"] = sum(bool(zoom(c, s).parsed["zoom_hit"]) for c, s in with_region) / len(with_region)
    return out
