"""Inspector view functions: pure record -> component values, escaping, heatmaps, boxes, tables."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from mmrlvr.inspector import views
from mmrlvr.store import RolloutReader, RolloutRecord, UnsafePathError
from mmrlvr.testing.fake_run import HOSTILE_TEXT, make_fake_run, tokenize


def rec_with(**kw) -> RolloutRecord:
    base = dict(run_id="r", step=0, prompt_id="p", sample_index=0, group_size=4)
    base.update(kw)
    return RolloutRecord(**base)


# -- escaping ------------------------------------------------------------------------------------------
def test_esc_escapes_html_and_template_syntax() -> None:
    assert views.esc("<script>alert('x')</script>") == "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    # ${...} and {{...}} are template syntax in gr.HTML: they must reach the browser as entities
    assert views.esc("${7*7} {{x}} `y`") == "&#36;&#123;7*7&#125; &#123;&#123;x&#125;&#125; &#96;y&#96;"
    assert views.esc(None) == ""


def test_hostile_response_renders_as_text() -> None:
    rec = rec_with(response_text=HOSTILE_TEXT, parsed_answer="<u>1</u>", ground_truth="<em>1</em>",
                   consistency={"verdict": "<u>x</u>", "conclusion": "<script>alert(5)</script>",
                                "conclusion_span": [17, 44]},
                   rubric_results=[{"id": "<x>", "text": "<script>alert(3)</script>", "category": "c",
                                    "verdict": "fail", "score": 0.0, "weight": 1.0,
                                    "rationale": "<img src=x onerror=alert(4)>", "judge": "**j**"}],
                   reward_components={"<svg onload=alert(6)>": 1.0})
    out = views.thinking_answer_html(rec) + views.reward_breakdown_html(rec) + views.group_cards_html([rec])
    for bad in ("<script", "<img", "<svg", "<u>", "<em>", "${", "{{"):  # (the views never emit <u>/<em>)
        assert bad not in out, bad
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in out
    assert "**bold?**" in out  # markdown is not interpreted either
    assert "&#36;&#123;7*7&#125;" in out
    # the conclusion span [17, 44) is exactly the script tag: highlighted, still escaped
    assert '<mark class="mm-conclusion"' in out
    assert ">&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;</mark>" in out


# -- response layout -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, thinking, answer", [
    ("<think>I see 2</think><answer>2</answer>", "I see 2", "2"),
    ("<think>unclosed thinking", "unclosed thinking", ""),
    ("no tags at all", "", "no tags at all"),
    ("reasoning first <answer>3</answer>", "reasoning first ", "3"),
    ("<think>a</think> tail without answer tag", "a", " tail without answer tag"),
    ("<answer>unclosed", "", "unclosed"),
    ("", "", ""),
])
def test_split_response(text: str, thinking: str, answer: str) -> None:
    parts = views.split_response(text)
    assert text[slice(*parts.thinking)] == thinking
    assert text[slice(*parts.answer)] == answer


def test_conclusion_highlight_is_clipped_to_each_pane() -> None:
    text = "<think>I see 2 red</think><answer>2</answer>"
    # span covers "2 red" (offsets 13..18) in the thinking only
    assert views.highlighted_html(text, views.split_response(text).thinking, [13, 18]) == (
        'I see <mark class="mm-conclusion" title="extracted conclusion" '
        'style="background:#ffe082;color:#000;border-radius:3px;padding:0 2px">2 red</mark>')
    assert "<mark" not in views.highlighted_html(text, views.split_response(text).answer, [13, 18])
    assert views.highlighted_html(text, (0, 4), None) == "&lt;thi"


def test_consistency_badge() -> None:
    assert "not computed" in views.consistency_badge_html(rec_with())
    badge = views.consistency_badge_html(rec_with(consistency={"verdict": "inconsistent", "p_consistent": 0.125,
                                                               "conclusion": "3", "answer_correct": False}))
    assert "inconsistent" in badge and "p=0.125" in badge and "answer correct: no" in badge and "#c62828" in badge


# -- groups --------------------------------------------------------------------------------------------
def test_group_cards_sorted_by_reward_with_spread() -> None:
    recs = [rec_with(sample_index=i, reward=r, advantage=a, response_token_ids=[1] * n, finish_reason=f)
            for i, (r, a, n, f) in enumerate([(0.0, -1.0, 3, "stop"), (1.0, 1.0, 5, "length"), (0.5, 0.0, 4, "stop")])]
    out = views.group_cards_html(recs, selected=2)
    order = [out.index(f'data-sample="{i}"') for i in (1, 2, 0)]
    assert order == sorted(order)  # best reward first: #1 (1.0), #2 (0.5), #0 (0.0)
    assert "spread 1" in out and "zero variance" not in out  # spread = 1.0 - 0.0
    assert "5 tok · length" in out
    assert 'data-sample="2" style="border:3px solid' in out  # the selected card is outlined
    flat = views.group_cards_html([rec_with(sample_index=i, reward=1.0) for i in range(3)])
    assert "zero variance" in flat and "spread 0" in flat


def test_group_and_sample_choices() -> None:
    summary = pd.DataFrame({"prompt_id": ["a", "b"], "reward_mean": [0.5, 1.0], "spread": [1.0, 0.0],
                            "zero_variance": [False, True]})
    assert views.group_choices(summary) == [("a · mean 0.5 · spread 1", "a"),
                                            ("b · mean 1 · spread 0 ⚠ zero var", "b")]
    recs = [rec_with(sample_index=i, reward=r) for i, r in enumerate([0.2, 0.9, float("nan")])]
    assert [v for _, v in views.sample_choices(recs)] == [1, 0, 2]  # NaN reward sorts last


# -- heatmaps ------------------------------------------------------------------------------------------
def test_scale_signal_hand_worked() -> None:
    # peak |value| = 2 -> [-2, 1, 0] / 2
    assert views.scale_signal([-2.0, 1.0, 0.0], "entropy") == [-1.0, 0.5, 0.0]
    # ratio is shown as log(ratio): log 2 = 0.693, log 0.5 = -0.693, log 1 = 0 -> [1, -1, 0]
    assert views.scale_signal([2.0, 0.5, 1.0], "ratio") == pytest.approx([1.0, -1.0, 0.0])
    # -inf (a masked token's log-prob) is not coloured; the rest is scaled by the finite peak 4
    assert views.scale_signal([-float("inf"), -4.0, -1.0], "logprob") == [None, -1.0, -0.25]
    assert views.scale_signal([0.0, 0.0], "credit weight") == [0.0, 0.0]


def test_heatmap_collapses_image_pad_runs_and_keeps_raw_values() -> None:
    toks = ["The", "<|image_pad|>", "<|image_pad|>", "<|image_pad|>", " red", "<|image_pad|>"]
    rec = rec_with(response_tokens=toks, response_token_ids=list(range(6)),
                   token_entropy=[1.0, 0.0, 2.0, 4.0, -4.0, 1.0])
    spans = views.heatmap_tokens(rec, "entropy")
    assert [s.text for s in spans] == ["The", "<|image_pad|>×3", " red", "<|image_pad|>"]
    # peak 4: scores [0.25, 0, 0.5, 1, -1, 0.25]; the run's score is the mean of 0, 0.5, 1 = 0.5
    assert [s.score for s in spans] == [0.25, 0.5, -1.0, 0.25]
    assert spans[1].count == 3 and "tokens 1–3: 3× <|image_pad|>" in spans[1].raw and "mean 2" in spans[1].raw
    assert spans[2].raw.splitlines()[0] == "token 4: ' red' (id 4)" and "entropy -4" in spans[2].raw
    assert views.heatmap_highlighted(spans)[0] == ("The", 0.25)


def test_heatmap_html_escapes_tokens_and_hover() -> None:
    rec = rec_with(response_tokens=["<script>", "x"], response_token_ids=[1, 2], token_logprob=[-1.0, -0.5])
    html = views.heatmap_html(views.heatmap_tokens(rec, "logprob"), "logprob")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert 'title="token 0: &#x27;&lt;script&gt;&#x27; (id 1)\nlogprob -1"' in html
    assert "rgba(128,90,213,1.000)" in html  # -1 -> full purple


def test_heatmap_without_signal_and_unknown_signal() -> None:
    rec = rec_with(response_tokens=["a", "b"], response_token_ids=[1, 2])
    assert [s.score for s in views.heatmap_tokens(rec, "advantage")] == [None, None]
    with pytest.raises(ValueError, match="unknown heatmap signal"):
        views.heatmap_tokens(rec, "nope")


# -- boxes ---------------------------------------------------------------------------------------------
def test_best_ious_hand_worked() -> None:
    # [0,0,10,10] vs [5,0,15,10]: intersection 5x10 = 50, union 100 + 100 - 50 = 150 -> 1/3
    assert views.best_ious([[0, 0, 10, 10]], [[20, 20, 30, 30], [5, 0, 15, 10]]) == [pytest.approx(1 / 3)]
    assert views.best_ious([[0, 0, 1, 1]], []) == [None]


def test_box_annotations_labels_colours_and_clipping() -> None:
    rec = rec_with(parsed_boxes=[[0, 0, 10, 10], [-50, 5, 500, 8]], gt_boxes=[[5, 0, 15, 10]])
    ann, colours = views.box_annotations(rec, (100, 50))
    # IoU uses the unclipped prediction: pred 2 [-50,5,500,8] vs gt: intersection 10x3 = 30,
    # union 550x3 + 10x10 - 30 = 1720 -> 0.017 -> "0.02"; the drawn box is clipped to the 100x50 image
    assert ann == [((5, 0, 15, 10), "gt 1"), ((0, 0, 10, 10), "pred 1 IoU 0.33"), ((0, 5, 99, 8), "pred 2 IoU 0.02")]
    assert colours == {"gt 1": views.GT_COLOUR, "pred 1 IoU 0.33": views.PRED_COLOUR,
                       "pred 2 IoU 0.02": views.PRED_COLOUR}
    (img, scaled), _ = views.annotated_value(Image.new("RGB", (100, 50)), rec)
    assert img.size == (300, 150) and scaled[0] == ((15, 0, 45, 30), "gt 1")  # 384 // 100 = 3x


def test_draw_boxes_paints_both_colours() -> None:
    rec = rec_with(parsed_boxes=[[10, 10, 40, 40]], gt_boxes=[[50, 50, 90, 90]])
    out = views.draw_boxes(Image.new("RGB", (100, 100), "white"), rec)
    k = views.display_scale((100, 100))  # 3
    assert out.size == (300, 300)
    assert out.getpixel((50 * k, 70 * k)) == (0, 0xBC, 0xD4)  # left edge of the GT box: cyan
    assert out.getpixel((10 * k, 25 * k)) == (0xFF, 0, 0xFF)  # left edge of the predicted box: magenta
    assert out.getpixel((70 * k, 70 * k)) == (255, 255, 255)  # inside: untouched


def test_load_images_refuses_paths_outside_the_run(tmp_path: Path) -> None:
    run = make_fake_run(tmp_path / "run", steps=1, groups=1, group_size=2)
    rec = RolloutReader(run).read_step(0)[0]
    assert views.load_images(run, rec)[0].size == (112, 112)
    for bad in ("../../etc/passwd", "/etc/passwd", "images/../../outside.png"):
        with pytest.raises(UnsafePathError):
            views.load_images(run, rec_with(image_refs=[bad]))
    grey = views.load_images(run, rec_with(image_refs=["images/00/missing.png"]))[0]
    assert grey.getpixel((0, 0)) == (200, 200, 200)


# -- tables and plots ----------------------------------------------------------------------------------
def test_filter_table_and_metrics_frames(tmp_path: Path) -> None:
    run = make_fake_run(tmp_path / "run", steps=2, groups=2, group_size=2)
    reader = RolloutReader(run)
    table = views.filter_table(reader.filter(limit=3), reader.components())
    assert list(table.columns[:7]) == ["step", "prompt", "sample", "reward", "advantage", "finish", "tokens"]
    assert set(table.columns[7:]) == set(reader.components()) and len(table) == 3
    metrics = [{"step": 0, "reward/mean": 0.5, "accuracy": float("nan"), "note": "x"},
               {"step": 1, "reward/mean": 0.75, "accuracy": 1.0, "flag": True}]
    frame = views.metrics_frame(metrics, ["reward/mean", "accuracy"])
    assert frame.to_dict("records") == [{"step": 0, "value": 0.5, "metric": "reward/mean"},
                                        {"step": 1, "value": 0.75, "metric": "reward/mean"},
                                        {"step": 1, "value": 1.0, "metric": "accuracy"}]
    assert views.metric_names(metrics) == ["reward/mean", "accuracy"]
    assert views.nearest_step([0, 10, 20], 13.9) == 10 and views.nearest_step([], 3) is None
    hist = views.history_frame(reader.prompt_history("p00000"))
    assert len(hist) == 4 and set(hist["metric"]) == {"reward mean", "reward max"}


def test_fmt() -> None:
    assert [views.fmt(v) for v in (1.0, 0.5, 1 / 3, -0.0, 1e-5, float("nan"), float("-inf"), None, True, 7)] == \
        ["1", "0.5", "0.333", "0", "1e-05", "nan", "-inf", "–", "yes", "7"]


def test_fake_run_is_realistic(tmp_path: Path) -> None:
    run = make_fake_run(tmp_path / "run", steps=2, groups=4, group_size=4, include_hostile=True)
    reader = RolloutReader(run)
    assert reader.steps() == [0, 1] and len(reader.index) == 32
    recs = reader.read_step(1)
    assert all("".join(r.response_tokens) == r.response_text for r in recs)
    assert any(r.parsed_boxes and r.gt_boxes for r in recs) and any(r.rubric_results for r in recs)
    for r in recs:
        assert len(r.token_entropy) == r.num_response_tokens == len(r.token_credit_weight)
    # group advantages are standardised rewards: they sum to ~0 in each group
    for g in {r.prompt_id for r in recs}:
        assert abs(sum(r.advantage for r in recs if r.prompt_id == g)) < 1e-6
    assert reader.read_step(0)[1].response_text == HOSTILE_TEXT
    assert [m["step"] for m in reader.metrics()] == [0, 1]
    assert math.isfinite(reader.metrics()[0]["reward/mean"])
    assert tokenize("a <b> c") == ["a", " <", "b", ">", " c"]  # lossless, leading spaces kept like BPE


# -- second pass: what the views say at a glance -------------------------------------------------------
def test_most_informative_group_widest_spread_then_advantage() -> None:
    rows = pd.DataFrame({
        "prompt_id": ["a", "a", "b", "b", "c", "c", "d", "d"],
        # spreads: a 0 (flat), b 0.5, c 0.5, d 0.25; b and c tie on spread
        "reward": [1.0, 1.0, 0.0, 0.5, 0.25, 0.75, 0.5, 0.75],
        # mean |advantage|: b (0.5 + 0.5) / 2 = 0.5, c (1 + 1) / 2 = 1 -> c wins the tie
        "advantage": [0.0, 0.0, -0.5, 0.5, -1.0, 1.0, -1.0, 1.0],
    })
    pid, why = views.most_informative_group(rows)
    assert pid == "c"
    assert "spread 0.5" in why and "0.25 → 0.75" in why and "1 flat group" in why
    flat = rows.assign(reward=1.0, advantage=0.0)
    pid, why = views.most_informative_group(flat)
    assert pid == "a" and "equal rewards" in why
    assert views.most_informative_group(rows.iloc[:0]) == (None, "")


def test_reward_breakdown_weights_contributions_and_no_duplicate_rubric() -> None:
    comps = {"format": 1.0, "accuracy": 0.0, "rubric": 0.75, "rubric/rubric": 0.75, "rubric/crit/c1": 1.0,
             "grounding": 0.5, "grounding/iou": 0.5}
    weights = {"format": 0.2, "accuracy": 1.0, "rubric": 0.5}
    rows = views.reward_rows(comps, weights)
    # the config's order first, then unweighted components; rubric/rubric repeats rubric: dropped
    assert [(r.component, r.parent) for r in rows] == [
        ("format", None), ("accuracy", None), ("rubric", None), ("crit/c1", "rubric"), ("grounding", None),
        ("iou", "grounding")]
    # contributions: 0.2 x 1 = 0.2, 1 x 0 = 0, 0.5 x 0.75 = 0.375; grounding has no weight
    assert [r.contribution for r in rows if r.parent is None] == [0.2, 0.0, 0.375, None]
    html = views.reward_breakdown_html(rec_with(reward_components={"format": 1.0, "accuracy": 1.0},
                                                reward=1.2), {"format": 0.2, "accuracy": 1.0})
    assert "weight × raw" in html and "<b>1.2</b>" in html and "stored reward" not in html  # 0.2 + 1.0
    shaped = views.reward_breakdown_html(rec_with(reward_components={"accuracy": 1.0}, reward=0.9),
                                         {"accuracy": 1.0})
    assert "(stored reward 0.9)" in shaped  # a shaping term outside the components is not hidden
    unknown = views.reward_breakdown_html(rec_with(reward_components={"accuracy": 1.0}, reward=1.0), None)
    assert "weights not recorded" in unknown
    assert views.run_weights({"rewards": [{"name": "format", "weight": 0.2},
                                          {"name": "grounding", "label": "iou2", "weight": 2}]}) == {
        "format": 0.2, "iou2": 2.0}
    assert views.run_weights({"seed": 0}) is None


def test_rubric_verdicts_met_and_not_met_are_coloured() -> None:
    rec = rec_with(rubric_results=[{"id": "a", "text": "t", "verdict": "met", "score": 1.0, "weight": 1.0,
                                    "rationale": "why a", "judge": "program"},
                                   {"id": "b", "text": "t", "verdict": "not_met", "score": 0.0, "weight": 1.0,
                                    "rationale": "why b", "judge": "program"}])
    html = views.reward_breakdown_html(rec)
    assert "color:#2e7d32;font-weight:bold;white-space:nowrap'>met<" in html
    assert "color:#c62828;font-weight:bold;white-space:nowrap'>not_met<" in html
    assert "why a" in html and "why b" in html


def test_delta_logprob_signal_is_log_ratio() -> None:
    rec = rec_with(response_tokens=["a", "b", "c"], response_token_ids=[1, 2, 3], token_ratio=[math.e, 1.0, 1 / math.e])
    # log e = 1, log 1 = 0, log 1/e = -1 -> scores [1, 0, -1]; the hover lists Δlog-prob beside the ratio
    assert views.signal_values(rec, "Δlog-prob") == pytest.approx([1.0, 0.0, -1.0])
    assert [t.score for t in views.heatmap_tokens(rec, "Δlog-prob")] == pytest.approx([1.0, 0.0, -1.0])
    assert "Δlog-prob 1" in views.heatmap_tokens(rec, "ratio")[0].raw
    assert views.signal_peak(rec, "Δlog-prob") == pytest.approx(1.0)
    html = views.heatmap_html(views.heatmap_tokens(rec, "Δlog-prob"), "Δlog-prob", 1.0)
    assert 'class="mm-legend"' in html and 'tabindex="0"' in html and 'data-v="token 0' in html
    assert "max-height:260px" in html


def test_legend_of_a_signal_with_no_negative_value_runs_from_zero() -> None:
    """Entropy is never negative: its legend is 0 ... peak (white -> red), not a -peak purple end no token takes."""
    rec = rec_with(response_tokens=["a", "b"], response_token_ids=[1, 2], token_entropy=[0.5, 2.0])
    html = views.heatmap_html(views.heatmap_tokens(rec, "entropy"), "entropy", views.signal_peak(rec, "entropy"))
    assert "white = 0, red = high" in html and "purple = negative" not in html and "mm-legend-pos" in html
    assert "<span>0</span>" in html and "<span>-2</span>" not in html
    signed = rec_with(response_tokens=["a", "b"], response_token_ids=[1, 2], token_logprob=[-1.0, 0.5])
    html = views.heatmap_html(views.heatmap_tokens(signed, "logprob"), "logprob", 1.0)
    assert "purple = negative, red = positive" in html and "<span>-1</span>" in html


def test_outline_masks_leave_the_inside_clear() -> None:
    (mask, label), = views.outline_masks([((2, 3, 9, 8), "gt 1")], (12, 10), width=2)
    assert label == "gt 1" and mask.shape == (10, 12)
    assert mask[3, 2] == 1 and mask[3, 9] == 1 and mask[8, 5] == 1 and mask[4, 3] == 1  # the 2-px border
    assert mask[5, 5] == 0 and mask[0, 0] == 0  # inside and outside: untouched (no fill over the object)


def test_draw_boxes_labels_and_no_fill() -> None:
    rec = rec_with(parsed_boxes=[[30, 30, 60, 60]], gt_boxes=[[30, 30, 60, 60]])
    img = Image.new("RGB", (100, 100), (235, 195, 20))  # a yellow object filling the image
    out = views.draw_boxes(img, rec)
    k = views.display_scale((100, 100))
    assert out.getpixel((45 * k, 45 * k)) == (235, 195, 20)  # inside both boxes: the object's own colour
    assert out.getpixel((30 * k, 45 * k)) == (0xFF, 0, 0xFF)  # predicted outline drawn last, on top


def test_filter_table_shows_response_text_and_keeps_headers_when_empty(tmp_path: Path) -> None:
    run = make_fake_run(tmp_path / "run", steps=1, groups=2, group_size=2)
    reader = RolloutReader(run)
    rows = reader.filter(limit=2)
    table = views.filter_table(rows, reader.components(), texts=reader.texts(rows))
    assert table["response"].tolist() == [views.text_preview(r.response_text) for r in reader.records(rows)]
    empty = views.filter_table(reader.filter(reward_range=(99, None)), reader.components(), texts=[])
    assert len(empty) == 0 and list(empty.columns[:3]) == ["step", "prompt", "sample"]
    assert views.text_preview("a\nb", 10) == "a ⏎ b" and views.text_preview("x" * 20, 5) == "xxxx…"


# -- video frames --------------------------------------------------------------------------------------
def test_frame_strip_shows_every_frame_in_order_with_its_time(tmp_path: Path) -> None:
    run = make_fake_run(tmp_path / "run", steps=1, groups=1, group_size=2, video_groups=1, video_frames=8)
    rec = next(r for r in RolloutReader(run).read_step(0) if r.prompt_id == "v00000")
    videos = views.load_video_frames(run, rec)
    assert [(v.total, v.fps, len(v.frames)) for v in videos] == [(8, 2.0, 8)]
    assert [f.index for f in videos[0].frames] == list(range(8))
    # 2 fps: frame i is at i / 2 s
    assert [f.seconds for f in videos[0].frames] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    html_out = views.frame_strip_html(videos)
    assert "video: 8 frames · 2 fps sampled · 4 s" in html_out
    assert html_out.count('<img src="data:image/png;base64,') == 8
    captions = [c.split("</figcaption>")[0] for c in html_out.split("<figcaption>")[1:]]
    assert captions == [f"#{i} · {i / 2:.1f} s" for i in range(8)]
    assert "overflow-x:hidden" in html_out and "flex-wrap:wrap" in html_out  # wraps, never widens the page
    capped = views.frame_strip_html(views.load_video_frames(run, rec, limit=3))  # a long clip: all counted
    assert "video: 8 frames · 2 fps sampled · 4 s · first 3 shown" in capped and capped.count("<img ") == 3


def test_frame_strip_absent_for_image_rows_and_without_fps(tmp_path: Path) -> None:
    run = make_fake_run(tmp_path / "run", steps=1, groups=1, group_size=2, video_groups=1, video_frames=3,
                        video_fps=None)
    recs = RolloutReader(run).read_step(0)
    image_row = next(r for r in recs if r.prompt_id == "p00000")
    assert views.load_video_frames(run, image_row) == [] and views.frame_strip_html([]) == ""
    video_row = next(r for r in recs if r.prompt_id == "v00000")
    html_out = views.frame_strip_html(views.load_video_frames(run, video_row))
    assert "video: 3 frames</b>" in html_out and "fps" not in html_out  # no fps recorded: positions only
    assert "<figcaption>#2</figcaption>" in html_out and " s</figcaption>" not in html_out


def test_frame_refs_are_data_bad_ones_become_labelled_tiles(tmp_path: Path) -> None:
    run = make_fake_run(tmp_path / "run", steps=1, groups=1, group_size=2)
    good = RolloutReader(run).read_step(0)[0].image_refs[0]
    rec = rec_with(extra={"video_frames": [[good, "../../etc/passwd", "/etc/passwd", "images/00/missing.png"],
                                           ["<script>alert(1)</script>"]],
                          "video_fps": [4, "<b>"]})
    videos = views.load_video_frames(run, rec)
    assert [v.fps for v in videos] == [4.0, None]
    assert [f.problem for f in videos[0].frames] == [None, "path outside the run folder",
                                                     "path outside the run folder", "missing file"]
    assert videos[0].frames[0].image is not None and videos[0].frames[3].seconds == 0.75
    out = views.frame_strip_html(videos)
    assert "video 1 of 2: 4 frames" in out and "video 2 of 2: 1 frame</b>" in out
    assert "<script" not in out and "etc/passwd" not in out  # refs never reach the page
    # malformed values from a file: a flat list is one video; anything else is no video
    assert views.video_frame_refs(rec_with(extra={"video_frames": ["a.png", "b.png"]})) == [["a.png", "b.png"]]
    for bad in ("a.png", 3, None, [], [1, 2], {"x": 1}):
        assert views.video_frame_refs(rec_with(extra={"video_frames": bad})) == []
    assert views.video_fps(rec_with(extra={"video_fps": 2}), 2) == [2.0, 2.0]
    for bad in (0, -1, float("nan"), float("inf"), True, "2"):
        assert views.video_fps(rec_with(extra={"video_fps": bad}), 1) == [None]


def test_thumbnails_shrink_large_frames_and_the_sheet_tiles_frames() -> None:
    import base64
    import io

    big = Image.new("RGB", (640, 360), (10, 200, 30))
    uri = views.thumbnail_uri(big)
    assert uri.startswith("data:image/jpeg;base64,")
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as thumb:
        assert thumb.size == (128, 72)  # longest side FRAME_THUMB_PX, aspect kept
    assert views.thumbnail_uri(Image.new("RGB", (56, 56))).startswith("data:image/png;base64,")  # never enlarged
    frames = [views.VideoFrame(0, i, None, Image.new("RGB", (56, 56), (0, 0, 255))) for i in range(5)]
    frames.append(views.VideoFrame(0, 5, None, None, "missing file"))
    sheet = views.frame_sheet(frames, columns=4, cell=96)
    assert sheet.size == (4 * 96, 2 * 96 + 14)  # 2 rows of 4 cells + the caption band
    assert sheet.getpixel((48, 30)) == (0, 0, 255) and sheet.getpixel((96 + 48, 96 + 30)) == (210, 210, 210)


def test_plan_html_shows_each_stage_reason_and_settings_escaped():
    plan = {"stages": [{"kind": "advantages", "name": "group", "reason": "algo.advantage: grpo",
                        "settings": {"algo.advantage_params.eps": 1e-6, "rewards[0]": "<script>x</script>"},
                        "sources": {"algo.advantage_params.eps": "preset"}}],
            "notes": ["algo.rollout_correction is set but inert <b>"]}
    html = views.plan_html(plan)
    assert "<b>advantages</b>" in html and "<code>group</code>" in html and "algo.advantage: grpo" in html
    assert "(preset)" in html and "(default)" in html and "<script>" not in html and "&lt;script&gt;" in html
    assert "note: algo.rollout_correction is set but inert &lt;b&gt;" in html
    assert "no plan.json" in views.plan_html(None) and "no plan.json" in views.plan_html({"stages": "x"})


def test_analysis_html_renders_tables_and_plots_escaped():
    from PIL import Image

    md = "# trajectory\n\nrank-1 <b>share</b>\n\n| tensor | ev |\n|---|---|\n| q_proj<script> | 0.99 |\n"
    html = views.analysis_html({"trajectory": (md, [Image.new("RGB", (40, 30), "red")])})
    assert "<h3>trajectory</h3>" in html and "<table class='mm-analysis'>" in html
    assert "q_proj&lt;script&gt;" in html and "<script>" not in html and "&lt;b&gt;share" in html
    assert html.count("<tr>") == 2 and "data:image/png;base64," in html
    assert "mmrlvr analyze" in views.analysis_html({})
