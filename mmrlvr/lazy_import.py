"""A module that is imported on first use, so a module can name torch without paying for it at import.

The stage modules (``mmrlvr.train.stages``) hold both a stage's *selection* (which config keys choose it, what it
checks) and its *work* (tensors). Selection runs at config-check time, where a mistake must be reported in
milliseconds, without torch; the work runs in a training step, long after torch is loaded. ``torch =
lazy_module("torch")`` lets the same module serve both: ``torch.where(...)`` imports torch on its first call.

Deliberately not ``importlib.util.LazyLoader``: that puts a placeholder under ``sys.modules["torch"]``, and the
config checks test exactly that key to prove no heavy package was imported.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for module ``name``; any attribute access imports it (once) and reads the attribute from it."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_module(name: str) -> Any:
    """``LazyModule(name)``, typed as ``Any`` so ``torch.Tensor`` etc. type-check as the module's attributes."""
    return LazyModule(name)
