"""``mmrlvr export RUN_DIR --out DIR``: a trained run as a folder transformers and vLLM load without mmrlvr.

What the folder holds:

- full fine-tuning, or ``--merge`` of a LoRA run: ``config.json`` + ``model.safetensors`` (the adapter folded
  into the base with peft's ``merge_and_unload``), loadable by ``AutoModelForImageTextToText`` and vLLM;
- a LoRA run without ``--merge``: the base model's files *and* the peft adapter (``adapter_config.json`` +
  ``adapter_model.safetensors``) side by side; transformers (with peft installed) loads the base from the
  folder and applies the adapter (its "local model with an embedded adapter" path); vLLM takes the same
  folder as base and as ``LoRARequest``. Adapters whose init moves the base (PiSSA, OLoRA) are always merged:
  the adapter alone would need their residual base;
- the processor and chat template files as the base checkpoint has them (the stock Qwen processor where
  torchvision is installed). For Qwen families the folder also carries ``processing_image_only.py`` named in
  ``auto_map``: ``AutoProcessor.from_pretrained(DIR, trust_remote_code=True)`` then builds an image-only
  processor, which is what works on a CPU-only torch without torchvision (the stock Qwen processors insist
  on a video processor, which needs torchvision). Without ``trust_remote_code`` nothing changes;
- ``mmrlvr_export.json``: which run, step, checkpoint and options produced it.

``--push-to-hub REPO`` uploads the folder with ``huggingface_hub``; any Hub failure (offline, no token, no
network) is one message saying the export itself is complete and how to push it later.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError

DTYPE_NAMES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
               "fp16": "float16", "float16": "float16"}

# an image-only subclass of the stock processor, written into the export (no mmrlvr import)
IMAGE_ONLY_PROCESSOR = '''"""Image-only processor for CPU-only torch without torchvision (written by `mmrlvr export`).

