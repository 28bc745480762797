"""The multi-process matrix (marker ``matrix``; CI runs it after the suite, ``.ci/run``): every shipped tiny
config and the demo's own config on 2 ranks under torchrun, DDP and FSDP2, and one short variant per
registered option (``tests/matrix_cases.py``) on 2 DDP ranks, 2 steps each. Every 2-rank run must finish and
state world size 2 (``topology.json``) with the strategy asked for, and — prefix sharing off on both sides —
train what one process trains within 1e-5; an option that refuses several processes must exit 2 at
validation naming itself.

    python -m pytest -q -n 0 -m matrix tests/test_multiprocess_matrix.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from matrix_cases import cases
from multiproc import assert_trains_like, final_params, run, torchrun_cmd

pytestmark = pytest.mark.matrix
ROOT = Path(__file__).resolve().parents[1]
DRIVER = str(ROOT / "tests" / "scripts" / "matrix_driver.py")
CASES = cases()
RUNS = [c for c in CASES if c.expect != "refused"]


@pytest.fixture(scope="module")
def model_dir() -> str:
    from mmrlvr.train.model_path import resolve_model_path

    return str(resolve_model_path("tiny:qwen2_5_vl:warm"))  # built once (cached) if this machine has none yet


def _run_model(run_dir: Path) -> str:
    """The model the run trained (each tiny config names its own warm start)."""
    import yaml

    from mmrlvr.train.model_path import resolve_model_path

    return str(resolve_model_path(yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["path"]))


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, model_dir) -> Path:
    """Every side of the matrix, run once: 1 process, 2 DDP ranks, 2 FSDP2 ranks."""
    out = tmp_path_factory.mktemp("matrix")
    sides = [
        ([sys.executable, DRIVER, str(out / "one"), "ddp"], [c.name for c in RUNS if c.expect == "equal"]),
        (torchrun_cmd(DRIVER, str(out / "two"), "ddp"), [c.name for c in RUNS]),
        (torchrun_cmd(DRIVER, str(out / "two"), "fsdp2"), [c.name for c in RUNS if "fsdp2" in c.strategies]),
    ]
    for cmd, names in sides:
        res = run(cmd + names, timeout=3000)
        assert res.returncode == 0, f"{' '.join(cmd[:6])}: {res.stderr[-6000:]}"
    return out


def _case_dirs(out: Path, case, strategy: str) -> tuple[Path, Path]:
    return out / "one" / f"{case.name}-ddp", out / "two" / f"{case.name}-{strategy}"


@pytest.mark.parametrize("case", RUNS, ids=[c.name for c in RUNS])
def test_two_ranks_finish_and_train_what_one_process_trains(case, matrix):
    for strategy in case.strategies:
        one, two = _case_dirs(matrix, case, strategy)
        topo = json.loads((two / "topology.json").read_text())
        assert (topo["world_size"], topo["strategy"]) == (2, strategy), topo
        rows = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
        if case.expect == "equal":
            model = _run_model(two)
            assert_trains_like(final_params(one, model), final_params(two, model))


REFUSED = [c for c in CASES if c.expect == "refused"]


@pytest.mark.parametrize("case", REFUSED, ids=[c.name for c in REFUSED])
def test_an_option_refused_on_several_processes_exits_2_at_validation_naming_it(case, tmp_path):
    res = run(torchrun_cmd("-m", "mmrlvr.cli", "train", *case.argv(tmp_path, "ddp")), timeout=600)
    assert res.returncode != 0
    option = case.why.split(": runs on one process only")[0]
    assert f"{option}: runs on one process only" in res.stderr, res.stderr[-3000:]
    assert "exitcode  : 2" in res.stderr  # each rank: a user error, not a crash
    assert "Loading weights" not in res.stderr  # before any model loaded


def test_the_matrix_covers_every_registered_option():
    from matrix_cases import options

    names = {c.name for c in CASES}
    covered = {(k, n) for k, n in options() if f"{k}-{n}" in names}
    # an option a shipped config runs as it stands is that config's case
    by_config = {c.config for c in CASES if c.name.startswith("config-")}
    from matrix_cases import OWN_MATRIX_TEST, _config_for, _option

    for kind, name in options():
        if (kind, name) in OWN_MATRIX_TEST:  # its own matrix-marked test (named there) runs it on 2 ranks
            test = OWN_MATRIX_TEST[(kind, name)].split(" ")[0]
            path, func = test.split("::")
            assert f"def {func}(" in (ROOT / path).read_text()
            continue
        if (kind, name) not in covered:
            assert kind == "reward" and _config_for(kind, name) in by_config, (kind, name, _option(kind, name))
