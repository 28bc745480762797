"""Prompt length safety: rows too long for ``data.max_prompt_length`` are dropped whole, never cut.

The most reported failure of multimodal RL frameworks is "Image features and image tokens do not match":
a prompt cut at a token budget loses part of an image's ``<|image_pad|>`` run (or a whole image), and the
model then receives more vision features than placeholders. Cutting a prompt anywhere is unsafe for
RL anyway (the question or the answer instructions go missing), so rows that do not fit are dropped and
counted, and the run stops when more than ``max_dropped_share`` of a dataset would go (a limit that
small is almost certainly a mistake, and training on the short remainder would bias the data).

Lengths are measured exactly as the rollout engine builds prompts: the processor's chat template
(``mmrlvr.rollout.hf.prompt_texts``) and the processor itself on the sample's images, so every image
contributes its true number of ``<|image_pad|>`` tokens (h*w / (patch*merge)^2 for Qwen-VL) and nothing
is estimated. ``prompt_lengths`` is also what ``mmrlvr data inspect`` reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mmrlvr.errors import UserError
from mmrlvr.metric import Metric
from mmrlvr.types import Sample


@dataclass
class LengthReport:
    """What ``filter_by_length`` did to one dataset."""

    source: str
    max_prompt_length: int
    n_in: int = 0
    n_kept: int = 0
    dropped_ids: list[str] = field(default_factory=list)
    dropped_lengths: list[int] = field(default_factory=list)
    longest_kept: int = 0

    @property
    def n_dropped(self) -> int:
        return len(self.dropped_ids)

    @property
    def dropped_share(self) -> float:
        return self.n_dropped / self.n_in if self.n_in else 0.0

    def warning(self) -> str | None:
        """One line for the log when rows were dropped, naming one example row; None when none were."""
        if not self.n_dropped:
            return None
        return (f"data: {self.source}: dropped {self.n_dropped} of {self.n_in} rows ({self.dropped_share:.1%}) whose "
                f"prompt is longer than data.max_prompt_length={self.max_prompt_length} tokens (e.g. row "
                f"{self.dropped_ids[0]!r}: {self.dropped_lengths[0]} tokens); prompts are never cut")

    def metrics(self, prefix: str = "data") -> dict[str, Metric]:
        """Rows dropped as too long, and their share; every process loads the whole data set (the same values)."""
        return {f"{prefix}/dropped_too_long": Metric.same(float(self.n_dropped)),
                f"{prefix}/dropped_too_long_share": Metric.same(self.dropped_share)}


def _processor_inputs(processor: Any, samples: list[Sample]) -> dict[str, Any]:
    from mmrlvr.data.video_processing import ensure_video_processor, video_processor_kwargs
    from mmrlvr.rollout.hf import prompt_texts

    video = video_processor_kwargs(samples)
    if video:
        ensure_video_processor(processor)  # before rendering: it may upgrade an old tiny chat template
    kwargs: dict[str, Any] = {"text": prompt_texts(processor, samples), "padding": True, **video}
    images = [im for s in samples for im in s.images]
    if images:
        kwargs["images"] = images
    return kwargs


def prompt_lengths(samples: list[Sample], processor: Any, chunk: int = 32) -> list[int]:
    """Prompt tokens of each sample (chat template + image/video tokens), as the rollout engine encodes it."""
    tok = getattr(processor, "tokenizer", processor)
    side = getattr(tok, "padding_side", "left")
    out: list[int] = []
    for i in range(0, len(samples), chunk):
        part = samples[i:i + chunk]
        mixed = any(bool(s.images) != bool(part[0].images) or bool(s.meta.get("videos")) != bool(part[0].meta.get("videos"))
                    for s in part)
        groups = [[s] for s in part] if mixed else [part]
        for g in groups:  # the processor cannot mix rows with and without images in one call
            enc = processor(**_processor_inputs(processor, g))
            out.extend(int(sum(m)) for m in enc["attention_mask"])
    tok.padding_side = side
    return out


def filter_by_length(samples: list[Sample], processor: Any, max_prompt_length: int, *, max_dropped_share: float = 0.1,
                     source: str = "data") -> tuple[list[Sample], LengthReport]:
    """(samples that fit, report). Raises ``UserError`` when more than ``max_dropped_share`` would be dropped.

    ``max_prompt_length`` <= 0 keeps everything (the report still counts the rows).
    """
    report = LengthReport(source=source, max_prompt_length=max_prompt_length, n_in=len(samples))
    if max_prompt_length <= 0:
        report.n_kept = len(samples)
        return list(samples), report
    lengths = prompt_lengths(samples, processor)
    kept = []
    for s, n in zip(samples, lengths):
        if n <= max_prompt_length:
            kept.append(s)
            report.longest_kept = max(report.longest_kept, n)
        else:
            report.dropped_ids.append(s.id)
            report.dropped_lengths.append(n)
    report.n_kept = len(kept)
    if report.dropped_share > max_dropped_share:
        raise UserError(f"data: {source}: {report.n_dropped} of {report.n_in} rows ({report.dropped_share:.1%}) have "
                        f"prompts longer than data.max_prompt_length={max_prompt_length} tokens (e.g. row "
                        f"{report.dropped_ids[0]!r}: {report.dropped_lengths[0]} tokens, the longest "
                        f"{max(report.dropped_lengths)}), over data.max_dropped_share={max_dropped_share}; raise "
                        "the limit, lower data.max_pixels, or raise max_dropped_share")
    return kept, report
