"""Tools for multi-turn rollouts: schemas from type hints and docstrings, Qwen tool-call parsing, the built-in zoom and
rotate on real images, and every failure mode as a counted message (never an exception)."""

from __future__ import annotations

import time

import pytest
from PIL import Image

from mmrlvr.tools import (TOOLS, ToolCall, ToolContext, ToolCounters, ToolResult, error_text, parse_tool_calls,
                          register_tool, run_call, tool_schema)
from mmrlvr.tools.builtin import ZOOM_SIDE


def test_builtin_schemas_hide_the_context_and_describe_each_argument():
    zoom = tool_schema(TOOLS.get("zoom"))["function"]
    assert zoom["name"] == "zoom" and zoom["parameters"]["required"] == ["image", "box"]
    assert set(zoom["parameters"]["properties"]) == {"image", "box", "coords"}
    assert "context" not in str(zoom)
    assert zoom["parameters"]["properties"]["box"]["type"] == "array"
    assert set(tool_schema(TOOLS.get("rotate"))["function"]["parameters"]["properties"]) == {"image", "degrees"}


@pytest.mark.parametrize("text, expect", [
    ('<tool_call>\n{"name": "zoom", "arguments": {"image": 0, "box": [1, 2, 3, 4]}}\n</tool_call>',
     [("zoom", {"image": 0, "box": [1, 2, 3, 4]}, None)]),
    ('think <tool_call>{"name": "rotate", "parameters": {"image": 0, "degrees": 90}}</tool_call>',
     [("rotate", {"image": 0, "degrees": 90}, None)]),
    ('<tool_call>{"name": "zoom", "arguments": "{\\"image\\": 1}"}</tool_call>', [("zoom", {"image": 1}, None)]),
    ('<tool_call>{"name": "zoom", "arguments": {}}</tool_call><tool_call>{"name": "rotate"}</tool_call>',
     [("zoom", {}, None), ("rotate", {}, None)]),
    ("<tool_call>{name: zoom}</tool_call>", [("", {}, "not valid JSON")]),
    ('<tool_call>["zoom"]</tool_call>', [("", {}, "must be a JSON object")]),
    ('<tool_call>{"arguments": {}}</tool_call>', [("", {}, "no \"name\"")]),
    ('<tool_call>{"name": "zoom", "arguments": [1]}</tool_call>', [("zoom", {}, "must be a JSON object")]),
    ('<tool_call>{"name": "zoom", "arguments": {"image": 0', [("", {}, "not closed")]),
    ("no call at all", []),
])
def test_parse_tool_calls(text, expect):
    calls = parse_tool_calls(text)
    assert len(calls) == len(expect)
    for call, (name, args, error) in zip(calls, expect):
        assert call.name == name and call.arguments == args
        assert (call.error is None) if error is None else (error in call.error)


def _scene() -> Image.Image:
    """A 112x112 white image with a 10x10 red square at (80, 20)."""
    im = Image.new("RGB", (112, 112), "white")
    for x in range(80, 90):
        for y in range(20, 30):
            im.putpixel((x, y), (255, 0, 0))
    return im


def _red_share(im: Image.Image) -> float:
    import numpy as np

    a = np.asarray(im.convert("RGB")).reshape(-1, 3)
    return float(((a[:, 0] > 200) & (a[:, 1] < 60) & (a[:, 2] < 60)).mean())


