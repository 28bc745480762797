"""Per-turn rewards of multi-turn trajectories (``rollout.tools``): a call that ran, and a zoom that looked where the
answer is.

Both read the trajectory's turns (``Completion.meta["turns"]``, ``mmrlvr.rollout.multiturn``) and score 0 for a
one-turn response, so they add to an outcome reward (``accuracy``) as shaping terms, the way DeepEyes rewards tool
use on top of the answer (arXiv 2505.14362: a tool bonus only on correct answers; here the plain terms, which a
``gated_process`` reward can gate on the answer).

- ``tool_call``: the share of the trajectory's calls that ran (a malformed call, unknown tool, bad arguments, a tool
  error or timeout, an oversized image all count as failed); 0 without calls.
- ``zoom_iou``: the best IoU between a ``zoom`` box on the prompt's image (converted from the call's coordinate frame
  to pixels) and the sample's gold region ``meta["region"]`` ([x1, y1, x2, y2] pixels of image 0; ``synth:zoom``
  rows carry it); 0 without such a zoom or region. ``parsed["zoom_hit"]`` is whether it reached ``hit_iou`` (0.5),
  which the step metrics average into the share of zooms on the right region.
"""

from __future__ import annotations

from typing import Any

from mmrlvr.rewards.base import REWARDS
from mmrlvr.types import Completion, RewardResult, Sample


def trajectory_calls(completion: Completion | str) -> list[dict[str, Any]]:
    """Every tool call of a multi-turn completion, in order ([] for a plain response)."""
    if isinstance(completion, str):
        return []
    return [c for t in (completion.meta or {}).get("turns") or [] if t.get("kind") == "tool" for c in t["calls"]]


@REWARDS.register("tool_call")
class ToolCallReward:
    """The share of the trajectory's tool calls that ran without error (0 without calls).

    >>> ok = {"name": "zoom", "arguments": {}, "error": None}
    >>> bad = {"name": "crop", "arguments": {}, "error": "unknown_tool: ..."}
    >>> turns = [{"kind": "model"}, {"kind": "tool", "calls": [ok, bad]}, {"kind": "model"}]
    >>> ToolCallReward()(Completion(text="", meta={"turns": turns}), None).score
    0.5
    """

    def __call__(self, completion: Completion | str, sample: Sample | None) -> RewardResult:
        calls = trajectory_calls(completion)
        ran = sum(1 for c in calls if not c.get("error"))
        return RewardResult(ran / len(calls) if calls else 0.0, {},
                            {"calls": len(calls), "failed": len(calls) - ran})


@REWARDS.register("zoom_iou")
class ZoomIoUReward:
    """Best IoU of a ``zoom`` box on image 0 with the gold region ``sample.meta["region"]``.

    hit_iou: the IoU from which a zoom counts as on the right region (``parsed["zoom_hit"]``).

    >>> call = {"name": "zoom", "arguments": {"image": 0, "box": [0, 0, 50, 100]}, "error": None}
    >>> c = Completion(text="", meta={"turns": [{"kind": "tool", "calls": [call]}]})
    >>> from PIL import Image
    >>> s = Sample(id="z", messages=[], images=[Image.new("RGB", (100, 100))], answer=None,
    ...            meta={"region": [0, 0, 100, 100]})
    >>> r = ZoomIoUReward()(c, s)
    >>> r.score, r.parsed["zoom_hit"]
    (0.5, True)
    """

    def __init__(self, hit_iou: float = 0.5) -> None:
        if not 0.0 < float(hit_iou) <= 1.0:
            raise ValueError(f"zoom_iou: hit_iou must be in (0, 1], got {hit_iou!r}")
        self.hit_iou = float(hit_iou)

    def __call__(self, completion: Completion | str, sample: Sample | None) -> RewardResult:
        from mmrlvr.boxes import iou, zoom_box

        region = (sample.meta or {}).get("region") if sample is not None else None
        zooms = [c for c in trajectory_calls(completion) if c.get("name") == "zoom" and not c.get("error")
                 and int((c.get("arguments") or {}).get("image", 0)) == 0]
        if not region or not zooms or not sample.images:
            return RewardResult(0.0, {}, {"zooms": len(zooms), "zoom_hit": False if zooms else None})
        size = sample.images[0].size
        best = 0.0
        for c in zooms:
            try:
                box = zoom_box(c["arguments"], size)  # the region the tool cropped
            except (TypeError, ValueError):
                continue
            best = max(best, iou(box, tuple(float(v) for v in region)))
        return RewardResult(best, {}, {"zooms": len(zooms), "zoom_hit": best >= self.hit_iou})
