"""mmrlvr.store: the run's rollout store (DESIGN.md "Run directory").

``RolloutRecord`` (record.py) is the contract; ``RolloutWriter`` writes one Parquet shard per step in the
background; ``RolloutReader`` indexes and filters shards (also while the run writes); ``ImageStore``
keeps images content-addressed under ``images/``; ``atomic_write_*`` are the temp-file + rename helpers
the trainer uses for metrics and checkpoints.
"""

from mmrlvr.store.atomic import atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text
from mmrlvr.store.images import ImageStore, UnsafePathError, resolve_in_run
from mmrlvr.store.reader import RolloutReader
from mmrlvr.store.record import ROLLOUT_SCHEMA, RolloutRecord, records_to_table
from mmrlvr.store.writer import RolloutWriter, RolloutWriterError, step_filename

__all__ = [
    "RolloutRecord", "ROLLOUT_SCHEMA", "records_to_table", "RolloutWriter", "RolloutWriterError",
    "step_filename", "RolloutReader", "ImageStore", "UnsafePathError", "resolve_in_run", "atomic_path",
    "atomic_write_bytes", "atomic_write_text", "atomic_write_json",
]
