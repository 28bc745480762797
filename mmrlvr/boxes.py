"""Boxes: their coordinate frames, overlap (IoU) and the region a ``zoom`` call crops — defined once.

Everything that compares or draws boxes reads them from here: the grounding reward, the rubric's box checks, the
``zoom`` tool and the ``zoom_iou`` reward, the inspector and the fake runs. Pure Python (no torch, no PIL), so
config checks and the inspector can import it cheaply.

A box is ``(x1, y1, x2, y2)``. Coordinate frames of boxes a model writes:

- ``"abs"`` (= ``"absolute"``): pixels of the image the model saw (Qwen2.5-VL);
- ``"norm1000"`` (= ``"normalized_1000"``): 0-1000 of that image's width and height (Qwen2-VL, Qwen3-VL);
- ``"norm1"`` (= ``"normalized_1"``): 0-1 fractions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Box = tuple[float, float, float, float]  # x1, y1, x2, y2
COORD_FORMATS = ("abs", "norm1000", "norm1")
#: every accepted name of a frame, to the frame
COORD_ALIASES = {"absolute": "abs", "normalized_1000": "norm1000", "normalized_1": "norm1",
                 "abs": "abs", "norm1000": "norm1000", "norm1": "norm1"}


def box_area(b: Sequence[float]) -> float:
    """Area of a box; 0 for a degenerate one (x2 <= x1 or y2 <= y1)."""
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union; a degenerate box (x2 <= x1 or y2 <= y1) has IoU 0 with everything.

    >>> iou((0, 0, 10, 10), (5, 0, 15, 10))  # overlap 5x10 = 50; union 100 + 100 - 50 = 150
    0.3333333333333333
    """
    inter = box_area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    union = box_area(a) + box_area(b) - inter
    return inter / union if union > 0 and inter > 0 else 0.0


def best_ious(pred: Sequence[Sequence[float]], gold: Sequence[Sequence[float]]) -> list[float | None]:
    """For each predicted box, its IoU with the best-matching gold box (None for every box without gold)."""
    return [max((iou(p, g) for g in gold), default=None) if gold else None for p in pred]


def to_frame(boxes: Sequence[Sequence[float]], fmt: str, seen: tuple[float, float] | None,
             target: tuple[float, float] | None) -> list[Box]:
    """Map boxes given in ``fmt`` (relative to the image the model ``seen``) into the ``target`` frame.

    >>> to_frame([(500, 0, 1000, 500)], "norm1000", (100, 100), (640, 480))
    [(320.0, 0.0, 640.0, 240.0)]
    >>> to_frame([(10, 10, 20, 20)], "abs", (100, 100), (200, 300))  # resized 100x100 -> original 200x300
    [(20.0, 30.0, 40.0, 60.0)]
    """
    fmt = COORD_ALIASES.get(fmt, fmt)
    if fmt not in COORD_FORMATS:
        raise ValueError(f"unknown coordinate format {fmt!r}; known: {', '.join(COORD_ALIASES)}")
    if fmt == "abs":
        if seen is None or target is None:
            return [(b[0], b[1], b[2], b[3]) for b in boxes]
        sx, sy = target[0] / seen[0], target[1] / seen[1]
    else:
        if target is None:
            raise ValueError(f"{fmt} coordinates need the image size (an image or meta['orig_size'])")
        scale = 1000.0 if fmt == "norm1000" else 1.0
        sx, sy = target[0] / scale, target[1] / scale
    return [(b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy) for b in boxes]


def zoom_box(arguments: Mapping[str, Any], size: tuple[int, int]) -> Box:
    """The pixel region a ``zoom`` call with these arguments crops from an image of ``size`` (w, h): its ``box``
    read in its ``coords`` frame (default absolute), clipped to the image, corners put in order.

    The ``zoom`` tool crops exactly this region, so rewards and the inspector score and draw what the model saw.
    Raises ValueError naming what is wrong when the box is not four numbers or covers no pixel.

    >>> zoom_box({"box": [500, 0, 1500, 250], "coords": "normalized_1000"}, (200, 100))
    (100.0, 0.0, 200.0, 25.0)
    """
    box, coords = arguments.get("box"), arguments.get("coords", "absolute")
    if (not isinstance(box, (list, tuple)) or len(box) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)):
        raise ValueError(f"box must be four numbers [x1, y1, x2, y2], got {box!r}")
    w, h = float(size[0]), float(size[1])
    ((x1, y1, x2, y2),) = to_frame([tuple(float(v) for v in box)], str(coords), (w, h), (w, h))
    x1, x2 = sorted((max(0.0, min(w, x1)), max(0.0, min(w, x2))))
    y1, y2 = sorted((max(0.0, min(h, y1)), max(0.0, min(h, y2))))
    if x2 - x1 < 1 or y2 - y1 < 1:
        raise ValueError(f"the box {box!r} ({coords}) covers no pixels of the {size[0]}x{size[1]} image")
    return (x1, y1, x2, y2)
