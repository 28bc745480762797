"""A run's checkpoints as analyses read them: steps, folders, and their weights merged into plain tensors.

Every checkpoint goes through ``mmrlvr.train.export.load_checkpoint_model`` — the loader ``eval`` and ``export``
use — so full fine-tuning runs, LoRA runs (the adapter merged into the base: W = W_0 + B·A·scale) and sharded runs
(DCP, read without a process group) give the same thing: ``{parameter name: float32 CPU tensor}`` with the base
model's names. Weights are loaded one checkpoint at a time; an analysis that walks many keeps only what it needs.

Mistakes are one-line ``UserError``s naming what is missing: a run without checkpoints, checkpoints of different
models (names or shapes differ), a LoRA run compared with a full one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from mmrlvr.errors import UserError

if TYPE_CHECKING:
    import torch

#: how to keep every checkpoint of a run for analyses (said in every "no checkpoints" error)
KEEP_ALL_HINT = ("train with save_every: N and keep_checkpoints: 0 to keep them all (mmrlvr demo --save-every 20 "
                 "--keep-all)")


@dataclass(frozen=True)
class RunCheckpoints:
    """The verified checkpoints of a run, oldest first."""

    run_dir: Path
    steps: list[int]
    folders: list[Path]
    lora: bool  # the run trained a LoRA adapter (its checkpoints hold adapters)

    def base_folder(self) -> str:
        """The model the run started from (``state.json``'s ``base_model``, else the run's ``model.path``)."""
        from mmrlvr.train.export import base_model_folder

        return base_model_folder(self.folders[0])


def run_checkpoints(run_dir: str | Path, *, at_least: int = 1) -> RunCheckpoints:
    """The run's verified checkpoints; ``UserError`` when it has fewer than ``at_least``."""
    from mmrlvr.train.checkpoint import list_checkpoints, read_state, weights_kind

    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"{run}: no such run directory")
    if not (run / "checkpoints").is_dir():
        raise UserError(f"{run}: no checkpoints/ folder (not a run directory, or a run that saved none; "
                        f"{KEEP_ALL_HINT})")
    folders = list_checkpoints(run)
    if len(folders) < at_least:
        raise UserError(f"{run}: {len(folders)} verified checkpoint(s), this analysis needs at least {at_least}; "
                        f"{KEEP_ALL_HINT}")
    steps = [int(read_state(f)["step"]) for f in folders]
    kinds = {weights_kind(f) for f in folders}
    lora = any((f / "adapter_config.json").is_file() for f in folders)
    if lora and "transformers" in kinds:
        raise UserError(f"{run}: mixes LoRA and full checkpoints; analyse one kind of run")
    return RunCheckpoints(run, steps, folders, lora)


def _plain_name(name: str) -> str:
    """A parameter's name in the base model (a PeftModel's ``base_model.model.`` prefix removed)."""
    for prefix in ("base_model.model.",):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def model_weights(model: "torch.nn.Module", keep: Callable[[str], bool] | None = None) -> dict[str, "torch.Tensor"]:
    """``{name: float32 CPU tensor}`` of a model's parameters (a PeftModel merged into its base first)."""
    import torch

    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    with torch.no_grad():
        return {_plain_name(n): p.detach().to("cpu", torch.float32).clone()
                for n, p in model.named_parameters() if keep is None or keep(_plain_name(n))}


def checkpoint_weights(folder: str | Path, keep: Callable[[str], bool] | None = None) -> dict[str, "torch.Tensor"]:
    """The merged weights of one checkpoint (``keep``: which parameter names to return)."""
    from mmrlvr.train.export import load_checkpoint_model

    model, _, _ = load_checkpoint_model(Path(folder))
    return model_weights(model, keep)


def base_weights(folder: str | Path, keep: Callable[[str], bool] | None = None) -> dict[str, "torch.Tensor"]:
    """The weights of a model folder (``save_pretrained``), e.g. a run's base model."""
    from mmrlvr.models import load_policy

    model, _ = load_policy(str(folder))
    return model_weights(model, keep)


def weights_of(spec: str | Path, keep: Callable[[str], bool] | None = None) -> tuple[dict[str, "torch.Tensor"], str]:
    """(weights, kind) of a run directory (its newest checkpoint), a checkpoint folder or a model folder;
    kind is ``lora``, ``full`` or ``model``."""
    from mmrlvr.train.checkpoint import STATE

    path = Path(spec)
    if not path.exists():
        raise UserError(f"{spec}: no such run directory, checkpoint or model folder")
    if (path / "checkpoints").is_dir():
        run = run_checkpoints(path)
        path = run.folders[-1]
    if (path / STATE).is_file():
        kind = "lora" if (path / "adapter_config.json").is_file() else "full"
        return checkpoint_weights(path, keep), kind
    if (path / "config.json").is_file():
        return base_weights(path, keep), "model"
    raise UserError(f"{spec}: not a run directory (checkpoints/), a checkpoint (state.json) or a model folder "
                    f"(config.json)")


def check_same_model(a: dict[str, "torch.Tensor"], b: dict[str, "torch.Tensor"], what_a: str, what_b: str) -> None:
    """``UserError`` naming the first difference when two weight sets are not of one architecture."""
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        first = (only_a or only_b)[0]
        raise UserError(f"{what_a} and {what_b} are checkpoints of different models: {first!r} is only in "
                        f"{what_a if only_a else what_b} ({len(only_a) + len(only_b)} names differ)")
    for name in a:
        if a[name].shape != b[name].shape:
            raise UserError(f"{what_a} and {what_b} are checkpoints of different models: {name!r} is "
                            f"{tuple(a[name].shape)} in one and {tuple(b[name].shape)} in the other")
