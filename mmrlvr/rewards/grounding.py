"""``grounding``: IoU between predicted and ground-truth boxes (RefCOCO-style referring expressions).

Boxes are read from the final answer (template "r1": the ``<answer>`` block; "raw": the text after the
thinking) in any of these forms:
- JSON / Python literals: ``[x1, y1, x2, y2]``, ``[[…], […]]``, ``{"bbox_2d": […], "label": "cat"}`` (also
  ``bbox``, ``box`` keys, Visual-RFT's ``{'Position': […], 'Confidence': 0.9}``, Gemini's ``box_2d`` — read
  as [y1, x1, y2, x2], its order —, corner keys ``x1/y1/x2/y2``, ``xmin/ymin/xmax/ymax``, ``left/top/right/bottom``,
  or a corner and a size, ``x/y/w/h``, ``x/y/width/height``), lists of those, inside ```json fences or not;
- Qwen text: ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>`` — also bare ``(x1,y1),(x2,y2)``, since decoding
  with special tokens skipped drops the markers;
- location tokens, each on its model's own grid, so they set their frame whatever ``coords`` says
  (``location_boxes``): PaliGemma's ``<loc0256><loc0128><loc0768><loc0512>`` (y1 x1 y2 x2, n / 1024),
  Florence-2's ``<loc_128><loc_256><loc_512><loc_768>`` (x1 y1 x2 y2, bin centres (n + 0.5) / 1000) and
  Kosmos-2's ``<patch_index_0044><patch_index_0300>`` (the upper-left and lower-right cells of a 32 × 32 grid),
  MiniGPT-v2's ``{<10><20><50><60>}`` (x1 y1 x2 y2 on 0-100);
- four numbers between box tags (``<box>10 20 30 40</box>``, ``<bbox>10, 20, 30, 40</bbox>``) and corner keys in
  prose (``x1=10, y1=20, x2=30, y2=40``, ``xmin: 10, ...``).

Coordinate frames (``coords``, or ``coord_format``, of the predictions; ``target_format`` of the ground truth):
- "absolute" (= "abs"): pixels of the image the model saw — Qwen2.5-VL;
- "normalized_1000" (= "norm1000"): 0–1000 of that image's width/height — Qwen2-VL and Qwen3-VL;
- "normalized_1" (= "norm1"): 0–1 fractions.

A response whose answer holds something box-like that is not a box (three numbers, one corner, NaN)
scores 0 with ``problems: ["box_unparsed"]`` and ``parsed["box_error"]`` saying what was wrong; with no
box-like text at all, ``"no_box"``. Both are counted (``metrics()``): never silently "no box".

Sample metadata keys (all optional):
- ``meta["resized_size"] = [w, h]``: size of the image the model saw (default: ``sample.images[0].size``);
- ``meta["orig_size"] = [w, h]``: size of the image the ground-truth boxes are measured in, usually the
  original before resizing (default: ``resized_size``). Ground-truth "abs" boxes are pixels of this frame.
Predictions are mapped into the ground-truth frame (abs: scaled by orig/resized; norm: scaled by orig)
and clipped to it; IoU is computed there.

Several boxes: predicted and ground-truth boxes are matched one-to-one (``matching="hungarian"`` maximises
total IoU; "greedy" takes the best remaining pair first) and the score is Σ matched IoU / max(#pred,
#target), so extra boxes and missed boxes both cost. ``threshold`` turns each match into 1 if IoU ≥
threshold (score = hits / max(#pred, #target)). Component ``iou`` is always the mean matched IoU.

Guard: a predicted box covering more than ``max_area_fraction`` of the image (default 0.8) scores 0 unless a
target box is that large too — a full-image box would otherwise collect IoU = target area / image area for
free on every sample.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, Sequence

from mmrlvr.errors import DataError
from mmrlvr.rewards.base import REWARDS
from mmrlvr.boxes import COORD_ALIASES, Box, box_area, iou, to_frame
from mmrlvr.metric import Metric
from mmrlvr.rewards.common import AnswerReward, require_answer
from mmrlvr.rewards.parsing import fold_unicode
from mmrlvr.types import RewardResult, Sample

MATCHINGS = ("hungarian", "greedy")
_BOX_KEYS = ("bbox_2d", "bbox", "box_2d", "box", "Position", "position", "bounding_box", "xyxy")
#: keys whose four numbers are (y1, x1, y2, x2): Gemini's ``box_2d`` ([ymin, xmin, ymax, xmax]; its 0-1000 frame is
#: ``coords: normalized_1000``)
_YX_KEYS = ("box_2d",)
#: corner keys (x1, y1, x2, y2 in that order) and corner-plus-size keys (x, y, width, height), as objects name them
_CORNER_KEYS = (("x1", "y1", "x2", "y2"), ("xmin", "ymin", "xmax", "ymax"), ("x_min", "y_min", "x_max", "y_max"),
                ("left", "top", "right", "bottom"))
_SIZE_KEYS = (("x", "y", "w", "h"), ("x", "y", "width", "height"), ("left", "top", "width", "height"))
_MAX_LITERAL_CHARS = 20_000
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_QWEN_BOX_RE = re.compile(rf"\(\s*({_NUM})\s*,\s*({_NUM})\s*\)\s*,?\s*\(\s*({_NUM})\s*,\s*({_NUM})\s*\)")
_FENCE_RE = re.compile(r"```(?:json|python)?\s*(.*?)```", re.DOTALL)
#: four numbers with only spaces between them in brackets (``[10 20 30 40]``)
_SPACED_BOX_RE = re.compile(rf"\[\s*({_NUM})\s+({_NUM})\s+({_NUM})\s+({_NUM})\s*\]")
#: four numbers between box tags, separated by spaces or commas: MiniCPM-V's ``<box>x1 y1 x2 y2</box>``, also
#: ``<bbox>10, 20, 30, 40</bbox>``
_TAGGED_BOX_RE = re.compile(rf"<(b?box)>\s*({_NUM})(?:\s*,\s*|\s+)({_NUM})(?:\s*,\s*|\s+)({_NUM})(?:\s*,\s*|\s+)"
                            rf"({_NUM})\s*</\1>", re.IGNORECASE)
#: corner keys written as text, not as an object: ``x1=10, y1=20, x2=30, y2=40``, ``xmin: 10, ymin: 20, ...``
#: (the object corner keys above, but left/top/right/bottom: in prose those are words, not keys)
_TEXT_CORNER_RES = [tuple(re.compile(rf"(?<![\w.]){k}\s*[:=]\s*({_NUM})", re.IGNORECASE) for k in keys)
                    for keys in _CORNER_KEYS if keys[0] != "left"]
#: zeros that pad a number (CogVLM writes ``[[086,540,400,760]]`` on its 000-999 grid): not valid JSON or Python
_PADDING_ZEROS_RE = re.compile(r"(?<![\w.])0+(?=\d)")


def _tidy(text: str) -> str:
    """One spelling of a box for the parsers: fullwidth forms as ASCII, zero padding dropped, spaced lists
    comma-separated."""
    text = _PADDING_ZEROS_RE.sub("", fold_unicode(text))
    text = _TAGGED_BOX_RE.sub(lambda m: "[" + ", ".join(m.groups()[1:]) + "]", text)
    return _SPACED_BOX_RE.sub(lambda m: "[" + ", ".join(m.groups()) + "]", text)


def _text_corner_boxes(text: str) -> list[Box]:
    """Boxes written as corner keys in prose (``x1=10, y1=20, x2=30, y2=40``): the i-th value of each key makes
    the i-th box; none unless every key appears equally often."""
    for pattern in _TEXT_CORNER_RES:
        values = [[float(m.group(1)) for m in p.finditer(text)] for p in pattern]
        if values[0] and all(len(v) == len(values[0]) for v in values):
            return [tuple(b) for b in zip(*values)]  # type: ignore[misc]
    return []


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _coordinate(x: Any) -> float | None:
    """A coordinate: a number, or a string holding one (``["10", "20", "30", "40"]``: a model that quotes them)."""
    if _is_number(x):
        return float(x)
    if isinstance(x, str) and re.fullmatch(rf"\s*{_NUM}\s*", x):
        return float(x)
    return None


def _collect(obj: Any, out: list[Box], depth: int = 0) -> None:
    if depth > 6:
        return
    if isinstance(obj, dict):
        for key in _BOX_KEYS:
            if key in obj:
                value = obj[key]
                if key in _YX_KEYS and isinstance(value, (list, tuple)) and len(value) == 4:
                    value = [value[1], value[0], value[3], value[2]]
                _collect(value, out, depth + 1)
                return
        for keys in _CORNER_KEYS:
            if all(k in obj for k in keys):
                _collect([obj[k] for k in keys], out, depth + 1)
                return
        for x, y, w, h in _SIZE_KEYS:
            if all(k in obj for k in (x, y, w, h)) and all(_is_number(obj[k]) for k in (x, y, w, h)):
                _collect([obj[x], obj[y], obj[x] + obj[w], obj[y] + obj[h]], out, depth + 1)
                return
        return
    if isinstance(obj, (list, tuple)):
        if len(obj) == 4:
            coords = [_coordinate(v) for v in obj]
            if None not in coords:
                out.append(tuple(coords))  # type: ignore[arg-type]
                return
        if len(obj) == 2 and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in obj):
            coords = [_coordinate(v) for p in obj for v in p]  # two (x, y) corners
            if None not in coords:
                out.append(tuple(coords))  # type: ignore[arg-type]
                return
        for item in obj:
            _collect(item, out, depth + 1)


def _literal(text: str) -> Any:
    """JSON, then a Python literal (never eval); None if neither parses."""
    if len(text) > _MAX_LITERAL_CHARS:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except Exception:  # noqa: BLE001 - SyntaxError, RecursionError, MemoryError on hostile nesting: not a literal
        return None


def _top_level_brackets(text: str) -> list[str]:
    """Balanced ``[...]`` / ``{...}`` substrings that are not inside another one."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "[{":
            if depth == 0:
                start = i
            depth += 1
        elif c in "]}" and depth:
            depth -= 1
            if depth == 0:
                out.append(text[start : i + 1])
    return out


#: PaliGemma: four ``<locNNNN>`` (0-1023) as y1, x1, y2, x2; a coordinate is n / 1024 of the image's height or width
#: (Beyer et al. 2024, "PaliGemma: A versatile 3B VLM for transfer", and big_vision's decoding)
_PALIGEMMA_RE = re.compile(r"<loc(\d{4})>\s*<loc(\d{4})>\s*<loc(\d{4})>\s*<loc(\d{4})>")
PALIGEMMA_GRID = 1024
#: Florence-2: four ``<loc_N>`` (0-999) as x1, y1, x2, y2, each the index of one of 1,000 equal bins; its processor
#: reads a bin as its centre, (n + 0.5) / 1000 (transformers' ``Florence2PostProcessor`` quantizer)
_FLORENCE_RE = re.compile(r"<loc_(\d{1,3})>\s*<loc_(\d{1,3})>\s*<loc_(\d{1,3})>\s*<loc_(\d{1,3})>")
FLORENCE_BINS = 1000
#: Kosmos-2: a pair of ``<patch_index_NNNN>`` (0-1023), the upper-left and lower-right cells of a 32 x 32 grid
#: (Peng et al. 2023, "Kosmos-2: Grounding Multimodal Large Language Models to the World"; transformers'
#: ``patch_index_to_coordinate``)
_KOSMOS_RE = re.compile(r"<patch_index_(\d{4})>\s*<patch_index_(\d{4})>")
KOSMOS_CELLS = 32
#: MiniGPT-v2: ``{<x1><y1><x2><y2>}``, integers on 0-100 (Chen et al. 2023, "MiniGPT-v2: large language model as a
#: unified interface for vision-language multi-task learning")
_MINIGPT_RE = re.compile(r"\{\s*<(\d{1,3})>\s*<(\d{1,3})>\s*<(\d{1,3})>\s*<(\d{1,3})>\s*\}")
MINIGPT_GRID = 100
_LOCATION_TOKEN_RE = re.compile(r"<loc_?\d|<patch_index_\d|\{\s*<\d")


def _kosmos_box(upper_left: int, lower_right: int, n: int = KOSMOS_CELLS) -> Box:
    """The normalised box of two Kosmos-2 cells, as its processor decodes them: from cell edge to cell edge when
    the cells share a row or a column (or are one cell), else from cell centre to cell centre."""
    cell = 1.0 / n
    ux, uy, lx, ly = upper_left % n, upper_left // n, lower_right % n, lower_right // n
    if ux == lx or uy == ly:
        return ux * cell, uy * cell, (lx + 1) * cell, (ly + 1) * cell
    return (ux + 0.5) * cell, (uy + 0.5) * cell, (lx + 0.5) * cell, (ly + 0.5) * cell


def location_boxes(text: str) -> list[Box]:
    """The boxes ``text`` states in location tokens (PaliGemma, Florence-2, Kosmos-2, MiniGPT-v2), as 0-1 fractions
    of the image's width and height, in order; [] when it holds none (tokens off their grid are skipped:
    ``why_no_box`` names them).

    >>> location_boxes("<loc0256><loc0128><loc0768><loc0512> cat")  # y1 x1 y2 x2 on PaliGemma's 1024 grid
    [(0.125, 0.25, 0.5, 0.75)]
    >>> location_boxes("<loc_99><loc_199><loc_499><loc_799>")  # Florence-2 bin centres
    [(0.0995, 0.1995, 0.4995, 0.7995)]
    >>> location_boxes("<object><patch_index_0000><patch_index_1023></object>")  # Kosmos-2 cells, centre to centre
    [(0.015625, 0.015625, 0.984375, 0.984375)]
    """
    if "<loc" not in text and "<patch_index_" not in text and "{" not in text:
        return []
    found: list[tuple[int, Box]] = []
    for m in _PALIGEMMA_RE.finditer(text):
        y1, x1, y2, x2 = (int(g) for g in m.groups())
        if max(y1, x1, y2, x2) < PALIGEMMA_GRID:
            found.append((m.start(), tuple(v / PALIGEMMA_GRID for v in (x1, y1, x2, y2))))  # type: ignore[arg-type]
    for m in _FLORENCE_RE.finditer(text):
        x1, y1, x2, y2 = (int(g) for g in m.groups())
        if max(x1, y1, x2, y2) < FLORENCE_BINS:
            found.append((m.start(), tuple((v + 0.5) / FLORENCE_BINS for v in (x1, y1, x2, y2))))  # type: ignore[arg-type]
    for m in _MINIGPT_RE.finditer(text):
        values = [int(g) for g in m.groups()]
        if max(values) <= MINIGPT_GRID:
            found.append((m.start(), tuple(v / MINIGPT_GRID for v in values)))  # type: ignore[arg-type]
    for m in _KOSMOS_RE.finditer(text):
        ul, lr = int(m.group(1)), int(m.group(2))
        if max(ul, lr) < KOSMOS_CELLS ** 2:
            found.append((m.start(), _kosmos_box(ul, lr)))
    return [b for _, b in sorted(found, key=lambda f: f[0])]


def read_boxes(text: str, coords: str) -> tuple[list[Box], str]:
    """(boxes, their frame): location tokens in their own 0-1 frame ("norm1") when ``text`` has any, else
    ``parse_boxes``' numbers in ``coords``."""
    located = location_boxes(text)
    return (located, "norm1") if located else (parse_boxes(text), coords)


def parse_boxes(text: str) -> list[Box]:
    """Every box stated in ``text`` (see the module docstring for the forms), in order.

    >>> parse_boxes('[10, 20, 30, 40]')
    [(10.0, 20.0, 30.0, 40.0)]
    >>> parse_boxes('```json\\n[{"bbox_2d": [1, 2, 3, 4], "label": "cat"}]\\n```')
    [(1.0, 2.0, 3.0, 4.0)]
    >>> parse_boxes('<|box_start|>(100,200),(300,400)<|box_end|>')
    [(100.0, 200.0, 300.0, 400.0)]
    >>> parse_boxes('no box here')
    []
    """
    fenced = _FENCE_RE.findall(text)
    body = _tidy("\n".join(fenced) if fenced else text)
    boxes: list[Box] = []
    whole = _literal(body.strip())
    if whole is not None:
        _collect(whole, boxes)
    else:
        for chunk in _top_level_brackets(body):
            obj = _literal(chunk)
            if obj is not None:
                _collect(obj, boxes)
    if not boxes:
        boxes = [tuple(float(g) for g in m.groups()) for m in _QWEN_BOX_RE.finditer(body)]  # type: ignore[misc]
    if not boxes:
        boxes = _text_corner_boxes(body)
    return boxes


_BOXLIKE_RE = re.compile(r"<\|box_start\|>|bbox|box_2d|position|<loc_?\d|<patch_index_\d|\{\s*<\d|"
                         r"(?<![\w.])(?:x1|xmin|x_min)\s*[:=]|"
                         r"[\[(]\s*[-+]?(?:\d|\.\d|nan|inf)", re.IGNORECASE)
_NUMBER_LIST_RE = re.compile(r"\[([^\[\]]{0,400})\]")


def why_no_box(text: str) -> tuple[str, str]:
    """(problem, reason) for a text ``parse_boxes`` found no box in: ``"no_box"`` when nothing in it looks
    like a box, else ``"box_unparsed"`` with what was wrong.

    >>> why_no_box("the cat on the left")
    ('no_box', 'no box-like text')
    >>> why_no_box("[10, 20, 30]")
    ('box_unparsed', 'a list of 3 numbers (a box is [x1, y1, x2, y2])')
    """
    text = _tidy(text)  # as parse_boxes reads it: "［１０，２０，３０］" is three numbers too
    if not _BOXLIKE_RE.search(text):
        return "no_box", "no box-like text"
    for m in _NUMBER_LIST_RE.finditer(text):
        items = [x.strip() for x in m.group(1).split(",") if x.strip()]
        if items and all(re.fullmatch(_NUM + r"|(?i:nan|-?inf(?:inity)?)", x) for x in items) and len(items) != 4:
            return "box_unparsed", f"a list of {len(items)} numbers (a box is [x1, y1, x2, y2])"
    if "<|box_start|>" in text:
        return "box_unparsed", "box tokens without two (x, y) corners"
    if _LOCATION_TOKEN_RE.search(text):
        return "box_unparsed", ("location tokens that are not a box: four <locNNNN> under 1024 (PaliGemma), four "
                                "<loc_N> under 1000 (Florence-2), two <patch_index_NNNN> under 1024 (Kosmos-2) or "
                                "{<x1><y1><x2><y2>} up to 100 (MiniGPT-v2)")
    if re.search(r"(?i)\bnan\b|\binf", text):
        return "box_unparsed", "a box with non-finite coordinates"
    return "box_unparsed", "box-like text that is not a box, a JSON/Python list of boxes or two (x, y) corners"


def _hungarian_min(cost: list[list[float]]) -> list[int]:
    """Minimum-cost perfect assignment of a square matrix; returns column index per row. O(n³)."""
    n = len(cost)
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    p, way = [0] * (n + 1), [0] * (n + 1)  # p[j]: row assigned to column j (1-based, 0 = none)
    for i in range(1, n + 1):
        p[0], j0 = i, 0
        minv, used = [inf] * (n + 1), [False] * (n + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = p[j0], inf, 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(n + 1):
                if used[j]:
                    u[p[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while j0:  # augment along the alternating path
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
    assign = [0] * n
    for j in range(1, n + 1):
        assign[p[j] - 1] = j - 1
    return assign


def match_boxes(pred: Sequence[Box], gold: Sequence[Box], method: str = "hungarian") -> list[tuple[int, int, float]]:
    """One-to-one matches ``(pred_index, gold_index, iou)`` with IoU > 0.

    "hungarian" maximises the total IoU; "greedy" repeatedly takes the highest-IoU unused pair.

    >>> match_boxes([(0, 0, 10, 10), (20, 20, 30, 30)], [(20, 20, 30, 30)])
    [(1, 0, 1.0)]
    """
    if method not in MATCHINGS:
        raise ValueError(f"unknown matching {method!r}; known: {', '.join(MATCHINGS)}")
    if not pred or not gold:
        return []
    ious = [[iou(p, g) for g in gold] for p in pred]  # [P, T]
    if method == "greedy":
        pairs = sorted(((ious[i][j], i, j) for i in range(len(pred)) for j in range(len(gold))), reverse=True)
        used_p, used_g, out = set(), set(), []
        for v, i, j in pairs:
            if v > 0 and i not in used_p and j not in used_g:
                used_p.add(i)
                used_g.add(j)
                out.append((i, j, v))
        return sorted(out)
    n = max(len(pred), len(gold))
    cost = [[-(ious[i][j] if i < len(pred) and j < len(gold) else 0.0) for j in range(n)] for i in range(n)]
    assign = _hungarian_min(cost)
    return [(i, j, ious[i][j]) for i, j in enumerate(assign) if i < len(pred) and j < len(gold) and ious[i][j] > 0]


def _size(value: Any, key: str, sample_id: str) -> tuple[float, float] | None:
    if value is None:
        return None
    try:
        w, h = (float(x) for x in value)
    except (TypeError, ValueError):
        raise DataError(f"sample {sample_id!r}: meta[{key!r}] must be [width, height], got {value!r}",
                        field=f"meta.{key}") from None
    if not (w > 0 and h > 0 and math.isfinite(w) and math.isfinite(h)):
        raise DataError(f"sample {sample_id!r}: meta[{key!r}] must be positive, got {value!r}", field=f"meta.{key}")
    return w, h


def frame_sizes(sample: Sample) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """(resized_size, target_size): the image the model saw and the frame of the ground-truth boxes."""
    meta = sample.meta or {}
    resized = _size(meta.get("resized_size"), "resized_size", sample.id)
    if resized is None and sample.images:
        resized = tuple(float(x) for x in sample.images[0].size)  # type: ignore[assignment]
    target = _size(meta.get("orig_size"), "orig_size", sample.id) or resized
    return resized, target


def _clip(b: Box, frame: tuple[float, float] | None) -> Box:
    if frame is None:
        return b
    w, h = frame
    return (min(max(b[0], 0.0), w), min(max(b[1], 0.0), h), min(max(b[2], 0.0), w), min(max(b[3], 0.0), h))


@REWARDS.register("grounding")
class GroundingReward(AnswerReward):
    """Box IoU reward.

    Parameters: ``coords`` ("absolute" | "normalized_1000" | "normalized_1": the frame of predicted boxes;
    the same as ``coord_format``, which also takes "abs" | "norm1000" | "norm1"), ``target_format`` (same
    names, ground truth; default "abs"), ``matching`` ("hungarian" | "greedy"), ``threshold`` (None = score is the IoU;
    a number = 1 per match with IoU ≥ threshold), ``max_area_fraction`` (None disables the guard),
    ``max_boxes`` (more predicted boxes score 0), ``template`` ("r1" | "raw" | "boxed"), ``think_prefilled``.
    ``components``: ``iou``. ``parsed``: boxes (ground-truth frame), image_boxes (pixels of the image the
    model saw, for drawing), target_boxes, target_image_boxes, matches, problems.

    >>> from mmrlvr.types import Sample
    >>> s = Sample(id="r", messages=[], images=[], answer="[0, 0, 10, 10]", answer_type="box",
    ...            meta={"orig_size": [100, 100]})
    >>> r = GroundingReward()("<think>left</think><answer>[5, 0, 15, 10]</answer>", s)
    >>> round(r.score, 4), round(r.components["iou"], 4)  # overlap 50 / union 150
    (0.3333, 0.3333)
    >>> GroundingReward()("<think>all</think><answer>[0, 0, 100, 100]</answer>", s).score  # full image
    0.0
    """

    name = "grounding"
    default_max_answer_chars = 4096

    def __init__(self, coord_format: str = "abs", target_format: str = "abs", matching: str = "hungarian",
                 threshold: float | None = None, max_area_fraction: float | None = 0.8, max_boxes: int = 32,
                 template: str = "r1", think_prefilled: bool = False, max_answer_chars: int | None = None,
                 coords: str | None = None, max_response_chars: int | None = None) -> None:
        super().__init__(template, think_prefilled, max_answer_chars, max_response_chars)
        if coords is not None:
            coord_format = coords
        for label, v, known in (("coords" if coords is not None else "coord_format", coord_format, tuple(COORD_ALIASES)),
                                ("target_format", target_format, tuple(COORD_ALIASES)), ("matching", matching, MATCHINGS)):
            if v not in known:
                raise ValueError(f"grounding: unknown {label} {v!r}; known: {', '.join(known)}")
        coord_format, target_format = COORD_ALIASES[coord_format], COORD_ALIASES[target_format]
        if threshold is not None and not 0 < float(threshold) <= 1:
            raise ValueError(f"grounding: threshold must be in (0, 1], got {threshold!r}")
        if max_area_fraction is not None and not 0 < float(max_area_fraction) <= 1:
            raise ValueError(f"grounding: max_area_fraction must be in (0, 1], got {max_area_fraction!r}")
        self.coord_format, self.target_format, self.matching = coord_format, target_format, matching
        self.threshold = None if threshold is None else float(threshold)
        self.max_area_fraction = None if max_area_fraction is None else float(max_area_fraction)
        self.max_boxes = int(max_boxes)
        self._counts = {"no_box": 0, "box_unparsed": 0}

    def metrics(self) -> dict[str, float]:
        """Responses with no box and with box-like text that did not parse, since the last call."""
        out = {f"reward/{self.name}/{k}": Metric.sum(float(v)) for k, v in self._counts.items()}
        self._counts = {k: 0 for k in self._counts}
        return out

    def target_boxes(self, sample: Sample) -> list[Box]:
        """Ground-truth boxes of ``sample`` in its own frame (``orig_size``); a data error if there are none."""
        gold_text = require_answer(sample, self.name)
        boxes, fmt = read_boxes(gold_text, self.target_format)
        if not boxes:
            raise DataError(f"sample {sample.id!r}: no box in answer {gold_text[:80]!r}", field="answer")
        _, target = frame_sizes(sample)
        if fmt != "abs":
            try:
                boxes = to_frame(boxes, fmt, target, target)
            except ValueError as e:
                raise DataError(f"sample {sample.id!r}: {e}", field="meta.orig_size") from None
        return boxes

    def check(self, answer: str, sample: Sample) -> RewardResult:
        gold = self.target_boxes(sample)
        seen, target = frame_sizes(sample)
        raw, fmt = read_boxes(answer, self.coord_format)
        problems: list[str] = []
        parsed: dict[str, Any] = {"answer": answer, "boxes": [], "image_boxes": [], "target_boxes": [list(b) for b in gold],
                                  "target_image_boxes": [list(b) for b in to_frame(gold, "abs", target, seen)],
                                  "matches": [], "problems": problems}
        if not raw:
            problem, why = why_no_box(answer)
            problems.append(problem)
            parsed["box_error"] = why
            self._counts[problem] += 1
            return RewardResult(0.0, {"iou": 0.0}, parsed)
        if len(raw) > self.max_boxes:
            problems.append("too_many_boxes")
            return RewardResult(0.0, {"iou": 0.0}, parsed)
        finite = [b for b in raw if all(math.isfinite(v) for v in b)]
        if len(finite) < len(raw):
            problems.append("invalid_box")
        try:
            pred = [_clip(b, target) for b in to_frame(finite, fmt, seen, target)]
        except ValueError as e:
            raise DataError(f"sample {sample.id!r}: {e}", field="meta.orig_size") from None
        parsed["boxes"] = [list(b) for b in pred]
        parsed["image_boxes"] = [list(b) for b in to_frame(pred, "abs", target, seen)]
        if any(box_area(b) <= 0 for b in pred):
            problems.append("degenerate_box")
        matches = match_boxes(pred, gold, self.matching)
        parsed["matches"] = [list(m) for m in matches]
        denom = max(len(raw), len(gold))
        mean_iou = sum(m[2] for m in matches) / denom
        score = mean_iou if self.threshold is None else sum(m[2] >= self.threshold for m in matches) / denom
        if self.max_area_fraction is not None and target is not None:
            image_area = target[0] * target[1]
            biggest_target = max(box_area(g) for g in gold) / image_area
            if biggest_target <= self.max_area_fraction and any(
                box_area(b) / image_area > self.max_area_fraction for b in pred
            ):
                problems.append("oversized_box")
                score = 0.0
        return RewardResult(float(score), {"iou": float(mean_iou)}, parsed)

