"""What the inspector shows, as pure functions of records (no Gradio here, so everything is unit-tested).

Each function turns a ``RolloutRecord`` (or index rows from ``RolloutReader``) into the value of one
component: card HTML, thinking/answer panes, reward tables, heatmap spans, box annotations, plot frames.

Safety rule: every piece of rollout text (prompt, response, tokens, rubric text, judge rationale, parsed
answer, ground truth) goes through ``esc`` before it is put into HTML. ``esc`` escapes HTML *and* the
characters Gradio's ``gr.HTML`` templates treat as syntax (``${…}``, ``{{…}}``, backticks), so text from a
model is always shown as text and never executed or interpreted. Image paths from records go through
``mmrlvr.store.images.resolve_in_run`` (refuses anything outside the run folder).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from mmrlvr.store.images import resolve_in_run
from mmrlvr.store.record import RolloutRecord

#: heatmap name -> record field
SIGNALS: dict[str, str] = {
    "logprob": "token_logprob",
    "entropy": "token_entropy",
    "vision sensitivity": "token_vision_sensitivity",
    "credit weight": "token_credit_weight",
    "advantage": "token_advantage",
    "ratio": "token_ratio",
}
#: tokens whose runs are collapsed into one span in heatmaps
PAD_TOKENS = frozenset({"<|image_pad|>", "<|video_pad|>", "<|vision_pad|>", "<|endoftext|>", "<pad>"})
PRED_COLOUR = "#ff00ff"  # magenta: predicted boxes
GT_COLOUR = "#00bcd4"  # cyan: ground-truth boxes (magenta/cyan stand out on natural images and on
#                         the primary-coloured synthetic shapes, and stay apart for colour-blind users)
METRIC_NAMES = ["reward/mean", "accuracy", "inconsistency_rate", "response_length/mean",
                "credit/selected_fraction"]

_EXTRA_ESCAPES = str.maketrans({"{": "&#123;", "}": "&#125;", "$": "&#36;", "`": "&#96;"})


def esc(text: Any) -> str:
    """Escape any value for HTML shown by ``gr.HTML`` (HTML + template syntax). ``None`` -> ''."""
    if text is None:
        return ""
    return html.escape(str(text), quote=True).translate(_EXTRA_ESCAPES)


def fmt(value: Any, digits: int = 3) -> str:
    """Short number formatting that survives None / NaN / inf."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.{digits}g}"
    return f"{x:.{digits}f}".rstrip("0").rstrip(".")


# -- response layout ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResponseParts:
    """Character ranges ``[start, end)`` of the thinking and the answer inside ``response_text``."""

    thinking: tuple[int, int]
    answer: tuple[int, int]


def split_response(text: str) -> ResponseParts:
    """Locate ``<think>…</think>`` and ``<answer>…</answer>`` (tolerates missing/unclosed tags).

    No think tags: the thinking is the text before ``<answer>`` (empty without an answer tag).
    No answer tags: the answer is the text after ``</think>`` (the whole text without think tags).
    """
    n = len(text)
    t_open, t_close = text.find("<think>"), text.find("</think>")
    a_open = text.find("<answer>")
    a_close = text.find("</answer>", a_open + 1) if a_open >= 0 else -1
    if a_open >= 0:
        answer = (a_open + len("<answer>"), a_close if a_close >= 0 else n)
    elif t_close >= 0:
        answer = (t_close + len("</think>"), n)
    elif t_open >= 0:
        answer = (n, n)  # unclosed thinking, no answer (truncated)
    else:
        answer = (0, n)
    if t_open >= 0 or t_close >= 0:
        start = t_open + len("<think>") if 0 <= t_open and (t_close < 0 or t_open < t_close) else 0
        end = t_close if t_close >= 0 else (a_open if a_open >= 0 else n)
        thinking = (start, max(start, end))
    elif a_open >= 0:
        thinking = (0, a_open)
    else:
        thinking = (0, 0)
    return ResponseParts(thinking, answer)


