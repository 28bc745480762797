"""Datasets, prompts, images and synthetic visual tasks.

- ``synth``: procedurally drawn tasks with verifiable answers (``make_rows``, ``write_dataset``, ``TASKS``).
- ``prompts``: chat templates (``build_messages``, ``TEMPLATES``).
- ``loading``: rows -> ``Sample`` (``rows_to_samples``).
"""

from mmrlvr.data.loading import rows_to_samples
from mmrlvr.data.prompts import TEMPLATES, build_messages
from mmrlvr.data.synth import TASKS, make_rows, write_dataset

__all__ = ["TASKS", "TEMPLATES", "build_messages", "make_rows", "rows_to_samples", "write_dataset"]
