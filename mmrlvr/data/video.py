"""Video inputs: decode a video file or a folder of frames into a few resized frames, as qwen-vl-utils does.

A row's ``videos`` column holds, per video, a file path (decoded with OpenCV), a folder of image frames
(sorted by name), or a list of frames (paths / bytes / PIL). Sampling follows qwen-vl-utils'
``fetch_video``: ``fps`` frames per second of the source (a frame folder counts as ``source_fps``
frames per second, 2 by default), clamped to [``min_frames``, ``max_frames``], rounded to a multiple of 2
(Qwen-VL's temporal patch merges 2 frames), taken evenly spaced; each frame is resized with the image
``smart_resize`` to at most ``max_pixels``. We decode with OpenCV rather than importing qwen-vl-utils
because that package imports torchvision at module top, which the CPU install lacks.

The result is stored in ``sample.meta["videos"]``: one dict per video with ``frames`` (PIL RGB, all the
same size), ``fps`` (the sampled frames' rate), ``source_fps`` and ``indices`` (the source frames taken:
Qwen2.5-VL's ``second_per_grid_ts`` and Qwen3-VL's ``<t seconds>`` timestamps come from them through
``mmrlvr.data.video_processing``), ``source`` and ``n_source_frames``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from mmrlvr.errors import DataError

FRAME_FACTOR = 2  # Qwen-VL temporal_patch_size: frames are merged in pairs
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v")
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


@dataclass(frozen=True)
class VideoOptions:
    fps: float = 2.0
    max_frames: int = 8
    min_frames: int = 2
    max_pixels: int = 112 * 112
    min_pixels: int = 28 * 28
    source_fps: float = 2.0  # frame rate assumed for frame folders / frame lists


def n_frames_to_sample(total: int, source_fps: float, opts: VideoOptions) -> int:
    """How many frames to take from ``total`` source frames (qwen-vl-utils' ``smart_nframes`` rule).

    >>> n_frames_to_sample(100, 25.0, VideoOptions(fps=2, max_frames=8))   # 4 s of video -> 8 frames
    8
    >>> n_frames_to_sample(30, 30.0, VideoOptions(fps=2, max_frames=8))    # 1 s -> 2 frames
    2
    """
    if total < 1:
        raise DataError("video has no frames")
    n = total / source_fps * opts.fps
    lo = math.ceil(opts.min_frames / FRAME_FACTOR) * FRAME_FACTOR
    hi = max(lo, math.floor(min(opts.max_frames, total if total >= FRAME_FACTOR else FRAME_FACTOR)
                            / FRAME_FACTOR) * FRAME_FACTOR)
    n = min(max(n, lo), hi)
    return max(FRAME_FACTOR, int(round(n / FRAME_FACTOR)) * FRAME_FACTOR)


def _indices(total: int, n: int) -> list[int]:
    """``n`` evenly spaced indices over ``total`` frames (repeats allowed when the video is shorter)."""
    if n == 1:
        return [0]
    return [int(round(i * (total - 1) / (n - 1))) for i in range(n)]


def _read_video_file(path: Path, opts: VideoOptions) -> tuple[list[Image.Image], float, int, list[int]]:
    import cv2

    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise DataError(f"video file {path} could not be opened by OpenCV")
    try:
        total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = float(cap.get(cv2.CAP_PROP_FPS)) or opts.source_fps
        frames_bgr = []
        ok = True
        while ok:  # sequential read: CAP_PROP_POS_FRAMES seeking is unreliable across codecs
            ok, frame = cap.read()
            if ok:
                frames_bgr.append(frame)
    finally:
        cap.release()
    total = len(frames_bgr) or total
    if not frames_bgr:
        raise DataError(f"video file {path} has no decodable frames")
    n = n_frames_to_sample(total, fps, opts)
    idx = _indices(total, n)
    frames = [Image.fromarray(cv2.cvtColor(frames_bgr[i], cv2.COLOR_BGR2RGB)) for i in idx]
    return frames, fps, total, idx


def _read_frame_list(values: list[Any], base_dir: Path | None, opts: VideoOptions,
                     where: str) -> tuple[list[Image.Image], float, int, list[int]]:
    from mmrlvr.data.images import load_image

    total = len(values)
    if total == 0:
        raise DataError(f"{where} has no frames")
    n = n_frames_to_sample(total, opts.source_fps, opts)
    frames = []
    idx = _indices(total, n)
    for i in idx:
        try:
            frames.append(load_image(values[i], base_dir))
        except DataError as exc:
            raise DataError(f"{where} frame {i}: {exc}") from None
    return frames, opts.source_fps, total, idx


def load_video(value: Any, base_dir: str | Path | None = None, opts: VideoOptions | None = None,
               factor: int = 28) -> dict[str, Any]:
    """One video as ``{"frames", "fps", "source", "n_source_frames"}`` (see the module docstring)."""
    from mmrlvr.data.images import resize_image

    opts = opts or VideoOptions()
    base = Path(base_dir) if base_dir is not None else None
    if isinstance(value, (list, tuple)):
        frames, fps, total, idx = _read_frame_list(list(value), base, opts, "frame list")
        source = f"{len(value)} frames"
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith(("http://", "https://", "s3://", "gs://")):
            raise DataError(f"video {text[:80]!r} is a URL; nothing is downloaded at run time")
        path = Path(text[len("file://"):] if text.startswith("file://") else text).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in FRAME_SUFFIXES)
            if not files:
                raise DataError(f"frame folder {path} holds no image files ({', '.join(FRAME_SUFFIXES)})")
            frames, fps, total, idx = _read_frame_list([str(p) for p in files], None, opts, f"frame folder {path}")
        elif path.is_file():
            frames, fps, total, idx = _read_video_file(path, opts)
        else:
            raise DataError(f"video not found: {path}")
        source = str(path)
    else:
        raise DataError(f"cannot read a video from a value of type {type(value).__name__} (a file path, a frame "
                        "folder, or a list of frames)")
    first = frames[0]
    try:
        sized = [resize_image(f.resize(first.size) if f.size != first.size else f, factor, opts.min_pixels,
                              opts.max_pixels) for f in frames]
    except ValueError as exc:
        raise DataError(f"video frames of size {first.size[0]}x{first.size[1]} cannot be resized: {exc}") from None
    return {"frames": sized, "fps": float(fps) * len(idx) / total, "source_fps": float(fps), "indices": idx,
            "source": source, "n_source_frames": int(total)}


def load_videos_for_row(values: list[Any], base_dir: str | Path | None, opts: VideoOptions | None,
                        factor: int = 28) -> list[dict[str, Any]]:
    out = []
    for i, value in enumerate(values):
        try:
            out.append(load_video(value, base_dir, opts, factor))
        except DataError as exc:
            raise DataError(f"video {i}: {exc}") from None
    return out
