"""Procedurally drawn visual tasks with verifiable answers that need the image.

Why: a tiny VLM on CPU needs tasks it can learn in minutes, with answers a program can check and that a
text-only guess cannot beat (the question text says nothing about the answer). Every task draws a scene of
a few flat shapes (or an angle) with PIL, asks one question about it, and gives a reference response
``<think>...</think><answer>...</answer>`` for warm-starting by SFT.

Tasks (``TASKS``):
- ``count``: "How many {colour} shapes are there?" over 1-4 shapes; answer 0-3, uniform (chance 25%).
- ``count_chatter``: ``count`` whose reference thinking opens with five random filler words ("The then
  box of is in. I see 2 red, 1 blue."). The fillers are the most uncertain tokens of a response yet do not
  depend on the image; the count digits that decide the answer read the image and are *less* uncertain
  — the situation where entropy-only token selection (top 20% by entropy) trains the chatter and misses
  the visual tokens (the credit study's task, docs/credit.md).
- ``largest_colour``: colour of the largest shape (area at least 1.5x any other); uniform over 4 colours.
- ``left_right``: "Is the {c1} {s1} left or right of the {c2} {s2}?"; "left"/"right" 50/50.
- ``grounding``: "Give the box of the {colour} {shape}."; answer ``[x1, y1, x2, y2]`` in pixels of the
  image as given (x2/y2 exclusive: the shape covers columns x1..x2-1).
- ``grounding_single``: ``grounding`` with the described shape alone in the scene (26-44 px): localisation
  without distractors, which the tiny VLM learns well enough by SFT to place boxes with some overlap — the
  grounding demo's task (on ``grounding`` its warm start places boxes at random, IoU ~0.07, and RL has no
  signal to climb).
- ``geometry``: read a drawn angle, 20-160 degrees in steps of 10 (chance 1/15); ``meta["tolerance"]``
  is the accepted absolute error in degrees.
- ``zoom``: "How many {colour} shapes are inside the dark square?" (answer 1-3, chance 1/3) on an image drawn at
  eight times ``image_size`` (896 px by default): a dark square an eighth of the image wide, small shapes (16-20 px)
  inside it (at most three) and around it (the asked colour outside too); the square is in one of nine cells
  (3 x 3). The tiny processor shows a model at most 224x224 px, where those shapes are 4-5 px specks inside one
  patch; one ``zoom`` into the square (``meta["region"]``) returns its 112 px at 224 px, where they are 32-40 px
  (2-3 patches, the size the ``count`` task's shapes have). The reference is two turns: the call
  (``meta["reference_turns"]``), then the count — what ``tiny:FAMILY:warm:zoom`` is warm-started on.

Vocabulary is small on purpose (tiny models read it with a ~400-token BPE): colours red, green, blue,
yellow; shapes circle, square, triangle. Geometry is laid out on a 112-px canvas and scaled to
``image_size``; at 112x112 every shape is at least 20 px wide (more than one 14-px patch).

Determinism and splits: row ``i`` of (task, split, seed) draws from its own ``random.Random`` seeded with
that string (so the first n rows do not depend on how many are made), and a scene is accepted only if the
hash of its drawn content falls in its split's bucket (1 in 5 hashes are test). Train and test therefore
never share a scene, whatever the seeds.

Not done here: anti-aliasing, textures, occlusion; the point is a fast, readable, checkable signal.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from PIL import Image, ImageDraw

TASKS: tuple[str, ...] = ("count", "count_chatter", "largest_colour", "left_right", "grounding", "geometry",
                         "grounding_single", "zoom")
GROUNDING_TASKS: tuple[str, ...] = ("grounding", "grounding_single")  # answer: a pixel box
SPLITS: tuple[str, ...] = ("train", "test")
COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow")
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 195, 20),
}
BACKGROUND = (255, 255, 255)
BASE = 112  # layout canvas; coordinates are scaled by image_size / BASE when drawn
TEST_BUCKETS = 5  # a scene is test iff hash % TEST_BUCKETS == 0
ANGLES = tuple(range(20, 161, 10))  # geometry answers (degrees)
# count_chatter's filler words: single tokens of the tiny BPE with a leading space, none of them a colour,
# shape, number or negation (so the counting conclusion's parser never reads them)
FILLERS: tuple[str, ...] = ("then", "about", "yes", "and", "of", "in", "lines", "meet", "box", "angle",
                            "degrees", "is")
# five fillers: about a fifth of a ~25-token response, so entropy top-20% can be filled by them alone
N_FILLERS = 5
ANGLE_TOLERANCE = 5.0

_AREA_FACTOR = {"circle": math.pi / 4, "square": 1.0, "triangle": 0.5}  # area / side^2


@dataclass
class Shape:
    """One drawn shape; ``box`` is [x1, y1, x2, y2] on the BASE canvas (x2, y2 exclusive)."""

    colour: str
    kind: str
    x: int
    y: int
    size: int

    @property
    def box(self) -> list[int]:
        return [self.x, self.y, self.x + self.size, self.y + self.size]

    @property
    def area(self) -> float:
        return _AREA_FACTOR[self.kind] * self.size * self.size

    @property
    def cx(self) -> float:
        return self.x + self.size / 2


class _Retry(Exception):
    """A scene could not be laid out; draw again from the same stream."""


# ----------------------------------------------------------------------------------------------------
# layout

def _place(rng: random.Random, sizes: list[int], margin: int = 4, gap: int = 4) -> list[tuple[int, int]]:
    """Top-left corners for squares of the given sides, inside the canvas and not touching (gap px).

    Whole layouts are retried here, keeping the task's choices (answer, colours, sizes): redrawing those on
    a failed layout would make answers with more shapes rarer and unbalance the answer distribution.
    """
    for _ in range(100):
        placed: list[tuple[int, int, int]] = []
        for size in sizes:
            for _ in range(30):
                x = rng.randint(margin, BASE - margin - size)
                y = rng.randint(margin, BASE - margin - size)
                if all(x + size + gap <= px or px + ps + gap <= x or y + size + gap <= py or py + ps + gap <= y
                       for px, py, ps in placed):
                    placed.append((x, y, size))
                    break
            else:
                break
        if len(placed) == len(sizes):
            return [(x, y) for x, y, _ in placed]
    raise _Retry


def _shapes(rng: random.Random, specs: list[tuple[str, str]], sizes: list[int]) -> list[Shape]:
    corners = _place(rng, sizes)
    return [Shape(c, k, x, y, s) for (c, k), (x, y), s in zip(specs, corners, sizes)]


def _region(shape: Shape) -> str:
    """Coarse position words (thirds of the canvas) for reference reasoning."""
    cx, cy = shape.x + shape.size / 2, shape.y + shape.size / 2
    row = ("top", "middle", "bottom")[min(2, int(cy * 3 // BASE))]
    col = ("left", "centre", "right")[min(2, int(cx * 3 // BASE))]
    return "centre" if (row, col) == ("middle", "centre") else f"{row} {col}"


def _scaled_box(box: list[int], scale: float) -> list[int]:
    return [int(round(v * scale)) for v in box]


# ----------------------------------------------------------------------------------------------------
# tasks: each returns (scene, question, answer, thinking, task meta); scene is what gets drawn and hashed

Scene = dict[str, Any]


def _count(rng: random.Random) -> tuple[Scene, str, str, str, dict]:
    target = rng.choice(COLOURS)
    answer = rng.randint(0, 3)
    n_total = rng.randint(max(answer, 1), 4)
    others = [c for c in COLOURS if c != target]
    colours = [target] * answer + [rng.choice(others) for _ in range(n_total - answer)]
    rng.shuffle(colours)
    specs = [(c, rng.choice(SHAPES)) for c in colours]
    shapes = _shapes(rng, specs, [rng.randint(22, 34) for _ in specs])
    counts = {c: colours.count(c) for c in COLOURS if c in colours}
    thinking = "I see " + ", ".join(f"{n} {c}" for c, n in counts.items()) + "."
    return ({"shapes": shapes}, f"How many {target} shapes are there?", str(answer), thinking,
            {"colour": target, "counts": counts})


def _largest_colour(rng: random.Random) -> tuple[Scene, str, str, str, dict]:
    answer = rng.choice(COLOURS)
    n = rng.randint(2, 4)
    colours = [answer] + rng.sample([c for c in COLOURS if c != answer], n - 1)
    kinds = [rng.choice(SHAPES) for _ in colours]
    sizes = [rng.randint(36, 44)] + [rng.randint(18, 28) for _ in colours[1:]]
    shapes = [Shape(c, k, 0, 0, s) for c, k, s in zip(colours, kinds, sizes)]
    areas = sorted((s.area for s in shapes), reverse=True)
    if shapes[0].area != areas[0] or areas[0] < 1.5 * areas[1]:
        raise _Retry
    order = list(range(n))
    rng.shuffle(order)  # the largest is not always placed (or listed) first
    shapes = _shapes(rng, [(colours[i], kinds[i]) for i in order], [sizes[i] for i in order])
    big = max(shapes, key=lambda s: s.area)
    thinking = f"The largest shape is the {big.colour} {big.kind}."
    return {"shapes": shapes}, "What colour is the largest shape?", answer, thinking, {}


def _distinct_specs(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """n (colour, kind) pairs, all different, so each names one shape in the scene."""
    pool = [(c, k) for c in COLOURS for k in SHAPES]
    return rng.sample(pool, n)


def _left_right(rng: random.Random) -> tuple[Scene, str, str, str, dict]:
    want = rng.choice(("left", "right"))
    specs = _distinct_specs(rng, rng.randint(2, 4))
    shapes = _shapes(rng, specs, [rng.randint(22, 32) for _ in specs])
    a, b = shapes[0], shapes[1]
    if abs(a.cx - b.cx) < 16:
        raise _Retry
    if (a.cx < b.cx) != (want == "left"):
        a, b = b, a  # ask about them the other way round so the answer is the one drawn for balance
    thinking = f"The {a.colour} {a.kind} is at x {round(a.cx)}, the {b.colour} {b.kind} is at x {round(b.cx)}."
    question = f"Is the {a.colour} {a.kind} left or right of the {b.colour} {b.kind}?"
    return {"shapes": shapes}, question, want, thinking, {"subject": [a.colour, a.kind], "reference": [b.colour, b.kind]}


def _grounding(rng: random.Random) -> tuple[Scene, str, str, str, dict]:
    specs = _distinct_specs(rng, rng.randint(1, 4))
    shapes = _shapes(rng, specs, [rng.randint(22, 40) for _ in specs])
    t = shapes[0]
    thinking = f"The {t.colour} {t.kind} is at the {_region(t)}."
    # the answer box is filled in at render time, in pixels of the final image size
    return ({"shapes": shapes}, f"Give the box of the {t.colour} {t.kind}.", "", thinking,
            {"target": {"colour": t.colour, "shape": t.kind}, "_target_box": t.box})


def _grounding_single(rng: random.Random) -> tuple[Scene, str, str, str, dict]:
    (spec,) = _distinct_specs(rng, 1)
    (t,) = _shapes(rng, [spec], [rng.randint(26, 44)])
    thinking = f"The {t.colour} {t.kind} is at the {_region(t)}."
    return ({"shapes": [t]}, f"Give the box of the {t.colour} {t.kind}.", "", thinking,
            {"target": {"colour": t.colour, "shape": t.kind}, "_target_box": t.box})


def _geometry(rng: random.Random) -> tuple[Scene, str, str, str, dict]:
    angle = rng.choice(ANGLES)
    start = rng.uniform(0, 360)
    vx, vy = BASE / 2 + rng.uniform(-6, 6), BASE / 2 + rng.uniform(-6, 6)
    length = rng.uniform(38, 46)
    rays = []
    for deg in (start, start + angle):
        rad = math.radians(deg)
        rays.append((vx + length * math.cos(rad), vy - length * math.sin(rad)))
    scene = {"vertex": (vx, vy), "rays": rays, "arc": (start, start + angle)}
    thinking = f"The two lines meet at about {angle} degrees."
    return scene, "What is the angle in degrees?", str(angle), thinking, {"tolerance": ANGLE_TOLERANCE}


ZOOM_SCALE = 8  # the zoom task's image is drawn at ZOOM_SCALE x image_size
ZOOM_CANVAS = BASE * ZOOM_SCALE  # its layout canvas (896)
ZOOM_FRAME = 112  # frame side on the canvas (an eighth of it): the zoom tool returns it twice as large
ZOOM_LINE = 8  # the frame's line width on the canvas
#: the frame is filled with this dark grey: in the 224-px view it is a dark square of one or two patches a tiny vision
#: tower can locate (an outline of 2 px was not found in 500 SFT steps), and the shapes inside stand out on it
ZOOM_FILL = (64, 64, 64)
ZOOM_SHAPE = (16, 20)  # small shapes' sides on the canvas
#: the answer's range: at least one shape of the asked colour is inside the square, so a look into another cell
#: (whose crop holds the asked colour's outside shapes, usually none) rarely gives the right count; a right look is
#: what a right answer needs, and learning where to look lifts accuracy too (with 0 allowed, a wrong look's "0" was
#: right a quarter of the time)
ZOOM_ANSWERS = (1, 3)
#: at most this many shapes inside the square (the asked colour's and others): the crop is counted as the ``count``
#: task's scenes are, and a tiny model counts few shapes better than four (sampled, right after a right look: 0.43
#: with up to four inside, 0.52-0.54 with up to three)
ZOOM_INSIDE = 3
#: the frame sits in one of 3 x 3 cells (top-left corners on the canvas): where to look is a choice of nine regions
#: the tiny VLM can learn to name, not a regression on pixel coordinates
ZOOM_CELLS = (48, (ZOOM_CANVAS - ZOOM_FRAME) // 2, ZOOM_CANVAS - 48 - ZOOM_FRAME)


def _scatter(rng: random.Random, n: int, area: tuple[int, int, int, int], avoid: list[tuple[int, int, int, int]],
             gap: int = 12) -> list[tuple[int, int, int]]:
    """n small shapes (x, y, size) inside ``area``, apart from each other and from the ``avoid`` boxes."""
    placed: list[tuple[int, int, int]] = []
    for _ in range(n):
        for _ in range(200):
            size = rng.randint(*ZOOM_SHAPE)
            x = rng.randint(area[0], area[2] - size)
            y = rng.randint(area[1], area[3] - size)
            box = (x - gap, y - gap, x + size + gap, y + size + gap)
            if all(box[2] <= a[0] or a[2] <= box[0] or box[3] <= a[1] or a[3] <= box[1]
                   for a in avoid + [(px, py, px + ps, py + ps) for px, py, ps in placed]):
                placed.append((x, y, size))
                break
        else:
            raise _Retry
    return placed


def _zoom(rng: random.Random) -> tuple[Scene, str, str, str, dict]:
    target = rng.choice(COLOURS)
    others = [c for c in COLOURS if c != target]
    answer = rng.randint(*ZOOM_ANSWERS)
    fx, fy = rng.choice(ZOOM_CELLS), rng.choice(ZOOM_CELLS)
    frame = (fx, fy, fx + ZOOM_FRAME, fy + ZOOM_FRAME)
    margin = ZOOM_LINE + 8
    inner = (fx + margin, fy + margin, fx + ZOOM_FRAME - margin, fy + ZOOM_FRAME - margin)
    inside_colours = [target] * answer + [rng.choice(others) for _ in range(rng.randint(0, ZOOM_INSIDE - answer))]
    outside_colours = [target] * rng.randint(1, 3) + [rng.choice(others) for _ in range(rng.randint(3, 5))]
    inside = _scatter(rng, len(inside_colours), inner, [])
    outside = _scatter(rng, len(outside_colours), (16, 16, ZOOM_CANVAS - 16, ZOOM_CANVAS - 16),
                       [(fx - 20, fy - 20, fx + ZOOM_FRAME + 20, fy + ZOOM_FRAME + 20)])
    shapes = [Shape(c, rng.choice(SHAPES), x, y, size)
              for c, (x, y, size) in zip(inside_colours + outside_colours, inside + outside)]
    where = _region(Shape("", "square", fx // ZOOM_SCALE, fy // ZOOM_SCALE, ZOOM_FRAME // ZOOM_SCALE))
    thinking = f"I see {answer} {target}."
    return ({"shapes": shapes, "frame": frame, "canvas": ZOOM_CANVAS},
            f"How many {target} shapes are inside the dark square?", str(answer), thinking,
            {"target": target, "_frame": list(frame), "_where": where, "_cell": [fx, fy]})


def _count_chatter(rng: random.Random) -> tuple[Scene, str, str, str, dict]:
    scene, question, answer, thinking, meta = _count(rng)
    chatter = " ".join(rng.choice(FILLERS) for _ in range(N_FILLERS))
    return scene, question, answer, f"The {chatter}. {thinking}", meta


_TASK_FNS: dict[str, Callable[[random.Random], tuple[Scene, str, str, str, dict]]] = {
    "count": _count,
    "count_chatter": _count_chatter,
    "largest_colour": _largest_colour,
    "left_right": _left_right,
    "grounding": _grounding,
    "geometry": _geometry,
    "grounding_single": _grounding_single,
    "zoom": _zoom,
}
#: tasks whose drawing changed since their warm starts were first cached: part of those warm starts' cache key
#: (zoom 2: a frame an eighth of the image wide, returned twice as large by one zoom; zoom 3: the frame filled dark
#: grey, and a decoy look answers with what its crop shows; zoom 4: answers 1-3 and at most three shapes inside)
DATA_VERSIONS: dict[str, int] = {"zoom": 4}
ANSWER_TYPES: dict[str, str] = {
    "count": "number", "count_chatter": "number", "largest_colour": "text", "left_right": "text", "grounding": "box", "geometry": "number",
    "grounding_single": "box", "zoom": "number",
}


# ----------------------------------------------------------------------------------------------------
# drawing and hashing

def _scene_key(task: str, scene: Scene) -> str:
    """Hash of what is drawn (not of the question), so no image is shared between splits."""
    if "shapes" in scene:
        content = sorted((s.colour, s.kind, s.x, s.y, s.size) for s in scene["shapes"])
        if "frame" in scene:
            content.append(list(scene["frame"]))
    else:
        content = [round(v, 1) for v in (*scene["vertex"], *scene["rays"][0], *scene["rays"][1])]
    return hashlib.sha1(json.dumps([task, content]).encode()).hexdigest()


def _split_of(key: str) -> str:
    return "test" if int(key[:8], 16) % TEST_BUCKETS == 0 else "train"


def _draw(scene: Scene, image_size: int) -> Image.Image:
    scale = image_size / scene.get("canvas", BASE)
    img = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(img)
    if "frame" in scene:
        draw.rectangle(_scaled_box(list(scene["frame"]), scale), fill=ZOOM_FILL, outline=(0, 0, 0),
                       width=max(2, round(ZOOM_LINE * scale)))
    for s in scene.get("shapes", []):
        x1, y1, x2, y2 = _scaled_box(s.box, scale)
        fill = RGB[s.colour]
        if s.kind == "circle":
            draw.ellipse((x1, y1, x2 - 1, y2 - 1), fill=fill)
        elif s.kind == "square":
            draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=fill)
        else:
            draw.polygon([((x1 + x2 - 1) / 2, y1), (x2 - 1, y2 - 1), (x1, y2 - 1)], fill=fill)
    if "vertex" in scene:
        width = max(2, round(3 * scale))
        vx, vy = scene["vertex"]
        v = (vx * scale, vy * scale)
        for rx, ry in scene["rays"]:
            draw.line([v, (rx * scale, ry * scale)], fill=(0, 0, 0), width=width)
        r = 12 * scale  # arc marks which of the two angles is asked about (always the one < 180)
        a0, a1 = scene["arc"]
        # PIL measures angles clockwise from +x; ours are counter-clockwise (y grows downwards)
        draw.arc((v[0] - r, v[1] - r, v[0] + r, v[1] + r), start=-a1, end=-a0, fill=(200, 40, 40),
                 width=max(1, round(2 * scale)))
    return img


def _check_args(task: str, split: str, n: int, image_size: int) -> None:
    from mmrlvr.errors import UserError

    if task not in _TASK_FNS:
        raise UserError(f"unknown synthetic task {task!r}; known tasks: {', '.join(TASKS)}")
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; use one of: {', '.join(SPLITS)}")
    if n < 0:
        raise UserError(f"n must be >= 0, got {n}")
    if image_size < 56:
        raise UserError(f"image_size must be at least 56 pixels, got {image_size}")


def make_row(task: str, split: str, index: int, seed: int = 0, image_size: int = 112) -> dict[str, Any]:
    """Row ``index`` of (task, split, seed): the same every time, independent of other rows."""
    rng = random.Random(f"mmrlvr-synth/{task}/{split}/{seed}/{index}")
    fn = _TASK_FNS[task]
    for _ in range(10_000):
        try:
            scene, question, answer, thinking, meta = fn(rng)
        except _Retry:
            continue
        key = _scene_key(task, scene)
        if _split_of(key) == split:
            break
    else:  # pragma: no cover - the acceptance rate is >= 1/5 for every task
        raise RuntimeError(f"could not draw a {task}/{split} scene")
    drawn = image_size * ZOOM_SCALE if task == "zoom" else image_size  # the zoom task is drawn larger
    scale = drawn / scene.get("canvas", BASE)
    if task in GROUNDING_TASKS:
        answer = json.dumps(_scaled_box(meta.pop("_target_box"), scale))  # "[x1, y1, x2, y2]"
    reference_turns = None
    if task == "zoom":  # two turns: look at the frame, then count
        region = _scaled_box(meta.pop("_frame"), scale)
        meta["region"] = region
        call = json.dumps({"name": "zoom", "arguments": {"image": 0, "box": region}})
        where = meta.pop("_where")
        reference_turns = [f"<think>The frame is at the {where}.</think>\n<tool_call>\n{call}\n</tool_call>",
                           f"<think>{thinking}</think><answer>{answer}</answer>"]
        # a look into another cell (drawn from the scene's hash, so the scene itself is untouched), answered with
        # what that crop shows (the asked colour's shapes whose centre falls in it): a warm start that sometimes
        # looks in the wrong place, and whose answer always reads the crop, so the right look is what makes it right
        cells = [(x, y) for x in ZOOM_CELLS for y in ZOOM_CELLS if [x, y] != meta["_cell"]]
        dx, dy = random.Random(key).choice(cells)
        seen = sum(s.colour == meta["target"] and dx <= s.x + s.size / 2 < dx + ZOOM_FRAME
                   and dy <= s.y + s.size / 2 < dy + ZOOM_FRAME for s in scene["shapes"])
        decoy = json.dumps({"name": "zoom", "arguments": {"image": 0, "box": _scaled_box(
            [dx, dy, dx + ZOOM_FRAME, dy + ZOOM_FRAME], scale)}})
        decoy_where = _region(Shape("", "square", dx // ZOOM_SCALE, dy // ZOOM_SCALE, ZOOM_FRAME // ZOOM_SCALE))
        meta["decoy_turns"] = [
            f"<think>The frame is at the {decoy_where}.</think>\n<tool_call>\n{decoy}\n</tool_call>",
            f"<think>I see {seen} {meta['target']}.</think><answer>{seen}</answer>"]
        meta.pop("_cell")
    meta = {
        "task": task, "split": split, "seed": seed, "index": index, "image_size": [drawn, drawn],
        "scene_hash": key, **meta,
    }
    if reference_turns is not None:
        meta["reference_turns"] = reference_turns
    if "shapes" in scene:
        meta["shapes"] = [{"colour": s.colour, "shape": s.kind, "box": _scaled_box(s.box, scale)}
                          for s in scene["shapes"]]
    return {
        "id": f"{task}-{split}-{seed}-{index:06d}",
        "problem": "<image>" + question,
        "images": [_draw(scene, drawn)],
        "answer": answer,
        "answer_type": ANSWER_TYPES[task],
        "solution": f"<think>{thinking}</think><answer>{answer}</answer>",
        "task": task,
        "meta": meta,
    }


def make_rows(task: str, split: str, n: int, seed: int = 0, image_size: int = 112,
              progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """``n`` rows of a synthetic task (see the module docstring for the row format).

    progress: optional callback called with 1 after each row (e.g. ``tqdm.update``).
    """
    _check_args(task, split, n, image_size)
    rows = []
    for i in range(n):
        rows.append(make_row(task, split, i, seed, image_size))
        if progress is not None:
            progress(1)
    return rows


def write_dataset(task: str, split: str, n: int, out_dir: str | Path, seed: int = 0, image_size: int = 112,
                  progress: Callable[[int], None] | None = None) -> Path:
    """Write ``n`` rows as a Hugging Face dataset (``save_to_disk``) and return its path (``save_rows``)."""
    return save_rows(make_rows(task, split, n, seed, image_size, progress), out_dir)


def save_rows(rows: list[dict[str, Any]], out_dir: str | Path) -> Path:
    """Save synthetic rows as a Hugging Face dataset (``save_to_disk``) and return its path.

    rows: as ``make_rows`` makes them, or ``mmrlvr.data.synth_video`` / ``mmrlvr.rubric.synth`` rows.
    Columns: id, problem, images (list of ``datasets.Image``), answer, answer_type, solution, task,
    meta (a JSON string: its keys differ between tasks, which Arrow columns cannot hold); when the rows
    have them, also videos (per video, its frames as a list of ``datasets.Image``) and rubric (a JSON
    string, as meta). ``mmrlvr.data.load_samples(path)`` reads it back (preset ``mmrlvr``, detected
    automatically).
    """
    import datasets

    spec: dict[str, Any] = {
        "id": datasets.Value("string"),
        "problem": datasets.Value("string"),
        "images": datasets.List(datasets.Image()),
        "answer": datasets.Value("string"),
        "answer_type": datasets.Value("string"),
        "solution": datasets.Value("string"),
        "task": datasets.Value("string"),
        "meta": datasets.Value("string"),
    }
    if any(r.get("videos") for r in rows):
        spec["videos"] = datasets.List(datasets.List(datasets.Image()))
    if any(r.get("rubric") is not None for r in rows):
        spec["rubric"] = datasets.Value("string")
    features = datasets.Features(spec)
    columns: dict[str, list[Any]] = {}
    for name in features:
        if name in ("meta", "rubric"):
            columns[name] = [json.dumps(r.get(name)) if r.get(name) is not None else None for r in rows]
        elif name == "videos":
            columns[name] = [[list(v["frames"]) for v in r.get("videos") or []] for r in rows]
        else:
            columns[name] = [r[name] for r in rows]
    ds = datasets.Dataset.from_dict(columns, features=features)
    out = Path(out_dir)
    ds.save_to_disk(str(out))
    return out
