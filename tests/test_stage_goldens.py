"""The step pipeline reproduces, value for value, the trainer it replaced (issue 18), and keeps doing so.

Each case of ``tests/stage_goldens.py`` trains a config for a few fixed-seed steps and must give exactly
(``==``, not allclose) the metrics.jsonl values and rollout-record digests stored in
``tests/data/stage_goldens.json``. The file was first written by the pre-pipeline trainer; a commit that means
to change results rewrites it (``python tests/stage_goldens.py --write``) and says so.

Bit-exact floats follow the kernels a CPU picks, so the cases run in a child process on pinned kernels
(``mmrlvr.models.kernels``: ATen's baseline build, MKL's reproducible branch, no oneDNN, one thread), from warm
starts built on the same kernels, and a golden written on one x86-64 CPU is compared on any other. The child
reports its kernel settings; a run that is not pinned fails.
"""

from __future__ import annotations

import json

import pytest

from mmrlvr.models import kernels
from mmrlvr.models.kernels import LABEL, PINNED_STATE, check_pinned
from tests import stage_goldens
from tests.stage_goldens import CASES, GOLDEN, run_all, supports_pinned_goldens

REQUIRED = {"demo", "demo-tiny", "consistency-tiny", "credit-vepo-tiny", "grounding-tiny", "rubric-tiny"}


def test_goldens_cover_the_demo_and_every_tiny_config():
    from pathlib import Path

    tiny = {p.stem for p in (Path(__file__).parents[1] / "configs").glob("*-tiny.yaml")}
    names = {c[0] for c in CASES}
    assert tiny <= names and REQUIRED <= names
    assert all(steps == 20 for name, _, _, steps in CASES if name in REQUIRED)
    assert set(json.loads(GOLDEN.read_text())) == names


def test_every_golden_was_written_on_the_pinned_kernels():
    for case, value in json.loads(GOLDEN.read_text()).items():
        assert value.get("kernels") == LABEL, f"{case} was written on other kernels: {value.get('kernels')!r}"
        assert " | " in value["written_on"], case


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_step_pipeline_matches_golden(case, tmp_path):
    ok, why = supports_pinned_goldens()
    if not ok:
        pytest.skip(why)
    expected = json.loads(GOLDEN.read_text())[case]
    got = run_all(tmp_path, [case])[case]  # raises unless the child ran on the pinned kernels
    where = f"written on {expected['written_on']!r}, compared on {stage_goldens.cpu_signature()!r}"
    assert len(got["metrics"]) == len(expected["metrics"]), where
    for i, (g, e) in enumerate(zip(got["metrics"], expected["metrics"])):
        diff = {k: (g.get(k), e.get(k)) for k in set(g) | set(e) if g.get(k) != e.get(k)}
        assert not diff, f"{case}: metrics line {i + 1} differs (got, expected), {where}: {diff}"
    assert got["records"] == expected["records"], f"{case}: rollout records differ, {where}"


def test_an_unpinned_golden_run_is_an_error_not_a_pass():
    check_pinned(dict(PINNED_STATE))
    for key, value in [("capability", "AVX512"), ("mkl_cbwr", None), ("mkldnn", True), ("threads", 2)]:
        with pytest.raises(RuntimeError, match=key):
            check_pinned({**PINNED_STATE, key: value})


def test_the_child_process_really_runs_pinned(tmp_path):
    """The premise of the goldens: the child that trains runs pinned, and it is the environment that pins it."""
    import os
    import subprocess
    import sys

    import torch

    def child_state(env):
        out = tmp_path / "state.json"
        subprocess.run([sys.executable, str(stage_goldens.__file__), "--run", str(out)], cwd=GOLDEN.parents[2],
                       env=env, check=True, capture_output=True)  # no case named: reports its kernels only
        return json.loads(out.read_text())["_kernels"]

    assert child_state(kernels.pinned_env()) == PINNED_STATE
    native = torch.backends.cpu.get_cpu_capability()
    if native != "DEFAULT":  # on a CPU with SIMD kernels, an unpinned child picks them
        unpinned = {k: v for k, v in os.environ.items() if k not in kernels.PINNED_ENV}
        assert child_state(unpinned)["capability"] == native


def test_goldens_are_skipped_with_the_reason_off_x86(monkeypatch):
    import platform

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    ok, why = supports_pinned_goldens()
    assert not ok and "aarch64" in why


def test_an_unknown_case_is_named(tmp_path):
    with pytest.raises(ValueError, match="no-such-case"):
        run_all(tmp_path, ["no-such-case"])
