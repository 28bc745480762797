"""Checkpoints in the ecosystem's format that prove themselves, and resuming from the newest good one.

A checkpoint is a folder ``checkpoints/step-{k:08d}/`` that other tools open as it is:

- the weights as their library writes them: a LoRA run's peft adapter (``adapter_config.json`` +
  ``adapter_model.safetensors``, what ``PeftModel.save_pretrained`` writes), a full fine-tuning run's
  ``save_pretrained`` folder (``config.json`` + ``model.safetensors``), or ``trainable.safetensors`` for a
  plain ``torch.nn.Module``;
- the processor and chat template (``processor.save_pretrained``, or copied from the model's folder);
- ``training_state/``: optimizer, scheduler and RNG states as accelerate's ``save_state`` writes them
  (``accelerate.checkpointing.save_accelerator_state``; ``optimizer.bin``, ``scheduler.bin``,
  ``random_states_0.pkl``), so a later FSDP2 save (torch.distributed.checkpoint shards written by each
  rank) drops into the same folder;
- ``state.json``: step, config hash, LoRA settings, base model folder and the adaptive reward state;
- ``manifest.json``, written LAST: the size and SHA-256 of every other file.

The folder is written under ``.tmp-step-...-PID`` and renamed into place in one ``os.replace``, so a folder
with the final name is complete when written; the manifest catches what happens to it afterwards (a
truncated or edited file, a disk error). ``list_checkpoints`` verifies the newest checkpoints against
their manifests, skips (and names, with the reason) any that fail, and removes temporary folders left by
killed writers. The data position needs no state: ``DataOrder`` derives each step's prompts from
(seed, step), and sampling is seeded per (seed, step, prompt, sample).

Checkpoints of the first format (``trainable.pt`` + ``optimizer.pt`` + ``rng.pt``, no manifest) still
resume.

Sharded runs (``distributed.strategy: fsdp2``, parameters are DTensors): ``save_distributed`` (called by
EVERY rank) writes the weights and optimizer state with ``torch.distributed.checkpoint`` into
``sharded/`` (each rank writes its own ``__R_0.distcp``, rank 0 the ``.metadata``; trainable weights
only, so a LoRA run stores its adapter), plus ``training_state/scheduler.bin`` and one
``random_states_R.pkl`` per rank, and ``state.json`` with ``"weights": "dcp"``, ``world_size`` and
``strategy``; then the same manifest, rename and pruning. ``load_checkpoint`` reads it at any world size:
DCP reshards by global offsets, so a 2-rank checkpoint resumes on 2 ranks exactly, on 1 process (plain
tensors) or on 4; the RNG files of the saving ranks are used when the sizes match. ``mmrlvr export``
consolidates such a checkpoint into a plain ``save_pretrained`` folder (``load_weights`` reads DCP into
an unsharded model without a process group).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrlvr.errors import UserError
from mmrlvr.store.atomic import atomic_write_json

_STEP_DIR = re.compile(r"^step-(\d{8})$")
_TMP_DIR = re.compile(r"^\.tmp-step-\d{8}-(\d+)$")
MANIFEST = "manifest.json"
STATE = "state.json"
STAGE_STATE = "stage_state.pt"
TRAINING_STATE = "training_state"
SHARDED = "sharded"  # torch.distributed.checkpoint folder of a sharded (FSDP2) run
FORMAT_VERSION = 2
# processor / tokenizer / chat template files copied from the model folder when no processor is given
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
                   "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.json", "chat_template.jinja")


class CheckpointError(UserError):
    """A checkpoint that does not verify or cannot be read (names the folder, file and reason)."""


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _say(message: str) -> None:
    if _is_main():
        print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- weights
def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters that receive gradients (LoRA adapter weights, or every weight for full fine-tuning)."""
    return {n: p.detach().cpu().clone().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _is_peft(model: torch.nn.Module) -> bool:
    from mmrlvr.models.lora import is_peft_model

    return is_peft_model(model)


def _is_pretrained(model: torch.nn.Module) -> bool:
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def weights_kind(folder: Path) -> str:
    """``dcp`` | ``peft`` | ``transformers`` | ``safetensors`` | ``legacy`` for a checkpoint folder's weights."""
    folder = Path(folder)
    if (folder / SHARDED / ".metadata").is_file():
        return "dcp"
    if (folder / "adapter_config.json").is_file():
        return "peft"
    if (folder / "config.json").is_file():
        return "transformers"
    if (folder / "trainable.safetensors").is_file():
        return "safetensors"
    if (folder / "trainable.pt").is_file():
        return "legacy"
    raise CheckpointError(f"{folder}: no weights (adapter_config.json, config.json, trainable.safetensors "
                          "or trainable.pt)")


def model_source(model: torch.nn.Module) -> str | None:
    """The local folder the (base) model was loaded from, if any."""
    if _is_peft(model):
        cfg = next(iter(model.peft_config.values()), None)
        base = getattr(cfg, "base_model_name_or_path", None)
        if base:
            return str(base)
        model = model.get_base_model()
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if name else None


@contextlib.contextmanager
def quiet_progress():
    """No "Writing model shards" bar per checkpoint in the training log."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def save_weights(model: torch.nn.Module, folder: Path) -> str:
    """Write the model's weights the way its library does; returns the kind (see ``weights_kind``)."""
    folder = Path(folder)
    if _is_peft(model) or _is_pretrained(model):
        with quiet_progress():
            model.save_pretrained(str(folder), safe_serialization=True)
        return "peft" if _is_peft(model) else "transformers"
    from safetensors.torch import save_file

    save_file(trainable_state(model), str(folder / "trainable.safetensors"))
    return "safetensors"


def save_processor(folder: Path, processor: Any = None, source: str | None = None) -> None:
    """The processor and chat template beside the weights (``processor.save_pretrained`` or a file copy)."""
    if processor is not None and hasattr(processor, "save_pretrained"):
        processor.save_pretrained(str(folder))
        return
    if source and Path(source).is_dir():
        for name in PROCESSOR_FILES:
            src = Path(source) / name
            if src.is_file() and not (Path(folder) / name).exists():
                shutil.copy2(src, Path(folder) / name)


def load_weights(model: torch.nn.Module, folder: Path) -> None:
    """Copy a checkpoint's saved weights into ``model`` in place (same architecture; names must match)."""
    folder = Path(folder)
    kind = weights_kind(folder)
    if kind == "dcp":
        _load_dcp(folder, model, None)
        return
    if kind == "legacy":
        state = torch.load(folder / "trainable.pt", map_location="cpu", weights_only=True)
        _copy_named(model, state, folder / "trainable.pt")
        return
    if kind == "peft":
        if not _is_peft(model):
            raise CheckpointError(f"{folder}: a LoRA adapter checkpoint, but the model has no LoRA adapter "
                                  "(was model.lora.enabled changed?)")
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        state = load_file(str(folder / "adapter_model.safetensors"))
        before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        result = set_peft_model_state_dict(model, state)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise CheckpointError(f"{folder}: adapter weights this model lacks, e.g. {unexpected[0]}")
        if before and len(state) < len(before):
            raise CheckpointError(f"{folder}: the adapter has {len(state)} tensors, the model trains {len(before)} "
                                  "(was model.lora changed?)")
        return
    if kind == "transformers":
        if _is_peft(model):
            raise CheckpointError(f"{folder}: a full fine-tuning checkpoint, but the model has a LoRA adapter "
                                  "(was model.lora.enabled changed?)")
        if not _is_pretrained(model):
            raise CheckpointError(f"{folder}: a transformers checkpoint for a plain torch module")
        # from_pretrained applies transformers' own key conversions (saved names differ from module names)
        dtype = next(model.parameters()).dtype
        with quiet_progress():
            saved = type(model).from_pretrained(str(folder), dtype=dtype, local_files_only=True)
        _copy_named(model, saved.state_dict(), folder / "model.safetensors")
        return
    from safetensors.torch import load_file

    _copy_named(model, load_file(str(folder / "trainable.safetensors")), folder / "trainable.safetensors")


def _copy_named(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Copy ``state`` into the model's tensors of the same names; every trainable parameter must be covered."""
    targets = model.state_dict(keep_vars=True)
    missing = [n for n in state if n not in targets]
    if missing:
        raise CheckpointError(f"{where}: checkpoint has weights this model lacks, e.g. {missing[0]}")
    covered: set[int] = set()
    with torch.no_grad():
        for n, t in state.items():
            dst = targets[n]
            if tuple(dst.shape) != tuple(t.shape):
                raise CheckpointError(f"{where}: {n} has shape {tuple(t.shape)}, the model {tuple(dst.shape)}")
            dst.copy_(t.to(dst.device, dst.dtype))
            covered.add(id(dst))
    uncovered = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in covered]
    if uncovered:
        raise CheckpointError(f"{where}: no saved value for trainable weight {uncovered[0]}")


# ------------------------------------------------------------------------------------------ manifest
def _sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path, step: int) -> Path:
    """``manifest.json``: size and SHA-256 of every file under ``folder`` (call it last)."""
    folder = Path(folder)
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(folder).as_posix()
            files[rel] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    return atomic_write_json(folder / MANIFEST, {"format": "mmrlvr-checkpoint", "version": FORMAT_VERSION,
                                                 "step": step, "files": files})


