"""mmrlvr rewards through verl's custom reward function API.

verl (volcengine/verl) loads a reward function from a file named in its config and calls it once per
response (reward manager ``naive``, the default)::

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)  # -> float | dict

``solution_str`` is the decoded response, ``ground_truth`` the row's ``reward_model.ground_truth``,
``extra_info`` the row's ``extra_info`` dict (verl adds ``num_turns``), and every key under
``custom_reward_function.reward_kwargs`` in the config is added as a keyword argument. A dict result must
hold ``"score"``; verl logs its other keys. The ``batch`` reward manager instead calls
``compute_score(data_sources=..., solution_strs=..., ground_truths=..., extra_infos=..., **reward_kwargs)``
once per batch and expects one result per response: that is ``compute_score_batch`` here, and it is the
one to use for group-aware rewards (``rubric`` saturation/POW3R, ``consistency`` ``variant="care"``).
See docs/integrations.md for where these calls were read in verl.

Configuration through ``reward_kwargs``: ``reward`` (a registered mmrlvr reward, default
``auto_accuracy``) with ``params`` (its constructor parameters), or ``rewards`` (a list of
``{name, weight, params, label}``, summed with weights as in mmrlvr's config), and ``default_answer_type``
(default "math") for rows whose ``extra_info`` has no ``answer_type``.

What ``extra_info`` may carry (all optional): ``answer_type``; ``question`` (or ``problem`` / ``prompt``:
the question text or chat messages); ``images`` (or ``image`` / ``image_paths``: paths, bytes or
``{"bytes", "path"}``; grounding reads their sizes, image-facing rubric judges see them); ``rubric`` (list
of criteria or JSON); ``options`` (choice answers); ``meta`` (dict or JSON: ``tolerance``, ``orig_size``,
``resized_size``, ``task``, ...); ``uid`` / ``id`` / ``index`` (the prompt, for grouping). Other keys are
copied into ``sample.meta``.

Result: ``{"score": Σ weight·score, <label>: unweighted score per reward}`` with the same keys on every
row (verl stacks them into columns). Groups in a batch are formed by prompt (``uid``/``id``, else
``data_source``+``split``+``index``, else the question, ground truth and image references), not by
position, so verl's batch balancing may reorder rows freely.

Same rewards, same modes: ``+custom_reward_function.reward_kwargs.params.math.mode=math_verify`` (for
``auto_accuracy``) picks math-verify's own behaviour. verl has no way to leave a row out of the loss from a
reward function, so a row a reward drops (``RewardResult.dropped``: a ground truth that does not parse)
scores 0.0 here; its count is in the reward's ``metrics()`` and the guard's ``reward/dropped``.

Not possible here: the ``likelihood`` consistency judge (it scores with the policy, which a verl reward
function cannot reach); use the ``rule`` or ``nli`` judge.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping, Sequence

from mmrlvr.errors import UserError
from mmrlvr.integrations.common import (
    build,
    ensure_registered,
    content_key,
    labels_from_keys,
    load_images,
    make_sample,
    messages_from_prompt,
    plain,
    score_in_groups,
)
from mmrlvr.rewards.base import RewardFn, score_batch
from mmrlvr.rewards.combine import CombinedReward, RewardSpec
from mmrlvr.types import Completion, RewardResult, Sample

__all__ = ["compute_score", "compute_score_batch", "make_compute_score", "sample_from_verl"]

DEFAULT_REWARD = "auto_accuracy"
#: keyword arguments some verl reward managers add for their own scorers; ignored here
VERL_EXTRAS = frozenset({"reward_router_address", "reward_model_tokenizer", "sandbox_fusion_url",
                         "concurrent_semaphore", "memory_limit_mb"})
_QUESTION_KEYS = ("question", "problem", "prompt")
_IMAGE_KEYS = ("images", "image", "image_paths")
_ID_KEYS = ("uid", "id")
_FIELD_KEYS = frozenset({"answer_type", "rubric", "options", "meta", *_QUESTION_KEYS, *_IMAGE_KEYS, *_ID_KEYS})


class _Scorer:
    """A built mmrlvr reward (one, or a weighted sum) plus the labels of its result keys."""

    def __init__(self, reward: str | None, params: Mapping[str, Any] | None, rewards: Sequence[Any] | None) -> None:
        if rewards:
            if params:
                raise UserError("verl reward_kwargs: give either `rewards` (a list) or `reward` + `params`, not both")
            specs = [RewardSpec.coerce(plain(s), f"reward_kwargs.rewards[{i}]") for i, s in enumerate(rewards)]
            ensure_registered()
            self.fn: RewardFn = CombinedReward(specs)
            self.labels = list(self.fn.labels)  # type: ignore[attr-defined]
            self.weights = [s.weight for s in specs]
            self.fns = list(self.fn.fns)  # type: ignore[attr-defined]
            combined = True
        else:
            name = reward or DEFAULT_REWARD
            self.fn = build(name, params or {}, f"reward_kwargs (reward {name!r})")
            self.labels, self.weights, self.fns = [name], [1.0], [self.fn]
            combined = False
        self.combined = combined
        if "score" in self.labels:
            raise UserError("verl reward_kwargs: a reward labelled 'score' would clash with verl's 'score' key; "
                            "set a different `label`")
        for label, fn in zip(self.labels, self.fns):
            if getattr(fn, "needs_policy", False):
                raise UserError(f"verl: reward {label!r} scores with the policy model (likelihood judge), which a "
                                "verl reward function cannot reach; use judge 'rule' or 'nli'")
        self.group_aware = any(getattr(fn, "variant", None) == "care" for fn in self.fns)

    def result_dicts(self, results: Sequence[RewardResult]) -> list[dict[str, float]]:
        out = []
        for r in results:
            total = float(r.score)
            if not math.isfinite(total):
                raise ValueError(f"mmrlvr reward returned a non-finite score {total}")
            row = {"score": total}
            if self.combined:
                row.update({label: float(r.components[label]) for label in self.labels})
            else:
                row[self.labels[0]] = total
            out.append(row)
        return out


_SCORERS: dict[str, _Scorer] = {}


def _scorer(reward: str | None, params: Mapping[str, Any] | None, rewards: Sequence[Any] | None) -> _Scorer:
    """Built once per configuration and process (verl calls once per response)."""
    key = json.dumps([reward, plain(params), plain(rewards)], sort_keys=True, default=str)
    if key not in _SCORERS:
        _SCORERS[key] = _Scorer(reward, params, rewards)
    return _SCORERS[key]


def _check_extras(kwargs: Mapping[str, Any]) -> None:
    unknown = sorted(set(kwargs) - VERL_EXTRAS)
    if unknown:
        raise UserError(f"verl reward_kwargs: unknown key(s) {unknown}; mmrlvr's compute_score takes reward, "
                        "params, rewards, default_answer_type (reward parameters go under `params`)")


# ---------------------------------------------------------------------------------------------- rows

def sample_from_verl(data_source: Any, ground_truth: Any, extra_info: Mapping[str, Any] | None, *,
                     default_answer_type: str = "math", where: str = "verl row") -> tuple[Sample, str]:
    """(Sample, prompt key) from what verl passes (see the module docstring for the ``extra_info`` keys)."""
    info = plain(dict(extra_info or {}))
    question = next((info[k] for k in _QUESTION_KEYS if info.get(k) is not None), None)
    image_refs = next((info[k] for k in _IMAGE_KEYS if info.get(k) is not None), None)
    images = load_images(image_refs, where)
    meta = plain(info.get("meta"))
    if isinstance(meta, str):
        meta = json.loads(meta) if meta.strip() else {}
    meta = dict(meta or {})
    meta.update({k: v for k, v in info.items() if k not in _FIELD_KEYS and k not in meta})
    meta["data_source"] = plain(data_source)
    uid = next((info[k] for k in _ID_KEYS if info.get(k) not in (None, "")), None)
    if uid is not None:
        key = f"id:{uid}"
    elif info.get("index") is not None:
        key = f"index:{plain(data_source)}/{info.get('split')}/{info['index']}"
    else:
        key = "content:" + content_key(data_source, question, ground_truth, images=images)
    sample = make_sample(sample_id=key, messages=messages_from_prompt(question, len(images)), images=images,
                         answer=ground_truth, answer_type=info.get("answer_type") or default_answer_type,
                         rubric=info.get("rubric"), options=info.get("options"), meta=meta, where=where)
    return sample, key


# ------------------------------------------------------------------------------------------ entries

def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None,
                  *, reward: str | None = None, params: Mapping[str, Any] | None = None,
                  rewards: Sequence[Any] | None = None, default_answer_type: str = "math",
                  **kwargs: Any) -> dict[str, float]:
    """verl's per-response reward function (reward manager ``naive``); see the module docstring.

    >>> compute_score(data_source="synth", solution_str="<think>2 red</think><answer>2</answer>",
    ...               ground_truth="2", extra_info={"answer_type": "number"})
    {'score': 1.0, 'auto_accuracy': 1.0}
    """
    _check_extras(kwargs)
    scorer = _scorer(reward, params, rewards)
    if scorer.group_aware:
        raise UserError("verl: consistency variant 'care' compares the rollouts of a prompt; use the batch reward "
                        "manager (reward_manager=batch) with custom_reward_function.name=compute_score_batch")
    sample, _ = sample_from_verl(data_source, ground_truth, extra_info, default_answer_type=default_answer_type)
    result = score_batch(scorer.fn, [Completion(text=solution_str or "")], [sample])[0]
    return scorer.result_dicts([result])[0]


def compute_score_batch(data_sources: Sequence[Any], solution_strs: Sequence[str], ground_truths: Sequence[Any],
                        extra_infos: Sequence[Mapping[str, Any] | None] | None = None, *, reward: str | None = None,
                        params: Mapping[str, Any] | None = None, rewards: Sequence[Any] | None = None,
                        default_answer_type: str = "math", **kwargs: Any) -> list[dict[str, float]]:
    """verl's batch reward function (reward manager ``batch``): one dict per response, groups by prompt."""
    _check_extras(kwargs)
    scorer = _scorer(reward, params, rewards)
    n = len(solution_strs)
    infos = list(extra_infos) if extra_infos is not None else [None] * n
    if not (len(data_sources) == len(ground_truths) == len(infos) == n):
        raise ValueError(f"verl batch: {len(data_sources)} data sources, {n} responses, {len(ground_truths)} "
                         f"ground truths, {len(infos)} extra_infos")
    samples, keys = [], []
    for i in range(n):
        s, k = sample_from_verl(data_sources[i], ground_truths[i], infos[i],
                                default_answer_type=default_answer_type, where=f"verl batch row {i}")
        samples.append(s)
        keys.append(k)
    comps = [Completion(text=t or "") for t in solution_strs]
    results = score_in_groups(scorer.fn, comps, samples, labels_from_keys(keys))
    return scorer.result_dicts(results)


