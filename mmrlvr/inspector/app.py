"""The Gradio layer of the inspector: layout and wiring only.

``Inspector`` holds the run's ``RolloutReader`` and answers each UI event by calling the pure functions of
``views.py``; ``build_app`` lays out the components and connects events to ``Inspector`` methods, each
with an ``api_name`` so ``gradio_client`` (and the tests) can call it. ``launch`` starts the server the
safe way: bound to 127.0.0.1 unless told otherwise, and serving files only from the run folder.

Navigation: step -> prompt group -> sample; keys ``j``/``k`` (or → / ←) move between samples, ``n``/``p``
between groups. A step opens on its most informative group (largest reward spread, ties by |advantage|)
with a line saying why. A timer (and the Refresh button) picks up new steps while the run is still
training; while "follow run" is on and the newest step is shown, a new step is opened as it arrives.

Video prompts: their sampled frames (``extra["video_frames"]``) show as a strip of captioned thumbnails in
the Browse tab's left column, beside the rollout (a box of bounded height that wraps, never widens the
page); the prompt-image box is hidden when the row has no image. The two-step compare slider shows the frames
tiled into one sheet. Rows without video look exactly as before.

Layout budget: everything fits a 1440×900 screen without horizontal scrolling (tables wrap, the token
heatmap is wrapped text in a box of bounded height), checked by ``tests/test_inspector_screens.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd
import yaml

from mmrlvr.errors import UserError
from mmrlvr.inspector import views
from mmrlvr.store.reader import RolloutReader
from mmrlvr.store.record import RolloutRecord

DEFAULT_SIGNAL = "vision sensitivity"
MAX_PLOTS = 6
ANY = "(any)"
#: app-wide CSS (passed to ``launch``): nothing may push the page wider than the window
APP_CSS = """
.gradio-container { max-width: 100% !important; overflow-x: hidden; }
#mm-reward table, #mm-thinking-answer table { max-width: 100%; }
"""
FILTER_PREVIEW_CHARS = 60  # response preview in Filter results: fits beside the numeric columns at 1440 px
RECUR_HINT = ("prompts recur when the training pool is smaller than max_steps × prompts_per_step "
              "(data.train_size for synth: data)")

# Keyboard navigation: clicks the prev/next buttons; ignored while typing in inputs.
KEYBOARD_JS = """
if (!window.__mmrlvrKeys) {
  window.__mmrlvrKeys = true;
  const keys = {j: 'mm-next-sample', ArrowRight: 'mm-next-sample', k: 'mm-prev-sample',
                ArrowLeft: 'mm-prev-sample', n: 'mm-next-group', p: 'mm-prev-group'};
  document.addEventListener('keydown', (e) => {
    const t = e.target;
    const tag = ((t && t.tagName) || '').toLowerCase();
    if (tag === 'input' || tag === 'textarea' || tag === 'select' || (t && t.isContentEditable)) return;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const id = keys[e.key];
    if (!id) return;
    const el = document.getElementById(id);
    const btn = el && (el.tagName === 'BUTTON' ? el : el.querySelector('button'));
    if (btn) { e.preventDefault(); btn.click(); }
  });
}
"""


class Inspector:
    """UI-independent answers to the inspector's events (outputs are component values / updates)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.reader = RolloutReader(self.run_dir)
        self._weights: dict[str, float] | None = None
        self._weights_read = False

    def weights(self) -> dict[str, float] | None:
        """The run's reward weights from ``config.yaml`` (read server-side; the file itself is never served)."""
        if not self._weights_read:
            try:
                config = yaml.safe_load((self.run_dir / "config.yaml").read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError, UnicodeDecodeError):
                config = None
            self._weights = views.run_weights(config if isinstance(config, dict) else None)
            self._weights_read = config is not None
        return self._weights

    def analysis(self) -> str:
        """What ``mmrlvr analyze`` wrote under ``analysis/`` (read server-side; plots inlined)."""
        from PIL import Image

        found: dict[str, tuple[str, list]] = {}
        root = self.run_dir / "analysis"
        for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
            try:
                md = (folder / "results.md").read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                md = "(no results.md)"
            images = []
            for png in sorted(folder.glob("*.png"))[:12]:
                try:
                    with Image.open(png) as im:
                        images.append(im.copy())
                except OSError:
                    continue
            found[folder.name] = (md, images)
        return views.analysis_html(found)

    def plan(self) -> str:
        """The run's plan (``plan.json``, read server-side) as HTML."""
        try:
            plan = json.loads((self.run_dir / "plan.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            plan = None
        return views.plan_html(plan)

    # -- header / refresh -------------------------------------------------------------------------------
    def header(self) -> str:
        steps = self.reader.steps()
        return views.run_header_html(self.run_dir.name, steps, len(self.reader.index), self.reader.errors)

    def step_choices(self) -> list[tuple[str, int]]:
        return [(f"step {s}", s) for s in self.reader.steps()]

    def refresh(self, step: int | None, force: bool = True) -> tuple[Any, Any, Any, Any]:
        """(header, step dropdown, component dropdown, finish-reason dropdown); skips when nothing changed."""
        changed = self.reader.refresh()
        if not changed and not force:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        steps = self.reader.steps()
        value = step if step in steps else (steps[-1] if steps else None)
        return (self.header(), gr.update(choices=self.step_choices(), value=value),
                gr.update(choices=[ANY] + self.reader.components()),
                gr.update(choices=self.finish_reasons()))

    def tick(self, step: int | None, signal: str | None = DEFAULT_SIGNAL) -> tuple:
        """The follow-run timer: (header, component dd, finish dd, *Browse outputs); all skipped when no
        shard changed. A new step is opened only when the view was empty or showed the newest step, so
        someone reading an older step is not moved."""
        idx = self.reader.index
        before = int(idx["step"].max()) if len(idx) else None
        if not self.reader.refresh():
            return tuple(gr.skip() for _ in range(3 + BROWSE_OUTPUTS))
        steps = self.reader.steps()
        head = (self.header(), gr.update(choices=[ANY] + self.reader.components()),
                gr.update(choices=self.finish_reasons()))
        shown = _as_int(step)
        if steps and (shown is None or before is None or shown == before or shown not in steps):
            return (*head, *self.render(steps[-1], None, None, signal))
        if not steps:
            return (*head, *self._empty_render())
        return (*head, gr.update(choices=self.step_choices(), value=shown),
                *(gr.skip() for _ in range(BROWSE_OUTPUTS - 1)))

    def finish_reasons(self) -> list[str]:
        idx = self.reader.index
        return sorted(str(v) for v in idx["finish_reason"].dropna().unique()) if len(idx) else []

    # -- browse -----------------------------------------------------------------------------------------
    def render(self, step: int | None, prompt_id: str | None, sample: int | None,
               signal: str | None = DEFAULT_SIGNAL, compare_step: int | None = None) -> tuple:
        """Everything the Browse tab shows for one sample; missing/invalid choices fall back to defaults
        (last step, first group, best-reward sample)."""
        steps = self.reader.steps()
        if not steps:
            return self._empty_render()
        step = _as_int(step)
        step = step if step in steps else steps[-1]
        groups = self.reader.groups(step)
        prompt_ids = [str(p) for p in groups["prompt_id"]]
        why = None
        if prompt_id not in prompt_ids:
            idx = self.reader.index
            prompt_id, why = views.most_informative_group(idx[idx["step"] == step])
            prompt_id = prompt_id if prompt_id in prompt_ids else prompt_ids[0]
        records = self.reader.group(step, prompt_id)
        by_index = {r.sample_index: r for r in records}
        order = [i for _, i in views.sample_choices(records)]
        sample = _as_int(sample)
        sample = sample if sample in by_index else order[0]
        rec = by_index[sample]
        images = views.load_images(self.run_dir, rec)
        videos = views.load_video_frames(self.run_dir, rec)
        annotated = self._annotated(rec, images, step, video=bool(videos))
        gallery = gr.update(value=images[1:], visible=len(images) > 1)
        compare_steps = [int(s) for s in self.reader.prompt_history(prompt_id)["step"].tolist() if s != step]
        compare_step = _as_int(compare_step)
        if compare_step not in compare_steps:
            earlier = [s for s in compare_steps if s < step]
            compare_step = earlier[-1] if earlier else (compare_steps[0] if compare_steps else None)
        slider = self.compare(step, prompt_id, sample, compare_step, rec=rec, images=images, videos=videos)
        recorded = views.recorded_signals(rec)
        if signal not in recorded and recorded:  # e.g. no vision sensitivity in this run: show what exists
            signal = recorded[0]
        heat, heat_html = self.heatmap(step, prompt_id, sample, signal, rec=rec)
        prompt_html = (f'<div class="mm-prompt"><b>Prompt</b> <code>{views.esc(prompt_id)}</code>: '
                       f'<span style="white-space:pre-wrap">{views.esc(rec.prompt_text)}</span></div>')
        return (
            gr.update(choices=[(f"step {s}", s) for s in steps], value=step),
            gr.update(choices=views.group_choices(groups), value=prompt_id),
            gr.update(choices=views.sample_choices(records), value=sample),
            sample,
            views.group_cards_html(records, selected=sample, why=why),
            prompt_html,
            annotated,
            gallery,
            gr.update(choices=[(f"step {s}", s) for s in compare_steps], value=compare_step,
                      label=self._compare_label(step, compare_steps)),
            slider,
            views.thinking_answer_html(rec),
            views.reward_breakdown_html(rec, self.weights()),
            heat,
            heat_html,
            gr.update(value=signal or DEFAULT_SIGNAL),
            gr.update(value=views.frame_strip_html(videos), visible=bool(videos)),
            self.turns(rec, images),
        )

    def turns(self, rec, images) -> Any:
        """The turn view of a multi-turn record (hidden for one-turn records)."""
        if not views.record_turns(rec):
            return gr.update(value="", visible=False)
        return gr.update(value=views.turns_html(rec, images, views.load_turn_images(self.run_dir, rec)), visible=True)

    def _empty_render(self) -> tuple:
        """Every Browse output for a run with no rollout shards yet: one explanation, empty components."""
        bad = (f" {len(self.reader.errors)} shard(s) could not be read: see the header."
               if self.reader.errors else "")
        empty = (f'<div class="mm-empty" style="padding:24px;border:1px dashed #bbb;border-radius:8px;color:#555">'
                 f"<b>No rollouts yet</b> in <code>{views.esc(self.run_dir.name)}/rollouts/</code>.{views.esc(bad)} "
                 "The first step file appears after the first training step; with “follow run” on, this page "
                 "opens it by itself (or press Refresh).</div>")
        return (gr.update(choices=[], value=None), gr.update(choices=[], value=None),
                gr.update(choices=[], value=None), None, empty, "", gr.AnnotatedImage(value=None),
                gr.update(value=None, visible=False), gr.update(choices=[], value=None), None, "", "",
                gr.HighlightedText(value=[]), "", gr.skip(), gr.update(value="", visible=False),
                gr.update(value="", visible=False))

    @staticmethod
    def _compare_label(step: int, compare_steps: list[int]) -> str:
        if not compare_steps:
            return f"Compare with step (this prompt occurs only at step {step})"
        return f"Compare step {step} with step ({len(compare_steps)} other step(s) of this prompt)"

    def _annotated(self, rec: RolloutRecord, images: list, step: int | None = None, video: bool = False) -> Any:
        """The first image with GT (cyan) and predicted (magenta, with IoU) boxes as labelled outlines;
        hidden for a video prompt without image (the frame strip stands in its place)."""
        where = f"step {step} · {rec.prompt_id} #{rec.sample_index}" if step is not None else "Image"
        if not images:
            return gr.AnnotatedImage(value=None, label=f"{where} · no image", visible=not video)
        (big, annotations), colours = views.annotated_value(images[0], rec)
        base = views.draw_boxes(images[0], rec)  # same display scale as annotated_value
        if not annotations:
            what = "no boxes in this sample"
        else:
            what = "predicted (magenta, with IoU) vs ground truth (cyan), outlines only"
        return gr.AnnotatedImage(value=(base, views.outline_masks(annotations, base.size)), color_map=colours,
                                 label=f"{where} · {what}", visible=True)

    def navigate(self, step: int | None, prompt_id: str | None, sample: int | None, delta: int, level: str,
                 signal: str | None = DEFAULT_SIGNAL) -> tuple:
        """Move ``delta`` samples (in reward order, wrapping) or groups (in prompt order, wrapping)."""
        steps = self.reader.steps()
        if not steps:
            return self.render(None, None, None, signal)
        step = int(step) if step is not None and int(step) in steps else steps[-1]
        prompt_ids = [str(p) for p in self.reader.groups(step)["prompt_id"]]
        if prompt_id not in prompt_ids:
            return self.render(step, None, None, signal)
        if level == "group":
            i = prompt_ids.index(prompt_id)
            return self.render(step, prompt_ids[(i + delta) % len(prompt_ids)], None, signal)
        order = [i for _, i in views.sample_choices(self.reader.group(step, prompt_id))]
        pos = order.index(int(sample)) if sample is not None and int(sample) in order else -delta
        return self.render(step, prompt_id, order[(pos + delta) % len(order)], signal)

    def heatmap(self, step: int, prompt_id: str, sample: int, signal: str | None,
                rec: RolloutRecord | None = None) -> tuple[Any, str]:
        """(HighlightedText, hover HTML) for one sample and signal; the label says when the signal is
        missing for this sample (e.g. vision sensitivity with a credit scheme that doesn't compute it)."""
        signal = signal if signal in views.SIGNALS else DEFAULT_SIGNAL
        if rec is None:
            if step is None or prompt_id is None or sample is None:
                return gr.HighlightedText(value=[]), ""
            rec = self.reader.record(int(step), prompt_id, int(sample))
        tokens = views.heatmap_tokens(rec, signal)
        if signal in views.recorded_signals(rec):
            label, note = f"{signal} per token (scaled to [-1, 1])", ""
        else:
            label = f"{signal}: not recorded for this sample (tokens shown uncoloured)"
            note = f'<div style="font-size:12px"><i>{views.esc(label)}</i></div>'
        return (gr.HighlightedText(value=views.heatmap_highlighted(tokens), label=label),
                note + views.heatmap_html(tokens, signal, views.signal_peak(rec, signal)))

    def compare(self, step: int, prompt_id: str, sample: int, other_step: int | None,
                rec: RolloutRecord | None = None, images: list | None = None,
                videos: list[views.Video] | None = None) -> Any:
        """ImageSlider value: this sample's boxes at ``step`` (left) vs the same prompt at ``other_step``
        (right), each captioned with its step; both images are redrawn on every call, so the slider never
        keeps a previous image. A video prompt without image compares its frames tiled into one sheet."""
        if step is None or prompt_id is None or sample is None:
            return None
        if rec is None:
            rec = self.reader.record(int(step), prompt_id, int(sample))
            images = views.load_images(self.run_dir, rec)
        image, drawn = self._compare_image(rec, images, videos)
        if image is None:
            return None
        left = views.draw_boxes(image, drawn, caption=f"left: step {step} #{sample} r={views.fmt(rec.reward, 2)}")
        if other_step is None:
            only = views.draw_boxes(image, drawn, caption=f"right: only step {step} has this prompt",
                                    caption_right=True)
            return (left, only)
        others = self.reader.group(int(other_step), prompt_id)
        other = next((r for r in others if r.sample_index == int(sample)), others[0])
        other_image, other_drawn = self._compare_image(other, views.load_images(self.run_dir, other))
        if other_image is None:
            other_image, other_drawn = image, other
        right = views.draw_boxes(other_image, other_drawn,
                                 caption=f"right: step {other_step} #{other.sample_index} r={views.fmt(other.reward, 2)}",
                                 caption_right=True)
        return (left, right)

    def _compare_image(self, rec: RolloutRecord, images: list | None,
                       videos: list[views.Video] | None = None) -> tuple[Any, RolloutRecord]:
        """(image to compare, record whose boxes are drawn on it): the first prompt image; for a video prompt
        without image its first video's frames as one sheet, drawn without boxes (a sheet has no single
        frame's coordinates); (None, rec) when there is neither."""
        if images:
            return images[0], rec
        videos = views.load_video_frames(self.run_dir, rec) if videos is None else videos
        if not videos or not videos[0].frames:
            return None, rec
        return views.frame_sheet(videos[0].frames), dataclasses.replace(rec, parsed_boxes=[], gt_boxes=[])

    # -- filter -----------------------------------------------------------------------------------------
    def run_filter(self, step_lo: str | float | None, step_hi: str | float | None, reward_lo: str | float | None,
                   reward_hi: str | float | None, component: str | None, passed: str | None, adv_sign: str | None,
                   finish: list[str] | None, regex: str | None, order: str | None,
                   limit: float | None) -> tuple[str, pd.DataFrame]:
        """(count line, table) for the Filter tab. Empty bounds mean "no bound"."""
        self.reader.refresh()
        component = None if component in (None, "", ANY) else component
        passed_flag = {"pass": True, "fail": False}.get(passed or "")
        try:
            rows = self.reader.filter(
                step_range=(_bound(step_lo, "step ≥", int), _bound(step_hi, "step ≤", int)),
                reward_range=(_bound(reward_lo, "reward ≥", float), _bound(reward_hi, "reward ≤", float)),
                component=component,
                passed=passed_flag if component else None,
                advantage_sign=None if adv_sign in (None, "", ANY) else adv_sign,
                finish_reason=finish or None, regex=regex or None,
                order="round_robin" if order == "round robin" else "step",
            )
        except UserError as exc:
            raise gr.Error(str(exc)) from None
        total = len(rows)
        n = max(0, int(limit)) if limit else 200
        picked = rows.iloc[:n]
        shown = views.filter_table(picked, self.reader.components(), texts=self.reader.texts(picked),
                                   preview=FILTER_PREVIEW_CHARS)
        if not self.reader.steps():
            return "No rollouts yet: nothing to filter (the run has not written a step file).", shown
        if total == 0:
            return ("**0 rollouts match** these conditions: widen the step or reward range, or clear the "
                    "component, advantage, finish-reason or regex conditions."), shown
        return f"{total} rollouts match; showing {len(shown)} (select a row to open it)", shown

    # -- across steps -----------------------------------------------------------------------------------
    def history(self, prompt_id: str | None) -> tuple[str, pd.DataFrame, pd.DataFrame]:
        """(title, per-step table, plot frame) for one prompt across the run."""
        if not prompt_id:
            return "<i>choose a prompt in Browse, then press “Across steps”</i>", pd.DataFrame(), views.history_frame(pd.DataFrame())
        summary = self.reader.prompt_history(prompt_id)
        if summary.empty:
            raise gr.Error(f"no rollouts for prompt {prompt_id!r}")
        table = summary.round(4)
        if len(summary) == 1:
            title = (f"<b>Prompt</b> <code>{views.esc(prompt_id)}</code> occurs only at step "
                     f"{int(summary['step'].iloc[0])}: there is no history to compare yet ({views.esc(RECUR_HINT)})")
        else:
            title = (f"<b>Prompt</b> <code>{views.esc(prompt_id)}</code> over {len(summary)} steps "
                     "(select a row to open that step's group)")
        return title, table, views.history_frame(summary)

    # -- metrics ----------------------------------------------------------------------------------------
    def metric_plots(self, names: list[str] | None) -> list[dict[str, Any]]:
        """Props for the ``MAX_PLOTS`` metric plots: one metric each (own y scale), unused ones hidden."""
        metrics = self.reader.metrics()
        names = list(names or [])[:MAX_PLOTS]
        out = []
        for k in range(MAX_PLOTS):
            if k < len(names):
                out.append({"value": views.metrics_frame(metrics, [names[k]]), "title": names[k], "visible": True})
            else:
                out.append({"value": views.metrics_frame([], []), "title": "", "visible": False})
        return out

    def metric_choices(self) -> tuple[list[str], list[str]]:
        names = views.metric_names(self.reader.metrics())
        default = [n for n in views.METRIC_NAMES if n in names] or names[:3]
        return names, default

    def nearest_step(self, x: float | None) -> int | None:
        if x is None:
            return None
        return views.nearest_step(self.reader.steps(), float(x))


BROWSE_OUTPUTS = 17  # len(Inspector.render(...)): the Browse components every navigation event updates


def _as_int(x: Any) -> int | None:
    """A step / sample number from a component value (int, float, "3", "step 3"); None when it is not one."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, str):
        x = x.strip().removeprefix("step").strip()
    try:
        return int(float(x))
    except (TypeError, ValueError):
        return None


def _bound(x: str | float | None, name: str, kind: type) -> Any:
    """'' / None -> None; otherwise the number (UserError naming the box when it is not one)."""
    if x is None or (isinstance(x, str) and not x.strip()):
        return None
    try:
        number = float(x)
    except (TypeError, ValueError):
        raise UserError(f"{name}: {x!r} is not a number") from None
    return int(number) if kind is int else number


@dataclasses.dataclass
class _HeaderBar:
    """The run header with its follow-run switch, Refresh button and the timer that follow-run drives."""

    header: gr.HTML
    follow: gr.Checkbox
    refresh_btn: gr.Button
    timer: gr.Timer


@dataclasses.dataclass
class _SampleView:
    """The Browse components that show the selected sample: prompt, images, text, rewards, heatmap, compare."""

    prompt_html: gr.HTML
    frames_html: gr.HTML
    annotated: gr.AnnotatedImage
    gallery: gr.Gallery
    ta_html: gr.HTML
    turns_html: gr.HTML
    reward_html: gr.HTML
    signal_radio: gr.Radio
    heat: gr.HighlightedText
    heat_html: gr.HTML
    compare_dd: gr.Dropdown
    slider: gr.ImageSlider


@dataclasses.dataclass
class _Browse:
    """The Browse tab: step / group / sample navigation and the view of the selected sample."""

    step_dd: gr.Dropdown
    group_dd: gr.Dropdown
    prev_group: gr.Button
    next_group: gr.Button
    history_btn: gr.Button
    group_html: gr.HTML
    sample_radio: gr.Radio
    sample_num: gr.Number
    prev_sample: gr.Button
    next_sample: gr.Button
    view: _SampleView

    def outputs(self) -> list[Any]:
        """The components every navigation event updates, in the order of ``Inspector.render``'s tuple."""
        v = self.view
        return [self.step_dd, self.group_dd, self.sample_radio, self.sample_num, self.group_html, v.prompt_html,
                v.annotated, v.gallery, v.compare_dd, v.slider, v.ta_html, v.reward_html, v.heat, v.heat_html,
                v.signal_radio, v.frames_html, v.turns_html]

    def selection(self) -> list[Any]:
        """(step, group, sample): the inputs that name the shown sample."""
        return [self.step_dd, self.group_dd, self.sample_num]


@dataclasses.dataclass
class _Filter:
    """The Filter tab: the condition boxes, the Filter button, the count line and the results table."""

    step_lo: gr.Textbox
    step_hi: gr.Textbox
    reward_lo: gr.Textbox
    reward_hi: gr.Textbox
    limit: gr.Number
    component_dd: gr.Dropdown
    passed: gr.Radio
    adv_sign: gr.Radio
    finish_dd: gr.Dropdown
    regex: gr.Textbox
    order: gr.Radio
    run_btn: gr.Button
    count_md: gr.Markdown
    results: gr.Dataframe

    def inputs(self) -> list[Any]:
        """The inputs of ``Inspector.run_filter``, in its argument order."""
        return [self.step_lo, self.step_hi, self.reward_lo, self.reward_hi, self.component_dd, self.passed,
                self.adv_sign, self.finish_dd, self.regex, self.order, self.limit]


@dataclasses.dataclass
class _History:
    """The "Prompt across steps" tab: a title line, the per-step table and the reward plot."""

    title: gr.HTML
    table: gr.Dataframe
    plot: gr.LinePlot


@dataclasses.dataclass
class _Metrics:
    """The Metrics tab: the metric picker, the ``MAX_PLOTS`` plots and the go-to-step controls."""

    pick: gr.Dropdown
    plots: list[gr.LinePlot]
    goto_step: gr.Number
    goto_btn: gr.Button


def build_app(run_dir: str | os.PathLike[str], *, refresh_s: float = 5.0) -> gr.Blocks:
    """The inspector app for ``run_dir`` (see module docstring). Launch it with ``launch``.

    The layout helpers create the components in page order and the wiring helpers connect their events
    afterwards, so component ids and API endpoints keep a fixed order."""
    ins = Inspector(run_dir)
    names, default_names = ins.metric_choices()
    with gr.Blocks(title=f"mmrlvr inspect · {ins.run_dir.name}") as demo:
        gr.HTML("", js_on_load=KEYBOARD_JS, elem_id="mm-keys", padding=False)
        bar = _header_bar(ins, refresh_s)
        with gr.Tabs(selected="browse") as tabs:
            with gr.Tab("Browse", id="browse"):
                browse = _browse_tab(ins)
            with gr.Tab("Filter", id="filter"):
                filt = _filter_tab(ins)
            with gr.Tab("Prompt across steps", id="history"):
                history = _history_tab()
            with gr.Tab("Plan", id="plan"):
                _plan_tab(ins)
            with gr.Tab("Analysis", id="analysis"):
                _analysis_tab(ins)
            with gr.Tab("Metrics", id="metrics"):
                metrics = _metrics_tab(ins, names, default_names)

        _wire_browse(demo, ins, browse)
        _wire_refresh(ins, bar, browse, filt)
        _wire_filter(ins, filt, browse, tabs)
        _wire_history(ins, history, browse, tabs)
        _wire_metrics(ins, metrics, browse, tabs)
    demo.inspector = ins  # type: ignore[attr-defined]  # for tests and scripting
    return demo


# -- layout (each helper runs inside the Blocks / Tab context its caller opened) ------------------------------
def _header_bar(ins: Inspector, refresh_s: float) -> _HeaderBar:
    """The header row (run summary, follow-run switch, Refresh) and the follow-run timer."""
    with gr.Row(equal_height=True):
        header = gr.HTML(ins.header(), elem_id="mm-header")
        follow = gr.Checkbox(value=True, label=f"follow run (every {refresh_s:g} s)", scale=0, min_width=180)
        refresh_btn = gr.Button("Refresh", size="sm", scale=0, min_width=90, elem_id="mm-refresh")
    timer = gr.Timer(refresh_s, active=True)
    return _HeaderBar(header, follow, refresh_btn, timer)


def _browse_tab(ins: Inspector) -> _Browse:
    """The Browse tab: the step / group row, the group cards, the sample row, then the sample view."""
    with gr.Row():
        # allow_custom_value: the server validates (and falls back) itself, so API clients may
        # pass any step / prompt id without first loading the choices of their session
        steps = ins.reader.steps()
        step_dd = gr.Dropdown(label="Step", choices=ins.step_choices(), value=steps[-1] if steps else None,
                              allow_custom_value=True, scale=1, elem_id="mm-step")
        group_dd = gr.Dropdown(label="Prompt group", allow_custom_value=True, scale=3, elem_id="mm-group")
        prev_group = gr.Button("◀ group (p)", size="sm", scale=0, min_width=100, elem_id="mm-prev-group")
        next_group = gr.Button("group (n) ▶", size="sm", scale=0, min_width=100, elem_id="mm-next-group")
        history_btn = gr.Button("Across steps", size="sm", scale=0, min_width=110)
    group_html = gr.HTML(elem_id="mm-group-cards")
    with gr.Row():
        sample_radio = gr.Radio(label="Sample (best reward first)", scale=5, elem_id="mm-sample")
        sample_num = gr.Number(visible=False, precision=0)  # the selected sample, for API calls
        prev_sample = gr.Button("◀ sample (k)", size="sm", scale=0, min_width=110, elem_id="mm-prev-sample")
        next_sample = gr.Button("sample (j) ▶", size="sm", scale=0, min_width=110, elem_id="mm-next-sample")
    view = _sample_view()
    return _Browse(step_dd, group_dd, prev_group, next_group, history_btn, group_html, sample_radio, sample_num,
                   prev_sample, next_sample, view)


def _sample_view() -> _SampleView:
    """The selected sample: prompt, images beside thinking / turns / rewards, token heatmap, two-step compare."""
    prompt_html = gr.HTML(elem_id="mm-prompt")
    with gr.Row():
        with gr.Column(scale=2):
            # a video prompt's frames, in order (hidden for rows without video)
            frames_html = gr.HTML(elem_id="mm-frames", visible=False)
            annotated = gr.AnnotatedImage(label="Image · predicted boxes (magenta, with IoU) vs ground "
                                          "truth (cyan), outlines", format="png",
                                          elem_id="mm-annotated")  # no fixed height: a letterboxed
                                          # image and its box masks would be scaled apart
            gallery = gr.Gallery(label="More images", visible=False, columns=4, height=160)
        with gr.Column(scale=3):
            ta_html = gr.HTML(elem_id="mm-thinking-answer")
            # a multi-turn trajectory's turns: calls, returned images, zoom boxes, masked spans
            turns_html = gr.HTML(elem_id="mm-turns", visible=False)
            reward_html = gr.HTML(elem_id="mm-reward")
    signal_radio = gr.Radio(list(views.SIGNALS), value=DEFAULT_SIGNAL,
                            label="Token heatmap signal (click a token for its values)",
                            elem_id="mm-signal")
    # the visible heatmap is wrapped HTML text; the same scores as a HighlightedText value stay
    # available to API clients (/render, /heatmap) without taking page height
    heat = gr.HighlightedText(label="Response tokens (scaled to [-1, 1])", show_legend=False,
                              combine_adjacent=False, visible=False, elem_id="mm-heatmap-values")
    heat_html = gr.HTML(elem_id="mm-heatmap", css_template=views.HEATMAP_CSS, js_on_load=None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=240):
            compare_dd = gr.Dropdown(label="Compare with step", allow_custom_value=True,
                                     elem_id="mm-compare")
            gr.Markdown("Drag the handle: left is the selected step, right the step chosen here "
                        "(each image is captioned with its step and reward).")
        with gr.Column(scale=1, min_width=300):
            slider = gr.ImageSlider(label="Same prompt at two steps (drag)", type="pil", format="png",
                                    elem_id="mm-slider")
        with gr.Column(scale=1, min_width=0):  # keeps the slider (and its image) at a third of the width
            pass
    return _SampleView(prompt_html, frames_html, annotated, gallery, ta_html, turns_html, reward_html,
                       signal_radio, heat, heat_html, compare_dd, slider)


def _filter_tab(ins: Inspector) -> _Filter:
    """The Filter tab: range boxes, component / advantage / finish conditions, regex and order, results."""
    with gr.Row():
        # text boxes, not gr.Number: an empty box must mean "no bound" (a Number sends 0)
        step_lo = gr.Textbox(label="step ≥", placeholder="any", elem_id="mm-step-lo")
        step_hi = gr.Textbox(label="step ≤", placeholder="any", elem_id="mm-step-hi")
        reward_lo = gr.Textbox(label="reward ≥", placeholder="any", elem_id="mm-reward-lo")
        reward_hi = gr.Textbox(label="reward ≤", placeholder="any", elem_id="mm-reward-hi")
        limit = gr.Number(label="show at most", value=200, precision=0)
    with gr.Row():
        component_dd = gr.Dropdown([ANY] + ins.reader.components(), value=ANY, label="component")
        passed = gr.Radio([ANY, "pass", "fail"], value=ANY, label="component passes (≥ 0.5)")
        adv_sign = gr.Radio([ANY, "+", "-", "0"], value=ANY, label="advantage sign")
        finish_dd = gr.Dropdown(ins.finish_reasons(), multiselect=True, label="finish reason")
    with gr.Row():
        regex = gr.Textbox(label="regex in response text", placeholder=r"e.g. answer>\s*3<")
        order = gr.Radio(["step order", "round robin"], value="round robin",
                         label="order (round robin: one sample per group first)")
        run_btn = gr.Button("Filter", variant="primary", scale=0, min_width=100, elem_id="mm-run-filter")
    count_md = gr.Markdown(elem_id="mm-count")
    results = gr.Dataframe(interactive=False, elem_id="mm-results", max_height=480, wrap=True)
    return _Filter(step_lo, step_hi, reward_lo, reward_hi, limit, component_dd, passed, adv_sign, finish_dd, regex,
                   order, run_btn, count_md, results)


def _history_tab() -> _History:
    """The "Prompt across steps" tab: title line, then the per-step table beside the reward plot."""
    title = gr.HTML()
    with gr.Row():
        table = gr.Dataframe(interactive=False, scale=2)
        plot = gr.LinePlot(x="step", y="value", color="metric", scale=3,
                           title="reward of this prompt per step")
    return _History(title, table, plot)


def _plan_tab(ins: Inspector) -> None:
    """The Plan tab: the run's plan, rendered once when the app is built."""
    gr.Markdown("What this run's step ran: the stage of each kind, why (the config key that chose it) "
                "and its settings with their source (user, preset, loss default, default).")
    gr.HTML(ins.plan(), elem_id="mm-plan")


def _analysis_tab(ins: Inspector) -> None:
    """The Analysis tab: what ``mmrlvr analyze`` wrote, and a button (API ``analysis``) that reloads it."""
    gr.Markdown("What `mmrlvr analyze` found in this run (RUN_DIR/analysis/): tables and plots.")
    analysis_html = gr.HTML(ins.analysis(), elem_id="mm-analysis")
    gr.Button("Reload analyses", size="sm").click(ins.analysis, None, analysis_html, api_name="analysis")


def _metrics_tab(ins: Inspector, names: list[str], default_names: list[str]) -> _Metrics:
    """The Metrics tab: the picker (``names``, ``default_names`` chosen), ``MAX_PLOTS`` plots two per row
    (unused ones hidden) and the go-to-step controls."""
    pick = gr.Dropdown(names, value=default_names, multiselect=True,
                       label=f"metrics from metrics.jsonl (up to {MAX_PLOTS})")
    gr.Markdown("Select a range on a plot to open the samples of that step.")
    plots = []
    initial = ins.metric_plots(default_names)
    for row in range(0, MAX_PLOTS, 2):
        with gr.Row():
            for k in range(row, row + 2):
                plots.append(gr.LinePlot(initial[k]["value"], x="step", y="value",
                                         title=initial[k]["title"], visible=initial[k]["visible"],
                                         elem_id=f"mm-metric-{k}", height=240))
    with gr.Row():
        goto_step = gr.Number(label="step", precision=0, scale=1)
        goto_btn = gr.Button("Show samples of this step", scale=0, min_width=200)
    return _Metrics(pick, plots, goto_step, goto_btn)


# -- events (registered in this order: it fixes the API endpoints' order) -----------------------------------
def _wire_browse(demo: gr.Blocks, ins: Inspector, browse: _Browse) -> None:
    """Browse events: the first render on page load, the step / group / sample pickers, the prev / next
    buttons (which the keyboard keys click), the heatmap signal and the compare step."""
    browse_out = browse.outputs()
    sel = browse.selection()
    step_dd, group_dd, sample_radio = browse.step_dd, browse.group_dd, browse.sample_radio
    signal_radio, compare_dd = browse.view.signal_radio, browse.view.compare_dd
    demo.load(ins.render, sel + [signal_radio, compare_dd], browse_out,
              api_name="render")
    step_dd.input(lambda s, sig: ins.render(s, None, None, sig), [step_dd, signal_radio], browse_out,
                  api_name="select_step")
    group_dd.input(lambda s, p, sig: ins.render(s, p, None, sig), [step_dd, group_dd, signal_radio], browse_out,
                   api_name="select_group")
    sample_radio.input(lambda s, p, i, sig, c: ins.render(s, p, i, sig, c),
                       [step_dd, group_dd, sample_radio, signal_radio, compare_dd],
                       browse_out, api_name="select_sample")
    for btn, delta, level, name in [(browse.next_sample, 1, "sample", "next_sample"),
                                    (browse.prev_sample, -1, "sample", "prev_sample"),
                                    (browse.next_group, 1, "group", "next_group"),
                                    (browse.prev_group, -1, "group", "prev_group")]:
        btn.click(lambda s, p, i, sig, d=delta, lv=level: ins.navigate(s, p, i, d, lv, sig),
                  sel + [signal_radio], browse_out, api_name=name)
    signal_radio.input(ins.heatmap, sel + [signal_radio], [browse.view.heat, browse.view.heat_html],
                       api_name="heatmap")
    compare_dd.input(ins.compare, sel + [compare_dd], browse.view.slider, api_name="compare")


def _wire_refresh(ins: Inspector, bar: _HeaderBar, browse: _Browse, filt: _Filter) -> None:
    """Refresh events: the button always re-renders the header, the follow-run timer only when something
    changed; the follow-run switch starts and stops the timer."""
    refresh_out = [bar.header, browse.step_dd, filt.component_dd, filt.finish_dd]
    bar.refresh_btn.click(lambda s: ins.refresh(s, True), browse.step_dd, refresh_out, api_name="refresh")
    tick_out = [bar.header, filt.component_dd, filt.finish_dd, *browse.outputs()]
    bar.timer.tick(ins.tick, [browse.step_dd, browse.view.signal_radio], tick_out, api_visibility="private",
                   show_progress="hidden")
    bar.follow.change(lambda on: gr.Timer(active=on), bar.follow, bar.timer, api_visibility="private")


def _wire_filter(ins: Inspector, filt: _Filter, browse: _Browse, tabs: gr.Tabs) -> None:
    """Filter events: the button and Enter in the regex box run the filter; selecting a result row opens
    that sample in Browse."""
    filter_in = filt.inputs()
    filt.run_btn.click(ins.run_filter, filter_in, [filt.count_md, filt.results], api_name="filter")
    filt.regex.submit(ins.run_filter, filter_in, [filt.count_md, filt.results], api_visibility="private")

    def open_row(table: pd.DataFrame, sig: str, evt: gr.SelectData) -> tuple:
        row = table.iloc[evt.index[0]]
        return (*ins.render(int(row["step"]), str(row["prompt"]), int(row["sample"]), sig),
                gr.Tabs(selected="browse"))

    filt.results.select(open_row, [filt.results, browse.view.signal_radio], browse.outputs() + [tabs],
                        api_visibility="private")


def _wire_history(ins: Inspector, history: _History, browse: _Browse, tabs: gr.Tabs) -> None:
    """One prompt across steps: "Across steps" opens the tab for the Browse group; selecting a row opens that
    step's group in Browse."""
    def show_history(p: str | None) -> tuple:
        return (*ins.history(p), gr.Tabs(selected="history"))

    browse.history_btn.click(show_history, browse.group_dd, [history.title, history.table, history.plot, tabs],
                             api_name="history")

    def open_history_row(table: pd.DataFrame, p: str | None, sig: str, evt: gr.SelectData) -> tuple:
        step = int(table.iloc[evt.index[0]]["step"])
        return (*ins.render(step, p, None, sig), gr.Tabs(selected="browse"))

    history.table.select(open_history_row, [history.table, browse.group_dd, browse.view.signal_radio],
                         browse.outputs() + [tabs], api_visibility="private")


def _wire_metrics(ins: Inspector, metrics: _Metrics, browse: _Browse, tabs: gr.Tabs) -> None:
    """Metrics events: the picker redraws the plots; the go-to button and a range selected on a plot open the
    nearest saved step in Browse."""
    metrics.pick.change(lambda names: [gr.LinePlot(**p) for p in ins.metric_plots(names)], metrics.pick,
                        metrics.plots, api_name="metrics")

    def goto(step: float | None, sig: str) -> tuple:
        target = ins.nearest_step(step)
        return (*ins.render(target, None, None, sig), gr.Tabs(selected="browse"))

    metrics.goto_btn.click(goto, [metrics.goto_step, browse.view.signal_radio], browse.outputs() + [tabs],
                           api_name="goto_step")

    def plot_select(sig: str, evt: gr.SelectData) -> tuple:
        lo, hi = evt.index if isinstance(evt.index, (list, tuple)) else (evt.index, evt.index)
        return (*ins.render(ins.nearest_step((float(lo) + float(hi)) / 2), None, None, sig),
                gr.Tabs(selected="browse"))

    for plot in metrics.plots:
        plot.select(plot_select, browse.view.signal_radio, browse.outputs() + [tabs], api_visibility="private")


#: the only parts of a run folder the server hands out as files (never config.yaml, checkpoints, logs)
SERVED_DIRS = ("images", "rollouts")
#: refused even if a served folder links to them (blocked paths win over allowed ones in Gradio)
BLOCKED = ("config.yaml", "plan.json", "plugins", "checkpoints", "events", "metrics.jsonl", "summary.json")


def served_paths(run_dir: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """(allowed, blocked) file paths for ``gr.Blocks.launch``: the run's images and rollout shards only."""
    run = Path(run_dir).resolve()
    return [str(run / d) for d in SERVED_DIRS], [str(run / b) for b in BLOCKED]


def launch(app_or_run_dir: gr.Blocks | str | os.PathLike[str], *, host: str = "127.0.0.1", port: int | None = None,
           auth: tuple[str, str] | None = None, prevent_thread_lock: bool = False, quiet: bool = False,
           **kwargs: Any) -> tuple[Any, str, str]:
    """Start the inspector: binds ``host`` (127.0.0.1 by default), asks for ``auth`` = (user, password) when
    given, and serves as files only the run's ``images/`` and ``rollouts/`` (see ``served_paths``)."""
    app = app_or_run_dir if isinstance(app_or_run_dir, gr.Blocks) else build_app(app_or_run_dir)
    ins: Inspector = app.inspector  # type: ignore[attr-defined]
    allowed, blocked = served_paths(ins.run_dir)
    return app.launch(server_name=host, server_port=port, allowed_paths=allowed, blocked_paths=blocked, auth=auth,
                      prevent_thread_lock=prevent_thread_lock, quiet=quiet, share=False, show_error=True,
                      footer_links=["api"], css=APP_CSS, **kwargs)
