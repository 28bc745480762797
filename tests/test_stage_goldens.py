"""The step pipeline reproduces, value for value, the trainer it replaced (issue 18), and keeps doing so.

Each case of ``tests/stage_goldens.py`` trains a config for a few fixed-seed steps and must give exactly
(``==``, not allclose) the metrics.jsonl values and rollout-record digests stored in
``tests/data/stage_goldens.json``. The file was first written by the pre-pipeline trainer; a commit that means
to change results rewrites it (``python tests/stage_goldens.py --write``) and says so.

Bit-exact values hold only on the kind of CPU that wrote them (``cpu_signature``). A case written with its
CPU recorded is compared on that CPU and skipped, with the reason, on another; cases from before the
signature was recorded (no ``cpu`` key) are compared everywhere, as they always were.
"""

from __future__ import annotations

import json

import pytest

from tests.stage_goldens import CASES, GOLDEN, cpu_signature, run_all

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
    if expected.get("cpu", cpu_signature()) != cpu_signature():
        pytest.skip(f"{case}: written on {expected['cpu']!r}, this CPU is {cpu_signature()!r}; bit-exact values "
                    f"do not carry across CPUs (re-record here: python tests/stage_goldens.py --write {case})")
    got = run_all(tmp_path, [case])[case]
    assert len(got["metrics"]) == len(expected["metrics"])
    for i, (g, e) in enumerate(zip(got["metrics"], expected["metrics"])):
        diff = {k: (g.get(k), e.get(k)) for k in set(g) | set(e) if g.get(k) != e.get(k)}
        assert not diff, f"{case}: metrics line {i + 1} differs (got, expected): {diff}"
    assert got["records"] == expected["records"], f"{case}: rollout records differ"


def test_cpu_signature_names_the_cpu_and_the_recorded_ones_are_signatures():
    sig = cpu_signature()
    model, capability = sig.split(" | ")
    assert model and capability
    assert all(isinstance(c["cpu"], str) and " | " in c["cpu"]
               for c in json.loads(GOLDEN.read_text()).values() if "cpu" in c)


def test_a_golden_written_on_another_cpu_is_skipped_with_the_reason(monkeypatch):
    import sys

    recorded = {c: v["cpu"] for c, v in json.loads(GOLDEN.read_text()).items() if "cpu" in v}
    assert recorded, "no golden carries its CPU"
    case = sorted(recorded)[0]
    monkeypatch.setattr(sys.modules[__name__], "cpu_signature", lambda: "Some Other CPU | AVX2")
    with pytest.raises(pytest.skip.Exception, match="Some Other CPU.*--write " + case):
        test_step_pipeline_matches_golden(case, None)  # skipped before it trains (tmp_path unused)
