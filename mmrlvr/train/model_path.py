"""Resolve ``model.path``: a local folder, or ``tiny:FAMILY[:warm]`` for the offline tiny VLM.

``tiny:qwen2_5_vl:warm`` builds (once) the tiny Qwen2.5-VL and its supervised warm start in the cache
(``$MMRLVR_CACHE`` or ``~/.cache/mmrlvr``) and returns that folder; later calls reuse it. A real
checkpoint is just a folder path — the same loading code runs for both.
"""

from __future__ import annotations

import os
from pathlib import Path

from mmrlvr.errors import UserError

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def cache_dir() -> Path:
    return Path(os.environ.get("MMRLVR_CACHE", Path.home() / ".cache" / "mmrlvr"))


def resolve_model_path(spec: str, *, task: str = "count", answer_noise: float = 0.0) -> str:
    if not spec.startswith("tiny:"):
        if not Path(spec).exists():
            raise UserError(f"model.path: {spec}: no such folder (nothing is downloaded; point to a local checkpoint)")
        return spec
    parts = spec.split(":")
    family = parts[1] if len(parts) > 1 else ""
    if family not in FAMILIES:
        raise UserError(f"model.path: {spec}: unknown tiny family {family!r}; known: {', '.join(FAMILIES)}")
    warm = len(parts) > 2 and parts[2] == "warm"
    suffix = "-warm" if warm else ""
    if warm and task != "count":
        suffix += f"-{task}"
    if answer_noise:
        suffix += f"-noise{answer_noise:g}"
    out = cache_dir() / "tiny" / f"{family}{suffix}"
    if warm:
        from mmrlvr.models.warmstart import warm_start

        warm_start(out, family=family, task=task, answer_noise=answer_noise)
    elif not (out / "config.json").exists():
        from mmrlvr.models.tiny import build_tiny

        build_tiny(family, out)
    return str(out)
