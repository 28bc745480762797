"""A disk cache of raw judge outputs, so re-scoring the same response never pays for the judge twice.

Key: a hash of (prompt version, judge identity, criterion text + check, the response section shown,
question, reference, image hashes, vote index) - exactly what determines the judge's answer. Value: the
judge's raw output text; verdicts are re-parsed on read, so a fix to the parser applies to cached entries.
Only outputs that arrived are stored: a timeout or a server error is retried next time, not remembered.

SQLite gives atomic writes (each ``put`` is one transaction, WAL journal), safe use from the judge's
worker threads (one connection guarded by a lock) and from several processes on one file (DDP ranks wait
on the file lock via ``timeout``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any


def cache_key(*parts: Any) -> str:
    """A stable SHA-256 of JSON-serialisable parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class VerdictCache:
    """``get(key) -> raw text | None`` and ``put(key, raw, identity)`` on one SQLite file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS outputs (key TEXT PRIMARY KEY, raw TEXT NOT NULL, "
                         "judge TEXT NOT NULL, created REAL DEFAULT (julianday('now')))")

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT raw FROM outputs WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, raw: str, judge: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO outputs (key, raw, judge) VALUES (?, ?, ?)", (key, raw, judge))

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM outputs").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
