"""Atomic file writes: write a temp file next to the target, flush + fsync, then ``os.replace``.

A reader (the inspector, ``--resume``) therefore sees either the old file or the complete new one, never a
half-written file. Temp files are named ``.<name>.tmp-<pid>-<random>`` in the target's folder (same file
system, so the rename is atomic); readers that glob ``step-*.parquet`` never match them. A crash can leave
such a temp file behind; ``remove_stale_temp_files`` cleans them up.
"""

from __future__ import annotations

import json
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

TEMP_MARKER = ".tmp-"


def temp_path_for(path: str | os.PathLike[str]) -> Path:
    """A unique temp path in the same folder as ``path`` (hidden, never matching ``*.parquet`` globs)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARKER}{os.getpid()}-{uuid.uuid4().hex[:12]}")


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """Yield a temp path to write to; on success it replaces ``path`` atomically, on error it is removed.

    >>> with atomic_path("out.parquet") as tmp:          # doctest: +SKIP
    ...     pq.write_table(table, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        yield tmp
        if fsync:
            _fsync_file(tmp)
        os.replace(tmp, path)
        if fsync:
            _fsync_dir(path.parent)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically. Returns ``path``."""
    with atomic_path(path, fsync=fsync) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8",
                      fsync: bool = True) -> Path:
    """Write ``text`` to ``path`` atomically. Returns ``path``."""
    return atomic_write_bytes(path, text.encode(encoding), fsync=fsync)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2,
                      fsync: bool = True) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (keys sorted, so files diff cleanly)."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n", fsync=fsync)


def remove_stale_temp_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete temp files left in ``folder`` by a crashed writer (call only when no writer is running)."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        if p.name.startswith(".") and TEMP_MARKER in p.name and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders can't be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
