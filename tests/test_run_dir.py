"""Run folders: never clobbered, one writer at a time, resumed only with an unchanged config, no secrets.

Unit tests of ``mmrlvr.train.run_dir`` on hand-made folders, then one short real run through the CLI: a
planted API key never reaches the run folder, a second start is refused, ``--resume`` continues without
duplicate steps and ``--overwrite`` starts afresh.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mmrlvr.config import load_config, redact_secrets
from mmrlvr.errors import ConfigErrors, UserError
from mmrlvr.train import run_dir as rd

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def cfg_for(out: Path, **more):
    return load_config(data={"output_dir": str(out), "model": {"path": "tiny:qwen2_5_vl"},
                             "data": {"train": "synth:count"}, **more})


def make_run(path: Path, cfg=None) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text((cfg or cfg_for(path)).to_yaml())
    (path / "metrics.jsonl").write_text('{"step": 1}\n')
    (path / "checkpoints").mkdir()
    return path


@pytest.fixture(autouse=True)
def _release_locks():
    yield
    for lock in list(rd._HELD.values()):
        lock.release()
    rd._HELD.clear()


def test_new_folder_is_created_locked_and_released(tmp_path):
    out = tmp_path / "runs" / "a"
    lock = rd.prepare_run_dir(cfg_for(out))
    info = json.loads((out / rd.LOCK_NAME).read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname() and info["started"]
    assert rd.prepare_run_dir(cfg_for(out)) is lock  # the trainer may call it again in the same process
    lock.release()
    assert not (out / rd.LOCK_NAME).exists()
    lock.release()  # twice is fine


def test_existing_run_is_refused_naming_both_ways_out(tmp_path):
    out = make_run(tmp_path / "run")
    with pytest.raises(ConfigErrors, match=r"already holds a run; add --resume .* or --overwrite"):
        rd.prepare_run_dir(cfg_for(out))
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_overwrite_renames_away_then_deletes(tmp_path, monkeypatch):
    out = make_run(tmp_path / "run")
    (out / "checkpoints" / "step-00000001").mkdir()
    renames = []
    real_rename = os.rename
    monkeypatch.setattr(rd.os, "rename", lambda a, b: (renames.append((Path(a), Path(b))), real_rename(a, b))[1])
    rd.prepare_run_dir(cfg_for(out), overwrite=True)
    assert renames and renames[0][0] == out and renames[0][1].name.startswith(".run.overwritten-")
    assert sorted(os.listdir(out)) == [rd.LOCK_NAME]  # a fresh folder: nothing of the old run is left
    assert not any(p.name.startswith(".run.overwritten-") for p in tmp_path.iterdir())


def test_overwrite_killed_mid_delete_leaves_no_half_run_and_is_cleaned_next_time(tmp_path, monkeypatch):
    out = make_run(tmp_path / "run")

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed)  # killed between the rename and the delete
    with pytest.raises(KeyboardInterrupt):
        rd.prepare_run_dir(cfg_for(out), overwrite=True)
    monkeypatch.undo()
    assert not out.exists()  # the old run is gone from its name in one step, not half-deleted
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run.overwritten-")]
    rd._HELD.clear()
    rd.prepare_run_dir(cfg_for(out))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.overwritten-")]


def test_a_folder_that_is_not_a_run_is_never_written_or_deleted(tmp_path):
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(ConfigErrors, match="not an mmrlvr run"):
            rd.prepare_run_dir(cfg_for(mine), overwrite=overwrite)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_output_dir_that_is_a_file(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x")
    assert "is a file" in rd.check_run_dir(cfg_for(f))[0]
    assert "is a file" in rd.check_run_dir(cfg_for(f / "sub"))[0]


def test_resume_refuses_changes_that_break_exactness(tmp_path):
    out = make_run(tmp_path / "run")
    changed = cfg_for(out, seed=3, optim={"lr": 1e-3}, max_steps=500)
    problems = rd.check_run_dir(changed, resume=True)
    assert len(problems) == 1
    assert "seed (0 -> 3)" in problems[0] and "optim.lr (0.0001 -> 0.001)" in problems[0]
    assert "max_steps" not in problems[0]  # constant lr: more steps continue the same run exactly
    assert "--allow-config-change" in problems[0]
    assert rd.check_run_dir(changed, resume=True, allow_config_change=True) == []
    # a cosine schedule spans max_steps: changing it moves every step's lr
    out2 = make_run(tmp_path / "run2", cfg_for(tmp_path / "run2", optim={"schedule": "cosine"}))
    longer = cfg_for(out2, optim={"schedule": "cosine"}, max_steps=500)
    assert "max_steps (100 -> 500)" in rd.check_run_dir(longer, resume=True)[0]
    # saving, evaluating and logging differently keeps the run exact
    same = cfg_for(out, save_every=5, eval={"k": 4}, progress=False, tensorboard=False)
    assert rd.check_run_dir(same, resume=True) == []


def test_config_changes_by_hand():
    old = {"seed": 0, "optim": {"lr": 1e-4, "schedule": "constant"}, "rewards": [{"name": "format", "weight": 0.2}],
           "eval": {"k": 8}, "rubric": {"judge_params": {}}}
    new = {"seed": 0, "optim": {"lr": 1e-4, "schedule": "constant"}, "rewards": [{"name": "format", "weight": 0.5}],
           "eval": {"k": 2}, "rubric": {"judge_params": {"timeout": 5}}}
    assert rd.config_changes(old, new) == ["rewards[0].weight"]


def _holder(run: Path) -> subprocess.Popen:
    code = (
        "import fcntl, json, os, socket, time\n"
        f"fd = os.open({str(run / rd.LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), 'started': 'T0'}).encode())\n"
        "print('locked', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_folder_in_use_is_refused_with_its_owner(tmp_path):
    out = make_run(tmp_path / "run")
    holder = _holder(out)
    try:
        with pytest.raises(ConfigErrors) as err:
            rd.prepare_run_dir(cfg_for(out), resume=True)
        assert f"in use by another run (pid {holder.pid} on host {socket.gethostname()} since T0" in str(err.value)
        with pytest.raises(UserError, match="in use by another run"):
            rd.acquire_lock(out)
    finally:
        holder.kill()
        holder.wait()
    # the holder died without cleaning up: its lock is stale and taken over
    assert json.loads((out / rd.LOCK_NAME).read_text())["pid"] == holder.pid
    lock = rd.prepare_run_dir(cfg_for(out), resume=True)
    assert lock.took_over["pid"] == holder.pid
    assert json.loads((out / rd.LOCK_NAME).read_text())["pid"] == os.getpid()


def test_stale_lock_file_of_a_dead_pid_is_taken_over(tmp_path, capsys):
    out = make_run(tmp_path / "run")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / rd.LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "T"}))
    lock = rd.prepare_run_dir(cfg_for(out), resume=True)
    assert lock.held and lock.took_over["pid"] == dead.pid
    assert "took over the stale lock" in capsys.readouterr().err


def test_lock_of_another_host_is_not_taken_silently(tmp_path):
    out = make_run(tmp_path / "run")
    (out / rd.LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "T"}))
    problem = rd.lock_problem(out)
    assert problem is not None and "host elsewhere" in problem and rd.LOCK_NAME in problem


def test_only_rank_zero_takes_the_lock(tmp_path, monkeypatch):
    out = make_run(tmp_path / "run")
    monkeypatch.setenv("RANK", "1")
    lock = rd.prepare_run_dir(cfg_for(out))  # rank 1 of a multi-process run: rank 0 decides
    assert not lock.held and not (out / rd.LOCK_NAME).exists()


def test_redaction_finds_secrets_anywhere():
    cfg = {"rubric": {"judge_params": {"api_key": "sk-A", "base_url": "https://u:pw@host/v1", "model": "m",
                                       "api_key_env": "OPENAI_API_KEY", "max_tokens": 256,
                                       "extra_body": {"headers": {"Authorization": "Bearer sk-B"}}}},
           "rewards": [{"name": "x", "params": {"hf_token": "hf_C", "password": "D", "client_secret": "E"}}]}
    text = json.dumps(redact_secrets(cfg))
    for secret in ("sk-A", "pw", "sk-B", "hf_C", '"D"', '"E"'):
        assert secret not in text
    kept = redact_secrets(cfg)["rubric"]["judge_params"]
    assert kept["api_key_env"] == "OPENAI_API_KEY" and kept["max_tokens"] == 256 and kept["model"] == "m"


PLANTED = "sk-PLANTED-7f3a9c"


def _train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", "train", *args], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=900)


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if '"step"' in line and "eval" not in json.loads(line).get("kind", "")]


def test_real_run_no_secret_refused_rerun_resume_overwrite(tmp_path):
    cfg = {
        "output_dir": str(tmp_path / "run"), "max_steps": 1, "save_every": 1, "progress": False,
        "model": {"path": "tiny:qwen2_5_vl"},
        "data": {"train": "synth:count", "train_size": 8},
        "rollout": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 8},
        "rubric": {"judge_params": {"api_key": PLANTED, "base_url": f"http://user:{PLANTED}@127.0.0.1:9/v1"}},
        "eval": {"at_start": False, "at_end": False},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    res = _train(str(path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    for f in run.rglob("*"):
        if f.is_file():
            assert PLANTED.encode() not in f.read_bytes(), f"secret written to {f}"
    assert "<redacted>" in (run / "config.yaml").read_text()
    assert not (run / rd.LOCK_NAME).exists()
    # a second start into the same folder is refused, the run untouched
    before = (run / "metrics.jsonl").read_text()
    res = _train(str(path), cwd=tmp_path)
    assert res.returncode == 2 and "--resume" in res.stderr and "--overwrite" in res.stderr
    assert "Traceback" not in res.stderr and (run / "metrics.jsonl").read_text() == before
    # --resume continues (flags after overrides), no duplicate step
    res = _train(str(path), "max_steps=2", "--resume", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    steps = _steps(run)
    assert len(steps) == len(set(steps)) and max(steps) == 2
    # --overwrite starts afresh (flags before overrides)
    res = _train("--overwrite", str(path), "seed=1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert max(_steps(run)) == 1 and yaml.safe_load((run / "config.yaml").read_text())["seed"] == 1
