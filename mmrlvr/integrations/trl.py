"""mmrlvr rewards as reward functions for TRL's ``GRPOTrainer`` (TRL >= 1.0; checked with 1.16).

``trl_reward("consistency")`` returns a callable with TRL's reward-function signature::

    reward(prompts, completions, completion_ids=None, **dataset_columns) -> list[float]

and a ``__name__`` (TRL logs its mean as ``rewards/<__name__>/mean``). For every row it builds the
mmrlvr ``Sample`` from the dataset columns TRL passes along (one list per column, one entry per
completion) and a ``Completion`` from the generated text, and calls the registered mmrlvr reward.

Columns (rename with ``answer_column=``, ``answer_type_column=``, ``image_column=`` or ``columns={...}``):

=============  ========================================================================================
answer         the ground truth (text or number; a box ``[x1, y1, x2, y2]`` or a list of boxes)
answer_type    "number" | "choice" | "math" | "box" | "text"; without the column: ``default_answer_type``
image/images   one image or a list of images (PIL, path, bytes; what TRL also feeds the model)
rubric         the instance rubric: a list of criterion dicts, or that list as a JSON string
options        choice options (list or JSON list); choice answers become option letters
meta           a dict or JSON string: anything else a reward reads (``tolerance``, ``task``, ``orig_size``)
id             optional prompt id; rollouts with the same id are one group
=============  ========================================================================================

Store ``rubric`` and ``meta`` as JSON strings in a ``datasets.Dataset``: Arrow needs one type per column,
and criteria (or metas) with different keys would come back padded with ``None`` fields.

Groups. TRL's ``RepeatSampler`` yields the ``num_generations`` completions of a prompt one after another,
and each process scores its own slice of the generation batch. With ``group_size=num_generations`` the
reward takes consecutive blocks as groups and checks that each block holds one prompt (a clear error
otherwise, e.g. when a process's batch does not hold whole groups); without it, rows are grouped by the
``id`` column or, failing that, by prompt content (text, answer, image pixels). The group-aware rewards
(``rubric`` saturation/POW3R, ``consistency`` with ``variant="care"``) then see whole groups. On several
processes, keep ``per_device_train_batch_size * steps_per_generation`` a multiple of ``num_generations``
so no group is split between processes. An eval set generated with a different
``num_generations_eval`` breaks the block check: leave ``group_size`` unset there (content grouping).

Logging: besides TRL's ``rewards/<name>/mean``, each call logs through TRL's ``log_metric`` hook the
means of the reward's sub-components (``rewards/rubric/crit/count``), the reward's own metrics
(``judge/unknown_rate``, ``rubric/undetermined_rate``) and, for ``consistency``, ``inconsistency_rate`` and
the ``consistency/*`` breakdown.

Policy-aware rewards (``consistency`` with the ``likelihood`` judge, the default for ``care``) and rewards
with state (POW3R's per-criterion α) need hooks into the training loop: pass ``reward_callback(rewards)``
in ``callbacks=``. It attaches the policy at train start, follows optimizer steps (the EMA reference) and
saves reward state beside each checkpoint.

Rows a reward drops (``RewardResult.dropped``: the accuracy reward's ``on_unparsed_gold="drop"``, a row
whose ground truth is unusable) are returned as ``None``, which TRL leaves out of the reward sum, as its own
``accuracy_reward`` does. Every call runs under mmrlvr's reward guard (an exception in a reward scores 0
with its reason and is logged as ``reward/errors``), and the accuracy modes are the same as in mmrlvr:
``trl_reward("accuracy", mode="math_verify", strict=False)``.

Not done: ``completion.finish_reason`` stays "stop" (TRL does not pass it; no mmrlvr reward reads it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mmrlvr.errors import UserError
from mmrlvr.integrations.common import (
    as_callable_name,
    batch_metrics,
    build,
    content_key,
    labels_from_blocks,
    labels_from_keys,
    load_images,
    make_sample,
    messages_from_prompt,
    score_in_groups,
)
from mmrlvr.rewards.base import score_batch
from mmrlvr.rewards.combine import RewardSpec
from mmrlvr.types import Completion, RewardResult, Sample

__all__ = ["TRLReward", "ScoredBatch", "trl_reward", "trl_rewards", "reward_callback", "load_reward_state",
           "completion_text", "seen_size", "STATE_FILE"]

COLUMN_ROLES = ("answer", "answer_type", "image", "images", "rubric", "options", "meta", "id")
TRL_CONTROL_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")
NEEDS_NO_ANSWER = ("rubric", "format")
STATE_FILE = "mmrlvr_rewards.json"


def completion_text(completion: Any) -> str:
    """The generated text of a TRL completion: a string, or conversational messages (assistant turns joined).

    >>> completion_text([{"role": "assistant", "content": "<answer>2</answer>"}])
    '<answer>2</answer>'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    turns = [m for m in completion if m.get("role", "assistant") == "assistant"] or list(completion)
    texts = []
    for m in turns:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text") or "" for p in content if p.get("type") == "text")
        texts.append(content or "")
    return "\n".join(texts)


