"""Stage order and stage names in docs, docstrings and ``--help-config`` match the code."""

from __future__ import annotations

import re
from pathlib import Path

import mmrlvr.train.stages  # noqa: F401 - registers the built-in stages
from mmrlvr.config import StagesConfig, describe
from mmrlvr.train.stages.base import STAGE_KINDS, STAGES

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = " -> ".join(STAGE_KINDS)


def builtin(kind: str) -> list[str]:
    """The stages the package registers (plug-ins other tests loaded are not documented here)."""
    return sorted(n for n in STAGES[kind].names() if STAGES[kind].get(n).__module__.startswith("mmrlvr."))


def test_the_code_runs_reference_before_credit():  # credit schemes read pi_old, which the reference kind recomputes
    assert STAGE_KINDS.index("reference") < STAGE_KINDS.index("credit")


def test_every_pipeline_line_in_docs_and_docstrings_is_the_code_order():
    files = [*ROOT.joinpath("docs").glob("*.md"), ROOT / "README.md", *ROOT.joinpath("mmrlvr").rglob("*.py")]
    found = 0
    for f in files:
        for ln in f.read_text(encoding="utf-8").splitlines():
            if re.search(r"generate\s*(->|→)\s*score", ln):
                found += 1
                line = re.sub(r"\s*(->|→)\s*", " -> ", ln.strip().strip("`"))
                assert PIPELINE in line, f"{f.relative_to(ROOT)}: {ln.strip()!r} is not {PIPELINE!r}"
    assert found >= 3


def _table_rows() -> dict[str, str]:
    text = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    table = text[text.index("<!-- stage-table:start -->"):text.index("<!-- stage-table:end -->")]
    rows = {}
    for ln in table.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].split()[0] in STAGE_KINDS:
            rows[cells[0].split()[0]] = cells[1]
    return rows


def test_the_docs_stage_table_lists_exactly_the_registered_stages_in_code_order():
    rows = _table_rows()
    assert list(rows) == list(STAGE_KINDS)
    for kind, cell in rows.items():
        # the stage names are the backticked words that are not config keys or values
        named = {w for w in re.findall(r"`([a-z_]+)`", cell) if w in STAGES[kind] or not any(
            w in STAGES[k] for k in STAGE_KINDS)}
        registered = set(builtin(kind))
        assert registered <= named, f"{kind}: the docs miss {sorted(registered - named)}"
        unknown = {w for w in re.findall(r"`([a-z_]+)` \(", cell)} - registered
        assert not unknown, f"{kind}: the docs name stages that are not registered: {sorted(unknown)}"


def test_help_config_names_the_registered_stages_in_code_order():
    fields = list(StagesConfig.__dataclass_fields__)
    assert fields == list(STAGE_KINDS)
    lines = {ln.split(" = ")[0]: ln for ln in describe() if ln.startswith("stages.")}
    for kind in STAGE_KINDS:
        listed = re.search(r"\(([^()]*)\)\s*$", lines[f"stages.{kind}"]).group(1)
        assert sorted(n.strip() for n in listed.split(",")) == builtin(kind), kind
