"""Load one dataset of a run from its ``DataConfig``: layout, prompt template, per-dataset options, length.

``load_configured(spec, data_cfg, split, processor=None)`` is what ``mmrlvr.train.data.load_split`` calls
for a dataset path: it merges ``data.train_options`` / ``data.eval_options`` over the shared ``data.*``
keys (so train and eval may differ in layout, columns or ``min_pixels`` / ``max_pixels``), loads with
``mmrlvr.data.loading.load_samples``, prints the detected layout when ``data.format`` is ``auto``, and
drops prompts longer than ``max_prompt_length`` (``mmrlvr.data.length``) when a processor is given.
"""

from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace
from typing import Any

from mmrlvr.errors import UserError
from mmrlvr.types import Sample

#: keys a per-dataset options mapping (``data.train_options`` / ``data.eval_options``) may set
PER_DATASET_KEYS: tuple[str, ...] = (
    "format", "preset", "columns", "template", "system_prompt", "prompt_template", "min_pixels", "max_pixels",
    "factor", "max_image_pixels", "image_dir", "on_error", "max_prompt_length", "max_dropped_share",
    "video_fps", "video_max_frames", "video_min_frames", "video_max_pixels",
)


def effective_options(data_cfg: Any, split: str) -> SimpleNamespace:
    """The data settings for ``split`` ("train" or anything else = eval): shared keys + that split's options."""
    base = dataclasses.asdict(data_cfg) if dataclasses.is_dataclass(data_cfg) else dict(vars(data_cfg))
    key = "train_options" if split == "train" else "eval_options"
    options = base.get(key) or {}
    unknown = sorted(set(options) - set(PER_DATASET_KEYS))
    if unknown:
        raise UserError(f"data.{key}: unknown key(s) {', '.join(unknown)}; known: {', '.join(PER_DATASET_KEYS)}")
    base.update(options)
    return SimpleNamespace(**base)


def layout_name(opts: Any) -> str | None:
    """The preset to load with: ``format`` unless ``auto``; the older ``preset`` key must agree with it."""
    from mmrlvr.data.loading import FORMATS

    fmt = getattr(opts, "format", "auto") or "auto"
    if fmt not in FORMATS:
        raise UserError(f"data.format: unknown layout {fmt!r}; known: {', '.join(FORMATS)}")
    preset = getattr(opts, "preset", None)
    if preset and fmt != "auto" and preset != fmt:
        raise UserError(f"data.format is {fmt!r} but data.preset is {preset!r}; set only data.format")
    chosen = fmt if fmt != "auto" else preset
    return chosen or None


def video_options(opts: Any) -> Any:
    from mmrlvr.data.video import VideoOptions

    return VideoOptions(fps=float(opts.video_fps), max_frames=int(opts.video_max_frames),
                        min_frames=int(opts.video_min_frames), max_pixels=int(opts.video_max_pixels))


def load_configured(spec: str, data_cfg: Any, split: str, processor: Any = None,
                    reports: list[Any] | None = None, log: Any = None) -> list[Sample]:
    """Samples of the dataset at ``spec`` under ``data_cfg`` (see the module docstring).

    reports: when a list, the ``LoadReport`` and (with a processor) the ``LengthReport`` are appended, so
        the caller can log ``LengthReport.metrics()``.
    log: where the one-line notes go (default: stderr).
    """
    from mmrlvr.data.loading import load_samples

    log = log or (lambda line: print(line, file=sys.stderr))
    opts = effective_options(data_cfg, split)
    split_name = getattr(opts, "train_split" if split == "train" else "eval_split", None)
    samples, report = load_samples(
        spec, preset=layout_name(opts), columns=opts.columns or None, template=opts.template,
        system=opts.system_prompt, prompt_template=opts.prompt_template, split=split_name,
        min_pixels=opts.min_pixels, max_pixels=opts.max_pixels, on_error=opts.on_error, factor=opts.factor,
        max_image_pixels=opts.max_image_pixels, image_dir=opts.image_dir, video=video_options(opts),
    )
    if reports is not None:
        reports.append(report)
    if report.detected:
        fields = ", ".join(f"{k}<-{v}" for k, v in report.columns.items())
        log(f"data: {spec}: detected layout {report.preset} ({fields}); set data.format to choose another")
    if report.n_skipped:
        log(f"data: {report.summary()}")
    if processor is not None:
        samples = apply_length_limit(samples, processor, opts, spec, reports, log)
    if not samples:
        raise UserError(f"data: {spec}: no usable rows")
    return samples


def apply_length_limit(samples: list[Sample], processor: Any, opts: Any, source: str,
                       reports: list[Any] | None = None, log: Any = None) -> list[Sample]:
    """``filter_by_length`` with the options' limit and share; logs the one warning line."""
    from mmrlvr.data.length import filter_by_length

    kept, length_report = filter_by_length(samples, processor, int(opts.max_prompt_length or 0),
                                           max_dropped_share=float(opts.max_dropped_share), source=source)
    if reports is not None:
        reports.append(length_report)
    line = length_report.warning()
    if line:
        (log or (lambda s: print(s, file=sys.stderr)))(line)
    return kept
