"""Turn dataset rows into ``Sample`` values.

``rows_to_samples`` converts in-memory rows in our synthetic format (``mmrlvr.data.synth``).
"""

from __future__ import annotations

from typing import Any, Iterable

from mmrlvr.data.prompts import build_messages
from mmrlvr.types import Sample


def rows_to_samples(rows: Iterable[dict[str, Any]], template: str = "r1", system: str | None = None) -> list[Sample]:
    """Samples from rows made by ``mmrlvr.data.synth.make_rows`` (images already PIL, already sized).

    ``meta`` gets the row's meta plus ``task``, ``problem`` and ``solution`` (the reference response,
    used for SFT warm starts).
    """
    samples = []
    for row in rows:
        images = [im if im.mode == "RGB" else im.convert("RGB") for im in row["images"]]
        meta = dict(row.get("meta") or {})
        meta.update(task=row.get("task"), problem=row["problem"], solution=row.get("solution"))
        samples.append(Sample(
            id=str(row["id"]),
            messages=build_messages(row["problem"], len(images), template, system),
            images=images,
            answer=str(row["answer"]),
            answer_type=row.get("answer_type", "math"),
            meta=meta,
        ))
    return samples