def seen_size(image_size: tuple[int, int], processor: Any) -> list[int]:
    """[w, h] of the image as a Qwen-style processor will resize it (the frame of "abs" box coordinates)."""
    from mmrlvr.data.images import smart_resize

    ip = getattr(processor, "image_processor", processor)
    size = getattr(ip, "size", None)
    get = (lambda k: getattr(size, k, None) if not isinstance(size, Mapping) else size.get(k))
    factor = int(getattr(ip, "patch_size", 14)) * int(getattr(ip, "merge_size", 2))
    min_pixels = getattr(ip, "min_pixels", None) or get("shortest_edge") or 4 * 28 * 28
    max_pixels = getattr(ip, "max_pixels", None) or get("longest_edge") or 1280 * 28 * 28
    w, h = image_size
    rh, rw = smart_resize(h, w, factor=factor, min_pixels=int(min_pixels), max_pixels=int(max_pixels))
    return [rw, rh]


@dataclass
class ScoredBatch:
    """What one call scored, kept on the reward as ``last_batch`` (debugging, tests, custom logging).

    labels: the group label of each row (None when the reward scores rows one by one).
    """

    samples: list[Sample]
    completions: list[Completion]
    labels: list[int] | None
    results: list[RewardResult]


class TRLReward:
    """One mmrlvr reward as a TRL reward function (see the module docstring).

    name / params: a registered mmrlvr reward and its constructor parameters.
    weight: multiplies the score TRL receives (TRL's ``GRPOConfig.reward_weights`` works too).
    label: ``__name__`` (default: ``name``); needed to use one reward twice.
    answer_column / answer_type_column / image_column: column names; ``columns`` renames the others
        (keys ``images``, ``rubric``, ``options``, ``meta``, ``id``).
    default_answer_type: used when the batch has no answer-type column.
    group_size: TRL's ``num_generations`` (checks contiguity); None groups by id / prompt content.
    processor: the model's processor; given, box answers are scored in the frame the processor resizes
        images to (``meta["resized_size"]``, ``meta["orig_size"]``), as Qwen2.5-VL's absolute boxes need.
    log_metrics: log sub-components and reward metrics through TRL's ``log_metric``.
    """

    def __init__(self, name: str, weight: float = 1.0, *, label: str | None = None, answer_column: str = "answer",
                 answer_type_column: str | None = None, image_column: str = "image",
                 columns: Mapping[str, str] | None = None, default_answer_type: str = "math",
                 group_size: int | None = None, processor: Any = None, log_metrics: bool = True,
                 **params: Any) -> None:
        where = f"trl_reward({name!r})"
        if not isinstance(weight, (int, float)) or not math.isfinite(float(weight)):
            raise UserError(f"{where}: weight must be a finite number, got {weight!r}")
        unknown = set(columns or {}) - set(COLUMN_ROLES)
        if unknown:
            raise UserError(f"{where}: unknown column role(s) {sorted(unknown)}; known: {', '.join(COLUMN_ROLES)}")
        self.name, self.weight, self.params = name, float(weight), dict(params)
        self.label = label or name
        self.__name__ = as_callable_name(self.label)
        self.columns = {role: role for role in COLUMN_ROLES}
        self.columns.update(answer=answer_column, image=image_column, **dict(columns or {}))
        if answer_type_column is not None:
            self.columns["answer_type"] = answer_type_column
        self._answer_type_required = answer_type_column is not None
        self.default_answer_type = default_answer_type
        self.group_size = int(group_size) if group_size else None
        self.processor, self.log_metrics = processor, log_metrics
        self.reward = build(name, params, where)
        self.last_batch: ScoredBatch | None = None

    def __repr__(self) -> str:
        return f"TRLReward({self.name!r}, weight={self.weight}, label={self.label!r})"

    # ------------------------------------------------------------------------------------- TRL entry
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 completion_ids: Sequence[Sequence[int]] | None = None, **kwargs: Any) -> list[float | None]:
        results = self.score(prompts, completions, completion_ids, **kwargs)
        scores: list[float | None] = []
        for i, r in enumerate(results):
            if r.dropped:  # e.g. a ground truth math-verify cannot parse: TRL leaves None out of the sum
                scores.append(None)
                continue
            value = float(r.score)
            if not math.isfinite(value):
                raise ValueError(f"{self.__name__}: reward {self.name!r} returned {value} for row {i}")
            scores.append(self.weight * value)
        log_metric = kwargs.get("log_metric")
        if self.log_metrics and callable(log_metric):
            for key, value in sorted(batch_metrics(self.label, results, self.reward).items()):
                log_metric(key, value)
        return scores

    def score(self, prompts: Sequence[Any], completions: Sequence[Any],
              completion_ids: Sequence[Sequence[int]] | None = None, **kwargs: Any) -> list[RewardResult]:
        """The mmrlvr ``RewardResult`` per row (unweighted), from TRL's arguments."""
        if len(completions) != len(prompts):
            raise ValueError(f"{self.__name__}: {len(completions)} completions for {len(prompts)} prompts")
        grouped = hasattr(self.reward, "score_batch")  # group-aware or batched: give it whole, labelled groups
        samples, keys = self._samples_and_keys(prompts, kwargs, grouped)
        comps = [Completion(text=completion_text(c), token_ids=list(completion_ids[i]) if completion_ids else [])
                 for i, c in enumerate(completions)]
        labels = None
        if grouped:
            labels = (labels_from_blocks(keys, self.group_size, self.__name__) if self.group_size
                      else labels_from_keys(keys))
            results = score_in_groups(self.reward, comps, samples, labels)
        else:
            results = score_batch(self.reward, comps, samples)
        self.last_batch = ScoredBatch(samples, comps, labels, results)
        return results

    # ---------------------------------------------------------------------------------- rows -> samples
    def samples(self, prompts: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Sample]:
        """One ``Sample`` per row from TRL's prompts and dataset columns."""
        return self._samples_and_keys(prompts, kwargs, False)[0]

    def _samples_and_keys(self, prompts: Sequence[Any], kwargs: Mapping[str, Any],
                          keyed: bool) -> tuple[list[Sample], list[str]]:
        """Samples plus one prompt key per row: the ``id`` column, else (when ``keyed``) a hash of the prompt's
        text, answer and image pixels, else the row number (hashing images costs time only groups need)."""
        n = len(prompts)
        cols = {k: v for k, v in kwargs.items() if k not in TRL_CONTROL_KWARGS}
        for key, value in cols.items():
            if isinstance(value, (list, tuple)) and len(value) != n:
                raise ValueError(f"{self.__name__}: column {key!r} has {len(value)} values for {n} prompts")
        c = self.columns
        if c["answer"] not in cols and self.name not in NEEDS_NO_ANSWER:
            raise UserError(f"{self.__name__}: the dataset has no {c['answer']!r} column (the ground truth the "
                            f"{self.name!r} reward needs); columns TRL passed: {sorted(cols) or 'none'}; set "
                            "answer_column=")
        if self._answer_type_required and c["answer_type"] not in cols:
            raise UserError(f"{self.__name__}: answer_type_column {c['answer_type']!r} is not a dataset column; "
                            f"columns: {sorted(cols)}")

        def col(role: str, i: int) -> Any:
            values = cols.get(c[role])
            return values[i] if isinstance(values, (list, tuple)) else values

        out, keys = [], []
        for i, prompt in enumerate(prompts):
            where = f"{self.__name__} row {i}"
            raw_images = col("images", i) if c["images"] in cols else col("image", i)
            if raw_images is None:
                raw_images = _prompt_images(prompt)
            images = load_images(raw_images, where)
            messages = messages_from_prompt(prompt, len(images))
            raw_id = col("id", i)
            answer = col("answer", i)
            sample = make_sample(
                sample_id=str(raw_id) if raw_id not in (None, "") else "",
                messages=messages, images=images, answer=answer,
                answer_type=col("answer_type", i) or self.default_answer_type,
                rubric=col("rubric", i), options=col("options", i), meta=col("meta", i), where=where)
            if self.processor is not None and images:
                sample.meta.setdefault("orig_size", list(images[0].size))
                sample.meta.setdefault("resized_size", seen_size(images[0].size, self.processor))
            if raw_id in (None, ""):
                sample.id = f"prompt-{content_key(messages, answer, images=images)}" if keyed else f"row{i}"
            keys.append(sample.id)
            out.append(sample)
        return out, keys


