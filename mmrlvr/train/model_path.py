"""Resolve ``model.path``: a local folder, or ``tiny:FAMILY[:warm[:TASK][:noiseP]]`` for the offline tiny VLM.

``tiny:qwen2_5_vl:warm`` builds (once) the tiny Qwen2.5-VL and its supervised warm start in the cache
(``$MMRLVR_CACHE`` or ``~/.cache/mmrlvr``) and returns that folder; later calls reuse it. A real
checkpoint is just a folder path — the same loading code runs for both.

``tiny:qwen2_5_vl:warm:noise0.9`` is the thinking–answer *inconsistent* warm start: the answer of 90% of
the SFT targets is randomised while the thinking stays correct (docs/consistency.md; what the consistency study and
``configs/consistency-tiny.yaml`` start from). It is cached beside the clean one (``...-warm-noise0.9``).

``tiny:qwen2_5_vl:warm:count_chatter`` warm-starts on another synthetic task (any of
``mmrlvr.data.synth.TASKS``; default ``count``), cached as ``...-warm-count_chatter``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mmrlvr.errors import UserError

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def cache_dir() -> Path:
    return Path(os.environ.get("MMRLVR_CACHE", Path.home() / ".cache" / "mmrlvr"))


def _noise_option(spec: str, option: str) -> float:
    """``noiseP`` -> P, the share of SFT targets whose answer is randomised (0 <= P <= 1)."""
    match = re.fullmatch(r"noise(\d*\.?\d+)", option)
    if match is None:
        raise UserError(f"model.path: {spec}: unknown option {option!r} (known: noiseP, e.g. noise0.9, or a "
                        f"synthetic task name to warm-start on)")
    value = float(match.group(1))
    if not 0.0 <= value <= 1.0:
        raise UserError(f"model.path: {spec}: answer noise must be in [0, 1], got {value:g}")
    return value


def tiny_spec(spec: str, *, task: str = "count", answer_noise: float = 0.0) -> tuple[str, bool, float, Path]:
    """(family, warm, answer_noise, cache folder) of a ``tiny:...`` spec; builds nothing.

    A ``noiseP`` option in the spec wins over the ``answer_noise`` argument.

    >>> family, warm, noise, folder = tiny_spec("tiny:qwen2_5_vl:warm:noise0.9")
    >>> family, warm, noise, folder.name
    ('qwen2_5_vl', True, 0.9, 'qwen2_5_vl-warm-noise0.9')
    """
    parts = spec.split(":")
    family = parts[1] if len(parts) > 1 else ""
    if family not in FAMILIES:
        raise UserError(f"model.path: {spec}: unknown tiny family {family!r}; known: {', '.join(FAMILIES)}")
    warm = len(parts) > 2 and parts[2] == "warm"
    if len(parts) > 2 and not warm:
        raise UserError(f"model.path: {spec}: expected tiny:FAMILY, tiny:FAMILY:warm or "
                        f"tiny:FAMILY:warm[:TASK][:noiseP]")
    task = spec_task(spec, task)
    for option in parts[3:]:
        if option != task:
            answer_noise = _noise_option(spec, option)
    suffix = "-warm" if warm else ""
    if warm and task != "count":
        suffix += f"-{task}"
    if answer_noise:
        suffix += f"-noise{answer_noise:g}"
    return family, warm, answer_noise, cache_dir() / "tiny" / f"{family}{suffix}"


def spec_task(spec: str, task: str = "count") -> str:
    """The synthetic task a ``tiny:FAMILY:warm[:TASK]...`` spec warm-starts on (``task`` when it names none).

    >>> spec_task("tiny:qwen2_5_vl:warm:count_chatter:noise0.5"), spec_task("tiny:qwen2_5_vl:warm")
    ('count_chatter', 'count')
    """
    from mmrlvr.data.synth import TASKS
    from mmrlvr.data.synth_video import VIDEO_TASKS

    return next((o for o in spec.split(":")[3:] if o in TASKS or o in VIDEO_TASKS), task)


def resolve_model_path(spec: str, *, task: str = "count", answer_noise: float = 0.0) -> str:
    if not spec.startswith("tiny:"):
        if not Path(spec).exists():
            raise UserError(f"model.path: {spec}: no such folder (nothing is downloaded; point to a local checkpoint)")
        return spec
    family, warm, answer_noise, out = tiny_spec(spec, task=task, answer_noise=answer_noise)
    task = spec_task(spec, task)
    # One builder per cache folder across processes (parallel test workers, several runs started at once): the
    # others wait for it and then reuse its result instead of building the same model again beside it.
    from mmrlvr.models.warmstart import BASE_TASKS, build_lock

    base = resolve_model_path(f"tiny:{family}:warm:{BASE_TASKS[task]}") if warm and task in BASE_TASKS else None
    with build_lock(out):
        if warm:
            from mmrlvr.models.warmstart import warm_start

            warm_start(out, family=family, task=task, answer_noise=answer_noise, base=base)
        elif not (out / "config.json").exists():
            from mmrlvr.models.tiny import build_tiny

            build_tiny(family, out)
    return str(out)
