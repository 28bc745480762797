"""A synthetic rubric task: counting scenes with an instance rubric that programs can check.

Built on ``mmrlvr.data.synth.make_rows("count", ...)`` ("How many {colour} shapes are there?", 1-4 shapes
of red/green/blue/yellow). Each row gets a ``rubric`` column (a list of criterion dicts) whose criteria are
all programmatic, so a tiny policy can be trained on it on CPU without any judge model:

=============  =========  =================================================================================
id             category   met when
=============  =========  =================================================================================
count          essential  the answer is the right count (``number`` vs ``{answer}``)
asked_colour   important  the thinking names the colour asked about (regex on the thinking)
asked_count    important  the thinking states the right count of the asked colour ("0 red" when absent)
colour_counts  optional   the thinking states the right count of every colour in the image, and no other
                          count for those colours (one regex of look-aheads)
absent_colour  pitfall    the thinking names a colour that is not in the image and was not asked about
                          (omitted when every colour is present or asked)
=============  =========  =================================================================================

The row's ``solution`` is replaced by a reference response that meets every criterion
("I see 0 red, 1 green." when red is asked about and absent: the data helper's reference omits absent
colours, which would fail ``asked_colour``).
"""

from __future__ import annotations

from typing import Any, Callable

from mmrlvr.data.synth import COLOURS, make_rows
from mmrlvr.types import Sample


def count_rubric(colour: str, counts: dict[str, int]) -> list[dict[str, Any]]:
    """The instance rubric of one counting scene (see the module docstring)."""
    present = {c: n for c, n in counts.items() if n > 0}
    asked = counts.get(colour, 0)
    lookaheads = "".join(rf"(?=[\s\S]*\b{n} {c}\b)(?![\s\S]*\b(?!{n}\b)\d+ {c}\b)" for c, n in present.items())
    rubric: list[dict[str, Any]] = [
        {"id": "count", "text": f"The final answer is the number of {colour} shapes in the image.",
         "category": "essential", "check": {"type": "number", "expected": "{answer}"}},
        {"id": "asked_colour", "text": f"The reasoning names the colour asked about ({colour}).",
         "category": "important", "check": {"type": "regex", "pattern": rf"\b{colour}\b", "target": "thinking"}},
        # a second important criterion: POW3R re-weights criteria *within* a category, so with one criterion
        # per category its weights would never move on this task
        {"id": "asked_count", "text": f"The reasoning states the number of {colour} shapes ({asked}).",
         "category": "important",
         "check": {"type": "regex", "pattern": rf"\b{asked} {colour}\b", "target": "thinking"}},
        {"id": "colour_counts",
         "text": "The reasoning states the correct count of every colour in the image: "
                 + ", ".join(f"{n} {c}" for c, n in present.items()) + ".",
         "category": "optional", "check": {"type": "regex", "pattern": "^" + lookaheads, "target": "thinking"}},
    ]
    absent = [c for c in COLOURS if c not in present and c != colour]
    if absent:
        rubric.append({
            "id": "absent_colour",
            "text": "The reasoning mentions a colour that is not in the image: " + ", ".join(absent) + ".",
            "category": "pitfall",
            "check": {"type": "regex", "pattern": r"\b(?:" + "|".join(absent) + r")\b", "target": "thinking"}})
    return rubric


def reference_response(colour: str, counts: dict[str, int], answer: str) -> str:
    """A response meeting every criterion: the asked colour first (0 if absent), then the others."""
    parts = [f"{counts.get(colour, 0)} {colour}"] + [f"{n} {c}" for c, n in counts.items() if c != colour and n]
    return f"<think>I see {', '.join(parts)}.</think><answer>{answer}</answer>"


def rubric_rows(n: int, split: str = "train", seed: int = 0, image_size: int = 112,
                progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """``n`` counting rows with a ``rubric`` column (list of dicts) and a rubric-meeting ``solution``.

    progress: optional callback called with 1 after each row (e.g. ``tqdm.update``)."""
    rows = make_rows("count", split, n, seed=seed, image_size=image_size, progress=progress)
    for row in rows:
        meta = row["meta"]
        row["rubric"] = count_rubric(meta["colour"], meta["counts"])
        row["solution"] = reference_response(meta["colour"], meta["counts"], row["answer"])
        row["meta"] = {**meta, "rubric_task": "count"}
    return rows


def rubric_samples(n: int, split: str = "train", seed: int = 0, image_size: int = 112,
                   template: str = "r1") -> list[Sample]:
    """``rubric_rows`` as ``Sample`` values with ``sample.rubric`` set (ready for the ``rubric`` reward)."""
    from mmrlvr.data.loading import rows_to_samples

    rows = rubric_rows(n, split, seed, image_size)
    samples = rows_to_samples(rows, template=template)
    for sample, row in zip(samples, rows):
        sample.rubric = row["rubric"]
        sample.meta["solution"] = row["solution"]
    return samples
