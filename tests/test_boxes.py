"""mmrlvr.boxes: one definition of IoU, frames and the zoom region, read the same by the tool that crops, the reward
that scores the crop and the inspector that draws it."""

from __future__ import annotations

import doctest

import pytest
from PIL import Image

import mmrlvr.boxes as boxes
from mmrlvr.inspector import views
from mmrlvr.rewards.tool_use import ZoomIoUReward
from mmrlvr.tools.base import ToolContext
from mmrlvr.tools.builtin import zoom
from mmrlvr.types import Completion, Sample


def test_doctests():
    assert doctest.testmod(boxes).failed == 0


@pytest.mark.parametrize("a, b, want", [
    ((0, 0, 10, 10), (5, 0, 15, 10), 50 / 150),  # half overlap on x
    ((0, 0, 10, 10), (0, 0, 10, 10), 1.0),
    ((0, 0, 10, 10), (2, 2, 4, 4), 4 / 100),  # nested
    ((0, 0, 10, 10), (10, 0, 20, 10), 0.0),  # touching edges
    ((0, 0, 10, 10), (20, 20, 30, 30), 0.0),
    ((0, 0, 0, 0), (0, 0, 0, 0), 0.0),  # degenerate: no area
    ((10, 10, 0, 0), (0, 0, 10, 10), 0.0),  # corners swapped: degenerate as written
])
def test_iou_by_hand(a, b, want):
    assert boxes.iou(a, b) == pytest.approx(want)
    assert boxes.iou(b, a) == pytest.approx(want)


@pytest.mark.parametrize("args, size, want", [
    ({"box": [10, 20, 30, 40]}, (100, 100), (10, 20, 30, 40)),
    ({"box": [30, 40, 10, 20]}, (100, 100), (10, 20, 30, 40)),  # corners in any order
    ({"box": [-50, 90, 50, 300]}, (100, 100), (0, 90, 50, 100)),  # clipped to the image
    ({"box": [0.5, 0, 1, 0.5], "coords": "normalized_1"}, (200, 100), (100, 0, 200, 50)),
    ({"box": [0, 0, 500, 1000], "coords": "norm1000"}, (64, 32), (0, 0, 32, 32)),
])
def test_zoom_box_reads_frames_orders_and_clips(args, size, want):
    assert boxes.zoom_box(args, size) == pytest.approx(want)


@pytest.mark.parametrize("args, match", [
    ({"box": [1, 2, 3]}, "four numbers"), ({"box": "0 0 5 5"}, "four numbers"), ({}, "four numbers"),
    ({"box": [True, 0, 5, 5]}, "four numbers"), ({"box": [200, 0, 300, 50]}, "covers no pixels"),
    ({"box": [0, 0, 5, 5], "coords": "percent"}, "unknown coordinate format"),
])
def test_zoom_box_says_what_is_wrong(args, match):
    with pytest.raises(ValueError, match=match):
        boxes.zoom_box(args, (100, 100))


def test_the_tool_the_reward_and_the_inspector_agree_on_an_out_of_frame_reversed_zoom():
    """A zoom written with swapped corners reaching past the image: the tool crops the clipped region, the reward
    scores that region against the gold one and the inspector draws it."""
    image = Image.new("RGB", (100, 80))
    args = {"image": 0, "box": [150, 60, 50, -20]}  # really [50, 0, 100, 60] once clipped and ordered
    result = zoom(**args, context=ToolContext(images=[image]))
    assert result.text.startswith("zoomed into [50, 0, 100, 60]")
    call = {"name": "zoom", "arguments": args, "error": None}
    completion = Completion(text="", meta={"turns": [{"kind": "tool", "calls": [call]}]})
    sample = Sample(id="z", messages=[], images=[image], answer=None, meta={"region": [50, 0, 100, 60]})
    assert ZoomIoUReward()(completion, sample).score == pytest.approx(1.0)
    src, drawn = views._zoom_source([image], args)
    assert src is image and drawn == [50, 0, 100, 60]
