"""What the inspector shows, as pure functions of records (no Gradio here, so everything is unit-tested).

Each function turns a ``RolloutRecord`` (or index rows from ``RolloutReader``) into the value of one
component: card HTML, thinking/answer panes, reward tables, heatmap spans, box annotations, plot frames.

Safety rule: every piece of rollout text (prompt, response, tokens, rubric text, judge rationale, parsed
answer, ground truth) goes through ``esc`` before it is put into HTML. ``esc`` escapes HTML *and* the
characters Gradio's ``gr.HTML`` templates treat as syntax (``${…}``, ``{{…}}``, backticks), so text from a
model is always shown as text and never executed or interpreted. Image paths from records go through
``mmrlvr.store.images.resolve_in_run`` (refuses anything outside the run folder); so do video frames
(``extra["video_frames"]``), which reach the page as small inline thumbnails, never as file links.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from mmrlvr.boxes import best_ious, iou, zoom_box
from mmrlvr.store.images import VIDEO_FPS_KEY, VIDEO_FRAMES_KEY, UnsafePathError, resolve_in_run
from mmrlvr.store.record import RolloutRecord

#: heatmap name -> record field (the toggle shows them in this order)
SIGNALS: dict[str, str] = {
    "entropy": "token_entropy",
    "vision sensitivity": "token_vision_sensitivity",
    "credit weight": "token_credit_weight",
    "advantage": "token_advantage",
    "Δlog-prob": "token_ratio",  # log π_θ − log π_old = log(ratio), derived in ``signal_values``
    "logprob": "token_logprob",
    "ratio": "token_ratio",
    "sampler gap": "token_sampler_gap",
}
#: one line per signal for the heatmap legend: what a red / purple token means
SIGNAL_HELP: dict[str, str] = {
    "entropy": "entropy of the next-token distribution (nats): red = the policy was unsure here",
    "vision sensitivity": "how much the token's distribution changes when the image is perturbed: red = it read "
                          "the image",
    "credit weight": "the policy-gradient weight the credit scheme gave the token (0 = no gradient)",
    "advantage": "per-token advantage of the update: red pushed up, purple pushed down",
    "Δlog-prob": "log π_new − log π_old at the update: red = made more likely, purple = less likely",
    "logprob": "log-probability of the sampled token under the rollout policy (≤ 0)",
    "ratio": "importance ratio π_new / π_old, coloured as log(ratio)",
    "sampler gap": "log π_old (trainer) − log π (sampler) of the sampled token: red = the trainer found it likelier "
                   "than the engine that drew it, purple = less likely (a gap far from 0 is off-policy)",
}
#: tokens whose runs are collapsed into one span in heatmaps
PAD_TOKENS = frozenset({"<|image_pad|>", "<|video_pad|>", "<|vision_pad|>", "<|endoftext|>", "<pad>"})
PRED_COLOUR = "#ff00ff"  # magenta: predicted boxes
GT_COLOUR = "#00bcd4"  # cyan: ground-truth boxes (magenta/cyan stand out on natural images and on
#                         the primary-coloured synthetic shapes, and stay apart for colour-blind users).
# Boxes are drawn as outlines with a label, never filled: a translucent fill mixes with the object's own
# colour (cyan over a yellow shape reads green), which misleads on the very thing the view is for.
BOX_LINE = 2  # outline width in display pixels (+ a 1-px white halo so it shows on dark images too)
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
@dataclass(frozen=True)
class RewardRow:
    """One line of the reward breakdown. ``weight``/``contribution`` are None for sub-components (details of
    their parent, not terms of the total) and for components whose weight the run's config does not give."""

    component: str
    raw: float
    weight: float | None
    contribution: float | None
    parent: str | None = None


def reward_rows(components: dict[str, float], weights: dict[str, float] | None) -> list[RewardRow]:
    """Components -> breakdown rows: each weighted term (weight × raw = contribution) followed by its
    sub-components (``label/sub``, e.g. ``grounding/iou``), indented, without weight.

    A sub-component that only repeats its parent (``rubric/rubric`` with the same value) is dropped: it is
    the same number under two names. With ``weights`` None (no config) every top-level component is a term
    of unknown weight.
    """
    weights = weights or {}
    tops = [k for k in components if "/" not in k or k.split("/", 1)[0] not in components]
    ordered = sorted(tops, key=lambda k: (k not in weights, list(weights).index(k) if k in weights else 0, k))
    rows: list[RewardRow] = []
    for top in ordered:
        raw = float(components[top])
        w = weights.get(top)
        rows.append(RewardRow(top, raw, w, None if w is None else w * raw))
        for sub in sorted(k for k in components if k.startswith(top + "/")):
            name = sub[len(top) + 1:]
            if name == top and _same(components[sub], raw):
                continue  # rubric/rubric == rubric: one number, one row
            rows.append(RewardRow(name, float(components[sub]), None, None, parent=top))
    return rows


def _same(a: Any, b: Any) -> bool:
    try:
        return abs(float(a) - float(b)) <= 1e-9 or (math.isnan(float(a)) and math.isnan(float(b)))
    except (TypeError, ValueError):
        return False


_VERDICT_COLOURS = {"pass": "#2e7d32", "met": "#2e7d32", "fail": "#c62828", "not_met": "#c62828"}
_TABLE = "font-size:13px;border-collapse:collapse;width:100%;table-layout:auto"
_CELL = "padding:2px 6px;border-bottom:1px solid #e0e0e0;vertical-align:top"


