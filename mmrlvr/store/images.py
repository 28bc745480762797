"""Content-addressed image store of a run: ``images/<ab>/<sha256>.png``.

An image is stored once per run however many rollouts, steps or groups show it: its path is the SHA-256
of its PNG bytes. Writes are atomic (temp file + rename), so two threads or processes putting the same
image at once both succeed and leave one complete file. Records keep the *relative* path
(``RolloutRecord.image_refs``) so a run folder can be moved or copied.

``resolve_in_run`` is the one place that turns a relative path from a record (untrusted: it is data) into
a file path, and refuses anything outside the run folder (``../../etc/passwd``, absolute paths, symlinks
that lead out).
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from pathlib import Path
from typing import Any

from PIL import Image

from mmrlvr.errors import UserError
from mmrlvr.store.atomic import atomic_write_bytes

IMAGES_DIR = "images"


class UnsafePathError(UserError):
    """A path that would leave the run folder."""


def resolve_in_run(run_dir: str | os.PathLike[str], relpath: str | os.PathLike[str]) -> Path:
    """``run_dir / relpath`` as an absolute path, or ``UnsafePathError`` if it is not inside ``run_dir``.

    Symlinks are resolved before the check, so a link pointing out of the run is refused too.
    """
    root = Path(run_dir).resolve()
    rel = str(relpath)
    if not rel or "\x00" in rel:
        raise UnsafePathError(f"invalid path {rel!r} in run {root}")
    candidate = (root / rel).resolve()
    if candidate != root and root not in candidate.parents:
        raise UnsafePathError(f"path {rel!r} is outside the run folder {root}")
    return candidate


def png_bytes(image: Image.Image) -> bytes:
    """Deterministic PNG encoding (no timestamps; same pixels + mode -> same bytes)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


class ImageStore:
    """Put/get images of one run folder by content hash. Thread-safe."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def put(self, image: Image.Image) -> str:
        """Store ``image`` (if not stored yet) and return its path relative to the run folder."""
        return self.put_png(png_bytes(image))

    def put_png(self, data: bytes) -> str:
        """Store already-encoded PNG bytes; returns ``images/ab/<sha256>.png``."""
        digest = hashlib.sha256(data).hexdigest()
        rel = f"{IMAGES_DIR}/{digest[:2]}/{digest}.png"
        with self._lock:
            if rel in self._known:
                return rel
        path = self.run_dir / rel
        if not path.exists():
            # Concurrent puts of the same image each write their own temp file; the last rename wins
            # and both leave identical, complete bytes behind.
            atomic_write_bytes(path, data)
        with self._lock:
            self._known.add(rel)
        return rel

    def path(self, relpath: str) -> Path:
        """Absolute path of a stored image (refuses paths outside the run folder)."""
        return resolve_in_run(self.run_dir, relpath)

    def open(self, relpath: str) -> Image.Image:
        """Load a stored image (fully read, so the file handle is closed)."""
        path = self.path(relpath)
        if not path.is_file():
            raise UserError(f"image {relpath!r} not found in run {self.run_dir}")
        with Image.open(path) as img:
            img.load()
            return img.copy()


#: ``RolloutRecord.extra`` key holding a video prompt's frames: one list of stored refs per video
VIDEO_FRAMES_KEY = "video_frames"
#: ``RolloutRecord.extra`` key: sampled frames per second of each video (a list, None where unknown); the
#: inspector times each frame with it
VIDEO_FPS_KEY = "video_fps"


def video_frame_refs(sample: Any, ref: Any) -> list[list[str]]:
    """Stored refs of the sampled frames of each video of ``sample`` (``sample.meta["videos"]``).

    ``ref``: image -> relative path (``ImageStore.put`` or a caching wrapper). Frames are content-addressed
    like images, so a clip shown to G rollouts over many steps is stored once. The trainer puts the result
    in ``RolloutRecord.extra[VIDEO_FRAMES_KEY]``; the inspector shows it as a frame strip beside the rollout.
    """
    return [[ref(frame) for frame in video["frames"]] for video in (getattr(sample, "meta", {}) or {}).get("videos") or []]
