"""Keep what a test file registers at run time inside that file.

A plug-in is imported once per process and its registrations stay (``mmrlvr.plugins``), which is what a run
wants. A test worker, though, runs many files one after the other, in an order xdist decides by timing: a file that
loads ``docs/examples/median_advantage.py`` left ``group_median`` in the advantage registry of every file its worker
ran next, and a test that lists the known estimators saw it or not depending on the order. ``Snapshot`` records
every registry of the imported ``mmrlvr`` modules and the plug-in modules loaded so far; ``restore`` puts them
back, so the next file starts from the built-ins and what collection registered (test modules that register at
import time, which every worker collects).
"""

from __future__ import annotations

import sys
from typing import Any


def _registries() -> list[Any]:
    """Every ``Registry`` a module of the imported ``mmrlvr`` package holds (directly, or in a dict of them)."""
    from mmrlvr.registry import Registry

    found: dict[int, Any] = {}
    for name, module in list(sys.modules.items()):
        if not (name == "mmrlvr" or name.startswith("mmrlvr.")) or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Registry):
                found[id(value)] = value
            elif isinstance(value, dict) and value and all(isinstance(v, Registry) for v in value.values()):
                found.update((id(v), v) for v in value.values())
    return list(found.values())


class Snapshot:
    """The registries' contents and the loaded plug-in modules, as they are now."""

    def __init__(self) -> None:
        from mmrlvr import plugins

        self._items = [(reg, dict(reg._items)) for reg in _registries()]  # noqa: SLF001 - a test helper
        self._modules = {k for k in sys.modules if k.startswith("mmrlvr_plugin_")}
        self._loaded = dict(plugins._LOADED)  # noqa: SLF001
        self._fallback = dict(plugins._FALLBACK)  # noqa: SLF001

    def restore(self) -> list[str]:
        """Put everything back; returns the names registered since (``kind: name``), for a message."""
        from mmrlvr import plugins

        added = []
        for reg, items in self._items:
            added += [f"{reg.kind}: {name}" for name in reg._items if name not in items]  # noqa: SLF001
            reg._items.clear()  # noqa: SLF001
            reg._items.update(items)  # noqa: SLF001
        for name in [k for k in sys.modules if k.startswith("mmrlvr_plugin_") and k not in self._modules]:
            del sys.modules[name]  # loaded again, it registers again
        for mine, saved in ((plugins._LOADED, self._loaded), (plugins._FALLBACK, self._fallback)):  # noqa: SLF001
            mine.clear()
            mine.update(saved)
        return added