def make_compute_score(name: str | Sequence[Any] = DEFAULT_REWARD, *, batch: bool = False,
                       default_answer_type: str = "math", **params: Any) -> Callable[..., Any]:
    """A verl reward function bound to one mmrlvr reward (``name`` + ``params``) or a list of specs.

    For a reward file of your own: ``compute_score = make_compute_score("consistency", variant="plain")``;
    ``batch=True`` gives the batch-manager form. Keyword arguments verl adds at call time (from
    ``reward_kwargs``) must not repeat these; verl-internal extras are ignored.
    """
    config: dict[str, Any] = ({"rewards": list(name)} if not isinstance(name, str)
                              else {"reward": name, "params": params})
    if not isinstance(name, str) and params:
        raise UserError("make_compute_score: with a list of reward specs, put parameters inside each spec")
    _scorer(config.get("reward"), config.get("params"), config.get("rewards"))  # fail at import, not mid-run

    if batch:
        def compute_score_batch_fn(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs):
            return compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos,
                                       default_answer_type=default_answer_type, **config, **kwargs)
        compute_score_batch_fn.__name__ = "compute_score_batch"
        return compute_score_batch_fn

    def compute_score_fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return compute_score(data_source, solution_str, ground_truth, extra_info,
                             default_answer_type=default_answer_type, **config, **kwargs)
    compute_score_fn.__name__ = "compute_score"
    return compute_score_fn
