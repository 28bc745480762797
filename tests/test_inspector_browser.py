"""A real headless Chromium drives the inspector: navigate to a sample, see boxes and heatmap, no XSS.

Needs Debian's /usr/bin/chromium (skipped without it; never `playwright install`). Saves screenshots to
tmp_path and, when MMRLVR_SCREENSHOT_DIR is set, there too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM}"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_shot(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    extra = os.environ.get("MMRLVR_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / name)
    return path


def test_browser_navigates_to_a_sample_with_boxes_and_heatmap(tmp_path: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from mmrlvr.inspector.app import build_app, launch
    from mmrlvr.testing.fake_run import make_fake_run

    run = make_fake_run(tmp_path / "run", steps=3, groups=4, group_size=4, include_hostile=True)
    app = build_app(run, refresh_s=3600)
    _, url, _ = launch(app, port=free_port(), prevent_thread_lock=True, quiet=True)
    dialogs: list[str] = []
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(url)
            page.wait_for_selector("#mm-group-cards .mm-card", timeout=60_000)
            assert page.locator("#mm-group-cards .mm-card").count() == 4

            # keyboard: "n" moves to the next group (p00001, a grounding prompt with boxes)
            page.keyboard.press("n")
            page.wait_for_function(
                "() => document.querySelector('#mm-group-cards code')?.textContent === 'p00001'", timeout=30_000)
            legend = page.locator("#mm-annotated").inner_text(timeout=30_000)
            assert "gt 1" in legend and "pred 1 IoU" in legend
            # the annotated image and the step slider both show an image
            page.wait_for_selector("#mm-annotated img", timeout=30_000)
            assert page.locator("#mm-slider img").count() >= 1
            # heatmap: every response token is a span with a colour
            heat = page.locator("#mm-heatmap")
            assert heat.locator("text=</answer>").count() >= 1 or "</answer>" in heat.inner_text()
            # "j" moves to the next sample of the group
            first = page.locator("#mm-group-cards .mm-card[style*='3px solid']").get_attribute("data-sample")
            page.keyboard.press("j")
            page.wait_for_function(
                f"() => document.querySelector(\"#mm-group-cards .mm-card[style*='3px solid']\")"
                f"?.getAttribute('data-sample') !== '{first}'", timeout=30_000)
            shot = save_shot(page, tmp_path, "inspector_sample.png")
            assert shot.stat().st_size > 10_000

            # the hostile response (step 0, p00000, sample 1) is shown as text and runs nothing
            page.locator("#mm-step input").fill("step 0")
            page.locator("#mm-step input").press("Enter")
            page.wait_for_function(
                "() => document.querySelector('#mm-group-cards .mm-group-head')?.textContent.includes('step 0')",
                timeout=30_000)
            # a step opens on its most informative group: go to the hostile one's group by name
            page.locator("#mm-group input").fill("p00000")
            page.locator("#mm-group input").press("Enter")
            page.wait_for_function(
                "() => document.querySelector('#mm-group-cards code')?.textContent === 'p00000'", timeout=30_000)
            page.locator("#mm-sample label").filter(has_text="#1 ").first.click()
            page.wait_for_function(
                "() => document.querySelector('#mm-thinking-answer .mm-thinking')?.textContent.includes('alert')",
                timeout=30_000)
            thinking = page.locator("#mm-thinking-answer .mm-thinking").inner_text()
            assert "<script>alert('x')</script>" in thinking and "<img src=x onerror=alert(1)>" in thinking
            assert "${7*7} {{7*7}}" in thinking and "**bold?**" in thinking
            assert page.locator("#mm-thinking-answer script, #mm-thinking-answer img").count() == 0
            save_shot(page, tmp_path, "inspector_hostile.png")

            # drill-down: selecting the right end of the reward/mean plot opens step 2 in Browse
            page.get_by_role("tab", name="Metrics").click()
            plot = page.locator("#mm-metric-0 canvas, #mm-metric-0 svg").first
            plot.wait_for(timeout=30_000)
            box = plot.bounding_box()
            y = box["y"] + box["height"] * 0.5
            page.mouse.move(box["x"] + box["width"] * 0.75, y)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] * 0.97, y, steps=8)
            page.mouse.up()
            page.wait_for_function(
                "() => document.querySelector('#mm-group-cards .mm-group-head')?.textContent.includes('step 2')",
                timeout=30_000)
            assert page.get_by_role("tab", name="Browse").get_attribute("aria-selected") == "true"
            browser.close()
    finally:
        app.close()
    assert dialogs == []  # no alert() ever ran


@contextlib.contextmanager
def _tab(run, name: str):
    """A headless Chromium page on the inspector of ``run``, with tab ``name`` opened."""
    playwright = pytest.importorskip("playwright.sync_api")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from mmrlvr.inspector.app import build_app, launch

    app = build_app(run, refresh_s=3600)
    _, url, _ = launch(app, port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.get_by_role("tab", name=name).click()
            yield page
            browser.close()
    finally:
        app.close()


def test_browser_shows_the_runs_plan(tmp_path: Path) -> None:
    from mmrlvr.config import load_config
    from mmrlvr.testing.fake_run import make_fake_run
    from mmrlvr.train.plan import build_plan

    run = make_fake_run(tmp_path / "run", steps=1, groups=2, group_size=2)
    root = Path(__file__).resolve().parents[1]
    plan = build_plan(load_config(root / "configs" / "demo-tiny.yaml", ["algo.rollout_correction=tis"]))
    (Path(run) / "plan.json").write_text(plan.to_json())
    with _tab(run, "Plan") as page:
        page.wait_for_selector("#mm-plan table.mm-plan", timeout=60_000)
        text = page.locator("#mm-plan").inner_text()
        for needle in ("advantages", "group", "algo.advantage: grpo", "algo.kl_coef = 0.05", "(user)",
                       "note: algo.rollout_correction is set but inert"):
            assert needle in text, needle
        assert page.locator("#mm-plan table.mm-plan tr").count() == 1 + 8  # header + one row per kind
        save_shot(page, tmp_path, "inspector_plan.png")


def test_browser_shows_the_runs_analyses(tmp_path: Path) -> None:
    from mmrlvr.analysis.report import markdown_table, write_report
    from mmrlvr.testing.fake_run import make_fake_run

    run = make_fake_run(tmp_path / "run", steps=1, groups=2, group_size=2)

    def plot():
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot([20, 40, 60], [0.2, 0.5, 0.9], marker="o")
        ax.set_title("c(t)")
        return fig

    table = markdown_table(["tensor", "explained var"], [["lm_head.weight<script>", 0.97]])
    write_report(run, "trajectory", {"ev": 0.97}, f"# Weight trajectory\n\n{table}\n", {"coefficients.png": plot})
    with _tab(run, "Analysis") as page:
        page.wait_for_selector("#mm-analysis table.mm-analysis", timeout=60_000)
        text = page.locator("#mm-analysis").inner_text()
        assert "trajectory" in text and "lm_head.weight<script>" in text and "0.97" in text
        assert page.locator("#mm-analysis img").count() == 1
        save_shot(page, tmp_path, "inspector_analysis.png")
