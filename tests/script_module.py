"""Load a script that is not a package module (``benchmarks/*.py``, ``demos/*.py``) as a module, for its tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """Execute the script at ``path`` as a fresh module (its ``main`` guard does not run) and return it."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
