"""mmrlvr.store: the run's rollout store (docs/training.md, "The run directory").

``RolloutRecord`` (record.py) is the contract; ``RolloutWriter`` writes one Parquet shard per step in the
background; ``RolloutReader`` indexes and filters shards (also while the run writes); ``ImageStore``
keeps images content-addressed under ``images/``; ``atomic_write_*`` are the temp-file + rename helpers
the trainer uses for metrics and checkpoints.
"""

import importlib

# Names resolve on first use (PEP 562), so that ``from mmrlvr.store.atomic import ...`` in the trainer does
# not load the reader, and with it pandas (~65 MiB resident), into every training process.
_WHERE = {
    "atomic_path": "atomic", "atomic_write_bytes": "atomic", "atomic_write_json": "atomic",
    "atomic_write_text": "atomic", "ImageStore": "images", "UnsafePathError": "images",
    "resolve_in_run": "images", "RolloutReader": "reader", "ROLLOUT_SCHEMA": "record",
    "RolloutRecord": "record", "records_to_table": "record", "RolloutWriter": "writer",
    "RolloutWriterError": "writer", "step_filename": "writer",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"mmrlvr.store.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'mmrlvr.store' has no attribute {name!r}")


__all__ = [
    "RolloutRecord", "ROLLOUT_SCHEMA", "records_to_table", "RolloutWriter", "RolloutWriterError",
    "step_filename", "RolloutReader", "ImageStore", "UnsafePathError", "resolve_in_run", "atomic_path",
    "atomic_write_bytes", "atomic_write_text", "atomic_write_json",
]
