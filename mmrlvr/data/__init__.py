"""Datasets, prompts, images and synthetic visual tasks.

- ``synth``: procedurally drawn tasks with verifiable answers (``make_rows``, ``write_dataset``, ``TASKS``).
- ``prompts``: chat templates (``build_messages``, ``TEMPLATES``).
- ``images``: image loading from paths / bytes / base64 / PIL and Qwen-style ``smart_resize``.
- ``loading``: dataset rows -> ``Sample`` (``load_samples``, ``rows_to_samples``, ``LoadReport``).
- ``cli``: ``mmrlvr data synth``.
"""

from mmrlvr.data.images import load_image, prepare_image, resize_image, smart_resize
from mmrlvr.data.loading import PRESETS, LoadReport, SkippedRow, load_samples, rows_to_samples
from mmrlvr.data.prompts import TEMPLATES, build_messages
from mmrlvr.data.synth import TASKS, make_rows, write_dataset

__all__ = [
    "PRESETS", "TASKS", "TEMPLATES", "LoadReport", "SkippedRow", "build_messages", "load_image", "load_samples",
    "make_rows", "prepare_image", "resize_image", "rows_to_samples", "smart_resize", "write_dataset",
]
