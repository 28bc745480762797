"""The step pipeline reproduces, value for value, the trainer it replaced (issue 18), and keeps doing so.

Each case of ``tests/stage_goldens.py`` trains a config for a few fixed-seed steps and must give exactly
(``==``, not allclose) the metrics.jsonl values and rollout-record digests stored in
``tests/data/stage_goldens.json``. The file was first written by the pre-pipeline trainer; a commit that means
to change results rewrites it (``python tests/stage_goldens.py --write``) and says so.
"""

from __future__ import annotations

import json

import pytest

from tests.stage_goldens import CASES, GOLDEN, run_all

REQUIRED = {"demo", "demo-tiny", "consistency-tiny", "credit-vepo-tiny", "grounding-tiny", "rubric-tiny"}


def test_goldens_cover_the_demo_and_every_tiny_config():
    from pathlib import Path

    tiny = {p.stem for p in (Path(__file__).parents[1] / "configs").glob("*-tiny.yaml")}
    names = {c[0] for c in CASES}
    assert tiny <= names and REQUIRED <= names
    assert all(steps == 20 for name, _, _, steps in CASES if name in REQUIRED)
    assert set(json.loads(GOLDEN.read_text())) == names


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_step_pipeline_matches_golden(case, tmp_path):
    expected = json.loads(GOLDEN.read_text())[case]
    got = run_all(tmp_path, [case])[case]
    assert len(got["metrics"]) == len(expected["metrics"])
    for i, (g, e) in enumerate(zip(got["metrics"], expected["metrics"])):
        diff = {k: (g.get(k), e.get(k)) for k in set(g) | set(e) if g.get(k) != e.get(k)}
        assert not diff, f"{case}: metrics line {i + 1} differs (got, expected): {diff}"
    assert got["records"] == expected["records"], f"{case}: rollout records differ"