def highlighted_html(text: str, rng: tuple[int, int], span: Sequence[int] | None) -> str:
    """Escaped ``text[rng]`` with the part inside ``span`` (absolute offsets) wrapped in ``<mark>``."""
    start, end = rng
    if not span or len(span) != 2 or span[0] is None or span[1] is None:
        return esc(text[start:end])
    s, e = max(int(span[0]), start), min(int(span[1]), end)
    if s >= e:
        return esc(text[start:end])
    return (esc(text[start:s]) + '<mark class="mm-conclusion" title="extracted conclusion" '
            'style="background:#ffe082;color:#000;border-radius:3px;padding:0 2px">'
            + esc(text[s:e]) + "</mark>" + esc(text[e:end]))


_PANE = ("white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,monospace;font-size:13px;"
         "border:1px solid #ccc;border-radius:6px;padding:8px;min-height:3em;max-height:420px;overflow:auto")


def thinking_answer_html(rec: RolloutRecord) -> str:
    """Two panes side by side: thinking | answer (+ parsed answer vs ground truth), conclusion highlighted."""
    parts = split_response(rec.response_text)
    span = (rec.consistency or {}).get("conclusion_span")
    thinking = highlighted_html(rec.response_text, parts.thinking, span)
    answer = highlighted_html(rec.response_text, parts.answer, span)
    verdict = consistency_badge_html(rec)
    correct = rec.reward_components.get("accuracy")
    return (
        '<div class="mm-ta" style="display:flex;gap:10px;flex-wrap:wrap">'
        f'<div style="flex:3;min-width:260px"><b>Thinking</b> {verdict}<div class="mm-thinking" style="{_PANE}">'
        f'{thinking or "<i>(none)</i>"}</div></div>'
        f'<div style="flex:2;min-width:200px"><b>Answer</b><div class="mm-answer" style="{_PANE}">'
        f'{answer or "<i>(none)</i>"}</div>'
        '<table class="mm-gt" style="margin-top:6px;font-size:13px">'
        f'<tr><td><b>parsed</b></td><td><code>{esc(rec.parsed_answer) or "–"}</code></td></tr>'
        f'<tr><td><b>ground truth</b></td><td><code>{esc(rec.ground_truth) or "–"}</code></td></tr>'
        + (f'<tr><td><b>accuracy</b></td><td>{fmt(correct)}</td></tr>' if correct is not None else "")
        + "</table></div></div>"
        f'<details style="margin-top:6px"><summary>raw response ({rec.num_response_tokens} tokens, '
        f'finish: {esc(rec.finish_reason)})</summary><div style="{_PANE}">{esc(rec.response_text)}</div></details>'
    )


def consistency_badge_html(rec: RolloutRecord) -> str:
    """A coloured badge: consistent / inconsistent / unknown, with p and the conclusion."""
    c = rec.consistency
    if not c:
        return '<span class="mm-badge" style="color:#777">consistency: not computed</span>'
    verdict = str(c.get("verdict") or "unknown")
    colour = {"consistent": "#2e7d32", "inconsistent": "#c62828"}.get(verdict, "#757575")
    details = [f"p={fmt(c.get('p_consistent'))}"]
    if c.get("conclusion") is not None:
        details.append(f"conclusion: {c.get('conclusion')}")
    for key in ("thinking_correct", "answer_correct"):
        if c.get(key) is not None:
            details.append(f"{key.replace('_', ' ')}: {fmt(c.get(key))}")
    return (f'<span class="mm-badge mm-{esc(verdict)}" style="background:{colour};color:#fff;border-radius:4px;'
            f'padding:1px 6px;font-size:12px">{esc(verdict)}</span> '
            f'<span style="font-size:12px;color:#555">{esc(" · ".join(details))}</span>')


