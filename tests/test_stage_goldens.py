"""The step pipeline reproduces, value for value, the trainer it replaced (issue 18), and keeps doing so.

Each case of ``tests/stage_goldens.py`` trains a config for a few fixed-seed steps and must give exactly
(``==``, not allclose) the metrics.jsonl values and rollout-record digests stored in
``tests/data/stage_goldens.json``. The file was first written by the pre-pipeline trainer; a commit that means
to change results rewrites it (``python tests/stage_goldens.py --write``) and says so.

Bit-exact floats follow the kernels a CPU picks, so the cases run in a child process on pinned kernels
(``mmrlvr.models.kernels``: ATen's baseline build, MKL's reproducible branch, no oneDNN, one thread), from warm
starts built on the same kernels. The child reports its kernel settings; a run that is not pinned fails. Some
kinds of CPU still round differently on the pinned kernels, so each case keeps a variant per kind of machine
(``tests/machine_variants.py``): equal to one bit for bit, or to this machine's where it has one; on a machine
kind with none, alike up to rounding.
"""

from __future__ import annotations

import copy
import json
import warnings

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
    for case, entry in json.loads(GOLDEN.read_text()).items():
        assert entry["variants"], case
        machines = [v["written_on"] for v in entry["variants"]]
        assert len(set(machines)) == len(machines), f"{case}: two variants from one kind of machine: {machines}"
        for value in entry["variants"]:
            assert value.get("kernels") == LABEL, f"{case} was written on other kernels: {value.get('kernels')!r}"
            assert " | " in value["written_on"], case


def test_the_multi_turn_golden_covers_the_update_on_tool_turns():
    """Premise of the zoom-tiny case: its steps hold tool calls that ran and returned images, and groups that differ,
    so the update trains (a golden of zero-variance groups would pin the rollout and nothing of the update)."""
    for variant in json.loads(GOLDEN.read_text())["zoom-tiny"]["variants"]:
        steps = variant["metrics"]
        assert all(m["tools/calls"] > m["tools/malformed_call"] for m in steps)
        assert all(m["grad_norm"] > 0 and m["reward/std"] > 0 for m in steps)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_step_pipeline_matches_golden(case, tmp_path):
    ok, why = supports_pinned_goldens()
    if not ok:
        pytest.skip(why)
    got = run_all(tmp_path, [case])[case]  # raises unless the child ran on the pinned kernels
    # every metric this config logs declares how two processes combine it, and the declaration holds up: two
    # processes that each hold this batch combine to the doubled batch's values
    assert got.pop("metric_checks") == [], case
    verdict = stage_goldens.judge_case(case, got)
    assert verdict.ok, f"{case}: {verdict.message}"
    if verdict.how == "alike":  # passes, but says it was not compared bit for bit (shown by pytest -ra)
        warnings.warn(f"stage golden {case}: {verdict.message}; `python tests/stage_goldens.py --add-machine "
                      f"{case}` records this machine's variant", stacklevel=1)


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


def test_one_pinned_child_serves_the_cases_of_a_test_process_and_reports_its_failures(tmp_path):
    """The child run_all keeps up: pinned on every answer, the same process for the next case, an error that names
    what went wrong and leaves it serving, and a new child when it died."""
    server = stage_goldens._Server()
    try:
        first = server.run(tmp_path / "a.json", [])  # no case: the child reports its kernels only
        assert first == {"_kernels": PINNED_STATE}
        pid = server.proc.pid
        with pytest.raises(RuntimeError, match=r"failed:\n(.|\n)*No such file"):  # its traceback comes back
            server.run(tmp_path / "no-such-folder" / "b.json", [])
        assert server.run(tmp_path / "c.json", []) == first and server.proc.pid == pid
        server.proc.kill()
        server.proc.wait()
        with pytest.raises(RuntimeError, match="the child died"):
            server.run(tmp_path / "d.json", [])
    finally:
        server.close()
    previous, stage_goldens._SERVER = stage_goldens._SERVER, server  # this process's child, as if it had died
    fresh = stage_goldens._server()
    assert fresh is not server and fresh.alive() and stage_goldens._server() is fresh  # replaced once, then reused
    if previous is not None:
        previous.close()


def test_goldens_are_skipped_with_the_reason_off_x86(monkeypatch):
    import platform

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    ok, why = supports_pinned_goldens()
    assert not ok and "aarch64" in why


def test_an_unknown_case_is_named(tmp_path):
    with pytest.raises(ValueError, match="no-such-case"):
        run_all(tmp_path, ["no-such-case"])


def _variant(machine, reward=0.5, loss=0.1, shard_digest="a"):
    metrics = [{"step": i, "reward/mean": reward, "accuracy": reward, "loss": loss * i} for i in range(1, 4)]
    return {"metrics": metrics, "records": {f"step-{i}.parquet": shard_digest for i in range(1, 4)},
            "kernels": LABEL, "written_on": machine}


def _judge(got, variants, here="this | AVX512 | 1"):
    from tests.machine_variants import judge

    return judge(got, variants, here, differences=stage_goldens.differences, unlike=stage_goldens.unlike)


def test_a_result_equal_to_any_variant_passes_bit_for_bit():
    amd, intel = _variant("amd | AVX512"), _variant("intel | AVX512 | 1", loss=0.2)
    for got in (copy.deepcopy(amd), copy.deepcopy(intel)):
        assert _judge(got, [amd, intel]).how == "exact"
    assert _judge(_variant("x"), []).ok is False


