"""Load a policy (model + processor) from a local folder, offline, for any image-text-to-text model.

``load_policy`` is what the trainer, the evaluator and the CLI call: one place that turns a folder into
(model, processor) with the dtype / device / attention implementation asked for, with errors that say
what is wrong with the folder instead of a hub lookup traceback. Qwen processors work without
torchvision (``mmrlvr.models.compat``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForImageTextToText

from mmrlvr.errors import UserError
from mmrlvr.models.compat import load_processor

DTYPES: dict[str, Any] = {
    "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "auto": "auto",
}


def _check_folder(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise UserError(f"model folder {str(path)!r} does not exist (models are loaded from local folders only; "
                        "build a tiny one with `mmrlvr tiny build --family qwen2_5_vl --out DIR`)")
    if not path.is_dir():
        raise UserError(f"model path {str(path)!r} is a file, not a model folder")
    config_file = path / "config.json"
    if not config_file.exists():
        raise UserError(f"{str(path)!r} is not a model folder: it has no config.json "
                        "(expected the output of save_pretrained)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{config_file}: unreadable config.json ({exc})") from None
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise UserError(f"{str(path)!r} has a config.json but no weights (*.safetensors or *.bin)")
    return config


def load_policy(path: str | Path, *, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu",
                attn_implementation: str | None = None, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """(model, processor) from a local ``AutoModelForImageTextToText`` folder.

    dtype: "float32" | "bfloat16" | "float16" | "auto" (or a torch dtype). attn_implementation: e.g.
    "sdpa", "eager", "flash_attention_2" (None = transformers' default). The tokenizer pads on the left
    (generation needs aligned prompt ends). Raises ``UserError`` for a missing folder, a folder that is
    not a model, or an unknown dtype.
    """
    folder = Path(path)
    config = _check_folder(folder)
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise UserError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
        torch_dtype = DTYPES[dtype]
    else:
        torch_dtype = dtype
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "local_files_only": True, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForImageTextToText.from_pretrained(str(folder), **kwargs)
    except ValueError as exc:
        raise UserError(f"{str(folder)!r} (model_type {config.get('model_type')!r}) cannot be loaded as an "
                        f"image-text-to-text model: {exc}") from None
    model.to(device)
    processor = load_processor(folder, config.get("model_type"), local_files_only=True,
                               trust_remote_code=trust_remote_code)
    from mmrlvr.models.tiny import upgrade_tiny_template

    upgrade_tiny_template(processor)  # a cached tiny folder built before the template gained tools
    tokenizer = getattr(processor, "tokenizer", processor)
    tokenizer.padding_side = "left"
    return model, processor
