"""Run folders: never clobbered, one writer at a time, resumed only with a config that keeps it exact.

- A folder that already holds a run (``config.yaml``, ``metrics.jsonl``, ``checkpoints/`` or
  ``rollouts/``) is refused unless the user says what to do with it: ``--resume`` continues it,
  ``--overwrite`` replaces it. A non-empty folder that is not a run is refused either way (an
  ``output_dir: .`` typo must not write into, or delete, a project).
- ``--overwrite`` removes the old run atomically: the folder is renamed away (one ``os.rename``), then
  deleted; a crash in between leaves a ``.NAME.overwritten-*`` folder that the next start deletes, never
  a half-deleted run under the run's name.
- ``--resume`` compares the stored ``config.yaml`` with the new config and refuses changes that break
  exactness (the resumed run would differ from an uninterrupted one), listing the keys;
  ``--allow-config-change`` accepts them. Keys in ``SAFE_TO_CHANGE`` never break it. A file plug-in whose
  sha256 differs from the one in ``plugins/manifest.json`` is refused the same way (``mmrlvr.plugins``).
- One writer per run folder: ``.mmrlvr.lock`` holds the pid, host and start time of the run that owns
  the folder and an ``fcntl.flock`` on it for the run's lifetime. A second run is refused with that
  information; the lock of a dead process (its flock is gone, and on this host its pid is not running)
  is taken over with a note.

API: ``check_run_dir(cfg, ...) -> list[str]`` (problems, nothing touched: what ``--dry-run`` reports) and
``prepare_run_dir(cfg, ...) -> RunDirLock`` (checks, removes an overwritten run, takes the lock);
``RunDirLock.release()`` when the run ends. In a multi-process run only rank 0 takes the lock.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmrlvr.errors import ConfigErrors, UserError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the pid check alone
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".mmrlvr.lock"
#: what makes a folder a run folder
RUN_MARKERS: tuple[str, ...] = ("config.yaml", "metrics.jsonl", "checkpoints", "rollouts", "events")
#: entries of a folder that do not make it a run or a user's folder (our lock, a leftover trash folder)
_IGNORED_PREFIXES: tuple[str, ...] = (LOCK_NAME,)
_TRASH_INFIX = ".overwritten-"

#: config keys (dotted; a trailing ``.*`` covers a section) a resumed run may change without breaking
#: exactness: where things are written, how often they are saved/evaluated/logged, and judge transport
SAFE_TO_CHANGE: tuple[str, ...] = (
    "output_dir", "max_steps", "save_every", "keep_checkpoints", "log_rollouts", "max_bad_steps",
    "tensorboard", "progress", "report_to", "trackers.*", "tracker.*", "eval.*", "data.eval", "data.eval_size",
    "data.eval_split", "rubric.judge_params.timeout", "rubric.judge_params.max_retries",
    "rubric.judge_params.concurrency", "rubric.judge_params.api_key", "rubric.judge_params.api_key_env",
    "rubric.judge_params.api_key_file", "rubric.warn_unknown_rate", "rubric.max_unknown_rate",
)


# ------------------------------------------------------------------------------------------ folder state
def _entries(path: Path) -> list[str]:
    try:
        return [e for e in os.listdir(path) if not e.startswith(_IGNORED_PREFIXES) and _TRASH_INFIX not in e]
    except OSError:
        return []


def is_run_dir(path: str | Path) -> bool:
    """True when ``path`` is a folder holding (part of) an mmrlvr run."""
    p = Path(path)
    return p.is_dir() and any((p / m).exists() for m in RUN_MARKERS)


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out  # an empty section is the same as an absent one
    if isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


def _safe(key: str) -> bool:
    for rule in SAFE_TO_CHANGE:
        if rule.endswith(".*") and (key == rule[:-2] or key.startswith(rule[:-1])):
            return True
        if key == rule:
            return True
    return False


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two config dicts and that break exact resumption.

    ``max_steps`` breaks it when the lr schedule is not constant (a linear or cosine schedule spans
    ``max_steps``, so every step's lr moves).

    >>> config_changes({"seed": 0, "max_steps": 10, "optim": {"lr": 1e-4}},
    ...                {"seed": 1, "max_steps": 20, "optim": {"lr": 1e-4}})
    ['seed']
    """
    a, b = _flatten(old), _flatten(new)
    keys = sorted(set(a) | set(b))
    changed = [k for k in keys if a.get(k, "<unset>") != b.get(k, "<unset>")]
    schedule = (new.get("optim") or {}).get("schedule", "constant")
    return [k for k in changed if not _safe(k) or (k == "max_steps" and schedule != "constant")]


# ------------------------------------------------------------------------------------------------- lock
def _host() -> str:
    return socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except (OSError, OverflowError):
        return False
    return True


