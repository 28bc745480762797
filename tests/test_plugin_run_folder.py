"""Plug-ins travel with the run: copied into RUN_DIR/plugins/ with a manifest, reloaded from there by eval,
export and --resume from any folder, and a plug-in changed since the run is refused on --resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from mmrlvr import plugins as P
from mmrlvr.plugins import (changed_run_plugins, file_sha256, load_run_plugins, read_manifest, resolve_run_plugins,
                            save_run_plugins)
from mmrlvr.train.run_dir import check_run_dir

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = '''import os
from pathlib import Path

log = os.environ.get("PLUGIN_TEST_LOG")
if log:
    with open(log, "a") as fh:
        fh.write("ran\\n")
VALUE = {value}
'''


@pytest.fixture
def stem():
    """A plug-in name of this test only; its module and the loader's maps are forgotten afterwards."""
    name = f"ptest_{uuid.uuid4().hex[:8]}"
    yield name
    sys.modules.pop(P.plugin_module_name(f"{name}.py"), None)
    for table in (P._FALLBACK, P._LOADED):
        for spec in [s for s in table if Path(s).stem == name]:
            table.pop(spec)


def _write(path: Path, value: float = 0.5) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PLUGIN.format(value=value))
    return path


class _Cfg:
    """The little of a RunConfig that check_run_dir reads."""

    def __init__(self, run_dir: Path, plugins: list[str]):
        self.output_dir, self.plugins = str(run_dir), plugins

    def to_dict(self, redact: bool = True) -> dict:
        return {"output_dir": self.output_dir, "plugins": self.plugins}


def _make_run(run_dir: Path, cfg: _Cfg) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))


# ------------------------------------------------------------------------------------------- unit tests
def test_copy_and_manifest_record_files_and_modules(tmp_path, monkeypatch, stem):
    a = tmp_path / "A"
    _write(a / "plug" / f"{stem}.py")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / f"{stem}_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.chdir(a)
    run = a / "run"
    spec, mod = f"plug/{stem}.py", f"{stem}_mod"
    manifest = save_run_plugins(run, [spec, mod])
    assert manifest == read_manifest(run)
    assert manifest["started_from"] == str(a)
    f, m = manifest["plugins"]
    src = (a / spec).resolve()
    assert f == {"spec": spec, "kind": "file", "module": f"mmrlvr_plugin_{stem}", "source": str(src),
                 "copy": f"plugins/{stem}.py", "sha256": file_sha256(src)}
    assert (run / f["copy"]).read_bytes() == src.read_bytes()
    lib = (tmp_path / "lib" / f"{stem}_mod.py").resolve()
    assert m == {"spec": mod, "kind": "module", "module": mod, "file": str(lib), "sha256": file_sha256(lib)}
    assert not (run / "plugins" / f"{stem}_mod.py").exists()  # modules are recorded, never copied
    assert not [p for p in (run / "plugins").iterdir() if ".tmp-" in p.name]  # atomic writes left no temp file
    sys.modules.pop(mod, None)


def test_two_files_with_one_stem_get_two_copies(tmp_path, monkeypatch, stem):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "x" / f"{stem}.py", 1.0)
    _write(tmp_path / "y" / f"{stem}.py", 2.0)
    manifest = save_run_plugins(tmp_path / "run", [f"x/{stem}.py", f"y/{stem}.py"])
    copies = [e["copy"] for e in manifest["plugins"]]
    assert copies == [f"plugins/{stem}.py", f"plugins/{stem}_2.py"]
    assert "VALUE = 2.0" in (tmp_path / "run" / copies[1]).read_text()


