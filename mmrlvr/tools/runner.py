"""Run one tool call safely: whatever goes wrong becomes a message the model reads, counted by kind.

The kinds (``ToolResult.error``, ``ToolCounters``): ``malformed_call`` (the block is not a call), ``unknown_tool``
(not offered by this run), ``bad_arguments`` (the function does not take them), ``tool_error`` (it raised),
``timeout`` (it ran past ``time_budget_s``: the rollout moves on; a Python thread cannot be killed, so a tool that
never returns keeps its thread — tools should be quick), ``image_too_large`` (a returned image above
``max_image_pixels``), ``bad_image`` (a returned "image" that is not a PIL image, or one the model's image
processor refuses: an empty crop, a sliver whose sides differ more than the processor allows). The message names
the problem in one line and, for an unknown tool, the tools offered.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from collections import Counter
from typing import Any, Callable

from PIL import Image

from mmrlvr.metric import Metric
from mmrlvr.run_settings import TOOL_DEFAULTS
from mmrlvr.tools.base import ToolContext, ToolResult, takes_context
from mmrlvr.tools.calls import ToolCall

#: the largest image a tool may return (pixels), above it the call is an error message
#: every way a call can fail, as counted (``tools/<kind>``) and shown to the model (``Error (<kind>): ...``)
ERROR_KINDS = ("malformed_call", "unknown_tool", "bad_arguments", "tool_error", "timeout", "image_too_large",
               "bad_image")


class ToolCounters(Counter):
    """Calls and errors by kind, for the step's metrics (``tools/calls``, ``tools/<kind>``)."""

    def metrics(self) -> dict[str, float]:
        out = {f"tools/{k}": Metric.sum(float(v)) for k, v in self.items()}
        self.clear()
        return out


def run_call(call: ToolCall, tools: dict[str, Callable[..., Any]], context: ToolContext, *,
             time_budget_s: float = TOOL_DEFAULTS["time_budget_s"],
             max_image_pixels: int = TOOL_DEFAULTS["max_image_pixels"],
             counters: ToolCounters | None = None, check_image: Callable[[Any], Any] | None = None) -> ToolResult:
    """The tool's result for ``call``, or an error result the model reads (never raises).

    ``check_image``: raises for an image the model cannot take in (the rollout passes its image processor), so
    such an image is this call's ``bad_image`` error rather than an exception when the tool turn is encoded."""
    counters = counters if counters is not None else ToolCounters()
    counters["calls"] += 1
    result = _run(call, tools, context, time_budget_s, max_image_pixels, check_image)
    if result.error is not None:
        counters[result.error.split(":", 1)[0]] += 1
    return result


def error_text(result: ToolResult) -> str:
    """What the model reads in the tool turn for an error result."""
    kind, _, why = (result.error or "").partition(": ")
    why = " ".join(why.split())  # one line, whatever the exception's message held
    return f"Error ({kind}): {why}" if why else f"Error ({kind})"


def _run(call: ToolCall, tools: dict[str, Callable[..., Any]], context: ToolContext, budget: float,
         max_pixels: int, check_image: Callable[[Any], Any] | None) -> ToolResult:
    if call.error is not None:
        return ToolResult(error=f"malformed_call: {call.error}")
    fn = tools.get(call.name)
    if fn is None:
        offered = ", ".join(sorted(tools)) or "none"
        return ToolResult(error=f"unknown_tool: no tool named {call.name!r}; the tools are: {offered}")
    kwargs = {**context.tools_kwargs.get(call.name, {}), **call.arguments}
    if takes_context(fn):
        kwargs["context"] = context
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as exc:
        return ToolResult(error=f"bad_arguments: {call.name}: {exc}")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, **kwargs)
    try:
        out = future.result(timeout=budget)
    except concurrent.futures.TimeoutError:
        return ToolResult(error=f"timeout: {call.name} ran longer than its {budget:g} s budget")
    except Exception as exc:  # noqa: BLE001 - any failure of a tool is a message, never a crash
        return ToolResult(error=f"tool_error: {call.name} failed: {type(exc).__name__}: {exc}")
    finally:
        pool.shutdown(wait=False)
    result = _as_result(out)
    for im in result.images:
        if not isinstance(im, Image.Image):
            return ToolResult(error=f"bad_image: {call.name} returned {type(im).__name__}, not a PIL image")
        w, h = im.size
        if w * h > max_pixels:
            return ToolResult(error=f"image_too_large: {call.name} returned a {w}x{h} image, over the "
                                    f"{max_pixels} pixel limit")
        if check_image is not None:
            try:
                check_image(im)
            except Exception as exc:  # noqa: BLE001 - the processor's reason, as the model's message
                return ToolResult(error=f"bad_image: {call.name} returned a {w}x{h} image the model cannot read: "
                                        f"{type(exc).__name__}: {exc}")
    return result


def _as_result(out: Any) -> ToolResult:
    if isinstance(out, ToolResult):
        return out
    if isinstance(out, str):
        return ToolResult(text=out)
    if isinstance(out, Image.Image):
        return ToolResult(images=[out])
    if isinstance(out, (list, tuple)):
        texts = [o for o in out if isinstance(o, str)]
        images = [o for o in out if not isinstance(o, str)]
        return ToolResult(text="\n".join(texts), images=images)
    return ToolResult(text=str(out))
