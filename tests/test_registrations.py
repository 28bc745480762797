"""Run-time registrations stay in their test file (tests/registrations.py, applied by tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from mmrlvr.algos.advantages import ADVANTAGES
from mmrlvr.plugins import _LOADED, load_plugins, plugin_module_name
from mmrlvr.train.stages.base import STAGES
from tests.registrations import Snapshot

EXAMPLE = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "median_advantage.py")


def test_a_plugin_loaded_after_a_snapshot_is_unregistered_and_loads_again():
    assert "group_median" not in ADVANTAGES  # the premise: this file starts without it (conftest's snapshot)
    snapshot = Snapshot()
    load_plugins([EXAMPLE])
    assert "group_median" in ADVANTAGES and plugin_module_name(EXAMPLE) in sys.modules and EXAMPLE in _LOADED
    added = snapshot.restore()
    assert "advantage estimator: group_median" in added
    assert "group_median" not in ADVANTAGES and plugin_module_name(EXAMPLE) not in sys.modules
    assert EXAMPLE not in _LOADED
    load_plugins([EXAMPLE])  # imported again, so it registers again (a plug-in still in sys.modules would not)
    assert "group_median" in ADVANTAGES
    snapshot.restore()


def test_registries_held_in_a_dict_are_restored_too():
    from mmrlvr.train.stages.base import Stage

    snapshot = Snapshot()

    class Probe(Stage):
        def __call__(self, batch, ctx):  # pragma: no cover - registered, never run
            return batch

    STAGES["shape"].add("registrations_probe", Probe)
    assert "registrations_probe" in STAGES["shape"]
    assert snapshot.restore() == ["shape stage: registrations_probe"]
    assert "registrations_probe" not in STAGES["shape"]


def test_the_next_test_file_does_not_see_what_the_last_one_registered(tmp_path):
    """The premise of the conftest fixture, end to end: two files in one process, the first loads a plug-in; the
    second sees the built-ins with the fixture, and the plug-in without it (so the check can fail)."""
    import subprocess

    (tmp_path / "test_a_loads.py").write_text(
        "from mmrlvr.plugins import load_plugins\n"
        f"def test_load():\n    load_plugins([{EXAMPLE!r}])\n")
    (tmp_path / "test_b_looks.py").write_text(
        "from mmrlvr.algos.advantages import ADVANTAGES\n"
        "def test_look():\n    assert 'group_median' not in ADVANTAGES\n")
    root = Path(__file__).resolve().parents[1]

    def run(*plugin):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", "/dev/null", "--rootdir", str(tmp_path),
                               "-p", "no:cacheprovider", *plugin, str(tmp_path / "test_a_loads.py"),
                               str(tmp_path / "test_b_looks.py")], cwd=root, capture_output=True, text=True)

    with_fixture, without = run("-p", "tests.conftest"), run()
    assert with_fixture.returncode == 0 and "2 passed" in with_fixture.stdout, with_fixture.stdout[-2000:]
    assert without.returncode == 1 and "1 failed, 1 passed" in without.stdout, without.stdout[-2000:]