def reward_breakdown_html(rec: RolloutRecord, weights: dict[str, float] | None = None) -> str:
    """Reward table (component, weight, raw, weight × raw, total) then the rubric verdicts with reasons.

    ``weights``: the run's reward weights by component label (``run_weights``); without them the weight
    and contribution columns say "–". The total row is Σ weight × raw; when the stored reward differs (a
    shaping term outside the listed components, e.g. an overlong penalty) both are shown.
    """
    rows = reward_rows(rec.reward_components, weights)
    body = []
    for r in rows:
        if r.parent is None:
            body.append(f"<tr><td style='{_CELL}'><b>{esc(r.component)}</b></td>"
                        f"<td style='{_CELL};text-align:right'>{fmt(r.weight)}</td>"
                        f"<td style='{_CELL};text-align:right'>{fmt(r.raw)}</td>"
                        f"<td style='{_CELL};text-align:right'>{fmt(r.contribution)}</td></tr>")
        else:
            body.append(f"<tr style='color:#666'><td style='{_CELL};padding-left:18px'>↳ {esc(r.component)}</td>"
                        f"<td style='{_CELL};text-align:right'></td><td style='{_CELL};text-align:right'>{fmt(r.raw)}</td>"
                        f"<td style='{_CELL};text-align:right;font-size:11px'>(part of {esc(r.parent)})</td></tr>")
    terms = [r.contribution for r in rows if r.parent is None]
    if terms and all(t is not None for t in terms):
        total = float(sum(terms))  # type: ignore[arg-type]
        note = "" if _same(round(total, 6), round(rec.reward, 6)) else f" (stored reward {fmt(rec.reward)})"
        body.append(f"<tr><td style='{_CELL}'><b>total</b></td><td style='{_CELL}'></td><td style='{_CELL}'></td>"
                    f"<td style='{_CELL};text-align:right'><b>{fmt(total)}</b>{esc(note)}</td></tr>")
    elif rows:
        body.append(f"<tr><td style='{_CELL}' colspan=4><i>weights not recorded in this run's config.yaml; "
                    f"stored reward {fmt(rec.reward)}</i></td></tr>")
    out = [f'<div class="mm-reward" style="overflow-x:auto;max-width:100%"><b>Reward {fmt(rec.reward)}</b> · '
           f'advantage {fmt(rec.advantage)}<table class="mm-components" style="{_TABLE};margin:4px 0">'
           f"<tr><th style='{_CELL};text-align:left'>component</th><th style='{_CELL};text-align:right'>weight</th>"
           f"<th style='{_CELL};text-align:right'>raw score</th>"
           f"<th style='{_CELL};text-align:right'>weight × raw</th></tr>"
           f"{''.join(body) or '<tr><td colspan=4><i>no components</i></td></tr>'}</table>"]
    if rec.rubric_results:
        crit = []
        for c in rec.rubric_results:
            verdict = str(c.get("verdict") or "unknown")
            colour = _VERDICT_COLOURS.get(verdict, "#757575")
            reason = c.get("rationale")
            crit.append(
                f"<tr><td style='{_CELL};word-break:break-word'><code>{esc(c.get('id'))}</code>"
                f"<div>{esc(c.get('text'))}</div>"
                f"<div style='color:#777;font-size:11px'>{esc(c.get('category'))}</div></td>"
                f"<td style='{_CELL};color:{colour};font-weight:bold;white-space:nowrap'>{esc(verdict)}</td>"
                f"<td style='{_CELL};text-align:right'>{fmt(c.get('score'))}</td>"
                f"<td style='{_CELL};text-align:right'>{fmt(c.get('weight'))}</td>"
                f"<td style='{_CELL};word-break:break-word'><span style='white-space:pre-wrap'>{esc(reason) or '–'}"
                f"</span><div style='color:#777;font-size:11px'>judge: {esc(c.get('judge')) or '–'}</div></td></tr>")
        out.append(f'<b>Rubric verdicts</b><table class="mm-rubric" style="{_TABLE}">'
                   f"<colgroup><col style='width:34%'><col style='width:11%'><col style='width:8%'>"
                   f"<col style='width:8%'><col style='width:39%'></colgroup>"
                   f"<tr><th style='{_CELL};text-align:left'>criterion</th><th style='{_CELL};text-align:left'>verdict"
                   f"</th><th style='{_CELL};text-align:right'>score</th><th style='{_CELL};text-align:right'>weight</th>"
                   f"<th style='{_CELL};text-align:left'>reason</th></tr>{''.join(crit)}</table>")
    out.append("</div>")
    return "".join(out)


def run_weights(config: dict[str, Any] | None) -> dict[str, float] | None:
    """Component label -> weight from a run's ``config.yaml`` (its ``rewards:`` list); None when absent."""
    specs = (config or {}).get("rewards")
    if not isinstance(specs, list):
        return None
    out: dict[str, float] = {}
    for spec in specs:
        if not isinstance(spec, dict) or not spec.get("name"):
            continue
        try:
            out[str(spec.get("label") or spec["name"])] = float(spec.get("weight", 1.0))
        except (TypeError, ValueError):
            continue
    return out or None


