"""The docs and config comments say what the code does (issue 14, defect 8)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mmrlvr.algos.aggregation import AGG_MODES
from mmrlvr.algos.presets import PRESETS, loss_defaults_table_markdown, preset_table_markdown

ROOT = Path(__file__).resolve().parents[2]


def _block(text: str, name: str) -> str:
    m = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    assert m, f"docs/training.md has no generated block {name}"
    return m.group(1)


def test_training_doc_tables_are_generated_from_the_code():
    text = (ROOT / "docs" / "training.md").read_text()
    assert _block(text, "preset-table") == preset_table_markdown()
    assert _block(text, "loss-defaults-table") == loss_defaults_table_markdown()


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_config_comments_name_the_presets_aggregation(path):
    # e.g. "preset: grpo   # ..., token-mean" was wrong: the grpo preset applies seq-mean-token-mean
    for line in path.read_text().splitlines():
        m = re.match(r"\s*preset:\s*(\w+)\s*#(.*)", line)
        if not m or m.group(1) not in PRESETS:
            continue
        preset, comment = PRESETS[m.group(1)], m.group(2)
        named = [mode for mode in sorted(AGG_MODES, key=len, reverse=True) if mode in comment]
        if named:
            assert named[0] == preset["agg_mode"], (path.name, line)
        lp = preset["loss_params"]
        for low, high in re.findall(r"(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)", comment):
            assert (float(low), float(high)) == (lp["eps_low"], lp["eps_high"]), (path.name, line)