def test_resolution_order_typed_then_start_folder_then_copy(tmp_path, monkeypatch, stem):
    a, b = tmp_path / "A", tmp_path / "B"
    b.mkdir()
    _write(a / f"{stem}.py")
    spec = f"{stem}.py"
    monkeypatch.chdir(a)
    save_run_plugins(a / "run", [spec])
    (r,) = resolve_run_plugins(a / "run", [spec])
    assert (r.origin, r.changed) == ("typed", False)
    monkeypatch.chdir(b)  # the typed relative path does not exist here: taken relative to where the run started
    (r,) = resolve_run_plugins(a / "run", [spec])
    assert r.origin == "started_from" and r.path == a / spec and not r.changed
    _write(a / spec, 0.25)  # changed since the run: noticed
    (r,) = changed_run_plugins(a / "run", [spec])
    assert r.recorded_sha != r.current_sha and r.copy == a / "run" / "plugins" / spec
    (a / spec).unlink()  # gone: the run folder's copy
    (r,) = resolve_run_plugins(a / "run", [spec])
    assert r.origin == "copy" and r.path == a / "run" / "plugins" / spec and not r.changed
    assert changed_run_plugins(a / "run", [spec]) == []


def test_module_name_is_the_same_from_the_copy_and_it_runs_once(tmp_path, monkeypatch, stem):
    log = tmp_path / "ran.log"
    monkeypatch.setenv("PLUGIN_TEST_LOG", str(log))
    a, b = tmp_path / "A", tmp_path / "B"
    b.mkdir()
    _write(a / "p" / f"{stem}.py")
    spec = f"p/{stem}.py"
    monkeypatch.chdir(a)
    P.load_plugins([spec])
    save_run_plugins(a / "run", [spec])
    (a / spec).unlink()
    monkeypatch.chdir(b)
    notes = load_run_plugins(a / "run", [spec], quiet=True)  # from the copy: same module, not run again
    assert len(notes) == 1 and "copy" in notes[0]
    assert log.read_text() == "ran\n"
    assert sys.modules[f"mmrlvr_plugin_{stem}"].VALUE == 0.5
    P.load_plugins([spec])  # what the trainer and the checks call afterwards finds it too
    assert log.read_text() == "ran\n"


def test_a_fresh_process_loads_the_copy_under_the_typed_name(tmp_path, monkeypatch, stem):
    a, b = tmp_path / "A", tmp_path / "B"
    b.mkdir()
    _write(a / f"{stem}.py", 0.75)
    monkeypatch.chdir(a)
    save_run_plugins(a / "run", [f"{stem}.py"])
    (a / f"{stem}.py").unlink()
    monkeypatch.chdir(b)
    load_run_plugins(a / "run", [f"{stem}.py"], quiet=True)
    mod = sys.modules[f"mmrlvr_plugin_{stem}"]
    assert mod.VALUE == 0.75 and Path(mod.__file__) == a / "run" / "plugins" / f"{stem}.py"


def test_resume_refuses_a_changed_plugin_unless_allowed(tmp_path, monkeypatch, stem):
    monkeypatch.chdir(tmp_path)
    spec = f"{stem}.py"
    _write(tmp_path / spec)
    run = tmp_path / "run"
    cfg = _Cfg(run, [spec])
    _make_run(run, cfg)
    save_run_plugins(run, [spec])
    assert check_run_dir(cfg, resume=True) == []
    old = file_sha256(tmp_path / spec)
    _write(tmp_path / spec, 0.25)
    (problem,) = check_run_dir(cfg, resume=True, where="c.yaml")
    assert problem.startswith("c.yaml: plugins[0]: --resume with a changed plug-in")
    assert spec in problem and old[:12] in problem and file_sha256(tmp_path / spec)[:12] in problem
    assert "--allow-config-change" in problem and "\n" not in problem
    assert check_run_dir(cfg, resume=True, allow_config_change=True) == []
    notes = load_run_plugins(run, [spec], resume=True, quiet=True)  # what the trainer says then
    assert len(notes) == 1 and "changed" in notes[0] and "continues with the current file" in notes[0]
    save_run_plugins(run, [spec], resume=True)  # the run's start then records the file it continues with
    assert read_manifest(run)["plugins"][0]["sha256"] == file_sha256(tmp_path / spec)
    assert check_run_dir(cfg, resume=True) == []
    (tmp_path / spec).unlink()  # gone: no problem, the copy is loaded (with a note)
    assert check_run_dir(cfg, resume=True) == []


