"""Load user plug-ins named in a config's ``plugins:`` list, so their registrations run.

A plug-in is a module path (``my_pkg.rewards``) or a file (``path/to/my_advantage.py``) whose import
registers rewards, losses, advantage estimators, credit schemes or stages (see docs/architecture.md).

Plug-ins travel with the run: at its start (rank 0) every file plug-in is copied into
``RUN_DIR/plugins/<stem>.py`` and ``RUN_DIR/plugins/manifest.json`` records each plug-in (the spec as typed,
the resolved source file, the copy, sha256; a module plug-in's name and, when importable, its file and that
file's sha256: modules are recorded, not copied) — ``save_run_plugins``. Whatever reloads a run from its
folder (eval of a run or checkpoint, resume) loads plug-ins with ``load_run_plugins`` (export builds no
reward, loss or stage and imports none): a file plug-in whose typed path does not exist here is taken
relative to the folder the run was started from, then from the run folder's copy.
A file plug-in is imported as ``mmrlvr_plugin_<stem of the typed path>`` wherever it is loaded from, so its
registrations run once per process.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError

PLUGIN_DIR = "plugins"  # RUN_DIR/plugins: the copies and the manifest
MANIFEST = "manifest.json"
MANIFEST_VERSION = 1

#: typed file spec -> the file to load when the typed path does not exist here (``use_run_plugins`` sets it)
_FALLBACK: dict[str, Path] = {}
#: typed file spec -> the resolved file this process loaded it from (what ``save_run_plugins`` copies)
_LOADED: dict[str, Path] = {}


def is_file_plugin(spec: str) -> bool:
    return spec.endswith(".py")


def plugin_module_name(spec: str) -> str:
    """The module a file plug-in is imported as: from the *typed* name, so the typed file and the run
    folder's copy (which keeps the stem, or gets ``<stem>_2.py`` on a clash) are one module per process."""
    return f"mmrlvr_plugin_{Path(spec).stem}"


def load_plugins(plugins: list[str]) -> None:
    """Import user modules (``pkg.module``) or files (``path/to/rewards.py``); each file is imported once."""
    for spec in plugins:
        if spec.endswith(".py"):
            path = Path(spec)
            if not path.is_file():
                path = _FALLBACK.get(spec, path)  # a run's plug-in gone from here: its start folder or copy
            if not path.is_file():
                raise UserError(f"plugins: {spec}: no such file")
            name = plugin_module_name(spec)
            if name in sys.modules:
                _LOADED.setdefault(spec, path.resolve())
                continue
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            try:
                mod_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)  # a failed plug-in is not half-registered under its name
                raise
            _LOADED[spec] = path.resolve()
        else:
            try:
                importlib.import_module(spec)
            except ImportError as exc:
                raise UserError(f"plugins: cannot import {spec!r}: {exc}") from None


# ------------------------------------------------------------------------------------ plug-ins of a run
def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _short(sha: str | None) -> str:
    return (sha or "?")[:12]


def read_manifest(run_dir: str | Path) -> dict[str, Any] | None:
    """``RUN_DIR/plugins/manifest.json`` as a dict, None when absent or unreadable (a run made before it)."""
    try:
        data = json.loads((Path(run_dir) / PLUGIN_DIR / MANIFEST).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("plugins"), list) else None