# -- rewards ------------------------------------------------------------------------------------------
def reward_breakdown_html(rec: RolloutRecord) -> str:
    """Tables: reward components, then rubric criteria with verdict, score, weight, judge, rationale."""
    rows = "".join(f"<tr><td>{esc(k)}</td><td style='text-align:right'>{fmt(v)}</td></tr>"
                   for k, v in sorted(rec.reward_components.items()))
    out = [f'<div class="mm-reward"><b>Reward {fmt(rec.reward)}</b> · advantage {fmt(rec.advantage)}'
           '<table style="font-size:13px;margin:4px 0"><tr><th>component</th><th>value</th></tr>'
           f"{rows or '<tr><td colspan=2><i>no components</i></td></tr>'}</table>"]
    if rec.rubric_results:
        colours = {"pass": "#2e7d32", "fail": "#c62828"}
        crit = []
        for c in rec.rubric_results:
            verdict = str(c.get("verdict") or "unknown")
            crit.append(
                f"<tr><td><code>{esc(c.get('id'))}</code></td><td>{esc(c.get('text'))}</td>"
                f"<td>{esc(c.get('category'))}</td>"
                f"<td style='color:{colours.get(verdict, '#757575')};font-weight:bold'>{esc(verdict)}</td>"
                f"<td>{fmt(c.get('score'))}</td><td>{fmt(c.get('weight'))}</td><td>{esc(c.get('judge'))}</td>"
                f"<td style='white-space:pre-wrap'>{esc(c.get('rationale'))}</td></tr>")
        out.append('<b>Rubric criteria</b><table class="mm-rubric" style="font-size:13px"><tr><th>id</th>'
                   "<th>criterion</th><th>category</th><th>verdict</th><th>score</th><th>weight</th>"
                   f"<th>judge</th><th>rationale</th></tr>{''.join(crit)}</table>")
    out.append("</div>")
    return "".join(out)


# -- groups -------------------------------------------------------------------------------------------
def group_cards_html(records: Sequence[RolloutRecord], selected: int | None = None) -> str:
    """The G samples of one prompt as cards sorted by reward (best first), with the group's spread.

    A zero-variance group (all rewards equal) is flagged: its advantages are 0, so it gives no gradient.
    """
    if not records:
        return "<i>no samples</i>"
    rewards = np.array([r.reward for r in records], dtype=float)
    spread = float(np.nanmax(rewards) - np.nanmin(rewards))
    zero_var = bool(np.nanstd(rewards) < 1e-8)
    head = (f'<div class="mm-group-head" style="margin-bottom:6px"><b>Group</b> <code>{esc(records[0].prompt_id)}'
            f"</code> · step {records[0].step} · G={len(records)} · reward mean {fmt(float(np.nanmean(rewards)))}"
            f" · std {fmt(float(np.nanstd(rewards)))} · spread {fmt(spread)}")
    if zero_var:
        head += (' <span class="mm-zero-var" style="background:#ff8f00;color:#fff;border-radius:4px;padding:1px 6px">'
                 "zero variance: no learning signal</span>")
    head += "</div>"
    cards = []
    for rec in sorted(records, key=lambda r: (-_nan_to(r.reward, -np.inf), r.sample_index)):
        border = "3px solid #1565c0" if rec.sample_index == selected else "1px solid #ccc"
        adv_colour = "#2e7d32" if rec.advantage > 1e-8 else "#c62828" if rec.advantage < -1e-8 else "#757575"
        preview = rec.response_text[:160] + ("…" if len(rec.response_text) > 160 else "")
        cards.append(
            f'<div class="mm-card" data-sample="{rec.sample_index}" style="border:{border};border-radius:6px;'
            'padding:6px;width:200px;font-size:12px">'
            f'<div><b>#{rec.sample_index}</b> reward <b>{fmt(rec.reward)}</b></div>'
            f'<div>adv <span style="color:{adv_colour}">{fmt(rec.advantage)}</span> · '
            f"{rec.num_response_tokens} tok · {esc(rec.finish_reason)}</div>"
            f'<div style="color:#555;white-space:pre-wrap;word-break:break-word;max-height:6em;overflow:hidden">'
            f"{esc(preview)}</div></div>")
    return head + '<div class="mm-cards" style="display:flex;flex-wrap:wrap;gap:6px">' + "".join(cards) + "</div>"


def group_choices(summary: pd.DataFrame) -> list[tuple[str, str]]:
    """Dropdown choices (label, prompt_id) from ``reader.groups(step)``; zero-variance groups marked."""
    out = []
    for row in summary.itertuples(index=False):
        flag = " ⚠ zero var" if row.zero_variance else ""
        out.append((f"{row.prompt_id} · mean {fmt(row.reward_mean)} · spread {fmt(row.spread)}{flag}",
                    str(row.prompt_id)))
    return out