def read_lock(run_dir: str | Path) -> dict[str, Any] | None:
    """The lock file's content (pid, host, started, argv), {} when unreadable, None when absent."""
    path = Path(run_dir) / LOCK_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        info = json.loads(text)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _describe_holder(info: dict[str, Any]) -> str:
    return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')} since {info.get('started', '?')}")


def _flock_free(path: Path) -> bool | None:
    """True when nobody holds an flock on ``path``, False when someone does, None when unknown."""
    if fcntl is None or not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops the probe's lock
    return True


def lock_problem(run_dir: str | Path) -> str | None:
    """Why ``run_dir`` is in use by another run, or None (free, ours, or a stale lock we may take over)."""
    run_dir = Path(run_dir)
    info = read_lock(run_dir)
    if info is None:
        return None
    if info.get("pid") == os.getpid() and info.get("host") == _host():
        return None  # this process already owns it
    free = _flock_free(run_dir / LOCK_NAME)
    same_host = info.get("host") == _host()
    if free is False or (free is None and same_host and isinstance(info.get("pid"), int)
                         and _pid_alive(info["pid"])):
        return (f"{run_dir} is in use by another run ({_describe_holder(info)}; lock file "
                f"{run_dir / LOCK_NAME}); wait for it to finish, stop it, or choose another output_dir")
    if not same_host and info.get("host"):
        return (f"{run_dir} is locked by a run on host {info.get('host')} ({_describe_holder(info)}); if that "
                f"run is over, delete {run_dir / LOCK_NAME}")
    return None


@dataclass
class RunDirLock:
    """The lock a run holds on its folder; ``release()`` (or leaving a ``with`` block) lets it go."""

    run_dir: Path
    fd: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    took_over: dict[str, Any] | None = None  # the stale lock's content when one was taken over

    @property
    def held(self) -> bool:
        return self.fd is not None

    def release(self) -> None:
        """Delete the lock file (if it is still ours) and drop the flock. Safe to call twice."""
        if self.fd is None:
            return
        path = self.run_dir / LOCK_NAME
        try:
            current = read_lock(self.run_dir)
            if current and current.get("pid") == self.info.get("pid") and current.get("host") == self.info.get("host"):
                path.unlink()
        except OSError:
            pass
        finally:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


_HELD: dict[str, RunDirLock] = {}  # run folder -> this process's lock (a second prepare_run_dir reuses it)