def test_a_run_without_manifest_still_loads_as_before(tmp_path, monkeypatch, stem):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / f"{stem}.py")
    assert load_run_plugins(tmp_path / "no-run", [f"{stem}.py"], quiet=True) == []
    assert save_run_plugins(tmp_path / "plain", []) is None and not (tmp_path / "plain").exists()
    from mmrlvr.errors import UserError

    with pytest.raises(UserError, match="no_such.py: no such file"):
        load_run_plugins(tmp_path / "no-run", ["no_such.py"], quiet=True)


# ------------------------------------------------------------------------------------------ end to end
REWARD_PLUGIN = '''from mmrlvr.rewards.base import REWARDS
from mmrlvr.types import RewardResult


class ConstHalf:
    def __init__(self, **_):
        pass

    def __call__(self, completion, sample):
        return RewardResult({value}, {{"const_half": {value}}})


if "const_half" not in REWARDS:
    REWARDS.add("const_half", ConstHalf)
'''
QUICK = ["max_steps=2", "save_every=1", "eval.every=0", "eval.at_start=false", "eval.at_end=false",
         "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "data.train_size=8",
         "data.eval_size=4", "eval.limit=2", "eval.k=1", "progress=false", "log_rollouts=false",
         "tensorboard=false"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PLUGIN_TEST_LOG", None)
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def test_eval_export_and_resume_from_another_folder(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    b.mkdir()
    plug = a / "plug" / "const_half.py"
    plug.parent.mkdir(parents=True)
    plug.write_text(REWARD_PLUGIN.format(value=0.5))
    run = a / "run"
    res = _cli("train", str(ROOT / "configs" / "demo-tiny.yaml"), f"output_dir={run}", *QUICK,
               "plugins=[plug/const_half.py]", "rewards=[{name: const_half, weight: 1.0}]", cwd=a)
    assert res.returncode == 0, res.stderr
    manifest = json.loads((run / "plugins" / "manifest.json").read_text())
    (entry,) = manifest["plugins"]
    assert entry["spec"] == "plug/const_half.py" and entry["sha256"] == file_sha256(plug)
    assert (run / entry["copy"]).read_text() == plug.read_text()
    assert yaml.safe_load((run / "config.yaml").read_text())["plugins"] == ["plug/const_half.py"]

    # from B, where plug/const_half.py does not exist
    ckpt = run / "checkpoints" / "step-00000002"
    res = _cli("eval", str(ckpt), "--no-progress", "--out", str(b / "eval.json"), cwd=b)
    assert res.returncode == 0, res.stderr
    assert json.loads((b / "eval.json").read_text())["n"] == 2
    res = _cli("export", str(run), "--out", str(b / "export"), cwd=b)
    assert res.returncode == 0, res.stderr
    assert (b / "export" / "config.json").is_file()
    res = _cli("train", str(run / "config.yaml"), "--resume", "max_steps=3", cwd=b)  # found where the run started
    assert res.returncode == 0, res.stderr
    assert (run / "checkpoints" / "step-00000003").is_dir()

    # gone everywhere but the run folder: the copy, with a note
    plug.rename(a / "const_half.py.away")
    res = _cli("train", str(run / "config.yaml"), "--resume", "max_steps=4", cwd=b)
    assert res.returncode == 0, res.stderr
    assert "note: plugins: plug/const_half.py is not found here" in res.stderr
    assert (run / "checkpoints" / "step-00000004").is_dir()

    # changed since the run: refused on resume, one line naming the plug-in and the flag
    plug.write_text(REWARD_PLUGIN.format(value=0.25))
    res = _cli("train", str(run / "config.yaml"), "--resume", "max_steps=5", cwd=b)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    (line,) = [ln for ln in res.stderr.splitlines() if "plugins[0]" in ln]
    assert "plug/const_half.py" in line and entry["sha256"][:12] in line and "--allow-config-change" in line
    assert not (run / "checkpoints" / "step-00000005").exists()
    res = _cli("train", str(run / "config.yaml"), "--resume", "max_steps=5", "--allow-config-change", cwd=b)
    assert res.returncode == 0, res.stderr
    assert "continues with the current file" in res.stderr
    (entry,) = json.loads((run / "plugins" / "manifest.json").read_text())["plugins"]
    assert entry["sha256"] == file_sha256(plug) and "0.25" in (run / entry["copy"]).read_text()