def verify_checkpoint(folder: Path, *, checksums: bool = True) -> str | None:
    """None when ``folder`` matches its manifest, else the reason it does not (missing, size, checksum).

    ``checksums=False`` checks presence and sizes only (cheap). A first-format checkpoint (``trainable.pt``,
    no manifest) cannot be verified and passes when its four files are present.
    """
    folder = Path(folder)
    if not (folder / MANIFEST).exists():
        legacy = ("trainable.pt", "optimizer.pt", "scheduler.pt", "rng.pt", STATE)
        if (folder / "trainable.pt").exists():
            absent = [n for n in legacy if not (folder / n).is_file()]
            return f"missing {absent[0]}" if absent else None
        return "no manifest.json (an incomplete or foreign folder)"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("empty file list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest.json ({type(exc).__name__}: {exc})"
    for rel, meta in files.items():
        path = folder / rel
        if not path.is_file():
            return f"missing {rel}"
        size = path.stat().st_size
        if size != meta.get("size"):
            return f"{rel} has {size} bytes, the manifest says {meta.get('size')}"
        if checksums and _sha256(path) != meta.get("sha256"):
            return f"{rel} does not match its SHA-256 in manifest.json"
    if STATE not in files:
        return f"the manifest lists no {STATE}"
    return None


# --------------------------------------------------------------------------------------- save / list
def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete ``checkpoints/.tmp-step-*-PID`` folders whose writer is gone (a kill during a save)."""
    root = Path(run_dir) / "checkpoints"
    removed: list[Path] = []
    if not root.is_dir() or not _is_main():
        return removed
    for p in root.iterdir():
        m = _TMP_DIR.match(p.name)
        if m and p.is_dir() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    if removed:
        _say(f"checkpoints: removed {len(removed)} unfinished temporary folder(s) of a killed save: "
             + ", ".join(p.name for p in removed))
    return removed


def _step_folders(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)), key=lambda p: p.name)


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, extra: dict[str, Any], keep: int = 2, *, processor: Any = None,
                    stage_state: dict[str, Any] | None = None) -> Path:
    """Write ``checkpoints/step-{step}`` atomically (manifest last); prune all but the newest ``keep``.

    ``processor``: saved with ``save_pretrained``; when None, the processor / tokenizer / chat template
    files are copied from the folder the model was loaded from. ``stage_state``: the state of the step's stages
    and methods (samplers, POPO's predictor, POISE's probe: ``Pipeline.state_dict``), in
    ``training_state/stage_state.pt``.
    """
    from accelerate.checkpointing import save_accelerator_state

    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(run_dir)  # leftovers of a save that was killed (its writer is gone)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    kind = save_weights(model, tmp)
    source = model_source(model)
    save_processor(tmp, processor, source)
    (tmp / TRAINING_STATE).mkdir()
    save_accelerator_state(str(tmp / TRAINING_STATE), [], [optimizer], [scheduler], [], process_index=0, step=step)
    if stage_state:
        torch.save(stage_state, tmp / TRAINING_STATE / STAGE_STATE)
    info = {"step": step, "format": FORMAT_VERSION, "weights": kind, **extra}
    if source and Path(source).is_dir():
        info.setdefault("base_model", str(Path(source).resolve()))
    atomic_write_json(tmp / STATE, info)
    write_manifest(tmp, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep > 0:
        for old in _step_folders(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_stage_state(path: Path) -> dict[str, Any] | None:
    """The stages' state saved with checkpoint ``path`` (``save_checkpoint(stage_state=)``), or None."""
    f = Path(path) / TRAINING_STATE / STAGE_STATE
    return torch.load(f, map_location="cpu", weights_only=False) if f.is_file() else None


def list_checkpoints(run_dir: Path, *, verify: bool = True) -> list[Path]:
    """Checkpoints to resume from, oldest first; the last one is the newest that verifies.

    Removes temporary folders of killed saves. From the newest down, each checkpoint is checked against its
    manifest (sizes and SHA-256) until one passes; the ones that fail are left out and named on stderr with
    the reason. Older checkpoints are checked for presence and size only (cheap). ``verify=False``: every
    folder with a ``state.json``, unchecked.
    """
    remove_stale_temporaries(run_dir)
    folders = _step_folders(run_dir)
    if not verify:
        return [p for p in folders if (p / STATE).is_file()]
    good: list[Path] = []
    newest_ok = False
    for p in reversed(folders):
        reason = verify_checkpoint(p, checksums=not newest_ok)
        if reason is not None:
            _say(f"checkpoints: skipping {p}: {reason}")
            continue
        newest_ok = True
        good.append(p)
    return good[::-1]


def newest_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """The newest checkpoint that verifies (or the one of ``step``); ``CheckpointError`` when none."""
    found = list_checkpoints(run_dir)
    if step is not None:
        match = [p for p in found if p.name == f"step-{step:08d}"]
        if not match:
            steps = ", ".join(str(int(p.name[5:])) for p in found) or "none"
            raise CheckpointError(f"{run_dir}: no verified checkpoint of step {step} (verified steps: {steps})")
        return match[0]
    if not found:
        raise CheckpointError(f"{run_dir}: no complete checkpoint under checkpoints/ (train first, or the run was "
                              "stopped before its first save)")
    return found[-1]


def read_state(folder: Path) -> dict[str, Any]:
    return json.loads((Path(folder) / STATE).read_text(encoding="utf-8"))


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and RNG from ``path``; returns ``state.json``.

    Verifies the manifest first (``CheckpointError`` naming the file if it does not match).
    """
    path = Path(path)
    reason = verify_checkpoint(path)
    if reason is not None:
        raise CheckpointError(f"{path}: {reason}")
    kind = weights_kind(path)
    if kind == "dcp":
        return _load_sharded(path, model, optimizer, scheduler)
    load_weights(model, path)
    if kind == "legacy":
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False))
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False))
        set_rng_state(torch.load(path / "rng.pt", map_location="cpu", weights_only=False))
    else:
        from accelerate.checkpointing import load_accelerator_state

        folder = path / TRAINING_STATE
        load_accelerator_state(str(folder), [], [optimizer], [scheduler], [], process_index=0, map_location="cpu")
        # accelerate logs and carries on when the RNG file fails to load; exact resume needs it
        states = torch.load(folder / "random_states_0.pkl", map_location="cpu", weights_only=False)
        random.setstate(states["random_state"])
        np.random.set_state(states["numpy_random_seed"])
        torch.set_rng_state(states["torch_manual_seed"])
    return read_state(path)


def load_trainable_into(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    """Apply a checkpoint's weights to a freshly loaded base model (for eval / export).

    A LoRA checkpoint's adapter is re-created from ``state.json``'s LoRA settings (the same init, so
    PiSSA-style residual bases match) before its weights are loaded.
    """
    path = Path(path)
    info = read_state(path) if (path / STATE).is_file() else {}
    lora = info.get("lora")
    if lora:
        from mmrlvr.models.lora import apply_lora

        model = apply_lora(model, **lora)
    elif weights_kind(path) == "peft" and not _is_peft(model):  # a bare adapter folder
        from peft import PeftModel

        return PeftModel.from_pretrained(model, str(path))
    load_weights(model, path)
    return model


# ------------------------------------------------------------------------------- sharded (FSDP2) runs
def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _rank_world() -> tuple[int, int]:
    dist = _dist()
    return (dist.get_rank(), dist.get_world_size()) if dist else (0, 1)


def _barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()


def _is_sharded(model: torch.nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def _bare_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (DCP reads torch's own)."""
    return getattr(optimizer, "optimizer", optimizer)


def _dcp_state(model: torch.nn.Module, optimizer: Any | None) -> dict[str, Any]:
    """{"model": trainable weights, "optim": optimizer state} as DCP state dicts (DTensors stay sharded)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    opts = StateDictOptions(ignore_frozen_params=True)
    if optimizer is None:
        return {"model": get_model_state_dict(model, options=opts)}
    msd, osd = get_state_dict(model, _bare_optimizer(optimizer), options=opts)
    return {"model": msd, "optim": osd}


def _load_dcp(folder: Path, model: torch.nn.Module, optimizer: Any | None) -> None:
    """Fill ``model`` (and ``optimizer``) from ``folder/sharded`` at this process's world size.

    Every weight the checkpoint holds must exist in the model; when resuming (``optimizer`` given) every
    weight the model trains must be in the checkpoint. A fresh model for export / eval (vision tower not
    frozen) takes the saved weights and keeps its other ones."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict, set_state_dict)

    saved = {k.split(".", 1)[1] for k in dcp.FileSystemReader(str(Path(folder) / SHARDED)).read_metadata()
             .state_dict_metadata if k.startswith("model.")}
    full = get_model_state_dict(model, options=StateDictOptions(ignore_frozen_params=False))
    trained = _dcp_state(model, None)["model"].keys()
    lacking = sorted(saved - set(full))
    if lacking:
        raise CheckpointError(f"{folder}: the sharded checkpoint holds weights this model lacks, e.g. {lacking[0]} "
                              "(was model.lora changed?)")
    missing = sorted(set(trained) - saved) if optimizer is not None else []
    if missing:
        raise CheckpointError(f"{folder}: no saved value for trainable weight {missing[0]} (was model.lora or "
                              "model.freeze_vision changed?)")
    state: dict[str, Any] = {"model": {k: v for k, v in full.items() if k in saved}}
    if optimizer is not None:
        state["optim"] = _dcp_state(model, optimizer)["optim"]
    try:
        dcp.load(state, checkpoint_id=str(Path(folder) / SHARDED))
    except Exception as exc:  # noqa: BLE001 - DCP raises a CheckpointException listing every rank's error
        first = str(exc).strip().splitlines()
        raise CheckpointError(f"{folder}: the sharded weights do not fit this model ({type(exc).__name__}: "
                              f"{first[-1] if first else exc})") from None
    # strict=False: weights outside the checkpoint (frozen ones) keep their values; the names were checked
    opts = StateDictOptions(strict=False)
    if optimizer is None:
        set_model_state_dict(model, state["model"], options=opts)
    else:
        set_state_dict(model, _bare_optimizer(optimizer), model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=opts)


def _random_states() -> dict[str, Any]:
    # accelerate's random_states_R.pkl keys, so both formats are read the same way
    return {"step": 0, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
            "torch_manual_seed": torch.get_rng_state()}


def save_distributed(run_dir: Path, step: int, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                     extra: dict[str, Any], keep: int = 2, *, processor: Any = None,
                     strategy: str | None = None, stage_state: dict[str, Any] | None = None) -> Path | None:
    """Save from EVERY rank: a sharded model (DTensor parameters) writes a DCP checkpoint with each rank's
    shards; an unsharded one is saved by rank 0 alone (``save_checkpoint``). Returns the folder (rank 0) or
    None. Temporary folder, manifest last, one rename and pruning as ``save_checkpoint``."""
    rank, world = _rank_world()
    if not _is_sharded(model):
        final = None
        if rank == 0:
            final = save_checkpoint(run_dir, step, model, _bare_optimizer(optimizer), scheduler, extra, keep=keep,
                                    processor=processor, stage_state=stage_state)
        _barrier()
        return final
    import torch.distributed.checkpoint as dcp

    dist = _dist()
    root = Path(run_dir) / "checkpoints"
    final = root / f"step-{step:08d}"
    names = [f".tmp-step-{step:08d}-{os.getpid()}"]
    dist.broadcast_object_list(names, src=0)  # one folder for all ranks, named after rank 0's process
    tmp = root / names[0]
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / TRAINING_STATE).mkdir(parents=True)
    _barrier()
    dcp.save(_dcp_state(model, optimizer), checkpoint_id=str(tmp / SHARDED))  # collective
    torch.save(_random_states(), tmp / TRAINING_STATE / f"random_states_{rank}.pkl")
    if rank == 0:
        torch.save(scheduler.state_dict(), tmp / TRAINING_STATE / "scheduler.bin")
        if stage_state:
            torch.save(stage_state, tmp / TRAINING_STATE / STAGE_STATE)
        source = model_source(model)
        save_processor(tmp, processor, source)
        info = {"step": step, "format": FORMAT_VERSION, "weights": "dcp", "world_size": world,
                "strategy": strategy or "fsdp2", **extra}
        if source and Path(source).is_dir():
            info.setdefault("base_model", str(Path(source).resolve()))
        atomic_write_json(tmp / STATE, info)
    _barrier()  # every rank's files are on disk before the manifest lists them
    if rank == 0:
        write_manifest(tmp, step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        if keep > 0:
            for old in _step_folders(run_dir)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final if rank == 0 else None


def _load_sharded(path: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """``load_checkpoint`` for a DCP checkpoint: every rank calls it (the load is collective)."""
    state = read_state(path)
    rank, world = _rank_world()
    saved = int(state.get("world_size", 1))
    if world > 1 and not _is_sharded(model):
        raise CheckpointError(f"{path}: a sharded checkpoint of {saved} process(es); this {world}-process run is "
                              "not sharded: resume with distributed.strategy: fsdp2 (or at 1 process)")
    _load_dcp(path, model, optimizer)
    folder = path / TRAINING_STATE
    scheduler.load_state_dict(torch.load(folder / "scheduler.bin", map_location="cpu", weights_only=False))
    rng_file = folder / f"random_states_{rank}.pkl"
    if saved != world:
        _say(f"resume: {path} was saved by {saved} process(es) and resumes on {world}: weights and optimizer "
             "state are resharded; each rank's random state starts from rank "
             f"{rank if rng_file.is_file() else 0}'s")
    if not rng_file.is_file():
        rng_file = folder / "random_states_0.pkl"
    states = torch.load(rng_file, map_location="cpu", weights_only=False)
    random.setstate(states["random_state"])
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    return state
