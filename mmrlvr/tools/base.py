"""Tools a multi-turn rollout offers the model: plain Python functions, registered by name.

A tool is a function with type hints and a Google-style docstring (an ``Args:`` section) — the convention
transformers' chat templates use for ``tools=`` — so its JSON schema comes from ``transformers.utils.
get_json_schema`` and the model sees exactly what the chat template renders. It receives the call's arguments as
keywords, plus ``context`` (a ``ToolContext``: the conversation's images and the row's own tool arguments) when its
signature takes one, and returns text, an image, or a ``ToolResult`` with both.

Calls run through ``run_call`` (``mmrlvr.tools.runner``): an unknown tool, bad arguments, a tool that raises or
overruns its time budget, or an oversized or unreadable image becomes an error message the model reads in the tool turn,
counted by kind — never an exception out of the rollout.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from mmrlvr.registry import Registry

#: name -> tool function (config: the names a run offers)
TOOLS: Registry[Callable[..., Any]] = Registry("tool")


@dataclass
class ToolContext:
    """What a tool may read besides its arguments: the images of the conversation so far, in order (the prompt's,
    then every image a tool returned), and the row's own tool arguments (``tools_kwargs``: per tool name, keyword
    defaults the row fixes, verl's ``extra_info.tools_kwargs`` layout)."""

    images: list[Any] = field(default_factory=list)
    tools_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    sample_id: str = ""


@dataclass
class ToolResult:
    """A tool's answer: text and images for the tool turn, or the error the model reads instead (``error`` names
    the kind: unknown_tool, bad_arguments, tool_error, timeout, image_too_large, bad_image, malformed_call)."""

    text: str = ""
    images: list[Any] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def register_tool(name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``@register_tool()`` registers a function under its own name (or ``name``); its schema is
    built at once, so a tool without type hints or docstring fails where it is defined, naming it."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        tool_schema(fn)  # raises with the reason when transformers cannot describe it
        TOOLS.add(name or fn.__name__, fn)
        return fn

    return deco


def takes_context(fn: Callable[..., Any]) -> bool:
    return "context" in inspect.signature(fn).parameters


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The function's JSON schema for the chat template's ``tools=`` (``context`` is not shown to the model)."""
    from transformers.utils import get_json_schema

    if not takes_context(fn):
        return get_json_schema(fn)

    def visible(*args: Any, **kwargs: Any) -> Any:  # the same signature without ``context``
        return fn(*args, **kwargs)

    sig = inspect.signature(fn)
    visible.__signature__ = sig.replace(parameters=[p for n, p in sig.parameters.items() if n != "context"])
    visible.__doc__, visible.__name__ = fn.__doc__, fn.__name__
    visible.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != "context"}
    doc = fn.__doc__ or ""
    # drop the context line from the Args section so the schema's parameters match
    visible.__doc__ = "\n".join(ln for ln in doc.splitlines() if not ln.strip().startswith("context:"))
    return get_json_schema(visible)
