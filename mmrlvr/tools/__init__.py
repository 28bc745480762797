"""Tools for multi-turn rollouts: registry and schemas (``base``), call parsing (``calls``), safe execution
(``runner``) and the built-in ``zoom`` / ``rotate`` (``builtin``)."""

from mmrlvr.tools.base import TOOLS, ToolContext, ToolResult, register_tool, tool_schema
from mmrlvr.tools.calls import ToolCall, parse_tool_calls
from mmrlvr.tools.runner import ToolCounters, error_text, run_call

import mmrlvr.tools.builtin  # noqa: E402,F401 - registers zoom and rotate

__all__ = ["TOOLS", "ToolContext", "ToolResult", "register_tool", "tool_schema", "ToolCall", "parse_tool_calls",
           "ToolCounters", "error_text", "run_call"]