# -- groups -------------------------------------------------------------------------------------------
def most_informative_group(rows: pd.DataFrame) -> tuple[str | None, str]:
    """(prompt id, one-line reason) of the group that shows most of what a step did.

    ``rows``: index rows of one step (``prompt_id``, ``reward``, ``advantage``). The most informative group
    has the largest reward spread (max − min: the update pushes its best and worst samples apart); ties go
    to the larger mean |advantage|, then to the first prompt id. A zero-spread group has zero advantages
    and gives no gradient, so when every group is flat the reason says so.
    """
    if rows is None or len(rows) == 0:
        return None, ""
    frame = pd.DataFrame({"prompt_id": rows["prompt_id"].astype(str).to_numpy(),
                          "reward": rows["reward"].to_numpy(dtype=float),
                          "abs_adv": np.abs(rows["advantage"].to_numpy(dtype=float))})
    g = frame.groupby("prompt_id", sort=True)
    stats = pd.DataFrame({"lo": g["reward"].min(), "hi": g["reward"].max(), "adv": g["abs_adv"].mean()})
    stats["spread"] = (stats["hi"] - stats["lo"]).fillna(0.0)
    stats["adv"] = stats["adv"].fillna(0.0)
    stats = stats.reset_index().sort_values(["spread", "adv", "prompt_id"], ascending=[False, False, True],
                                            kind="stable")
    best = stats.iloc[0]
    n_flat = int((stats["spread"].abs() < 1e-8).sum())
    if best["spread"] < 1e-8:
        return str(best["prompt_id"]), (f"every one of the {len(stats)} groups at this step has equal rewards "
                                        "(zero advantage: nothing to learn from); showing the first")
    return str(best["prompt_id"]), (
        f"opened on the most informative group of {len(stats)}: widest reward spread "
        f"({fmt(best['lo'])} → {fmt(best['hi'])}, spread {fmt(best['spread'])}; mean |advantage| "
        f"{fmt(best['adv'])})" + (f"; {n_flat} flat group(s) carry no signal" if n_flat else ""))