def acquire_lock(run_dir: str | Path) -> RunDirLock:
    """Take the folder's lock (creating the folder); raise ``UserError`` while another run holds it."""
    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    held = _HELD.get(key)
    if held is not None and held.held:
        return held
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    for _ in range(5):
        problem = lock_problem(run_dir)
        if problem:
            raise UserError(problem)
        previous = read_lock(run_dir)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # someone took it between the check and now: check again (and refuse)
            except OSError:
                pass  # a filesystem without flock: the pid check above is all we have
        try:  # the file we locked must still be the one at the path (not one a releaser just unlinked)
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                os.close(fd)
                continue
        except FileNotFoundError:
            os.close(fd)
            continue
        info = {"pid": os.getpid(), "host": _host(),
                "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "argv": list(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        os.fsync(fd)
        took_over = previous if previous else None
        if took_over is not None:
            print(f"run folder: took over the stale lock of a run that is no longer running "
                  f"({_describe_holder(took_over)})", file=sys.stderr)
        lock = RunDirLock(run_dir, fd, info, took_over)
        _HELD[key] = lock
        return lock
    raise UserError(f"{run_dir}: could not take the run lock {path} (another run keeps taking it)")


# --------------------------------------------------------------------------------------------- checks
def _output_dir_problems(run_dir: Path, key: str) -> list[str]:
    if run_dir.exists() and not run_dir.is_dir():
        return [f"{key}: {run_dir} is a file, not a folder; choose another output_dir or move the file"]
    parent = run_dir
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        return [f"{key}: {run_dir}: {parent} is a file, so the run folder cannot be created there"]
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return [f"{key}: {run_dir}: {parent} is not writable"]
    return []


def check_run_dir(cfg: Any, *, resume: bool = False, overwrite: bool = False, allow_config_change: bool = False,
                  where: str = "config") -> list[str]:
    """Problems with the run folder for this start (nothing is created, moved or locked).

    Only rank 0 of a multi-process run judges the folder: the other ranks start while rank 0 is creating
    and locking it.
    """
    if not _is_rank_zero():
        return []
    run_dir = Path(cfg.output_dir)
    key = f"{where}: output_dir"
    if resume and overwrite:
        return [f"{key}: --resume and --overwrite exclude each other (continue the run, or replace it)"]
    problems = _output_dir_problems(run_dir, key)
    if problems or not run_dir.is_dir():
        return problems
    held = lock_problem(run_dir)
    if held:
        return [f"{key}: {held}"]
    if is_run_dir(run_dir):
        if resume:
            return (_resume_problems(cfg, run_dir, key, allow_config_change)
                    + _plugin_resume_problems(cfg, run_dir, where, allow_config_change))
        if not overwrite:
            return [f"{key}: {run_dir} already holds a run; add --resume to continue it, or --overwrite to "
                    f"replace it (or choose another output_dir)"]
        return []
    if _entries(run_dir):
        return [f"{key}: {run_dir} is a non-empty folder that is not an mmrlvr run (no "
                f"{', '.join(RUN_MARKERS)}); refusing to write into or delete it: choose a new or empty folder"]
    return []


def _resume_problems(cfg: Any, run_dir: Path, key: str, allow_config_change: bool) -> list[str]:
    stored = run_dir / "config.yaml"
    if not stored.is_file() or allow_config_change:
        return []
    try:
        old = yaml.safe_load(stored.read_text()) or {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return [f"{key}: {stored} is unreadable, so the resumed config cannot be compared; "
                f"add --allow-config-change to resume anyway"]
    new = cfg.to_dict(redact=True) if hasattr(cfg, "to_dict") else dict(cfg)
    changed = config_changes(old if isinstance(old, dict) else {}, new)
    if not changed:
        return []
    shown = ", ".join(f"{k} ({_flatten(old).get(k, '<unset>')!r} -> {_flatten(new).get(k, '<unset>')!r})"
                      for k in changed[:12])
    more = f" and {len(changed) - 12} more" if len(changed) > 12 else ""
    return [f"{key}: --resume with a changed config breaks exactness: {shown}{more}; resume with the run's "
            f"config ({stored}), or add --allow-config-change to accept the change"]


def _plugin_resume_problems(cfg: Any, run_dir: Path, where: str, allow_config_change: bool) -> list[str]:
    """A file plug-in whose content (sha256) differs from the one the run recorded breaks exactness, as a
    changed config key does; ``--allow-config-change`` continues with the current file (the trainer notes it).
    A plug-in file gone from here is no problem: the run folder's copy is loaded (``mmrlvr.plugins``)."""
    plugins = list(getattr(cfg, "plugins", None) or [])
    if allow_config_change or not plugins:
        return []
    from mmrlvr.plugins import changed_run_plugins

    out = []
    for p in changed_run_plugins(run_dir, plugins):
        i = plugins.index(p.spec)
        out.append(f"{where}: plugins[{i}]: --resume with a changed plug-in breaks exactness: {p.spec} "
                   f"({p.path}) has sha256 {p.current_sha[:12]}, the run recorded {p.recorded_sha[:12]} "
                   f"(its copy: {p.copy}); restore the run's file, or add --allow-config-change to continue "
                   f"with the current one")
    return out


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") in ("", "0") and os.environ.get("LOCAL_RANK", "0") in ("", "0")


def _remove_trash(run_dir: Path) -> None:
    """Delete ``.NAME.overwritten-*`` folders left by an overwrite that was killed mid-delete."""
    parent = run_dir.parent
    prefix = f".{run_dir.name}{_TRASH_INFIX}"
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        shutil.rmtree(parent / name, ignore_errors=True)


def remove_run(run_dir: str | Path) -> None:
    """Remove a run folder atomically: rename it away in one step, then delete the renamed copy."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return
    trash = run_dir.parent / f".{run_dir.name}{_TRASH_INFIX}{os.getpid()}-{_dt.datetime.now().strftime('%H%M%S%f')}"
    os.rename(run_dir, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prepare_run_dir(cfg: Any, resume: bool = False, overwrite: bool = False,
                    allow_config_change: bool = False, *, where: str = "config") -> RunDirLock:
    """Check the run folder, replace it when ``overwrite``, and take its lock; call before loading a model.

    Raises ``ConfigErrors`` (one line each) when the folder is in the way. Calling it again in the same
    process returns the lock already held (so the CLI and the trainer may both call it).
    """
    run_dir = Path(cfg.output_dir)
    if not _is_rank_zero():
        return RunDirLock(run_dir)
    key = str(run_dir.resolve())
    if key in _HELD and _HELD[key].held:
        return _HELD[key]
    problems = check_run_dir(cfg, resume=resume, overwrite=overwrite, allow_config_change=allow_config_change,
                             where=where)
    if problems:
        raise ConfigErrors(problems)
    _remove_trash(run_dir)
    if overwrite and is_run_dir(run_dir):
        old = acquire_lock(run_dir)  # refuses while another run writes there
        try:
            remove_run(run_dir)
        finally:
            old.release()
            _HELD.pop(key, None)
    return acquire_lock(run_dir)