def sample_choices(records: Sequence[RolloutRecord]) -> list[tuple[str, int]]:
    """Radio choices (label, sample_index), sorted by reward like the cards."""
    ordered = sorted(records, key=lambda r: (-_nan_to(r.reward, -np.inf), r.sample_index))
    return [(f"#{r.sample_index} r={fmt(r.reward, 2)}", int(r.sample_index)) for r in ordered]


# -- heatmap ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeatToken:
    """One heatmap span: the text shown, the score in [-1, 1], the raw values for the hover text."""

    text: str
    score: float | None
    raw: str
    count: int = 1


def recorded_signals(rec: RolloutRecord) -> list[str]:
    """The heatmap signals this record has values for, in ``SIGNALS`` order."""
    return [name for name, field in SIGNALS.items() if len(getattr(rec, field))]


def scale_signal(values: Sequence[float], signal: str) -> list[float | None]:
    """Scale raw per-token values to [-1, 1] for colouring (None for non-finite values).

    ratio is shown as log(ratio) (1 -> 0, symmetric for up/down); every signal is divided by its largest
    absolute finite value in the response, so the most extreme token is ±1 and 0 stays white.
    """
    arr = np.asarray(values, dtype=float)
    if signal == "ratio":
        with np.errstate(divide="ignore", invalid="ignore"):
            arr = np.log(arr)
    finite = np.isfinite(arr)
    peak = float(np.max(np.abs(arr[finite]))) if finite.any() else 0.0
    out: list[float | None] = []
    for x, ok in zip(arr, finite):
        if not ok:
            out.append(None)
        else:
            out.append(float(np.clip(x / peak, -1.0, 1.0)) if peak > 0 else 0.0)
    return out


def heatmap_tokens(rec: RolloutRecord, signal: str) -> list[HeatToken]:
    """Per-token heatmap of ``signal`` (a key of ``SIGNALS``), runs of pad tokens collapsed to one span."""
    if signal not in SIGNALS:
        raise ValueError(f"unknown heatmap signal {signal!r}; choose one of {list(SIGNALS)}")
    tokens = rec.response_tokens or [str(t) for t in rec.response_token_ids]
    values = list(getattr(rec, SIGNALS[signal]))
    if not tokens:
        return []
    scores = scale_signal(values, signal) if values else [None] * len(tokens)
    out: list[HeatToken] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        j = i + 1
        if tok in PAD_TOKENS:
            while j < len(tokens) and tokens[j] == tok:
                j += 1
        if j - i > 1:
            run = [s for s in scores[i:j] if s is not None]
            raw_vals = [v for v in values[i:j] if v is not None and math.isfinite(v)] if values else []
            raw = (f"tokens {i}–{j - 1}: {j - i}× {tok}"
                   + (f"; {signal} mean {fmt(float(np.mean(raw_vals)))}" if raw_vals else ""))
            out.append(HeatToken(f"{tok}×{j - i}", float(np.mean(run)) if run else None, raw, j - i))
        else:
            out.append(HeatToken(tok, scores[i], _token_hover(rec, i, tok), 1))
        i = j
    return out


def _token_hover(rec: RolloutRecord, i: int, tok: str) -> str:
    parts = [f"token {i}: {tok!r}"]
    if i < len(rec.response_token_ids):
        parts[0] += f" (id {rec.response_token_ids[i]})"
    for name, field in SIGNALS.items():
        values = getattr(rec, field)
        if i < len(values):
            parts.append(f"{name} {fmt(values[i], 4)}")
    return "\n".join(parts)


def heatmap_highlighted(tokens: Sequence[HeatToken]) -> list[tuple[str, float | None]]:
    """Value for ``gr.HighlightedText``: (text, score in [-1, 1] or None)."""
    return [(t.text, None if t.score is None else round(t.score, 4)) for t in tokens]


