"""Held-out evaluation with thinking–answer consistency: accuracy metrics plus the rule analysis.

``evaluate_consistency(engine, samples)`` decodes each held-out prompt once greedily and k times at
temperature T (the same draws, seeds and verifier as ``mmrlvr.train.heldout.evaluate_samples``, so its
``greedy_accuracy`` / ``avg@k`` / ``pass@k`` equal the trainer's eval numbers for the same model), then
scores both sets of completions with ``metrics.score_completions``:

- ``greedy/<name>`` and ``sampled/<name>`` for ``inconsistency_rate``, ``thinking_accuracy``,
  ``think_right_answer_right``, ``think_right_answer_wrong``, ``think_wrong_answer_right``,
  ``think_wrong_answer_wrong``, ``both_wrong_consistent``, ``unknown_rate``, ``verifiable_fraction``
  (the ``consistency/`` prefix of the step metrics dropped).

Why a separate function: the step metrics see only training rollouts of the current policy at T = 1,
which move with the data order; a consistency claim ("the reward lowered the inconsistency rate without
rewriting correct thinking") needs fixed held-out prompts, before and after. The verdict is the rule
comparison (the definition of the inconsistency rate); no judge model runs here.
"""

from __future__ import annotations

from typing import Any, Callable

from mmrlvr.rollout.base import RolloutEngine, SamplingParams
from mmrlvr.types import Completion, Sample

__all__ = ["evaluate_consistency"]


def _prefixed(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k.removeprefix('consistency/')}": v for k, v in metrics.items()}


def evaluate_consistency(engine: RolloutEngine, samples: list[Sample], *, k: int = 8, temperature: float = 1.0,
                         max_new_tokens: int = 32, seed: int = 0, batch_size: int = 32,
                         judge: Callable[[Completion | str, Sample], "tuple[bool, bool]"] | None = None,
                         think_prefilled: bool = False) -> dict[str, Any]:
    """Accuracy (``n``, ``k``, ``greedy_accuracy``, ``greedy_format_rate``, ``avg@k``, ``pass@k``,
    ``format_rate``) and consistency (``greedy/*``, ``sampled/*``) over ``samples``; ``k=0`` skips sampling.

    judge: ``(completion, sample) -> (correct, formatted)``; default ``mmrlvr.rewards.answer_judge``
    (the trainer's eval verifier).
    """
    from mmrlvr.consistency.metrics import score_completions

    if not samples:
        raise ValueError("evaluate_consistency() needs at least one sample")
    if judge is None:
        from mmrlvr.rewards.combine import answer_judge as judge
    n = len(samples)
    greedy: list[Completion] = []
    for start in range(0, n, max(1, batch_size)):
        out = engine.generate(samples[start:start + batch_size], 1,
                              SamplingParams(max_new_tokens=max_new_tokens, greedy=True), seed=seed, step=0)
        greedy.extend(out.completions)
    verdicts = [judge(c, s) for c, s in zip(greedy, samples)]
    result: dict[str, Any] = {"n": n, "k": k,
                              "greedy_accuracy": sum(ok for ok, _ in verdicts) / n,
                              "greedy_format_rate": sum(fmt for _, fmt in verdicts) / n}
    result.update(_prefixed("greedy", score_completions(greedy, samples, think_prefilled)))
    if k <= 0:
        return result
    sampled: list[Completion] = []
    sampled_for: list[Sample] = []
    per_call = max(1, batch_size // k)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    for start in range(0, n, per_call):
        out = engine.generate(samples[start:start + per_call], k, params, seed=seed, step=0)
        sampled.extend(out.completions)
        sampled_for.extend(out.samples)
    verdicts = [judge(c, s) for c, s in zip(sampled, sampled_for)]
    hits = [sum(ok for ok, _ in verdicts[i * k:(i + 1) * k]) for i in range(n)]
    result.update({f"avg@{k}": sum(hits) / (n * k), f"pass@{k}": sum(h > 0 for h in hits) / n,
                   "format_rate": sum(fmt for _, fmt in verdicts) / (n * k)})
    result.update(_prefixed("sampled", score_completions(sampled, sampled_for, think_prefilled)))
    return result
