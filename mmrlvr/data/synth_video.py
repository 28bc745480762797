"""``synth:video_count``: a synthetic video task the tiny VLMs can learn offline.

A clip of 4 frames; each frame shows one shape on white, of the asked colour or of another colour, at a
random place. Question: "How many frames show a {colour} shape?" (answer 0-3, uniform, chance 25%).
The answer needs every frame: no single frame (and not the text) tells it, and Qwen-VL merges frames in
pairs (temporal patch 2), so the model must also tell the two frames of a pair apart.

Rows look like ``mmrlvr.data.synth`` rows with ``images=[]`` and a ``videos`` list (one video dict as
``mmrlvr.data.video.load_video`` returns: frames, fps, source_fps, indices, n_source_frames), so
``rows_to_samples`` puts the video into ``sample.meta["videos"]`` and every stage sees a normal video
sample. Train and test scenes are disjoint by content hash, as in ``synth``.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from PIL import Image, ImageDraw

from mmrlvr.data.synth import COLOURS, RGB, SHAPES, SPLITS, TEST_BUCKETS

VIDEO_TASKS: tuple[str, ...] = ("video_count",)
N_FRAMES = 4
FRAME_FPS = 2.0


def _frame(colour: str, kind: str, x: int, y: int, size: int, frame_size: int) -> Image.Image:
    img = Image.new("RGB", (frame_size, frame_size), (255, 255, 255))
    d = ImageDraw.Draw(img)
    box = (x, y, x + size - 1, y + size - 1)
    if kind == "circle":
        d.ellipse(box, fill=RGB[colour])
    elif kind == "square":
        d.rectangle(box, fill=RGB[colour])
    else:
        d.polygon([((box[0] + box[2]) / 2, box[1]), (box[2], box[3]), (box[0], box[3])], fill=RGB[colour])
    return img


def make_video_row(task: str, split: str, index: int, seed: int = 0, frame_size: int = 56) -> dict[str, Any]:
    """Row ``index`` of (task, split, seed): deterministic, independent of other rows."""
    if task not in VIDEO_TASKS:
        raise ValueError(f"unknown video task {task!r}; known: {', '.join(VIDEO_TASKS)}")
    rng = random.Random(f"mmrlvr-synth-video/{task}/{split}/{seed}/{index}")
    for _ in range(10_000):
        target = rng.choice(COLOURS)
        answer = rng.randint(0, 3)
        hits = set(rng.sample(range(N_FRAMES), answer))
        others = [c for c in COLOURS if c != target]
        size = rng.randint(frame_size // 3, frame_size // 2)
        specs = []
        for i in range(N_FRAMES):
            colour = target if i in hits else rng.choice(others)
            specs.append((colour, rng.choice(SHAPES), rng.randint(0, frame_size - size), rng.randint(0, frame_size - size)))
        key = hashlib.sha1(json.dumps([task, target, specs, size]).encode()).hexdigest()
        if ("test" if int(key[:8], 16) % TEST_BUCKETS == 0 else "train") == split:
            break
    else:  # pragma: no cover - the acceptance rate is about 1/5
        raise RuntimeError(f"could not draw a {task}/{split} clip")
    frames = [_frame(c, k, x, y, size, frame_size) for c, k, x, y in specs]
    question = f"How many frames show a {target} shape?"
    thinking = f"I see {target} in {answer} frames."
    return {
        "id": f"{task}-{split}-{seed}-{index:06d}",
        "problem": "<video>" + question,
        "images": [],
        "videos": [{"frames": frames, "fps": FRAME_FPS, "source_fps": FRAME_FPS, "indices": list(range(N_FRAMES)),
                    "n_source_frames": N_FRAMES, "source": "synth"}],
        "answer": str(answer),
        "answer_type": "number",
        "solution": f"<think>{thinking}</think><answer>{answer}</answer>",
        "task": task,
        "meta": {"task": task, "split": split, "seed": seed, "index": index, "colour": target,
                 "frame_colours": [c for c, *_ in specs], "scene_hash": key},
    }


def make_video_rows(task: str, split: str, n: int, seed: int = 0, frame_size: int = 56) -> list[dict[str, Any]]:
    from mmrlvr.errors import UserError

    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; use one of: {', '.join(SPLITS)}")
    if n < 0:
        raise UserError(f"n must be >= 0, got {n}")
    return [make_video_row(task, split, i, seed, frame_size) for i in range(n)]