def _prompt_images(prompt: Any) -> list[Any]:
    """Images TRL injected into a conversational prompt (``{"type": "image", "image": <PIL>}`` parts)."""
    if not isinstance(prompt, list):
        return []
    return [p["image"] for m in prompt if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image" and p.get("image") is not None]


def trl_reward(name: str, weight: float = 1.0, *, answer_column: str = "answer",
               answer_type_column: str | None = None, image_column: str = "image", group_size: int | None = None,
               **params: Any) -> TRLReward:
    """A TRL reward function for the registered mmrlvr reward ``name`` (see ``TRLReward`` for options).

    >>> acc = trl_reward("auto_accuracy", default_answer_type="number")
    >>> acc(prompts=["How many?"], completions=["<think>2</think><answer>2</answer>"], answer=["2"])
    [1.0]
    >>> acc.__name__
    'auto_accuracy'
    """
    return TRLReward(name, weight, answer_column=answer_column, answer_type_column=answer_type_column,
                     image_column=image_column, group_size=group_size, **params)


def trl_rewards(specs: Sequence[Any], **row_options: Any) -> list[TRLReward]:
    """Several rewards from specs ``{name, weight, params, label}`` (mmrlvr's ``rewards:`` config list).

    ``row_options`` (columns, group_size, processor, default_answer_type, ...) apply to every reward.
    """
    out = []
    for i, raw in enumerate(specs):
        spec = RewardSpec.coerce(raw, f"trl_rewards[{i}]")
        out.append(TRLReward(spec.name, spec.weight, label=spec.label, **row_options, **spec.params))
    names = [r.__name__ for r in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"trl_rewards: {dupes} listed twice; give each copy a distinct 'label'")
    return out


def reward_callback(rewards: Sequence[TRLReward]) -> Any:
    """A ``transformers.TrainerCallback`` giving the rewards the training-loop hooks they need.

    on_train_begin: ``attach_policy(model, processing_class)`` for rewards that score with the policy
    (GRPO-CARE's likelihood judge), and reload saved reward state when training resumes from a
    checkpoint that has one; on_step_end: ``on_optimizer_step(model, global_step)`` (the EMA reference);
    on_save: the rewards' ``state_dict()`` (POW3R α) to ``checkpoint-N/mmrlvr_rewards.json``.
    """
    from transformers import TrainerCallback

    fns = list(rewards)

    class MmrlvrRewardCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
            for r in fns:
                if getattr(r.reward, "needs_policy", False):
                    r.reward.attach_policy(model, processing_class)
            resume = getattr(args, "resume_from_checkpoint", None)
            if resume and (Path(resume) / STATE_FILE).is_file():
                load_reward_state(fns, resume)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            for r in fns:
                hook = getattr(r.reward, "on_optimizer_step", None)
                if hook is not None:
                    hook(model, state.global_step)

        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            states = {r.__name__: r.reward.state_dict() for r in fns if hasattr(r.reward, "state_dict")}
            if states and folder.is_dir() and state.is_world_process_zero:
                tmp = folder / (STATE_FILE + ".tmp")
                tmp.write_text(json.dumps(states, sort_keys=True))
                tmp.replace(folder / STATE_FILE)

    return MmrlvrRewardCallback()


def load_reward_state(rewards: Sequence[TRLReward], checkpoint_dir: str | Path) -> None:
    """Restore what ``reward_callback`` saved in ``checkpoint_dir`` (call before ``trainer.train(resume...)``)."""
    path = Path(checkpoint_dir) / STATE_FILE
    states = json.loads(path.read_text())
    for r in rewards:
        if r.__name__ in states and hasattr(r.reward, "load_state_dict"):
            r.reward.load_state_dict(states[r.__name__])
