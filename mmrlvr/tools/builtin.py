"""Built-in tools: looking again at an image — ``zoom`` (a region, enlarged) and ``rotate``.

Boxes use the coordinate frames the grounding reward reads (``mmrlvr.rewards.grounding.to_frame``): ``absolute``
pixels of the image as the model saw it (Qwen2.5-VL), ``normalized_1000`` (Qwen2-VL / Qwen3-VL) or ``normalized_1``.
"""

from __future__ import annotations

from typing import Any

from mmrlvr.tools.base import ToolContext, ToolResult, register_tool

#: the longest side of a zoomed crop (the crop is enlarged to it, keeping its aspect ratio)
ZOOM_SIDE = 224


def _image(context: ToolContext, image: int) -> Any:
    if not context.images:
        raise ValueError("the conversation has no image")
    if not -len(context.images) <= int(image) < len(context.images):
        raise ValueError(f"image {image} does not exist: the conversation has {len(context.images)} image(s), "
                         f"0 to {len(context.images) - 1}")
    return context.images[int(image)]


# The model reads each tool's schema, built from its docstring, in every prompt: the docstrings stay short. zoom
# enlarges the crop to ZOOM_SIDE on its longer side; rotate grows the canvas so the whole image stays in view.
@register_tool()
def zoom(image: int, box: list[float], coords: str = "absolute", context: ToolContext | None = None) -> ToolResult:
    """Zoom into a region of an image.

    Args:
        image: image index (0 is the first; returned images count too)
        box: [x1, y1, x2, y2]
        coords: absolute (pixels), normalized_1000 or normalized_1
    """
    from mmrlvr.boxes import zoom_box

    src = _image(context or ToolContext(), image)
    x1, y1, x2, y2 = zoom_box({"box": box, "coords": coords}, src.size)
    crop = src.crop((int(x1), int(y1), int(round(x2)), int(round(y2))))
    scale = ZOOM_SIDE / max(crop.size)
    out = crop.resize((max(1, round(crop.size[0] * scale)), max(1, round(crop.size[1] * scale))))
    return ToolResult(text=f"zoomed into [{int(x1)}, {int(y1)}, {int(round(x2))}, {int(round(y2))}] of image {image}",
                      images=[out])


@register_tool()
def rotate(image: int, degrees: float, context: ToolContext | None = None) -> ToolResult:
    """Rotate an image counter-clockwise.

    Args:
        image: image index (0 is the first; returned images count too)
        degrees: the angle, counter-clockwise
    """
    src = _image(context or ToolContext(), image)
    return ToolResult(text=f"image {image} rotated by {float(degrees):g} degrees",
                      images=[src.rotate(float(degrees), expand=True)])