def group_cards_html(records: Sequence[RolloutRecord], selected: int | None = None, why: str | None = None) -> str:
    """The G samples of one prompt as cards sorted by reward (best first), with the group's spread.

    A zero-variance group (all rewards equal) is flagged: its advantages are 0, so it gives no gradient.
    ``why``: a line saying why this group was opened (``most_informative_group``).
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
    if why:
        head += f'<div class="mm-why" style="font-size:12px;color:#1565c0;margin:-2px 0 6px">{esc(why)}</div>'
    cards = []
    for rec in sorted(records, key=lambda r: (-_nan_to(r.reward, -np.inf), r.sample_index)):
        border = "3px solid #1565c0" if rec.sample_index == selected else "1px solid #ccc"
        adv_colour = "#2e7d32" if rec.advantage > 1e-8 else "#c62828" if rec.advantage < -1e-8 else "#757575"
        preview = rec.response_text[:160] + ("…" if len(rec.response_text) > 160 else "")
        cards.append(
            f'<div class="mm-card" data-sample="{rec.sample_index}" style="border:{border};border-radius:6px;'
            'padding:6px;width:200px;font-size:12px">'
            f'<div><b>#{rec.sample_index}</b> reward <b>{fmt(rec.reward)}</b>{_guide_badge(rec)}</div>'
            f'<div>adv <span style="color:{adv_colour}">{fmt(rec.advantage)}</span> · '
            f"{rec.num_response_tokens} tok · {esc(rec.finish_reason)}</div>"
            f'<div style="color:#555;white-space:pre-wrap;word-break:break-word;max-height:6em;overflow:hidden">'
            f"{esc(preview)}</div></div>")
    return head + '<div class="mm-cards" style="display:flex;flex-wrap:wrap;gap:6px">' + "".join(cards) + "</div>"


def _guide_badge(rec: RolloutRecord) -> str:
    """A "guide" badge on a slot a later checkpoint filled (NPO: ``extra["guide"]``), naming the checkpoint."""
    guide = (rec.extra or {}).get("guide")
    if not guide:
        return ""
    src = guide.get("from", "") if isinstance(guide, dict) else str(guide)
    return (f' <span class="mm-guide" title="{esc(src)}" style="background:#6a1b9a;color:#fff;border-radius:4px;'
            'padding:0 5px">guide</span>')


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


def signal_values(rec: RolloutRecord, signal: str) -> list[float]:
    """Raw per-token values of ``signal`` (Δlog-prob = log of the stored ratio; [] when not recorded)."""
    values = list(getattr(rec, SIGNALS[signal]))
    if signal == "Δlog-prob" and values:
        with np.errstate(divide="ignore", invalid="ignore"):
            return [float(v) for v in np.log(np.asarray(values, dtype=float))]
    return values


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
    values = signal_values(rec, signal)
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
    for name in SIGNALS:
        values = signal_values(rec, name) if name == "Δlog-prob" else getattr(rec, SIGNALS[name])
        if i < len(values):
            parts.append(f"{name} {fmt(values[i], 4)}")
    return "\n".join(parts)


def heatmap_highlighted(tokens: Sequence[HeatToken]) -> list[tuple[str, float | None]]:
    """Value for ``gr.HighlightedText``: (text, score in [-1, 1] or None)."""
    return [(t.text, None if t.score is None else round(t.score, 4)) for t in tokens]


#: scoped CSS of the heatmap component (``gr.HTML(css_template=...)``): a token's values pop up under it
#: while it has focus (click / tab), so the numbers behind a colour are readable without leaving the view
HEATMAP_CSS = """
.mm-heatmap { max-height: 260px; overflow-y: auto; overflow-x: hidden; }
.mm-tok { position: relative; cursor: pointer; border-radius: 2px; }
.mm-tok:focus { outline: 2px solid #1565c0; }
.mm-tok:focus::after { content: attr(data-v); position: absolute; left: 0; top: 1.5em; z-index: 20;
  background: #263238; color: #fff; font-size: 11px; line-height: 1.35; padding: 4px 6px; border-radius: 4px;
  white-space: pre; pointer-events: none; }
.mm-legend-bar { display: inline-block; width: 120px; height: 10px; vertical-align: middle; border: 1px solid #ccc;
  background: linear-gradient(to right, rgb(128,90,213), #fff, rgb(239,68,60)); }
.mm-legend-pos { background: linear-gradient(to right, #fff, rgb(239,68,60)); }
"""


def signal_peak(rec: RolloutRecord, signal: str) -> float | None:
    """The largest |value| of ``signal`` in this response (what ±1 on the colour scale stands for)."""
    return _peak(signal_values(rec, signal), signal)


def _peak(values: Sequence[float], signal: str) -> float | None:
    arr = np.asarray(values, dtype=float)
    if signal == "ratio":
        with np.errstate(divide="ignore", invalid="ignore"):
            arr = np.log(arr)
    arr = arr[np.isfinite(arr)]
    return float(np.max(np.abs(arr))) if arr.size else None


def heatmap_legend_html(signal: str, peak: float | None = None, signed: bool = True) -> str:
    """The compact legend: colour bar −peak … 0 … +peak (``signed``), or 0 … peak when every value of the
    response is ≥ 0 (entropy, most credit weights) — a purple end that no token can take would mislead."""
    bar = "<span class='mm-legend-bar'></span>" if signed else "<span class='mm-legend-bar mm-legend-pos'></span>"
    scale = f"<span>{esc(fmt(-peak if signed else 0.0))}</span> {bar} <span>{esc(fmt(peak))}</span>" if peak else bar
    unit = " (log ratio)" if signal == "ratio" else ""
    colours = "purple = negative, red = positive" if signed else "white = 0, red = high"
    return (f'<div class="mm-legend" style="font-size:12px;color:#444;margin-bottom:4px;display:flex;gap:8px;'
            f'flex-wrap:wrap;align-items:center"><b>{esc(signal)}</b>{scale}<span>{esc(unit)}</span>'
            f'<span style="color:#666">{esc(SIGNAL_HELP.get(signal, ""))}; {colours}, '
            "scaled by the largest |value| in this response · click a token for its values</span></div>")


def heatmap_html(tokens: Sequence[HeatToken], signal: str, peak: float | None = None) -> str:
    """The heatmap as escaped, wrapped text: one span per token coloured by its score, a compact legend
    above, and every raw signal of the token in its ``title`` (hover) and ``data-v`` (shown on click)."""
    spans = []
    for t in tokens:
        if t.score is None:
            bg = "transparent"
        elif t.score >= 0:
            bg = f"rgba(239,68,60,{t.score:.3f})"
        else:
            bg = f"rgba(128,90,213,{-t.score:.3f})"
        extra = ";border:1px dashed #999" if t.count > 1 else ""
        raw = esc(t.raw)
        spans.append(f'<span class="mm-tok" tabindex="0" title="{raw}" data-v="{raw}" '
                     f'style="background:{bg}{extra}">{esc(t.text)}</span>')
    signed = any(t.score is not None and t.score < 0 for t in tokens)
    return (heatmap_legend_html(signal, peak, signed) + '<div class="mm-heatmap" style="white-space:pre-wrap;'
            'word-break:break-word;font-family:ui-monospace,monospace;font-size:13px;line-height:1.6;'
            'max-height:260px;overflow-y:auto;overflow-x:hidden;border:1px solid #e0e0e0;border-radius:6px;'
            'padding:6px">' + "".join(spans) + "</div>")


# -- images and boxes ---------------------------------------------------------------------------------
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


def outline_masks(annotations: Sequence[tuple[Sequence[int], str]], size: tuple[int, int],
                  width: int = BOX_LINE) -> list[tuple[np.ndarray, str]]:
    """Box annotations -> ``gr.AnnotatedImage`` masks that are only the box outline (``width`` px).

    Given boxes, Gradio paints the whole box at half opacity; a mask of just the border keeps the object's
    own colour readable inside it. ``size`` = (width, height) of the displayed image.
    """
    w, h = size
    out = []
    for box, label in annotations:
        x1, y1, x2, y2 = (int(v) for v in box)
        x1, x2 = max(0, min(x1, w - 1)), max(0, min(x2, w - 1))
        y1, y2 = max(0, min(y1, h - 1)), max(0, min(y2, h - 1))
        mask = np.zeros((h, w), dtype=np.float32)
        mask[y1:y2 + 1, x1:min(x1 + width, x2 + 1)] = 1.0
        mask[y1:y2 + 1, max(x1, x2 + 1 - width):x2 + 1] = 1.0
        mask[y1:min(y1 + width, y2 + 1), x1:x2 + 1] = 1.0
        mask[max(y1, y2 + 1 - width):y2 + 1, x1:x2 + 1] = 1.0
        out.append((mask, label))
    return out


def _label(draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, colour: str, size: tuple[int, int]) -> None:
    """A small label in a box of the outline's colour, kept inside the image."""
    width = draw.textlength(text) + 4
    x = min(max(0.0, xy[0]), max(0.0, size[0] - width))
    y = min(max(0.0, xy[1]), max(0.0, size[1] - 12))
    draw.rectangle([x, y, x + width, y + 11], fill=colour)
    draw.text((x + 2, y), text, fill=(0, 0, 0) if colour == GT_COLOUR else (255, 255, 255))


def draw_boxes(image: Image.Image, rec: RolloutRecord, caption: str | None = None,
               caption_right: bool = False, labels: bool = True) -> Image.Image:
    """A copy of ``image`` with GT (cyan) and predicted (magenta) boxes as labelled outlines, no fill.

    Each outline has a 1-px white halo so it shows on dark images; labels ("gt 1", "pred 1 IoU 0.62")
    sit at the box's left corner, above it for predictions and below it for ground truth (inside the image). The caption goes bottom-left (or bottom-right
    for the slider's right-hand image, whose left half the slider covers)."""
    img = image.convert("RGB").copy()
    scale = display_scale(img.size)  # small training images: enlarge so lines and labels stay visible
    if scale > 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    draw = ImageDraw.Draw(img)
    drawn: list[tuple[list[float], str, str]] = []
    for i, box in enumerate(rec.gt_boxes):
        drawn.append(([v * scale for v in _clip_box(box, image.size)], GT_COLOUR, f"gt {i + 1}"))
    for i, (box, iou) in enumerate(zip(rec.parsed_boxes, best_ious(rec.parsed_boxes, rec.gt_boxes))):
        text = f"pred {i + 1}" + (f" IoU {iou:.2f}" if iou is not None else "")
        drawn.append(([v * scale for v in _clip_box(box, image.size)], PRED_COLOUR, text))
    for xy, colour, _ in drawn:  # halos first, so no halo covers another box's line
        x1, y1, x2, y2 = xy
        draw.rectangle([x1 - 1, y1 - 1, x2 + 1, y2 + 1], outline=(255, 255, 255), width=BOX_LINE + 2)
    for xy, colour, _ in drawn:
        draw.rectangle(xy, outline=colour, width=BOX_LINE)
    if labels:  # predicted labels above the box, ground truth below: a good prediction hides no label
        for xy, colour, text in drawn:
            _label(draw, (xy[0], xy[1] - 12 if colour == PRED_COLOUR else xy[3] + 2), text, colour, img.size)
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


# -- video frames -------------------------------------------------------------------------------------
FRAME_THUMB_PX = 128  # longest side of a thumbnail as sent to the browser (bigger frames are shrunk)
FRAME_SHOW_PX = 84  # displayed thumbnail height: 5 frames to a row in the Browse tab's left column at 1440 px
FRAME_STRIP_MAX_PX = 300  # the strip box scrolls inside itself past this height (a 64-frame clip stays short)
MAX_STRIP_FRAMES = 64  # per video; more are counted in the label but not sent (page weight)


@dataclass(frozen=True)
class VideoFrame:
    """One sampled frame of a video prompt, ready for the strip.

    ``image`` is None when the frame cannot be shown; ``problem`` then says why ("missing file", "path outside
    the run folder"). ``seconds`` is the frame's time in the clip when the record gives the sampling fps.
    """

    video: int
    index: int
    seconds: float | None
    image: Image.Image | None
    problem: str | None = None


def video_frame_refs(rec: RolloutRecord) -> list[list[str]]:
    """The record's stored frame refs per video (``extra["video_frames"]``); [] for image-only rows.

    Records come from files, so a malformed value (not a list, a flat list of refs, non-string items) is
    read leniently: a flat list is one video, anything that is not a string ref is skipped.
    """
    raw = (rec.extra or {}).get(VIDEO_FRAMES_KEY)
    if not isinstance(raw, list) or not raw:
        return []
    videos = [raw] if all(isinstance(v, str) for v in raw) else [v for v in raw if isinstance(v, list)]
    return [[r for r in v if isinstance(r, str)] for v in videos]


def video_fps(rec: RolloutRecord, n_videos: int) -> list[float | None]:
    """Sampling fps of each video from ``extra["video_fps"]`` (None where absent or not a positive number)."""
    raw = (rec.extra or {}).get(VIDEO_FPS_KEY)
    values = raw if isinstance(raw, list) else [raw] * n_videos
    out: list[float | None] = []
    for i in range(n_videos):
        v = values[i] if i < len(values) else None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        out.append(float(v) if ok else None)
    return out


@dataclass(frozen=True)
class Video:
    """One video of a record: its frame count, sampling fps (None when not recorded) and the frames to show."""

    total: int
    fps: float | None
    frames: list[VideoFrame]


def load_video_frames(run_dir: Any, rec: RolloutRecord, limit: int = MAX_STRIP_FRAMES) -> list[Video]:
    """The record's videos with their first ``limit`` frames loaded.

    A frame whose file is missing, or whose ref leads out of the run folder (refs are data), becomes a frame
    without image and with the reason: one bad ref must not hide the rest of the rollout.
    """
    refs = video_frame_refs(rec)
    out = []
    for v, (video, fps) in enumerate(zip(refs, video_fps(rec, len(refs)))):
        frames = []
        for i, ref in enumerate(video[:limit]):
            seconds = i / fps if fps else None
            try:
                path = resolve_in_run(run_dir, ref)
            except UnsafePathError:
                frames.append(VideoFrame(v, i, seconds, None, "path outside the run folder"))
                continue
            if not path.is_file():
                frames.append(VideoFrame(v, i, seconds, None, "missing file"))
                continue
            with Image.open(path) as img:
                img.load()
                frames.append(VideoFrame(v, i, seconds, img.convert("RGB")))
        out.append(Video(len(video), fps, frames))
    return out


def thumbnail_uri(image: Image.Image, max_px: int = FRAME_THUMB_PX) -> str:
    """A ``data:`` URI of ``image`` shrunk to ``max_px`` on its longest side (never enlarged).

    Inline thumbnails keep the page independent of the file server (and of its login) and keep its weight
    bounded: small frames go as PNG (exact pixels), larger ones as JPEG.
    """
    img = image.convert("RGB")
    if max(img.size) > max_px:
        img = img.copy()
        img.thumbnail((max_px, max_px), Image.LANCZOS)
    buf = io.BytesIO()
    small = max(image.size) <= max_px
    img.save(buf, format="PNG" if small else "JPEG", quality=85)
    return f"data:image/{'png' if small else 'jpeg'};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def _frame_caption(frame: VideoFrame) -> str:
    return f"#{frame.index}" + (f" · {frame.seconds:.1f} s" if frame.seconds is not None else "")


def frame_strip_html(videos: Sequence[Video]) -> str:
    """The frame strip: per video a label ("video: N frames", with fps and length when known) and its frames
    in order as small captioned thumbnails ("#3 · 1.5 s") that wrap to the box's width; the box scrolls
    vertically past ``FRAME_STRIP_MAX_PX``. '' without videos (the component is then hidden)."""
    if not videos:
        return ""
    parts = []
    for v, video in enumerate(videos):
        total, frames = video.total, video.frames
        name = "video" if len(videos) == 1 else f"video {v + 1} of {len(videos)}"
        facts = [f"{fmt(video.fps)} fps sampled · {fmt(total / video.fps)} s"] if video.fps else []
        if total > len(frames):
            facts.append(f"first {len(frames)} shown")
        label = f"{name}: {total} frame{'s' if total != 1 else ''}" + (" · " + " · ".join(facts) if facts else "")
        tiles = []
        for f in frames:
            caption = esc(_frame_caption(f))
            if f.image is None:
                tiles.append(
                    f'<figure class="mm-frame mm-frame-missing" style="margin:0;text-align:center;font-size:11px">'
                    f'<div title="{esc(f.problem)}" style="height:{FRAME_SHOW_PX}px;width:{FRAME_SHOW_PX}px;'
                    'background:#ddd;color:#555;display:flex;align-items:center;justify-content:center;'
                    f'font-size:10px;border:1px solid #ccc">{esc(f.problem)}</div>'
                    f'<figcaption>{caption}</figcaption></figure>')
                continue
            # small frames are enlarged by the browser: keep their pixels sharp instead of blurred
            render = "pixelated" if f.image.height < FRAME_SHOW_PX else "auto"
            tiles.append(
                f'<figure class="mm-frame" style="margin:0;text-align:center;font-size:11px;color:#333">'
                f'<img src="{thumbnail_uri(f.image)}" alt="frame {f.index}" title="{caption}" '
                f'style="display:block;height:{FRAME_SHOW_PX}px;width:auto;max-width:100%;'
                f'image-rendering:{render};border:1px solid #ccc;border-radius:3px">'
                f'<figcaption>{caption}</figcaption></figure>')
        parts.append(f'<div class="mm-video" data-frames="{total}" style="margin-bottom:4px">'
                     f'<div class="mm-frames-label" style="font-size:13px;margin-bottom:4px"><b>{esc(label)}</b></div>'
                     '<div class="mm-strip" style="display:flex;flex-wrap:wrap;gap:6px">' + "".join(tiles)
                     + "</div></div>")
    return (f'<div class="mm-frames" style="border:1px solid #e0e0e0;border-radius:6px;padding:6px;'
            f'max-height:{FRAME_STRIP_MAX_PX}px;overflow-y:auto;overflow-x:hidden;max-width:100%;'
            'box-sizing:border-box">' + "".join(parts) + "</div>")


def frame_sheet(frames: Sequence[VideoFrame], columns: int = 4, cell: int = 96) -> Image.Image:
    """The frames tiled into one image (``columns`` per row, each ``cell`` px, index label in the cell's
    bottom-left corner): what the two-step compare slider shows for a video prompt, which has no single
    prompt image. A white band under the tiles leaves room for the slider's step caption (``draw_boxes``),
    and no label sits at the top, where Gradio's component label covers the image."""
    rows = max(1, math.ceil(len(frames) / columns))
    cols = min(columns, max(1, len(frames)))
    band = 14
    sheet = Image.new("RGB", (cols * cell, rows * cell + band), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for k, f in enumerate(frames):
        x, y = (k % columns) * cell, (k // columns) * cell
        if f.image is not None:
            tile = f.image.resize((cell - 2, cell - 2), Image.NEAREST if max(f.image.size) < cell else Image.LANCZOS)
            sheet.paste(tile, (x + 1, y + 1))
        else:
            draw.rectangle([x + 1, y + 1, x + cell - 2, y + cell - 2], fill=(210, 210, 210))
        text = _frame_caption(f)
        draw.rectangle([x + 1, y + cell - 13, x + 3 + draw.textlength(text), y + cell - 2], fill=(255, 255, 255))
        draw.text((x + 2, y + cell - 13), text, fill=(0, 0, 0))
    return sheet


# -- tables and plots ---------------------------------------------------------------------------------
FILTER_COLUMNS = ["step", "prompt", "sample", "reward", "advantage", "finish", "tokens"]


def filter_table(rows: pd.DataFrame, components: Iterable[str] = (),
                 texts: Sequence[str | None] | None = None, preview: int = 120) -> pd.DataFrame:
    """Index rows -> the table shown in the Filter tab (rounded, internal columns dropped).

    ``texts``: the rows' response texts (same order); shown as a last ``response`` column, cut to
    ``preview`` characters with newlines folded, so a match can be judged without opening it. An empty
    selection keeps its columns (an empty table with headers, not a broken one).
    """
    cols = ["step", "prompt_id", "sample_index", "reward", "advantage", "finish_reason", "num_response_tokens"]
    comp_cols = [f"c:{c}" for c in components if f"c:{c}" in rows.columns]
    out = rows[cols + comp_cols].copy()
    out.columns = FILTER_COLUMNS + [c[2:] for c in comp_cols]
    out = out.round(4).reset_index(drop=True)
    if texts is not None:
        out["response"] = [text_preview(t, preview) for t in texts]
    return out


def text_preview(text: str | None, n: int = 120) -> str:
    """One line of at most ``n`` characters (newlines shown as ⏎); '' for None."""
    if not text:
        return ""
    flat = str(text).replace("\r\n", "\n").replace("\n", " ⏎ ")
    return flat if len(flat) <= n else flat[: n - 1] + "…"


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


def markdown_html(text: str) -> str:
    """The Markdown an analysis writes (headings, paragraphs, pipe tables) as escaped HTML: every cell and line is
    text, nothing in it is interpreted (a token string from a rollout may sit in a table)."""
    out: list[str] = []
    rows: list[list[str]] = []

    def flush() -> None:
        if rows:
            head, body = rows[0], [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]
            out.append("<table class='mm-analysis'><tr>" + "".join(f"<th style='{_CELL}'>{esc(c)}</th>" for c in head)
                       + "</tr>" + "".join("<tr>" + "".join(f"<td style='{_CELL}'>{esc(c)}</td>" for c in r) + "</tr>"
                                          for r in body) + "</table>")
            rows.clear()

    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|") and s.endswith("|"):
            rows.append([c.strip() for c in s.strip("|").split("|")])
            continue
        flush()
        if not s:
            continue
        level = len(s) - len(s.lstrip("#"))
        if 0 < level <= 4 and s[level:level + 1] == " ":
            out.append(f"<h{level + 2}>{esc(s[level + 1:])}</h{level + 2}>")
        else:
            out.append(f"<p>{esc(s)}</p>")
    flush()
    return "".join(out)


def analysis_html(analyses: dict[str, tuple[str, list[Image.Image]]]) -> str:
    """``RUN_DIR/analysis/``: per analysis its table (``results.md``) and its plots (inline, no file served)."""
    if not analyses:
        return ("<p><i>no analysis/ in this run folder yet: run <code>mmrlvr analyze SUBCOMMAND RUN_DIR</code> "
                "(docs/analysis.md)</i></p>")
    parts = []
    for name, (md, images) in sorted(analyses.items()):
        imgs = "".join(f"<img src='{thumbnail_uri(im, 900)}' style='max-width:100%;margin:4px'>" for im in images)
        parts.append(f"<section><h3>{esc(name)}</h3>{markdown_html(md)}{imgs}</section>")
    return "".join(parts)


def _plan_value(v: Any) -> str:
    """A setting as the config file would write it (JSON for null, booleans, lists and mappings)."""
    if v is None or isinstance(v, (bool, dict, list)):
        return json.dumps(v, default=str)
    return fmt(v) if isinstance(v, float) else str(v)


def plan_html(plan: dict[str, Any] | None) -> str:
    """The run's plan (``plan.json``: the stage of each kind, why it runs, its settings and their source) as a
    table; a note when the run has no plan (runs written before plans existed)."""
    if not isinstance(plan, dict) or not isinstance(plan.get("stages"), list):
        return "<p><i>no plan.json in this run folder (it was written before runs recorded their plan)</i></p>"
    rows = []
    for st in plan["stages"]:
        if not isinstance(st, dict):
            continue
        settings = st.get("settings") if isinstance(st.get("settings"), dict) else {}
        sources = st.get("sources") if isinstance(st.get("sources"), dict) else {}
        cells = "<br>".join(f"<code>{esc(k)}</code> = {esc(_plan_value(v))} "
                            f"<span style='color:#777'>({esc(sources.get(k, 'default'))})</span>"
                            for k, v in settings.items())
        rows.append(f"<tr><td style='{_CELL}'><b>{esc(st.get('kind', ''))}</b></td>"
                    f"<td style='{_CELL}'><code>{esc(st.get('name', ''))}</code></td>"
                    f"<td style='{_CELL}'>{esc(st.get('reason', ''))}</td><td style='{_CELL}'>{cells}</td></tr>")
    notes = [n for n in plan.get("notes", []) if isinstance(n, str)]
    head = (f"<tr><th style='{_CELL}'>kind</th><th style='{_CELL}'>stage</th><th style='{_CELL}'>why</th>"
            f"<th style='{_CELL}'>settings (source)</th></tr>")
    out = f"<table class='mm-plan'>{head}{''.join(rows)}</table>"
    if notes:
        out += "<ul>" + "".join(f"<li>note: {esc(n)}</li>" for n in notes) + "</ul>"
    return out


def _nan_to(x: float, default: float) -> float:
    return default if x is None or (isinstance(x, float) and math.isnan(x)) else x


# -- multi-turn trajectories --------------------------------------------------------------------------------
TURN_THUMB_PX = 180  # displayed side of a tool turn's images (the source with the zoom box, the returned image)


def record_turns(rec: RolloutRecord) -> list[dict[str, Any]]:
    """The record's turns (multi-turn runs: ``extra["turns"]``), [] for a one-turn response."""
    turns = (rec.extra or {}).get("turns")
    return turns if isinstance(turns, list) else []


def load_turn_images(run_dir: Any, rec: RolloutRecord) -> list[Image.Image | None]:
    """The images tool turns returned (``extra["turn_images"]``), in order; None for one that cannot be shown."""
    out: list[Image.Image | None] = []
    for ref in (rec.extra or {}).get("turn_images") or []:
        try:
            path = resolve_in_run(run_dir, ref)
        except (ValueError, UnsafePathError):
            out.append(None)
            continue
        if path.is_file():
            with Image.open(path) as img:
                img.load()
                out.append(img.convert("RGB"))
        else:
            out.append(None)
    return out


def _zoom_source(images: Sequence[Image.Image | None], args: dict[str, Any]) -> tuple[Image.Image, list[float]] | None:
    """The image a zoom call looked into, with its box in that image's pixels (None when it cannot be drawn)."""
    try:
        src = images[int(args.get("image", 0))]
        box = zoom_box(args, src.size)  # the region the tool cropped
    except (IndexError, TypeError, ValueError, AttributeError):
        return None
    return (src, list(box)) if src is not None else None


def _img_tag(image: Image.Image, alt: str) -> str:
    return (f'<img src="{thumbnail_uri(image, max_px=2 * TURN_THUMB_PX)}" alt="{esc(alt)}" title="{esc(alt)}" '
            f'style="display:block;width:{TURN_THUMB_PX}px;max-width:100%;height:auto;border:1px solid #ccc;'
            'border-radius:3px">')


def turns_html(rec: RolloutRecord, prompt_images: Sequence[Image.Image], returned: Sequence[Image.Image | None]
               ) -> str:
    """A multi-turn trajectory as turns: each model turn (its text; it carries loss), each tool turn (masked: no
    loss) with every call, its arguments and result or error, the image it returned and, for a zoom, the source
    image with the zoom box drawn and the box's IoU with the gold region when the sample has one. '' for a one-turn
    record (the component is hidden)."""
    turns = record_turns(rec)
    if not turns:
        return ""
    images: list[Image.Image | None] = list(prompt_images) + list(returned)
    region = (rec.extra or {}).get("region")
    ids = rec.response_token_ids or []
    parts, k = [], 0
    for t in turns:
        n = max(0, int(t.get("end", 0)) - int(t.get("start", 0)))
        if t.get("kind") in ("model", "summary"):
            k += 1
            what = "model" if t.get("kind") == "model" else "model · summary (ReSum: the next segment starts from it)"
            parts.append(
                f'<div class="mm-turn mm-turn-model" style="border-left:4px solid #2e7d32;padding:4px 8px;margin:4px 0;'
                f'background:#f6fbf6"><div style="font-size:12px;color:#2e7d32"><b>turn {k} · {what}</b> · {n} tokens · '
                f'trained</div><div style="white-space:pre-wrap;word-break:break-word;font-family:monospace;'
                f'font-size:13px">{esc(t.get("text", ""))}</div></div>')
            continue
        if t.get("kind") == "user":  # ReSum's request for a summary
            parts.append(
                '<div class="mm-turn mm-turn-user" style="border-left:4px solid #9e9e9e;padding:4px 8px;margin:4px 0;'
                f'background:#f5f5f5"><div style="font-size:12px;color:#555"><b>asked to summarise</b> · {n} tokens · '
                f'masked (no loss)</div><div style="white-space:pre-wrap;word-break:break-word;font-size:12px">'
                f'{esc(t.get("text", ""))}</div></div>')
            continue
        calls = []
        returned_here = list(t.get("images") or [])
        for c in t.get("calls") or []:
            args = c.get("arguments") or {}
            head = f'<code>{esc(c.get("name"))}</code>(<code>{esc(json.dumps(args))}</code>)'
            if c.get("error"):
                calls.append(f'<div class="mm-call mm-call-error">{head} <span style="color:#c62828"><b>error</b>: '
                             f'{esc(c["error"])}</span></div>')
                continue
            figures = []
            if c.get("name") == "zoom" and (found := _zoom_source(images, args)) is not None:
                src, box = found
                shown = src.copy()
                width = max(2, round(max(shown.size) / 150))
                ImageDraw.Draw(shown).rectangle([round(v) for v in box], outline=(233, 30, 99), width=width)
                if region and int(args.get("image", 0)) == 0:
                    ImageDraw.Draw(shown).rectangle([round(v) for v in region], outline=(0, 172, 193), width=width)
                score = f" · IoU with the gold region {fmt(iou(box, region))}" if region and int(
                    args.get("image", 0)) == 0 else ""
                figures.append(f'<figure style="margin:0"><figcaption style="font-size:11px">zoom box (magenta) on '
                               f'image {esc(args.get("image", 0))}{" · gold region (cyan)" if region else ""}'
                               f'{esc(score)}</figcaption>{_img_tag(shown, "zoom box")}</figure>')
            for idx in returned_here[:1]:
                img = images[idx] if 0 <= idx < len(images) else None
                if img is not None:
                    figures.append(f'<figure style="margin:0"><figcaption style="font-size:11px">returned image {idx}'
                                   f' ({img.size[0]}×{img.size[1]})</figcaption>{_img_tag(img, f"image {idx}")}'
                                   '</figure>')
                returned_here = returned_here[1:]
            calls.append(f'<div class="mm-call">{head} <span style="color:#2e7d32">ran</span>'
                         '<div style="display:flex;flex-wrap:wrap;gap:8px;margin-top:4px">' + "".join(figures)
                         + "</div></div>")
        parts.append(
            f'<div class="mm-turn mm-turn-tool" style="border-left:4px solid #9e9e9e;padding:4px 8px;margin:4px 0;'
            f'background:#f5f5f5"><div style="font-size:12px;color:#555"><b>tool</b> · {n} tokens · masked (no '
            'loss)</div>' + "".join(calls)
            + f'<details><summary style="font-size:12px">what the model read</summary><div style="white-space:'
            f'pre-wrap;word-break:break-word;font-family:monospace;font-size:12px">{esc(t.get("text", ""))}</div>'
            '</details></div>')
    masked = sum(1 for t in turns if t.get("kind") == "tool")
    head = (f'<div style="font-size:13px"><b>Trajectory</b>: {k} model turn{"s" if k != 1 else ""}, {masked} tool '
            f'turn{"s" if masked != 1 else ""}, {len(ids)} tokens · finish: {esc(rec.finish_reason)}</div>')
    return ('<div class="mm-turns" style="max-width:100%;overflow-x:hidden;box-sizing:border-box">' + head
            + "".join(parts) + "</div>")