def test_zoom_crops_the_region_in_every_coordinate_frame_and_enlarges_it():
    ctx = ToolContext(images=[_scene()])
    tools = {n: TOOLS.get(n) for n in TOOLS.names()}
    for args in ({"image": 0, "box": [78, 18, 92, 32]},
                 {"image": 0, "box": [696, 161, 821, 286], "coords": "normalized_1000"},
                 {"image": 0, "box": [0.696, 0.161, 0.821, 0.286], "coords": "normalized_1"}):
        res = run_call(ToolCall("zoom", args), tools, ctx)
        assert res.ok, res.error
        (out,) = res.images
        assert max(out.size) == ZOOM_SIDE and _red_share(out) > 0.4  # the square fills the enlarged crop
    assert _red_share(_scene()) < 0.01
    # a later image (returned by an earlier call) is addressable too
    ctx.images.append(Image.new("RGB", (50, 20), "blue"))
    res = run_call(ToolCall("rotate", {"image": 1, "degrees": 90}), tools, ctx)
    assert res.ok and res.images[0].size == (20, 50)


def test_a_rows_tool_kwargs_fill_arguments_the_call_leaves_out():
    ctx = ToolContext(images=[_scene()], tools_kwargs={"zoom": {"coords": "normalized_1"}})
    tools = {n: TOOLS.get(n) for n in TOOLS.names()}
    res = run_call(ToolCall("zoom", {"image": 0, "box": [0.696, 0.161, 0.821, 0.286]}), tools, ctx)
    assert res.ok and _red_share(res.images[0]) > 0.4


def test_every_failure_is_a_counted_message():
    def slow(x: int) -> str:
        """Sleep.

        Args:
            x: unused
        """
        time.sleep(2)
        return "late"

    def boom(x: int) -> str:
        """Raise.

        Args:
            x: unused
        """
        raise RuntimeError("disk on fire")

    def huge(x: int) -> Image.Image:
        """A big image.

        Args:
            x: unused
        """
        return Image.new("RGB", (2000, 2000))

    tools = {"zoom": TOOLS.get("zoom"), "slow": slow, "boom": boom, "huge": huge}
    ctx = ToolContext(images=[_scene()])
    counters = ToolCounters()
    cases = [
        (parse_tool_calls("<tool_call>{oops}</tool_call>")[0], "malformed_call"),
        (ToolCall("crop", {}), "unknown_tool"),
        (ToolCall("zoom", {"image": 0}), "bad_arguments"),  # box missing
        (ToolCall("zoom", {"image": 0, "box": [1, 2, 3, 4], "colour": "red"}), "bad_arguments"),
        (ToolCall("zoom", {"image": 5, "box": [1, 2, 3, 4]}), "tool_error"),  # no such image
        (ToolCall("zoom", {"image": 0, "box": [1, 2]}), "tool_error"),
        (ToolCall("zoom", {"image": 0, "box": [5, 5, 5, 5]}), "tool_error"),  # an empty region
        (ToolCall("boom", {"x": 1}), "tool_error"),
        (ToolCall("slow", {"x": 1}), "timeout"),
        (ToolCall("huge", {"x": 1}), "image_too_large"),
    ]
    t0 = time.monotonic()
    for call, kind in cases:
        res = run_call(call, tools, ctx, time_budget_s=0.3, counters=counters)
        assert isinstance(res, ToolResult) and not res.ok and res.error.startswith(kind), (kind, res.error)
        msg = error_text(res)
        assert msg.startswith(f"Error ({kind})") and "\n" not in msg
    assert time.monotonic() - t0 < 1.9  # the slow tool did not hold the rollout for its 2 s
    assert "the tools are: boom, huge, slow, zoom" in run_call(ToolCall("crop", {}), tools, ctx).error
    m = counters.metrics()
    assert m["tools/calls"] == len(cases)
    assert m["tools/bad_arguments"] == 2 and m["tools/tool_error"] == 4 and m["tools/timeout"] == 1
    assert m["tools/malformed_call"] == 1 and m["tools/unknown_tool"] == 1 and m["tools/image_too_large"] == 1
    assert counters.metrics() == {}  # read once per step


def test_a_tool_without_a_docstring_is_refused_where_it_is_registered():
    def bare(x):
        return x

    with pytest.raises(Exception, match="bare|docstring|type hint"):
        register_tool("bare_tool")(bare)
    assert "bare_tool" not in TOOLS.names()
