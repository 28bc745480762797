"""The product stands alone: nothing in the package, configs, docs, benchmarks or README cites a document
that is not part of the repository (planning notes kept outside it, which a reader has nowhere to find).

Tests may mention anything; they are not scanned.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("mmrlvr", "configs", "docs", "benchmarks", "README.md")
CITATION = re.compile(r"METHODS|STACK\.md|DESIGN\.md|\.\./shared")
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def _text_files():
    for name in SCANNED:
        top = ROOT / name
        if top.is_file():
            yield top
            continue
        for path in sorted(top.rglob("*")):
            if path.is_file() and not SKIP_DIRS.intersection(path.relative_to(ROOT).parts):
                yield path


def _hits() -> list[str]:
    hits = []
    for path in _text_files():
        data = path.read_bytes()
        if b"\0" in data:  # images and other binary files
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if CITATION.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    return hits


def test_scanned_paths_exist():
    assert all((ROOT / name).exists() for name in SCANNED)


def test_no_citation_of_documents_outside_the_repository():
    hits = _hits()
    if hits:
        print("\n".join(hits))
    assert not hits, (f"{len(hits)} line(s) cite a document outside the repository (state the fact, or point "
                      "at docs/ instead):\n" + "\n".join(hits))
