"""The plain values that flow between stages of one training step (docs/training.md, docs/architecture.md).

Each arrow of the data path is one of these: ``Sample`` (data -> rollout), ``Completion`` (one sampled
response, rollout -> rewards), ``RewardResult`` (rewards -> trainer/store). Tensor batches used inside the
trainer are defined next to the code that builds them (``mmrlvr.rollout.base.RolloutBatch``).
These types carry no behaviour beyond small conveniences so every stage can be used on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image


@dataclass
class Sample:
    """One prompt with its images and verifiable target.

    messages: chat messages in the transformers multimodal format, e.g.
        ``[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many ..."}]}]``;
        the i-th ``{"type": "image"}`` entry refers to ``images[i]``.
    images: decoded, already resized RGB images (one per image placeholder).
    answer: the ground truth as a string (a number, option letter, expression, or a JSON box list).
    answer_type: how ``answer`` is verified: "number", "choice", "math", "box", "text".
    rubric: optional per-instance rubric (list of criterion dicts; see ``mmrlvr.rubric``).
    meta: anything else from the row (task name, options, original image size, source row index, ...).
    """

    id: str
    messages: list[dict[str, Any]]
    images: list[Image.Image]
    answer: str | None
    answer_type: str = "math"
    rubric: list[dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def question(self) -> str:
        """The text of the last user message (without image placeholders)."""
        for msg in reversed(self.messages):
            if msg.get("role") == "user":
                content = msg.get("content")
                if isinstance(content, str):
                    return content
                return "".join(p.get("text", "") for p in content if p.get("type") == "text")
        return ""


@dataclass
class Completion:
    """One sampled response to a Sample, as rewards see it.

    text: the decoded response (special tokens removed).
    finish_reason: "stop" (end-of-sequence sampled) or "length" (hit max_new_tokens).
    token_ids: response token ids (no padding).
    meta: engine extras (e.g. per-token log-probs) that rewards may ignore.
    """

    text: str
    finish_reason: str = "stop"
    token_ids: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardResult:
    """What a reward function returns.

    score: the reward this function contributes (before the config's weight).
    components: named sub-scores shown in the inspector and logged as ``reward/<name>``.
    parsed: what was extracted from the response (answer, boxes, criterion verdicts, conclusion span, ...).
    dropped: the row cannot be scored (e.g. its ground truth does not parse) and should leave the loss, as
        TRL does with a ``None`` reward; ``score`` is then 0.0 and ``parsed["dropped_reason"]`` says why.
    judged: ``(correct, formatted)`` by the run's answer judge (``mmrlvr.rewards.answer_judge``), written once per
        row by the trainer's score stage and read by everything that needs a row's correctness (the ``accuracy``
        and ``format_rate`` metrics, dynamic sampling, samplers); None until then.
    """

    score: float
    components: dict[str, float] = field(default_factory=dict)
    parsed: dict[str, Any] = field(default_factory=dict)
    dropped: bool = False
    judged: tuple[bool, bool] | None = None
