"""Screens of the inspector in a real headless Chromium at 1440×900: layout facts for every view.

Each view is opened as a user opens it and checked for what made it read poorly before: no horizontal
scrolling, the token heatmap's height bounded (it used to run ~2,300 px down the page), a colour legend
beside it, a token's values shown on click, the reason the opened group was chosen, a reward table with
weights, proper empty states (no rollouts yet; a filter with no match), and a prompt that never recurs
saying so, and a video prompt's frame strip (every frame shown, wrapped inside a box of bounded height).
Screenshots go to tmp_path (and to $MMRLVR_SCREENSHOT_DIR when set, to look at them).

Needs Debian's /usr/bin/chromium (skipped without it; never `playwright install`).
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import Any, Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM}"),
]
WIDTH, HEIGHT = 1440, 900
HEATMAP_MAX_PX = 330  # the heatmap box is capped at 260 px + legend; far below the old ~2,300 px
NO_OVERFLOW_JS = "() => document.documentElement.scrollWidth - window.innerWidth"
CARDS = "#mm-group-cards .mm-card"
VIDEO_FRAMES = 16  # more than fit in one row of the left column: the strip must wrap, then scroll inside itself


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    extra = os.environ.get("MMRLVR_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / name)
    return path


def assert_no_horizontal_overflow(page: Any) -> None:
    assert page.evaluate(NO_OVERFLOW_JS) <= 0, "the page scrolls sideways at 1440 px"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"])
        try:
            yield b
        finally:
            b.close()


def open_app(browser: Any, run: Path, refresh_s: float = 3600) -> tuple[Any, Any]:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from mmrlvr.inspector.app import build_app, launch

    app = build_app(run, refresh_s=refresh_s)
    _, url, _ = launch(app, port=free_port(), prevent_thread_lock=True, quiet=True)
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    page.goto(url)
    return app, page


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmrlvr.testing.fake_run import make_fake_run

    run = make_fake_run(tmp_path_factory.mktemp("screens") / "run", steps=3, groups=4, group_size=4,
                        filler_sentences=(8, 20), include_hostile=True)
    # a prompt seen at one step only: its history and compare views must say so
    from mmrlvr.store import RolloutReader, RolloutWriter

    once = [r for r in RolloutReader(run).read_step(2) if r.prompt_id == "p00003"]
    for r in once:
        r.prompt_id, r.step = "p-once", 3
    with RolloutWriter(run, "run") as w:
        w.write_step(3, once)
    # the run's reward weights, as a training run's config.yaml records them
    (run / "config.yaml").write_text("rewards:\n  - {name: format, weight: 0.2}\n  - {name: accuracy, weight: 1.0}\n"
                                     "  - {name: iou, weight: 1.0}\n  - {name: consistency, weight: 0.5}\n")
    return run


def test_browse_view_fits_and_reads_at_a_glance(browser: Any, fake_run: Path, tmp_path: Path) -> None:
    app, page = open_app(browser, fake_run)
    try:
        page.wait_for_selector(CARDS, timeout=60_000)
        page.locator("#mm-step input").fill("step 2")
        page.locator("#mm-step input").press("Enter")
        page.wait_for_function("() => document.querySelector('#mm-group-cards .mm-why')", timeout=60_000)
        # opened on the most informative group, and says why
        why = page.locator("#mm-group-cards .mm-why").inner_text()
        assert "most informative" in why and "spread" in why
        # reward breakdown: weight, raw, weighted contribution, total
        reward = page.locator("#mm-reward").inner_text()
        assert "weight × raw" in reward and "total" in reward
        # heatmap: a legend, wrapped text, bounded height
        legend = page.locator("#mm-heatmap .mm-legend")
        assert legend.count() == 1 and legend.is_visible()
        box = page.locator("#mm-heatmap .mm-heatmap").bounding_box()
        assert box is not None and box["height"] <= HEATMAP_MAX_PX and box["width"] <= WIDTH
        assert_no_horizontal_overflow(page)
        # a token's values appear on click, in the view (the ::after pop-up shows its data-v)
        token = page.locator("#mm-heatmap .mm-tok").nth(3)
        token.click()
        popup = token.evaluate("el => getComputedStyle(el, '::after').content")
        assert "entropy" in popup and "token 3" in popup
        shot(page, tmp_path, "browse_count.png")

        # a grounding group: boxes as outlines with labels, the step in the image's label
        page.locator("#mm-group input").fill("p00001")
        page.locator("#mm-group input").press("Enter")
        page.wait_for_function(
            "() => document.querySelector('#mm-group-cards code')?.textContent === 'p00001'", timeout=60_000)
        page.wait_for_selector("#mm-annotated img", timeout=60_000)
        label = page.locator("#mm-annotated").inner_text()
        assert "step 2" in label and "gt 1" in label and "pred 1 IoU" in label and "outlines" in label
        assert "Compare step 2 with step" in page.locator("#mm-compare").inner_text()
        # the signal toggle recolours the heatmap; the legend names the new signal
        page.locator("#mm-signal label").filter(has_text="Δlog-prob").first.click()
        page.wait_for_function(
            "() => document.querySelector('#mm-heatmap .mm-legend b')?.textContent === 'Δlog-prob'", timeout=60_000)
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "browse_grounding.png")

        # a prompt that occurs at one step only: the compare view says so
        page.locator("#mm-step input").fill("step 3")
        page.locator("#mm-step input").press("Enter")
        page.wait_for_function(
            "() => document.querySelector('#mm-group-cards code')?.textContent === 'p-once'", timeout=60_000)
        assert "occurs only at step 3" in page.locator("#mm-compare").inner_text()
        page.get_by_role("button", name="Across steps").click()
        page.wait_for_function("() => document.body.innerText.includes('occurs only at step 3')", timeout=60_000)
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "history_once.png")
    finally:
        page.close()
        app.close()


def open_group(page: Any, prompt_id: str) -> None:
    page.locator("#mm-group input").fill(prompt_id)
    page.locator("#mm-group input").press("Enter")
    page.wait_for_function(
        f"() => document.querySelector('#mm-group-cards code')?.textContent === '{prompt_id}'", timeout=60_000)


def test_video_frame_strip_fits_beside_the_rollout(browser: Any, tmp_path: Path) -> None:
    from mmrlvr.inspector.views import FRAME_STRIP_MAX_PX
    from mmrlvr.testing.fake_run import make_fake_run

    run = make_fake_run(tmp_path / "video", steps=2, groups=2, group_size=2, video_groups=1,
                        video_frames=VIDEO_FRAMES)
    app, page = open_app(browser, run)
    try:
        page.wait_for_selector(CARDS, timeout=60_000)
        open_group(page, "v00000")
        page.wait_for_selector("#mm-frames .mm-frame img", timeout=60_000)
        strip = page.locator("#mm-frames .mm-frames")
        assert f"video: {VIDEO_FRAMES} frames" in page.locator("#mm-frames .mm-frames-label").inner_text()
        imgs = page.locator("#mm-frames .mm-frame img")
        assert imgs.count() == VIDEO_FRAMES
        assert page.evaluate("() => [...document.querySelectorAll('#mm-frames .mm-frame img')]"
                             ".every(i => i.complete && i.naturalWidth > 0)"), "a frame thumbnail did not load"
        captions = page.locator("#mm-frames figcaption").all_inner_texts()
        assert captions[:3] == ["#0 · 0.0 s", "#1 · 0.5 s", "#2 · 1.0 s"] and len(captions) == VIDEO_FRAMES
        # beside the rollout: left of the thinking pane, in the viewport's width, of bounded height
        box, ta = strip.bounding_box(), page.locator("#mm-thinking-answer").bounding_box()
        assert box is not None and ta is not None
        assert box["x"] + box["width"] <= ta["x"] and box["height"] <= FRAME_STRIP_MAX_PX + 2
        sizes = strip.evaluate("el => [el.scrollWidth, el.clientWidth, el.scrollHeight, el.clientHeight]")
        assert sizes[0] <= sizes[1], "the strip scrolls sideways"
        assert sizes[2] > sizes[3], f"{VIDEO_FRAMES} frames should wrap past the box's height and scroll inside it"
        # the thumbnails wrap into rows rather than one long line
        tops = {round(b["y"]) for b in (imgs.nth(i).bounding_box() for i in range(VIDEO_FRAMES)) if b}
        assert len(tops) >= 3
        assert not page.locator("#mm-annotated").is_visible()  # no prompt image: the strip stands in its place
        page.wait_for_selector("#mm-slider img", timeout=60_000)  # the compare slider shows the frame sheet
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "browse_video.png")

        # an image row looks as before: no strip, the annotated image is back
        open_group(page, "p00001")
        page.wait_for_selector("#mm-annotated img", timeout=60_000)
        assert not page.locator("#mm-frames").is_visible()
        assert page.locator("#mm-frames .mm-frame").count() == 0
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "browse_after_video.png")
    finally:
        page.close()
        app.close()


def test_filter_and_metrics_views_fit(browser: Any, fake_run: Path, tmp_path: Path) -> None:
    app, page = open_app(browser, fake_run)
    try:
        page.wait_for_selector(CARDS, timeout=60_000)
        page.get_by_role("tab", name="Filter").click()
        page.locator("#mm-run-filter").first.click()
        page.wait_for_function("() => document.querySelector('#mm-count')?.innerText.includes('rollouts match')",
                               timeout=60_000)
        table = page.locator("#mm-results").inner_text()
        assert "response" in table and "think" in table  # the response text is in the results
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "filter.png")
        page.locator("#mm-reward-lo input, #mm-reward-lo textarea").first.fill("99")
        page.locator("#mm-run-filter").first.click()
        page.wait_for_function("() => document.querySelector('#mm-count')?.innerText.includes('0 rollouts match')",
                               timeout=60_000)
        assert "widen" in page.locator("#mm-count").inner_text()
        assert "prompt" in page.locator("#mm-results").inner_text()  # an empty table keeps its headers
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "filter_empty.png")
        page.get_by_role("tab", name="Metrics").click()
        page.locator("#mm-metric-0").wait_for(timeout=60_000)
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "metrics.png")
    finally:
        page.close()
        app.close()


def test_empty_run_then_live_refresh(browser: Any, tmp_path: Path) -> None:
    """A run with no rollouts yet shows one explanation; its first step appears without a restart."""
    from mmrlvr.store import RolloutReader, RolloutWriter
    from mmrlvr.testing.fake_run import make_fake_run

    source = make_fake_run(tmp_path / "source", steps=1, groups=2, group_size=2)
    run = tmp_path / "live"
    (run / "rollouts").mkdir(parents=True)
    app, page = open_app(browser, run, refresh_s=1)
    try:
        page.wait_for_selector("#mm-group-cards .mm-empty", timeout=60_000)
        assert "No rollouts yet" in page.locator("#mm-group-cards").inner_text()
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "empty.png")
        shutil.copytree(source / "images", run / "images")
        with RolloutWriter(run, "source") as w:  # the records keep their run id
            w.write_step(0, RolloutReader(source).read_step(0))
        page.wait_for_selector(CARDS, timeout=60_000)  # the timer picked the step up
        assert "step 0" in page.locator("#mm-group-cards .mm-group-head").inner_text()
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "live.png")
    finally:
        page.close()
        app.close()
