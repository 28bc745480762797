"""Checkpoints that a crash cannot half-write, and resuming from the last complete one.

A checkpoint is a folder ``checkpoints/step-{k:08d}/`` holding the trainable weights (the LoRA adapter
or all weights), the optimizer and scheduler states, every RNG state and ``state.json``. It is written
under a temporary name and renamed into place in one ``os.replace``, so a folder with the final name is
always complete. The data position needs no state: ``DataOrder`` derives each step's prompts from
(seed, step), and sampling is seeded per (seed, step, prompt, sample).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrlvr.store.atomic import atomic_write_json

_STEP_DIR = re.compile(r"^step-(\d{8})$")


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters that receive gradients (LoRA adapter weights, or every weight for full fine-tuning)."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, extra: dict[str, Any], keep: int = 2) -> Path:
    """Write ``checkpoints/step-{step}`` atomically; prune all but the newest ``keep``."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(trainable_state(model), tmp / "trainable.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    atomic_write_json(tmp / "state.json", {"step": step, **extra})
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders are ignored)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: p.name)


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and RNG from ``path``; returns ``state.json``."""
    import json

    _copy_trainable(model, path)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False))
    set_rng_state(torch.load(path / "rng.pt", map_location="cpu", weights_only=False))
    return json.loads((path / "state.json").read_text())


def load_trainable_into(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    """Apply a checkpoint's trainable weights to a freshly loaded base model (for eval / export).

    A LoRA checkpoint's names carry peft prefixes; the adapter is re-created from ``state.json``'s config
    before loading, so ``mmrlvr eval --adapter runs/x/checkpoints/step-N`` works without the trainer.
    """
    import json

    info = json.loads((Path(path) / "state.json").read_text())
    lora = info.get("lora")
    if lora:
        from mmrlvr.models.lora import apply_lora

        model = apply_lora(model, **lora)
    _copy_trainable(model, Path(path))
    return model


def _copy_trainable(model: torch.nn.Module, path: Path) -> None:
    """Copy ``path/trainable.pt`` into the model's parameters of the same names (errors name a misfit)."""
    state = torch.load(path / "trainable.pt", map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    missing = [n for n in state if n not in params]
    if missing:
        raise RuntimeError(f"{path}: checkpoint has weights this model lacks, e.g. {missing[0]}")
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t.to(params[n].device, params[n].dtype))