def _entries(manifest: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {e["spec"]: e for e in (manifest or {}).get("plugins", []) if isinstance(e, dict) and "spec" in e}


def _module_file(name: str) -> str | None:
    """The file a module plug-in resolves to (its ``__init__.py`` for a package), None when not importable."""
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        origin = found.origin if found is not None and found.has_location else None
    return str(Path(origin).resolve()) if origin and Path(origin).is_file() else None


def save_run_plugins(run_dir: str | Path, plugins: list[str], *, resume: bool = False) -> dict[str, Any] | None:
    """Copy the file plug-ins into ``RUN_DIR/plugins/`` and write its ``manifest.json`` (atomic writes).

    Call at each start of a run (rank 0), after its plug-ins were loaded: the copy is the file this process
    loaded (``_LOADED``), else the typed path. On a resume whose plug-in was loaded from the run folder's
    own copy (the original is gone) the entry is kept as it was; a resume keeps the folder the run was first
    started from (``started_from``), a fresh start records the current one. Returns the manifest written
    (None: the run has no plug-ins and never had).
    """
    from mmrlvr.store.atomic import atomic_write_bytes, atomic_write_json

    run_dir = Path(run_dir)
    folder = run_dir / PLUGIN_DIR
    old = read_manifest(run_dir)
    if not plugins and old is None:
        return None
    if not resume:
        old = None  # a new run (or one that replaced an older run): nothing of an older manifest is kept
    old_entries = _entries(old)
    started_from = (old or {}).get("started_from") or os.getcwd()
    taken: set[str] = set()
    entries: list[dict[str, Any]] = []
    for spec in plugins:
        prev = old_entries.get(spec)
        if not is_file_plugin(spec):
            file = _module_file(spec)
            entries.append({"spec": spec, "kind": "module", "module": spec, "file": file,
                            "sha256": file_sha256(file) if file else None})
            continue
        src = _LOADED.get(spec)
        if src is None or not src.is_file():
            src = Path(spec) if Path(spec).is_file() else _FALLBACK.get(spec)
        if src is None or not src.is_file():
            raise UserError(f"plugins: {spec}: no such file")
        src = src.resolve()
        if folder.resolve() == src.parent and prev is not None:  # loaded from the run's own copy: keep it
            taken.add(Path(prev["copy"]).name)
            entries.append(prev)
            continue
        name = Path(prev["copy"]).name if prev and prev.get("copy") else f"{Path(spec).stem}.py"
        stem, n = Path(spec).stem, 2
        while name in taken or name == MANIFEST:
            name, n = f"{stem}_{n}.py", n + 1
        taken.add(name)
        data = src.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        dest = folder / name
        if not (dest.is_file() and file_sha256(dest) == sha):
            atomic_write_bytes(dest, data)
        entries.append({"spec": spec, "kind": "file", "module": plugin_module_name(spec), "source": str(src),
                        "copy": f"{PLUGIN_DIR}/{name}", "sha256": sha})
    manifest = {"version": MANIFEST_VERSION, "started_from": started_from, "plugins": entries}
    atomic_write_json(folder / MANIFEST, manifest)
    return manifest


@dataclass
class RunPlugin:
    """Where a run's file plug-in is found now, and whether it is still the file the run recorded."""

    spec: str
    path: Path | None  # the file to load; None: nowhere (not here, not in the run folder)
    origin: str  # "typed" (as typed, from here), "started_from", "source", "copy" or "missing"
    recorded_sha: str | None = None  # the manifest's sha256 (None: no manifest entry)
    current_sha: str | None = None  # sha256 of ``path`` when it is not the run's copy
    copy: Path | None = None  # the run folder's copy, when it has one

    @property
    def changed(self) -> bool:
        return bool(self.recorded_sha and self.current_sha and self.recorded_sha != self.current_sha)


def resolve_run_plugins(run_dir: str | Path, plugins: list[str]) -> list[RunPlugin]:
    """Where each *file* plug-in of a run is loaded from: the typed path (relative to here), else relative to
    the folder the run was started from (the manifest's ``started_from``) or the recorded source file, else
    the run folder's copy. Module plug-ins are left out (imported by name, never copied)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    entries = _entries(manifest)
    started = (manifest or {}).get("started_from")
    out: list[RunPlugin] = []
    for spec in plugins:
        if not is_file_plugin(spec):
            continue
        entry = entries.get(spec, {})
        copy = run_dir / entry["copy"] if entry.get("copy") else None
        candidates: list[tuple[str, Path]] = [("typed", Path(spec))]
        if started and not Path(spec).is_absolute():
            candidates.append(("started_from", Path(started) / spec))
        if entry.get("source"):
            candidates.append(("source", Path(entry["source"])))
        if copy is not None:
            candidates.append(("copy", copy))
        origin, path = next(((o, p) for o, p in candidates if p.is_file()), ("missing", None))
        current = file_sha256(path) if path is not None and origin != "copy" else None
        out.append(RunPlugin(spec, path, origin, entry.get("sha256"), current,
                             copy if copy is not None and copy.is_file() else None))
    return out


def changed_run_plugins(run_dir: str | Path, plugins: list[str]) -> list[RunPlugin]:
    """The file plug-ins whose current file differs (sha256) from the one the run recorded."""
    return [p for p in resolve_run_plugins(run_dir, plugins) if p.changed]


def use_run_plugins(run_dir: str | Path, plugins: list[str], *, resume: bool = False) -> list[str]:
    """Point ``load_plugins`` at a run's files (nothing imported): a file plug-in missing here is loaded from
    the run's start folder or its copy. Returns notes (a copy used, a file changed since the run)."""
    notes: list[str] = []
    for p in resolve_run_plugins(run_dir, plugins):
        if p.path is None:
            continue  # load_plugins names it: no such file
        if p.origin != "typed":
            _FALLBACK[p.spec] = p.path
        if p.origin == "copy":
            notes.append(f"plugins: {p.spec} is not found here nor where the run started; loading the run "
                         f"folder's copy {p.path}")
        elif p.changed:
            what = "the run continues with the current file" if resume else "using the current file"
            notes.append(f"plugins: {p.spec} changed since the run recorded it (sha256 {_short(p.recorded_sha)} "
                         f"-> {_short(p.current_sha)}); {what}")
    if resume:
        for spec, entry in _entries(read_manifest(run_dir)).items():
            if entry.get("kind") == "module" and spec in plugins and entry.get("sha256"):
                file = _module_file(spec)
                if file and file_sha256(file) != entry["sha256"]:
                    notes.append(f"plugins: module {spec} ({file}) changed since the run recorded it (sha256 "
                                 f"{_short(entry['sha256'])} -> {_short(file_sha256(file))}); modules are not "
                                 f"copied, the run continues with the installed one")
    return notes


def load_run_plugins(run_dir: str | Path, plugins: Any, *, resume: bool = False, quiet: bool = False) -> list[str]:
    """Load the plug-ins of a run reloaded from its folder (eval, resume): ``use_run_plugins``, then
    ``load_plugins``. ``plugins``: the list, or a config with ``.plugins``. Notes go to stderr (rank 0)."""
    specs = list(getattr(plugins, "plugins", plugins) or [])
    notes = use_run_plugins(run_dir, specs, resume=resume)
    if not quiet and os.environ.get("RANK", "0") in ("", "0"):
        for note in notes:
            print(f"note: {note}", file=sys.stderr, flush=True)
    load_plugins(specs)
    return notes