def heatmap_html(tokens: Sequence[HeatToken], signal: str) -> str:
    """The same heatmap as escaped HTML spans whose hover text (``title``) lists every raw signal."""
    spans = []
    for t in tokens:
        if t.score is None:
            bg = "transparent"
        elif t.score >= 0:
            bg = f"rgba(239,68,60,{t.score:.3f})"
        else:
            bg = f"rgba(128,90,213,{-t.score:.3f})"
        extra = ";border:1px dashed #999" if t.count > 1 else ""
        spans.append(f'<span class="mm-tok" title="{esc(t.raw)}" style="background:{bg}{extra}">{esc(t.text)}</span>')
    legend = (f'<div style="font-size:12px;color:#555;margin-bottom:4px">{esc(signal)}: purple = negative, '
              "red = positive, scaled by the largest |value| in this response; hover a token for raw values"
              "</div>")
    return (legend + '<div class="mm-heatmap" style="white-space:pre-wrap;word-break:break-word;'
            'font-family:ui-monospace,monospace;font-size:13px;line-height:1.6">' + "".join(spans) + "</div>")


# -- images and boxes ---------------------------------------------------------------------------------
def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of [x1, y1, x2, y2] boxes (0 for empty or invalid boxes)."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area_a = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])
    area_b = max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])
    union = area_a + area_b - inter
    return inter / union if union > 0 else 0.0