The stock processor requires a video processor, which needs torchvision. Load with
``AutoProcessor.from_pretrained(folder, trust_remote_code=True)``; with torchvision installed the stock
processor (``trust_remote_code=False``, the default) loads from the same files.
"""

from transformers.models.{module}.processing_{module} import {stock}


class {name}({stock}):
    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
'''
STOCK_PROCESSORS = {"qwen2_vl": ("qwen2_vl", "Qwen2VLProcessor"), "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLProcessor"),
                    "qwen3_vl": ("qwen3_vl", "Qwen3VLProcessor")}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmrlvr export", description=__doc__.splitlines()[0])
    p.add_argument("run", metavar="RUN_DIR", help="run directory (or one checkpoint folder inside it)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest that verifies)")
    p.add_argument("--out", required=True, help="folder to write (must not exist or be empty, unless --overwrite)")
    p.add_argument("--merge", action="store_true", help="fold a LoRA adapter into the base weights")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPE_NAMES),
                   help="weights dtype of the export (default: as trained)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    p.add_argument("--push-to-hub", default=None, metavar="REPO", help="also upload to this Hugging Face repo id")
    p.add_argument("--private", action="store_true", help="create the Hub repo as private")
    return p


# ------------------------------------------------------------------------------------- locate / load
def find_checkpoint(run: str | Path, step: int | None = None) -> Path:
    """A checkpoint folder from a run directory (newest verified, or ``step``) or a checkpoint folder."""
    from mmrlvr.train.checkpoint import STATE, CheckpointError, newest_checkpoint, verify_checkpoint

    path = Path(run)
    if not path.exists():
        raise UserError(f"{run}: no such run directory or checkpoint folder")
    if (path / STATE).is_file():
        reason = verify_checkpoint(path)
        if reason is not None:
            raise CheckpointError(f"{path}: {reason}")
        return path
    if not (path / "checkpoints").is_dir():
        raise UserError(f"{run}: not a run directory (no checkpoints/ folder) nor a checkpoint (no state.json)")
    return newest_checkpoint(path, step)


def run_dir_of(ckpt: Path) -> Path | None:
    """The run directory holding ``ckpt`` (``RUN/checkpoints/step-N``), if it has a config.yaml."""
    run = Path(ckpt).parent.parent
    return run if (run / "config.yaml").is_file() else None


def run_config(run: Path) -> Any:
    from mmrlvr.config import load_config

    return load_config(Path(run) / "config.yaml")


def base_model_folder(ckpt: Path) -> str:
    """The base model folder of a checkpoint: ``state.json``'s, else the run config's ``model.path``."""
    from mmrlvr.train.checkpoint import read_state

    base = read_state(ckpt).get("base_model")
    if base and Path(base).is_dir():
        return str(base)
    run = run_dir_of(ckpt)
    if run is None:
        raise UserError(f"{ckpt}: cannot tell its base model (no base_model in state.json and no run config.yaml "
                        "two folders up)")
    from mmrlvr.train.model_path import resolve_model_path

    return resolve_model_path(run_config(run).model.path)


def load_checkpoint_model(ckpt: Path, *, dtype: str = "float32") -> tuple[Any, Any, dict[str, Any]]:
    """(model, processor, state.json) of a checkpoint, as the run had it (a LoRA run gives a PeftModel)."""
    from mmrlvr.models import load_policy
    from mmrlvr.train.checkpoint import load_trainable_into, read_state, weights_kind

    ckpt = Path(ckpt)
    state = read_state(ckpt)
    kind = weights_kind(ckpt)
    if kind == "safetensors":
        raise UserError(f"{ckpt}: weights of a plain torch module; nothing transformers can load")
    if kind == "transformers":
        model, processor = load_policy(ckpt, dtype=dtype)
        return model, processor, state
    base = base_model_folder(ckpt)
    model, processor = load_policy(base, dtype=dtype)
    model = load_trainable_into(model, ckpt)
    return model, processor, state


def processor_source(ckpt: Path, state: dict[str, Any]) -> Path:
    """Where the processor files are: the checkpoint when it holds them, else the base model folder."""
    if any((ckpt / n).is_file() for n in ("processor_config.json", "preprocessor_config.json", "tokenizer.json",
                                          "tokenizer_config.json")):
        return ckpt
    return Path(base_model_folder(ckpt))


# --------------------------------------------------------------------------------------------- write
def add_image_only_processor(folder: Path, model_type: str | None) -> None:
    """Write ``processing_image_only.py`` and point ``auto_map.AutoProcessor`` at it (Qwen families)."""
    if model_type not in STOCK_PROCESSORS:
        return
    module, stock = STOCK_PROCESSORS[model_type]
    name = stock.replace("Processor", "ImageOnlyProcessor")
    (folder / "processing_image_only.py").write_text(IMAGE_ONLY_PROCESSOR.format(module=module, stock=stock, name=name))
    for fname in ("processor_config.json", "preprocessor_config.json"):
        path = folder / fname
        if path.is_file():
            data = json.loads(path.read_text())
            data.setdefault("auto_map", {})["AutoProcessor"] = f"processing_image_only.{name}"
            path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
            return


def export_checkpoint(ckpt: Path, out: Path, *, merge: bool = False, dtype: str | None = None,
                      overwrite: bool = False, hub_repo: str | None = None) -> dict[str, Any]:
    """Write the export folder (atomically: built beside ``out`` and renamed in); returns its description."""
    import torch

    from mmrlvr.models.loading import DTYPES
    from mmrlvr.train.checkpoint import PROCESSOR_FILES, quiet_progress

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UserError(f"--out {out}: already exists and is not empty (pass --overwrite to replace it)")
    with quiet_progress():
        model, _processor, state = load_checkpoint_model(ckpt)
    lora = state.get("lora")
    from mmrlvr.models.lora import BASE_PRESERVING_INITS

    forced = bool(lora) and not merge and lora.get("init", "default") not in BASE_PRESERVING_INITS
    merged = bool(lora) and (merge or forced)
    if forced:
        print(f"mmrlvr export: LoRA init {lora.get('init')!r} changes the base weights; exporting merged",
              file=sys.stderr)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    target_dtype = DTYPES[DTYPE_NAMES[dtype]] if dtype else None
    try:
        with quiet_progress():
            if lora and merged:
                model = model.merge_and_unload()
            if lora and not merged:
                model.save_pretrained(str(tmp), safe_serialization=True)  # the adapter, before unload drops it
                base = model.unload()  # the base without LoRA layers
                if target_dtype is not None:
                    base.to(target_dtype)
                base.save_pretrained(str(tmp), safe_serialization=True)
                model = base
                cfg_path = tmp / "adapter_config.json"
                adapter_cfg = json.loads(cfg_path.read_text())
                adapter_cfg["base_model_name_or_path"] = hub_repo or str(out.resolve())
                cfg_path.write_text(json.dumps(adapter_cfg, indent=2, sort_keys=True) + "\n")
            else:
                if target_dtype is not None:
                    model.to(target_dtype)
                model.save_pretrained(str(tmp), safe_serialization=True)
        src = processor_source(Path(ckpt), state)
        for name in PROCESSOR_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
        model_type = json.loads((tmp / "config.json").read_text()).get("model_type")
        add_image_only_processor(tmp, model_type)
        info = {"checkpoint": str(Path(ckpt).resolve()), "step": state.get("step"), "lora": bool(lora),
                "merged": merged, "dtype": str(target_dtype or next(model.parameters()).dtype).removeprefix("torch."), "config_hash": state.get("config_hash")}
        (tmp / "mmrlvr_export.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**info, "out": str(out)}


def push_to_hub(folder: Path, repo: str, *, private: bool = False) -> str:
    """Upload ``folder`` to the Hub repo ``repo``; any Hub failure becomes one ``UserError`` line."""
    try:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(repo, exist_ok=True, private=private)
        api.upload_folder(folder_path=str(folder), repo_id=repo, commit_message="mmrlvr export")
    except Exception as exc:  # noqa: BLE001 - offline mode, no token, no network, HTTP errors alike
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise UserError(f"--push-to-hub {repo}: could not reach the Hugging Face Hub ({type(exc).__name__}: "
                        f"{reason}). The export itself is complete in {folder}; push it later with "
                        f"`hf upload {repo} {folder}` once `hf auth login` works and HF_HUB_OFFLINE is unset.") from None
    return f"https://huggingface.co/{repo}"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    ckpt = find_checkpoint(args.run, args.step)
    info = export_checkpoint(ckpt, Path(args.out), merge=args.merge, dtype=args.dtype, overwrite=args.overwrite,
                             hub_repo=args.push_to_hub)
    kind = "merged model" if info["merged"] else ("base model + LoRA adapter" if info["lora"] else "model")
    print(f"mmrlvr export: {ckpt} (step {info['step']}) -> {args.out} ({kind}, {info['dtype']})")
    if args.push_to_hub:
        url = push_to_hub(Path(args.out), args.push_to_hub, private=args.private)
        print(f"mmrlvr export: pushed to {url}")
    return 0
