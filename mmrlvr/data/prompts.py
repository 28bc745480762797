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

Prompt templates (``data.prompt_template``, as EasyR1's ``format_prompt``): a Jinja string or file that
rewrites the user text, with ``{{ content }}`` standing for the problem (``<image>`` placeholders
included). Shipped ones: ``r1_tags``, ``boxed_math``, ``grounding_json`` (``PROMPT_TEMPLATES``). A prompt
template replaces the named template's instruction and system prompt (only ``data.system_prompt`` then
adds a system message), so the two cannot ask for different answer formats.

The answer convention: ``answer_format(data_config)`` is the ONE place that says how responses state
their final answer (``r1``: ``<answer>…</answer>``; ``boxed``: the final ``\\boxed{}``; ``raw``: the whole
text after any thinking). It follows ``data.answer_format`` when set, else the prompt template (declared
for shipped ones, inferred from the text for others: ``<answer>`` -> r1, ``boxed`` -> boxed, else raw),
else ``data.template``. Rewards, consistency extraction and the verl adapter read it from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
#: answer conventions understood by ``mmrlvr.rewards.parsing.locate_answer``
ANSWER_FORMATS: tuple[str, ...] = ("r1", "boxed", "raw")


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


def count_placeholders(problem: str, placeholder: str = IMAGE_PLACEHOLDER) -> int:
    return problem.count(placeholder)


_PLACEHOLDER_RE = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")


def build_messages(problem: str, n_images: int, template: str = "r1", system: str | None = None, *,
                   n_videos: int = 0, prompt_template: "PromptTemplate | None" = None) -> list[dict[str, Any]]:
    """Chat messages for one problem.

    Each ``<image>`` / ``<video>`` in ``problem`` becomes an image / video part at that position; a problem
    without placeholders of a kind gets its ``n_images`` image parts (then ``n_videos`` video parts) first.
    A placeholder count that is neither 0 nor the number given is an error (``ValueError``; the loaders
    turn it into a ``DataError`` naming the row).
    system: overrides the template's system prompt; "" means no system message.
    prompt_template: a Jinja ``PromptTemplate`` applied to the problem text; it replaces ``template``'s
        instruction and system prompt (only ``system`` adds a system message then).

    >>> build_messages("<image>How many red shapes are there?", 1, "plain")
    [{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': 'How many red shapes are there?'}]}]
    """
    tpl = get_template(template) if prompt_template is None else Template()
    if prompt_template is not None:
        problem = prompt_template.render(problem)
    counts = {"image": (count_placeholders(problem, IMAGE_PLACEHOLDER), n_images),
              "video": (count_placeholders(problem, VIDEO_PLACEHOLDER), n_videos)}
    for kind, (n_placeholders, n_given) in counts.items():
        if n_placeholders and n_placeholders != n_given:
            raise ValueError(f"the problem has {n_placeholders} <{kind}> placeholder(s) "
                             f"but {n_given} {kind}(s) were given")
    content: list[dict[str, Any]] = []
    for kind, (n_placeholders, n_given) in counts.items():
        if n_placeholders == 0:
            content.extend({"type": kind} for _ in range(n_given))
    for piece in _PLACEHOLDER_RE.split(problem):
        if piece == IMAGE_PLACEHOLDER:
            content.append({"type": "image"})
        elif piece == VIDEO_PLACEHOLDER:
            content.append({"type": "video"})
        else:
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


# ----------------------------------------------------------------------------------------------------
# Jinja prompt templates (data.prompt_template) and the answer convention they imply


@dataclass(frozen=True)
class PromptTemplate:
    """A Jinja template of the user text; ``{{ content }}`` is the problem. ``answer_format``: r1 | boxed | raw."""

    name: str
    source: str
    answer_format: str

    def render(self, content: str) -> str:
        return _compile(self.source, self.name).render(content=content)


PROMPT_TEMPLATES: dict[str, PromptTemplate] = {
    "r1_tags": PromptTemplate("r1_tags", "{{ content | trim }} Think inside <think> </think> tags, then give the "
                              "final answer inside <answer> </answer> tags.", "r1"),
    "boxed_math": PromptTemplate("boxed_math", "{{ content | trim }} Think step by step inside <think> </think> tags, "
                                 "then put the final answer in \\boxed{}.", "boxed"),
    "grounding_json": PromptTemplate(
        "grounding_json", "{{ content | trim }} Think inside <think> </think> tags, then give the box as JSON "
        "inside <answer> </answer> tags, e.g. <answer>[{\"bbox_2d\": [x1, y1, x2, y2], \"label\": \"object\"}]"
        "</answer>.", "r1"),
}


def _compile(source: str, name: str) -> Any:
    import jinja2
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False)
    try:
        ast = env.parse(source)
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"data.prompt_template {name}: Jinja syntax error on line {exc.lineno}: {exc.message}") from None
    names = meta.find_undeclared_variables(ast)
    if "content" not in names:
        raise UserError(f"data.prompt_template {name}: the template never uses {{{{ content }}}} (the problem text), "
                        "so every prompt would lose its question")
    extra = sorted(names - {"content"})
    if extra:
        raise UserError(f"data.prompt_template {name}: unknown variable(s) {', '.join(extra)}; only "
                        "{{ content }} is provided")
    return env.from_string(source)


def infer_answer_format(text: str) -> str:
    """r1 when the text asks for ``<answer>`` tags, boxed when it asks for ``\\boxed{}``, else raw.

    >>> infer_answer_format("Answer in <answer></answer>."), infer_answer_format("Put it in \\boxed{}.")
    ('r1', 'boxed')
    """
    if "<answer>" in text:
        return "r1"
    if "boxed" in text:
        return "boxed"
    return "raw"


def load_prompt_template(spec: str) -> PromptTemplate:
    """A shipped template by name, a Jinja file (``.jinja``/``.j2``/``.txt``), or an inline Jinja string."""
    if spec in PROMPT_TEMPLATES:
        return PROMPT_TEMPLATES[spec]
    if "{{" in spec or "{%" in spec:
        tpl = PromptTemplate("(inline)", spec, infer_answer_format(spec))
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise UserError(f"data.prompt_template: {spec!r} is neither a shipped template "
                            f"({', '.join(PROMPT_TEMPLATES)}), a Jinja file, nor a Jinja string with {{{{ content }}}}")
        source = path.read_text(encoding="utf-8")
        tpl = PromptTemplate(str(path), source, infer_answer_format(source))
    _compile(tpl.source, tpl.name)  # errors now, not at the first row
    return tpl


_TEMPLATE_ANSWER_FORMAT = {"r1": "r1", "r1_user": "r1", "boxed": "boxed", "plain": "r1"}


def answer_format(data: Any) -> str:
    """The answer convention of a run's prompts: r1 | boxed | raw (see the module docstring).

    ``data``: a ``DataConfig`` (or anything with ``template`` and optionally ``prompt_template`` /
    ``answer_format`` attributes). Rewards default their ``template`` parameter to this value.
    """
    explicit = getattr(data, "answer_format", None)
    if explicit and explicit != "auto":
        if explicit not in ANSWER_FORMATS:
            raise UserError(f"data.answer_format: unknown {explicit!r}; known: auto, {', '.join(ANSWER_FORMATS)}")
        return explicit
    spec = getattr(data, "prompt_template", None)
    if spec:
        return load_prompt_template(spec).answer_format
    template = getattr(data, "template", "r1")
    return _TEMPLATE_ANSWER_FORMAT.get(template, "r1")
