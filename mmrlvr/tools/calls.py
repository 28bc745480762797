"""Tool calls in a response, in the Qwen2.5-VL / Qwen3-VL format their chat templates define::

    <tool_call>
    {"name": "zoom", "arguments": {"image": 0, "box": [10, 20, 60, 70]}}
    </tool_call>

``parse_tool_calls(text)`` returns every call of a response, in order; a block that is not a JSON object with a
string ``name`` and an object ``arguments`` (``parameters`` is accepted, as some checkpoints write it) is a
``ToolCall`` with ``error`` set, which the runner turns into a message the model sees (``malformed_call``). An
opening tag without its closing one (a response cut by the token budget) is malformed too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass
class ToolCall:
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the block is not a call (malformed)
    raw: str = ""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>`` block of ``text`` as a call (or a malformed one, with the reason)."""
    calls: list[ToolCall] = []
    end = 0
    for m in _BLOCK.finditer(text):
        calls.append(_parse_block(m.group(1)))
        end = m.end()
    rest = text[end:]
    if OPEN in rest:  # an opening tag that never closes
        calls.append(ToolCall(error="the <tool_call> block is not closed with </tool_call>", raw=rest[rest.index(OPEN):]))
    return calls


def _parse_block(body: str) -> ToolCall:
    raw = body.strip()
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return ToolCall(error=f"the call is not valid JSON ({exc.msg} at character {exc.pos})", raw=raw)
    if not isinstance(obj, dict):
        return ToolCall(error="the call must be a JSON object with \"name\" and \"arguments\"", raw=raw)
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some checkpoints write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(name=str(name or ""), error="\"arguments\" is a string that is not JSON", raw=raw)
    if not isinstance(name, str) or not name:
        return ToolCall(error="the call has no \"name\" string", raw=raw)
    if not isinstance(args, dict):
        return ToolCall(name=name, error="\"arguments\" must be a JSON object", raw=raw)
    return ToolCall(name=name, arguments=args, raw=raw)


def ends_with_call(text: str) -> bool:
    """Whether the response stops at a complete tool call (the turn hands over to the tool)."""
    return text.rstrip().endswith(CLOSE)
