"""The one place that papers over a missing torchvision (the PyPI torchvision wheel fails to import next to
the CPU-only torch).

Two things in the Qwen stack need torchvision only for *video*, yet refuse to work for images without it:

1. The stock ``Qwen2VLProcessor`` / ``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor`` demand a video
   processor in ``__init__`` (and building one needs torchvision). We define image-only subclasses whose
   ``__init__`` takes just an image processor and a tokenizer, and - only when torchvision is missing -
   register them with ``AutoProcessor`` for the family's config class, so that
   ``AutoProcessor.from_pretrained(dir)`` returns one instead of silently falling back to a tokenizer.
   With torchvision installed nothing is registered and the stock processors are used.
2. ``qwen_vl_utils`` imports torchvision at module top although its image helpers (``fetch_image``,
   ``smart_resize``, ``process_vision_info`` for images) never touch it. ``import_qwen_vl_utils()`` imports
   it with a stand-in ``torchvision`` placed in ``sys.modules`` just for the duration of that import (and
   removed afterwards, so transformers' own torchvision checks are unaffected). Video calls then fail with a
   message that says torchvision is needed.

Nothing else in mmrlvr should test for torchvision; import from here.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

from transformers import (
    AutoImageProcessor,
    AutoProcessor,
    AutoTokenizer,
    Qwen2_5_VLConfig,
    Qwen2VLConfig,
    Qwen3VLConfig,
)
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.processing_utils import ProcessorMixin


def _torchvision_importable() -> bool:
    # A PyPI torchvision can be *installed* yet fail to import beside a CPU torch; only an import tells.
    try:
        importlib.import_module("torchvision")
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return False
    return True


HAS_TORCHVISION: bool = _torchvision_importable()


class Qwen2VLImageProcessorOnly(Qwen2VLProcessor):
    """``Qwen2VLProcessor`` for images only: no video processor, so no torchvision needed."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


class Qwen2_5_VLImageProcessorOnly(Qwen2_5_VLProcessor):
    """``Qwen2_5_VLProcessor`` for images only: no video processor, so no torchvision needed."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


class Qwen3VLImageProcessorOnly(Qwen3VLProcessor):
    """``Qwen3VLProcessor`` for images only: no video processor, so no torchvision needed."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


# model_type -> (config class, stock processor, image-only processor)
PROCESSORS: dict[str, tuple[type, type, type]] = {
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLProcessor, Qwen2VLImageProcessorOnly),
    "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLProcessor, Qwen2_5_VLImageProcessorOnly),
    "qwen3_vl": (Qwen3VLConfig, Qwen3VLProcessor, Qwen3VLImageProcessorOnly),
}

_registered = False


def register_image_only_processors() -> None:
    """Without torchvision, make ``AutoProcessor`` pick the image-only processors (idempotent)."""
    global _registered
    if _registered or HAS_TORCHVISION:
        return
    for config_cls, _, image_only in PROCESSORS.values():
        AutoProcessor.register(config_cls, image_only, exist_ok=True)
    _registered = True


def load_processor(path: str | Path, model_type: str | None = None, **kwargs: Any) -> Any:
    """``AutoProcessor.from_pretrained`` that also works for real Qwen checkpoints without torchvision.

    A real checkpoint names its stock processor class in ``preprocessor_config.json``, which bypasses the
    registration above, and a folder without a video processor config cannot build the stock processor
    even with torchvision; for Qwen families we then build the image-only processor from the same files.
    """
    register_image_only_processors()
    try:
        processor = AutoProcessor.from_pretrained(str(path), **kwargs)
    except Exception:  # noqa: BLE001 - retried below with the image-only class, re-raised if that fails
        if model_type not in PROCESSORS:
            raise
        processor = None
    if model_type in PROCESSORS and not isinstance(processor, ProcessorMixin):
        image_processor = AutoImageProcessor.from_pretrained(str(path), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(path), **kwargs)
        processor = PROCESSORS[model_type][2](image_processor, tokenizer,
                                              chat_template=getattr(tokenizer, "chat_template", None))
    return processor


class _NeedsTorchvision(types.ModuleType):
    """Stand-in module: any attribute use says that torchvision is required (video only)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError(f"torchvision.{name} is needed for video input; install torchvision to use video")


def import_qwen_vl_utils() -> types.ModuleType:
    """Import ``qwen_vl_utils`` for its image functions, with or without torchvision."""
    if HAS_TORCHVISION or "qwen_vl_utils" in sys.modules:
        return importlib.import_module("qwen_vl_utils")
    stub = _NeedsTorchvision("torchvision")
    stub.__version__ = "0.0.0+missing"  # type: ignore[attr-defined]
    stub_io, stub_tf = _NeedsTorchvision("torchvision.io"), _NeedsTorchvision("torchvision.transforms")
    stub_tf.InterpolationMode = _NeedsTorchvision("torchvision.transforms.InterpolationMode")  # type: ignore[attr-defined]
    stub.io, stub.transforms = stub_io, stub_tf  # type: ignore[attr-defined]
    names = {"torchvision": stub, "torchvision.io": stub_io, "torchvision.transforms": stub_tf}
    saved = {name: sys.modules.get(name) for name in names}
    sys.modules.update(names)
    try:
        return importlib.import_module("qwen_vl_utils")
    finally:
        for name, old in saved.items():  # leave no trace: transformers checks for torchvision itself
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
