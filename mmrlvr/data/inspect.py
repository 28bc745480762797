"""``mmrlvr data inspect PATH``: what the trainer will make of a dataset, before any training.

    mmrlvr data inspect data/train.parquet [--format verl] [--rows 3] [--model PATH] [--columns answer=a.b]
                        [--template r1] [--prompt-template boxed_math] [--max-prompt-length 1024]

Prints the layout (detected or given) and which column feeds each field, the first rows as the model
will see them (the chat template rendered, each image / video shown as a marker with its size and token
count, and the prompt's total tokens), then every problem found in the whole file: each bad row with its
row number and field, and, with ``--max-prompt-length``, each row too long to keep. Exit status: 0 when
no problem was found, 1 when some rows have problems, 2 when the file cannot be used at all (one
paragraph, no traceback, as for every ``mmrlvr`` command).

Token counts use ``--model``'s processor when given; otherwise the tiny offline Qwen2.5-VL processor
(``mmrlvr.models.tiny``: Qwen's chat template and image-token layout, its own small tokenizer), so image
tokens are exact for Qwen2/2.5-VL at factor 28 and text tokens are an estimate.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mmrlvr.errors import UserError

_VISION = re.compile(r"<\|vision_start\|>(<\|image_pad\|>|<\|video_pad\|>)+<\|vision_end\|>")


def add_arguments(parser: Any) -> None:
    from mmrlvr.data.loading import FORMATS

    parser.add_argument("path", help="a dataset folder, .parquet, .jsonl or .json file")
    parser.add_argument("--format", default="auto", help=f"layout: {', '.join(FORMATS)} (default auto)")
    parser.add_argument("--rows", type=int, default=3, help="rows to render (default 3)")
    parser.add_argument("--model", default=None, help="model folder whose processor counts tokens (default: tiny)")
    parser.add_argument("--columns", nargs="*", default=[], metavar="FIELD=COLUMN",
                        help="field mappings, dotted paths allowed (answer=reward_model.ground_truth)")
    parser.add_argument("--template", default="r1", help="prompt template: r1 | r1_user | boxed | plain")
    parser.add_argument("--prompt-template", default=None, help="Jinja prompt template (file, string or shipped name)")
    parser.add_argument("--system-prompt", default=None, help="system prompt override")
    parser.add_argument("--split", default=None, help="split of a DatasetDict folder / file-name prefix")
    parser.add_argument("--max-prompt-length", type=int, default=0, help="also list rows longer than this")
    parser.add_argument("--max-pixels", type=int, default=448 * 448, help="image resize limit (as data.max_pixels)")
    parser.add_argument("--min-pixels", type=int, default=28 * 28, help="as data.min_pixels")
    parser.add_argument("--factor", type=int, default=28, help="as data.factor (32 for Qwen3-VL)")


def _processor(model: str | None) -> tuple[Any, str]:
    if model:
        from mmrlvr.models.compat import load_processor

        path = Path(model)
        if not path.is_dir():
            raise UserError(f"--model {model}: not a model folder")
        model_type = None
        cfg = path / "config.json"
        if cfg.is_file():
            import json

            model_type = json.loads(cfg.read_text()).get("model_type")
        return load_processor(path, model_type), f"the processor of {model}"
    from mmrlvr.models.tiny import build_tokenizer, make_config, make_processor

    tok = build_tokenizer()
    return make_processor("qwen2_5_vl", tok, make_config("qwen2_5_vl", tok)), \
        "the tiny offline Qwen2.5-VL processor (image tokens exact at factor 28; text tokens estimated)"


def render(sample: Any, processor: Any) -> tuple[str, int]:
    """(the prompt as the model sees it with vision markers summarised, its total token count)."""
    from mmrlvr.data.length import prompt_lengths
    from mmrlvr.rollout.hf import prompt_texts

    text = prompt_texts(processor, [sample])[0]
    ip = getattr(processor, "image_processor", None)
    tokens_per = (getattr(ip, "patch_size", 14) * getattr(ip, "merge_size", 2)) ** 2
    images = iter(sample.images)
    videos = iter(sample.meta.get("videos") or [])
    counter = {"image": 0, "video": 0}

    def marker(m: re.Match) -> str:
        if "video_pad" in m.group(0):
            counter["video"] += 1
            v = next(videos, None)
            if v is None:
                return "[video ?]"
            w, h = v["frames"][0].size
            n = len(v["frames"]) // 2 * (w * h) // tokens_per
            return f"[video {counter['video']}: {len(v['frames'])} frames {w}x{h} @ {v['fps']:.2f} fps, {n} tokens]"
        counter["image"] += 1
        im = next(images, None)
        if im is None:
            return "[image ?]"
        return f"[image {counter['image']}: {im.size[0]}x{im.size[1]}, {im.size[0] * im.size[1] // tokens_per} tokens]"

    shown = _VISION.sub(marker, text)
    return shown, prompt_lengths([sample], processor)[0]


def run(args: Any, out: Any = print) -> int:
    from mmrlvr.data.loading import FORMATS, load_samples
    from mmrlvr.errors import DataError

    if args.format not in FORMATS:
        raise UserError(f"--format: unknown layout {args.format!r}; known: {', '.join(FORMATS)}")
    if args.rows < 0:
        raise UserError(f"--rows must be >= 0, got {args.rows}")
    columns = {}
    for item in args.columns:
        if "=" not in item:
            raise UserError(f"--columns {item!r}: expected FIELD=COLUMN (e.g. answer=reward_model.ground_truth)")
        k, v = item.split("=", 1)
        columns[k.strip()] = v.strip()
    try:
        samples, report = load_samples(
            args.path, preset=None if args.format == "auto" else args.format, columns=columns or None,
            template=args.template, system=args.system_prompt, prompt_template=args.prompt_template,
            split=args.split, on_error="skip", min_pixels=args.min_pixels, max_pixels=args.max_pixels,
            factor=args.factor)
    except DataError as exc:
        raise UserError(f"{exc}\n\nnothing could be loaded; fix the source or pass --format / --columns "
                        "(see docs/data.md)") from None
    how = "detected from the columns" if report.detected else "given with --format"
    out(f"layout: {report.preset} ({how})")
    for field, col in report.columns.items():
        out(f"  {field:<12} <- {col}")
    out(f"rows: {report.n_rows} read, {report.n_loaded} usable, {report.n_skipped} with problems")
    problems: list[str] = [f"row {r.row}" + (f", field {r.field!r}" if r.field else "") + f": {r.message}"
                           for r in report.skipped]
    processor = None
    if samples and (args.rows or args.max_prompt_length):
        processor, which = _processor(args.model)
        out(f"tokens: counted with {which}")
    for s in samples[: args.rows]:
        shown, n = render(s, processor)
        out("")
        out(f"--- row {s.meta.get('row')} (id {s.id!r}), {n} prompt tokens, answer {s.answer!r} ({s.answer_type})")
        out(shown.rstrip())
    if args.max_prompt_length and samples:
        from mmrlvr.data.length import prompt_lengths

        for s, n in zip(samples, prompt_lengths(samples, processor)):
            if n > args.max_prompt_length:
                problems.append(f"row {s.meta.get('row')} (id {s.id!r}): prompt is {n} tokens, over "
                                f"--max-prompt-length {args.max_prompt_length} (it would be dropped)")
    out("")
    if not problems:
        out("problems: none")
        return 0
    out(f"problems: {len(problems)}")
    for line in problems:
        out(f"  {line}")
    return 1