def test_a_machine_with_its_own_variant_gets_no_rounding_allowance():
    """Alike is not enough where this kind of machine has a variant: a last-bit change there is a changed result."""
    mine = _variant("this | AVX512 | 1")
    got = copy.deepcopy(mine)
    got["metrics"][0]["loss"] += 1e-9
    verdict = _judge(got, [_variant("amd | AVX512"), mine])
    assert not verdict.ok and "metrics line 1" in verdict.message and "this kind of machine" in verdict.message


def test_on_a_machine_without_a_variant_rounding_passes_as_alike_and_changed_behaviour_fails():
    amd = _variant("amd | AVX512")
    rounded = copy.deepcopy(amd)
    rounded["metrics"][1]["loss"] *= 1.7  # optimiser diagnostics follow rounding: not compared
    rounded["metrics"][2]["reward/mean"] += 0.1  # a run-mean gap of 0.033 < 0.15
    rounded["records"] = {k: "other bits" for k in rounded["records"]}
    verdict = _judge(rounded, [amd])
    assert verdict.ok and verdict.how == "alike" and "not compared bit for bit" in verdict.message

    broken_reward = copy.deepcopy(amd)
    for row in broken_reward["metrics"]:
        row["accuracy"] = 0.0  # a reward that stopped scoring
    missing_metric = copy.deepcopy(amd)
    del missing_metric["metrics"][0]["reward/mean"], missing_metric["metrics"][1]["reward/mean"]
    del missing_metric["metrics"][2]["reward/mean"]
    fewer_steps = copy.deepcopy(amd)
    fewer_steps["metrics"].pop()
    fewer_steps["records"].pop("step-3.parquet")
    nan_loss = copy.deepcopy(amd)
    nan_loss["metrics"][2]["loss"] = "nan"
    for got, what in [(broken_reward, "accuracy: run mean"), (missing_metric, "only in the variant"),
                      (fewer_steps, "2 metrics lines"), (nan_loss, "non-finite")]:
        verdict = _judge(got, [amd])
        assert not verdict.ok and what in verdict.message, (what, verdict.message)


def test_add_machine_files_rounding_and_refuses_a_changed_result(tmp_path, monkeypatch):
    monkeypatch.setattr(stage_goldens, "GOLDEN", tmp_path / "goldens.json")
    monkeypatch.setattr(stage_goldens, "cpu_signature", lambda: "this | AVX512 | 1")
    amd = _variant("amd | AVX512")
    (tmp_path / "goldens.json").write_text(json.dumps({"case": {"variants": [amd]}}))
    same = {k: v for k, v in amd.items() if k in ("metrics", "records")}
    assert stage_goldens.file_results({"case": same}, add_machine=True) == []  # reproduced: nothing added
    rounded = copy.deepcopy(same)
    rounded["records"] = {k: "other bits" for k in rounded["records"]}
    assert stage_goldens.file_results({"case": rounded}, add_machine=True) == ["case"]
    stored = json.loads((tmp_path / "goldens.json").read_text())["case"]["variants"]
    assert [v["written_on"] for v in stored] == ["amd | AVX512", "this | AVX512 | 1"]
    changed = copy.deepcopy(same)
    for row in changed["metrics"]:
        row["reward/mean"] = 0.9
    with pytest.raises(SystemExit, match="--write"):
        stage_goldens.file_results({"case": changed}, add_machine=True)
    assert stage_goldens.file_results({"case": changed}) == ["case"]  # --write: a meant change replaces them all
    stored = json.loads((tmp_path / "goldens.json").read_text())["case"]["variants"]
    assert [v["written_on"] for v in stored] == ["this | AVX512 | 1"]
    (tmp_path / "goldens.json").write_text(json.dumps({"case": {"variants": [amd, _variant("this | AVX512 | 1",
                                                                                           reward=0.4)]}}))
    assert stage_goldens.file_results({"case": same}, add_machine=True) == ["case"]  # now reproduces amd's bits:
    stored = json.loads((tmp_path / "goldens.json").read_text())["case"]["variants"]  # this machine's stale one goes
    assert [v["written_on"] for v in stored] == ["amd | AVX512"]


def test_the_machine_signature_tells_cpu_feature_sets_apart(monkeypatch):
    import builtins
    import io

    from tests import machine_variants

    real_open = builtins.open

    def cpuinfo(flags):
        text = f"model name\t: Some CPU\nflags\t\t: {flags}\n"
        return lambda path, *a, **k: io.StringIO(text) if path == "/proc/cpuinfo" else real_open(path, *a, **k)

    signatures = []
    base = "fpu sse4_2 avx2 fma avx512f"
    for flags in (base, base + " amx_tile", base + " x"):
        monkeypatch.setattr(builtins, "open", cpuinfo(flags))
        signatures.append(machine_variants.machine_signature())
    assert signatures[0] != signatures[1] and signatures[0] == signatures[2]  # a flag no kernel looks at: same
    assert all(s.startswith("Some CPU | ") for s in signatures)


def test_the_golden_script_takes_its_modes_from_the_command_line(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(stage_goldens, "write", lambda names, add_machine: calls.append((names, add_machine)) or [])
    stage_goldens.main(["--add-machine", "demo", "zoom-tiny"])
    stage_goldens.main(["--write"])
    assert calls == [(["demo", "zoom-tiny"], True), (None, False)]
    for wrong in ([], ["--write", "--add-machine"]):  # one mode, always
        with pytest.raises(SystemExit):
            stage_goldens.main(wrong)
    with pytest.raises(SystemExit):
        stage_goldens.main(["--help"])
    assert "--add-machine" in capsys.readouterr().out
