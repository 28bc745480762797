"""Datasets, prompts, images and synthetic visual tasks.

- ``synth``: procedurally drawn tasks with verifiable answers (``make_rows``, ``write_dataset``, ``TASKS``).
- ``prompts``: chat templates (``build_messages``, ``TEMPLATES``).
- ``images``: image loading from paths / bytes / base64 / PIL and Qwen-style ``smart_resize``.
- ``loading``: dataset rows -> ``Sample`` (``load_samples``, ``rows_to_samples``, ``LoadReport``); layouts
  (``PRESETS``: verl, easyr1, vlm_r1, llava, visual_rft, ...) and dotted column paths.
- ``chat``: chat-list prompts (verl ``prompt``, LLaVA ``conversations``, typed content parts).
- ``answers``: ground truths checked at load with the rewards' own parsers.
- ``prompts``: also Jinja prompt templates and ``answer_format`` (the one answer convention of a run).
- ``length``: ``data.max_prompt_length`` (rows dropped whole, never cut).
- ``video``: frame sampling for ``videos`` columns.
- ``from_config``: one dataset of a run from its ``DataConfig`` (what ``mmrlvr.train.data`` calls).
- ``cli`` / ``inspect``: ``mmrlvr data synth`` and ``mmrlvr data inspect``.
"""

from mmrlvr.data.images import load_image, prepare_image, resize_image, smart_resize
from mmrlvr.data.loading import PRESETS, LoadReport, SkippedRow, load_samples, rows_to_samples
from mmrlvr.data.prompts import PROMPT_TEMPLATES, TEMPLATES, answer_format, build_messages, load_prompt_template
from mmrlvr.data.synth import TASKS, make_rows, write_dataset

__all__ = [
    "PRESETS", "PROMPT_TEMPLATES", "TASKS", "TEMPLATES", "LoadReport", "SkippedRow", "answer_format",
    "build_messages", "load_image", "load_prompt_template", "load_samples",
    "make_rows", "prepare_image", "resize_image", "rows_to_samples", "smart_resize", "write_dataset",
]
