"""Prompt templates: turn a problem text with ``<image>`` placeholders into chat messages.

Messages use the transformers multimodal chat format, which every Qwen-VL processor's chat template
reads: ``{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ...}]}``; the i-th
``{"type": "image"}`` part refers to the sample's i-th image.

Templates are short on purpose: the tiny CPU models see prompts of ~30 tokens, so a long R1-style system
prompt would dominate them. Each template has an optional system prompt and an optional instruction
appended to the user text; ``build_messages(..., system=...)`` overrides the system prompt ("" drops it).

- ``r1``: a one-line system prompt asking for ``<think>...</think><answer>...</answer>``.
- ``r1_user``: the same request as a short instruction at the end of the user text (no system message).
- ``boxed``: ask for the final answer in ``\\boxed{}`` (the EasyR1 / MathVista evaluation style).
- ``plain``: the problem alone (for models already warm-started on the response format).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmrlvr.errors import UserError

IMAGE_PLACEHOLDER = "<image>"


@dataclass(frozen=True)
class Template:
    """system: the system prompt (None: no system message); instruction: appended to the user text."""

    system: str | None = None
    instruction: str = ""


TEMPLATES: dict[str, Template] = {
    "r1": Template(system="Think in <think></think>, then answer in <answer></answer>."),
    "r1_user": Template(instruction="Think in <think></think>, then answer in <answer></answer>."),
    "boxed": Template(instruction="Think step by step, then put the final answer in \\boxed{}."),
    "plain": Template(),
}


def get_template(name: str) -> Template:
    """The template called ``name``; an unknown name lists the known ones."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise UserError(f"unknown prompt template {name!r}; known: {', '.join(TEMPLATES)}") from None


def count_placeholders(problem: str) -> int:
    return problem.count(IMAGE_PLACEHOLDER)


def build_messages(problem: str, n_images: int, template: str = "r1", system: str | None = None) -> list[dict[str, Any]]:
    """Chat messages for one problem.

    Each ``<image>`` in ``problem`` becomes an image part at that position; a problem without
    placeholders gets its ``n_images`` image parts first. A problem whose placeholder count is neither 0
    nor ``n_images`` is an error (``ValueError``; the loaders turn it into a ``DataError`` naming the row).
    system: overrides the template's system prompt; "" means no system message.

    >>> build_messages("<image>How many red shapes are there?", 1, "plain")
    [{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': 'How many red shapes are there?'}]}]
    """
    tpl = get_template(template)
    n_placeholders = count_placeholders(problem)
    if n_placeholders and n_placeholders != n_images:
        raise ValueError(f"the problem has {n_placeholders} {IMAGE_PLACEHOLDER} placeholder(s) "
                         f"but {n_images} image(s) were given")
    content: list[dict[str, Any]] = []
    if n_placeholders == 0:
        content.extend({"type": "image"} for _ in range(n_images))
        pieces = [problem]
    else:
        pieces = problem.split(IMAGE_PLACEHOLDER)
    for i, piece in enumerate(pieces):
        if i > 0:
            content.append({"type": "image"})
        text = piece.strip()
        if text:
            content.append({"type": "text", "text": text})
    if tpl.instruction:
        if content and content[-1]["type"] == "text":
            content[-1] = {"type": "text", "text": content[-1]["text"] + " " + tpl.instruction}
        else:
            content.append({"type": "text", "text": tpl.instruction})
    messages: list[dict[str, Any]] = []
    system_text = tpl.system if system is None else system
    if system_text:
        messages.append({"role": "system", "content": [{"type": "text", "text": system_text}]})
    messages.append({"role": "user", "content": content})
    return messages
