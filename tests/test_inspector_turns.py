"""The inspector's turn view of multi-turn trajectories, in a real headless Chromium at 1440×900.

A real two-step run with a tool (``rollout.tools: [zoom]`` on ``synth:zoom``; tests/forced_zoom_plugin.py makes the
first turn a zoom call) is opened like a user opens it: the turn view lists the model turns (trained) and the tool
turn (masked), the call with its arguments, the zoom box drawn on the source image next to the gold region with their
IoU, and the returned image; nothing scrolls sideways. The unit part checks the HTML for a failed call and a
one-turn record (no view).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from analysis_helpers import train_tiny_run
from test_inspector_screens import CHROMIUM, HEIGHT, WIDTH, assert_no_horizontal_overflow, browser, open_app, shot  # noqa: F401

RUN = ["max_steps=2", "rollout.tools=[zoom]", "plugins=[tests/forced_zoom_plugin.py]", "rollout.max_new_tokens=80",
       "rollout.max_turns=2", "data.train=synth:zoom", "data.eval=synth:zoom", "data.train_size=8",
       "rewards=[{name: format, weight: 0.2}, {name: auto_accuracy, weight: 1.0}, {name: zoom_iou, weight: 0.5}, "
       "{name: tool_call, weight: 0.1}]"]


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_run(tmp_path_factory.mktemp("tools") / "run", *RUN)


def test_turn_view_html_for_failed_calls_and_one_turn_records():
    from PIL import Image

    from mmrlvr.inspector.views import turns_html
    from mmrlvr.store.record import RolloutRecord

    turns = [{"kind": "model", "start": 0, "end": 5, "text": "<tool_call>{bad}</tool_call>", "calls": [], "images": []},
             {"kind": "tool", "start": 5, "end": 9, "text": "Error (malformed_call): not JSON",
              "calls": [{"name": "", "arguments": {}, "error": "malformed_call: the call is not valid JSON"}],
              "images": []},
             {"kind": "model", "start": 9, "end": 12, "text": "<answer>2</answer>", "calls": [], "images": []}]
    rec = RolloutRecord(run_id="r", step=0, prompt_id="p", sample_index=0, group_size=1, response_text="<answer>2</answer>",
                        response_token_ids=list(range(12)), extra={"turns": turns})
    html = turns_html(rec, [Image.new("RGB", (8, 8))], [])
    assert html.count('class="mm-turn mm-turn-model"') == 2 and html.count('class="mm-turn mm-turn-tool"') == 1
    assert "malformed_call" in html and "masked (no loss)" in html and "&lt;tool_call&gt;" in html
    assert turns_html(RolloutRecord(run_id="r", step=0, prompt_id="p", sample_index=0, group_size=1), [], []) == ""


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM}")
def test_turn_view_shows_calls_zoom_boxes_and_returned_images(browser: Any, tool_run: Path, tmp_path: Path) -> None:
    app, page = open_app(browser, tool_run)
    try:
        page.wait_for_selector("#mm-turns .mm-turn", timeout=60_000)
        view = page.locator("#mm-turns")
        text = view.inner_text()
        assert "turn 1 · model" in text and "masked (no loss)" in text and "zoom" in text
        assert "IoU with the gold region" in text and "returned image 1" in text
        imgs = page.locator("#mm-turns img")
        assert imgs.count() == 2  # the source with the zoom box and gold region, and the returned crop
        assert page.evaluate("() => [...document.querySelectorAll('#mm-turns img')]"
                             ".every(i => i.complete && i.naturalWidth > 0)"), "a turn image did not load"
        sizes = view.evaluate("el => [el.scrollWidth, el.clientWidth]")
        assert sizes[0] <= sizes[1], "the turn view scrolls sideways"
        font = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector('#mm-turns .mm-turn-model "
                             "div:last-child')).fontSize)")
        assert font >= 12  # readable
        assert_no_horizontal_overflow(page)
        shot(page, tmp_path, "browse_turns.png")
    finally:
        page.close()
        app.close()
