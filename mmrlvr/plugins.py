"""Load user plug-ins named in a config's ``plugins:`` list, so their registrations run.

A plug-in is a module path (``my_pkg.rewards``) or a file (``path/to/my_advantage.py``) whose import
registers rewards, losses, advantage estimators, credit schemes or stages (see docs/architecture.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from mmrlvr.errors import UserError


def load_plugins(plugins: list[str]) -> None:
    """Import user modules (``pkg.module``) or files (``path/to/rewards.py``); each file is imported once."""
    for spec in plugins:
        if spec.endswith(".py"):
            path = Path(spec)
            if not path.is_file():
                raise UserError(f"plugins: {spec}: no such file")
            name = f"mmrlvr_plugin_{path.stem}"
            if name in sys.modules:
                continue
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            try:
                mod_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)  # a failed plug-in is not half-registered under its name
                raise
        else:
            try:
                importlib.import_module(spec)
            except ImportError as exc:
                raise UserError(f"plugins: cannot import {spec!r}: {exc}") from None