def best_ious(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> list[float | None]:
    """For each predicted box, its IoU with the best-matching ground-truth box (None without GT)."""
    return [max((box_iou(p, g) for g in gt), default=None) if gt else None for p in pred]


def _clip_box(box: Sequence[float], size: tuple[int, int]) -> tuple[int, int, int, int]:
    w, h = size
    x1, y1, x2, y2 = (float(v) for v in box)
    x1, x2 = sorted((min(max(x1, 0), w - 1), min(max(x2, 0), w - 1)))
    y1, y2 = sorted((min(max(y1, 0), h - 1), min(max(y2, 0), h - 1)))
    return int(round(x1)), int(round(y1)), int(round(x2)), int(round(y2))


def box_annotations(rec: RolloutRecord, size: tuple[int, int]) -> tuple[list[tuple[tuple[int, int, int, int], str]],
                                                                        dict[str, str]]:
    """``gr.AnnotatedImage`` annotations and colour map: predicted boxes (red, with IoU) and GT (blue).

    Boxes are clipped to the image (``size`` = (width, height)) so a wild prediction still shows.
    """
    annotations: list[tuple[tuple[int, int, int, int], str]] = []
    colours: dict[str, str] = {}
    for i, box in enumerate(rec.gt_boxes):
        label = f"gt {i + 1}"
        annotations.append((_clip_box(box, size), label))
        colours[label] = GT_COLOUR
    for i, (box, iou) in enumerate(zip(rec.parsed_boxes, best_ious(rec.parsed_boxes, rec.gt_boxes))):
        label = f"pred {i + 1}" + (f" IoU {iou:.2f}" if iou is not None else "")
        annotations.append((_clip_box(box, size), label))
        colours[label] = PRED_COLOUR
    return annotations, colours


def display_scale(size: tuple[int, int], target: int = 384) -> int:
    """Integer upscaling factor so small (e.g. 112 px) training images are visible in the browser."""
    return max(1, int(target // max(size)))


def annotated_value(image: Image.Image, rec: RolloutRecord) -> tuple[tuple[Image.Image, list], dict[str, str]]:
    """``(image, annotations)`` for ``gr.AnnotatedImage`` plus its colour map, enlarged for display."""
    annotations, colours = box_annotations(rec, image.size)
    k = display_scale(image.size)
    if k > 1:
        image = image.resize((image.width * k, image.height * k), Image.NEAREST)
        annotations = [(tuple(v * k for v in box), label) for box, label in annotations]
    return (image, annotations), colours


def draw_boxes(image: Image.Image, rec: RolloutRecord, caption: str | None = None,
               caption_right: bool = False) -> Image.Image:
    """A copy of ``image`` with GT (cyan) and predicted (magenta) boxes drawn in, for the step slider.

    The caption goes bottom-left (or bottom-right for the slider's right-hand image, whose left half the
    slider covers)."""
    img = image.convert("RGB").copy()
    scale = display_scale(img.size)  # small training images: enlarge so lines and labels stay visible
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    draw = ImageDraw.Draw(img)
    for box in rec.gt_boxes:
        draw.rectangle([v * scale for v in _clip_box(box, image.size)], outline=GT_COLOUR, width=2)
    for box, iou in zip(rec.parsed_boxes, best_ious(rec.parsed_boxes, rec.gt_boxes)):
        x1, y1, x2, y2 = (v * scale for v in _clip_box(box, image.size))
        draw.rectangle([x1, y1, x2, y2], outline=PRED_COLOUR, width=2)
        if iou is not None:
            draw.text((x1 + 2, max(0, y1 - 11)), f"IoU {iou:.2f}", fill=PRED_COLOUR)
    if caption:  # bottom-left: Gradio's component label covers the top-left corner
        draw.rectangle([0, img.height - 14, img.width, img.height], fill=(255, 255, 255))
        width = draw.textlength(caption)
        draw.text((img.width - width - 3 if caption_right else 3, img.height - 13), caption, fill=(0, 0, 0))
    return img


def load_images(run_dir: Any, rec: RolloutRecord) -> list[Image.Image]:
    """The record's images (paths checked to stay inside the run; a missing file becomes a grey tile)."""
    out = []
    for ref in rec.image_refs:
        path = resolve_in_run(run_dir, ref)
        if path.is_file():
            with Image.open(path) as img:
                img.load()
                out.append(img.convert("RGB"))
        else:
            out.append(Image.new("RGB", (64, 64), (200, 200, 200)))
    return out


# -- tables and plots ---------------------------------------------------------------------------------
def filter_table(rows: pd.DataFrame, components: Iterable[str] = ()) -> pd.DataFrame:
    """Index rows -> the table shown in the Filter tab (rounded, internal columns dropped)."""
    cols = ["step", "prompt_id", "sample_index", "reward", "advantage", "finish_reason", "num_response_tokens"]
    comp_cols = [f"c:{c}" for c in components if f"c:{c}" in rows.columns]
    out = rows[cols + comp_cols].copy()
    out.columns = ["step", "prompt", "sample", "reward", "advantage", "finish", "tokens"] + [c[2:] for c in comp_cols]
    return out.round(4).reset_index(drop=True)


def metrics_frame(metrics: Sequence[dict[str, Any]], names: Sequence[str]) -> pd.DataFrame:
    """metrics.jsonl rows -> long frame (step, value, metric) for ``gr.LinePlot(color="metric")``."""
    rows = []
    for m in metrics:
        for name in names:
            v = m.get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                rows.append({"step": int(m["step"]), "value": float(v), "metric": name})
    return pd.DataFrame(rows, columns=["step", "value", "metric"])


def metric_names(metrics: Sequence[dict[str, Any]]) -> list[str]:
    """Numeric metric names present in the file, the standard ones first."""
    seen: dict[str, None] = {}
    for m in metrics:
        for k, v in m.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                seen.setdefault(k, None)
    return [n for n in METRIC_NAMES if n in seen] + sorted(n for n in seen if n not in METRIC_NAMES)


def history_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """``reader.prompt_history`` -> long frame for a line plot of mean and max reward per step."""
    rows = []
    for row in summary.itertuples(index=False):
        rows.append({"step": int(row.step), "value": float(row.reward_mean), "metric": "reward mean"})
        rows.append({"step": int(row.step), "value": float(row.reward_max), "metric": "reward max"})
    return pd.DataFrame(rows, columns=["step", "value", "metric"])


def nearest_step(steps: Sequence[int], x: float) -> int | None:
    """The step in ``steps`` closest to plot coordinate ``x`` (drill-down from a plot selection)."""
    if not steps:
        return None
    return min(steps, key=lambda s: (abs(s - x), s))


def run_header_html(run_name: str, steps: Sequence[int], n_rollouts: int, errors: dict[str, str]) -> str:
    span = f"steps {steps[0]}–{steps[-1]}" if steps else "no steps yet"
    out = (f'<div class="mm-run"><b>Run</b> <code>{esc(run_name)}</code> · {len(steps)} step files ({span}) · '
           f"{n_rollouts} rollouts")
    if errors:
        out += f' · <span style="color:#c62828">{len(errors)} unreadable shard(s): {esc(", ".join(sorted(errors)))}</span>'
    return out + "</div>"


def _nan_to(x: float, default: float) -> float:
    return default if x is None or (isinstance(x, float) and math.isnan(x)) else x
