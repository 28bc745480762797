"""Several processes (issue 25): launches that would run silent copies are refused, the topology is stated,
and FSDP2 (torch's ``fully_shard``) on 2 gloo ranks shards every parameter and trains like 1 process."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from multiproc import (assert_same_params, assert_trains_like, final_params, free_port, run, topology, torchrun_cmd,
                       train_cli)  # tests/ is on sys.path under pytest

from mmrlvr.errors import UserError
from mmrlvr.train import distributed as D

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------- launch checks
def test_accelerate_request_reads_flags_and_config_file(tmp_path):
    assert D.accelerate_request(["/v/bin/python", "/v/bin/accelerate", "launch", "--num_processes", "2", "--cpu",
                                 "-m", "mmrlvr.cli", "train", "c.yaml"]) == {"processes": 2, "machines": 1}
    assert D.accelerate_request(["accelerate", "launch", "--cpu", "--num_machines=2", "--machine_rank", "1",
                                 "x.py"]) == {"processes": 1, "machines": 2}
    cfg = tmp_path / "acc.yaml"
    cfg.write_text("distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nuse_cpu: true\n")
    assert D.accelerate_request(["accelerate", "launch", "--config_file", str(cfg), "t.py"]) == \
        {"processes": 4, "machines": 2}
    # a flag beats the file, as in accelerate
    assert D.accelerate_request(["accelerate", "launch", "--config_file", str(cfg), "--num_processes", "3",
                                 "t.py"])["processes"] == 3
    assert D.accelerate_request(["python", "-m", "mmrlvr.cli", "train", "c.yaml"]) is None
    assert D.accelerate_request([]) is None


@pytest.mark.parametrize("env, parent, expected", [
    ({"WORLD_SIZE": "2"}, [], 2),
    ({"WORLD_SIZE": "1"}, [], 1),
    ({}, [], 1),
    ({"SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"}, [], 8),  # srun -n 8 mmrlvr train ... (8 copies)
    ({"SLURM_NTASKS": "8"}, [], 1),  # sbatch's batch step: not inside srun
    ({"SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "WORLD_SIZE": "4"}, [], 4),  # srun + torchrun per node
    ({}, ["accelerate", "launch", "--num_processes", "2", "--cpu", "x.py"], 2),
    ({}, ["accelerate", "launch", "--num_processes", "1", "x.py"], 1),
    ({}, ["bash", "-c", "launch --num_processes 2"], 1),
])
def test_expected_world_size(env, parent, expected):
    assert D.expected_world_size(env, parent)[0] == expected


def test_a_lone_process_of_a_multi_process_launch_stops_with_the_launch_that_works():
    with pytest.raises(UserError) as exc:
        D.check_launch(1, {}, ["/v/bin/python", "/v/bin/accelerate", "launch", "--num_processes", "2", "--cpu",
                                "-m", "mmrlvr.cli", "train", "c.yaml"])
    msg = str(exc.value)
    assert "2-process run" in msg and "runs alone" in msg and "torchrun --nproc_per_node" in msg
    with pytest.raises(UserError, match="2-process run"):  # the multi-node recipe that ran 2 unrelated copies
        D.check_launch(1, {}, ["accelerate", "launch", "--cpu", "--num_machines", "2", "--machine_rank", "0",
                               "--main_process_ip", "127.0.0.1", "x.py"])
    with pytest.raises(UserError, match="WORLD_SIZE=2"):
        D.check_launch(1, {"WORLD_SIZE": "2"}, [])
    with pytest.raises(UserError, match="asked for 4 processes"):
        D.check_launch(2, {"WORLD_SIZE": "4"}, [])
    # what works: alone and asked to be alone; 2 of 2
    D.check_launch(1, {}, ["python", "-m", "mmrlvr.cli", "train", "c.yaml"])
    D.check_launch(1, {"WORLD_SIZE": "1"}, [])
    D.check_launch(2, {"WORLD_SIZE": "2"}, [])


def test_trains_like_allows_adams_rounding_flips_and_nothing_more():
    torch.manual_seed(0)
    one = {"w": torch.randn(256, 128), "b": torch.randn(64)}
    assert_trains_like(one, {n: t.clone() for n, t in one.items()})
    flipped = {n: t.clone() for n, t in one.items()}
    flipped["w"][3, 7] += 4e-5  # one element stepped on a rounding-noise gradient (seen: 3.8e-5)
    flipped["b"][0] -= 4e-5
    assert_trains_like(one, flipped)
    for bad in ({"w": one["w"] + 2e-5 * torch.randn_like(one["w"]).sign(), "b": one["b"]},  # every element apart
                {"w": one["w"].index_put((torch.tensor([0]), torch.tensor([0])), torch.tensor(5.0)), "b": one["b"]},
                {"w": one["w"], "b": one["b"] + torch.tensor([3e-5, 3e-5] + [0.0] * 62)}):  # two of 64
        with pytest.raises(AssertionError, match="elements differ"):
            assert_trains_like(one, bad)


def test_strategy_names():
    assert D.check_strategy("ddp") == [] and D.check_strategy("fsdp2") == []
    assert "known: ddp, fsdp2" in D.check_strategy("fsdp")[0]


def test_topology_of_one_process_is_written_and_logged(tmp_path, capsys):
    topo = D.gather_topology(1, 0, "ddp", 4, env={})
    assert (topo.world_size, topo.num_nodes, topo.procs_per_node, topo.prompts_per_rank) == (1, 1, [1], [4])
    metrics = D.announce(topo, tmp_path, is_main=True)
    assert metrics == {"dist/world_size": 1.0, "dist/nodes": 1.0, "dist/procs_per_node": 1.0,
                       "dist/prompts_per_rank": 4.0, "dist/fsdp2": 0.0}
    assert "world size 1 (1 node(s) x 1 process(es)), strategy ddp" in capsys.readouterr().err  # a log line, on stderr
    saved = D.read_topology(tmp_path)
    assert saved["world_size"] == 1 and saved["hosts"] == [socket.gethostname()]
    D.announce(topo, tmp_path / "other", is_main=False)
    assert not (tmp_path / "other").exists()  # only rank 0 writes


def _cfg(model: str, out: Path, **extra) -> Path:
    import yaml

    from test_train_loop import small_config

    path = out.parent / f"{out.name}.yaml"
    # whole-row passes on both sides of these comparisons (the runs with prefix sharing on are compared in
    # test_two_ranks_keep_prefix_sharing_and_equal_one_process)
    extra.setdefault("model__prefix_sharing", False)
    path.write_text(yaml.safe_dump(small_config(model, out, **extra)))
    return path


def test_accelerate_cpu_launch_of_two_processes_stops_instead_of_training_a_copy(tiny_dir, tmp_path):
    """The issue's command: `accelerate launch --num_processes 2 --cpu` starts one lone process (accelerate
    1.16). `mmrlvr train` must say so and exit 2 (a user error, no traceback) before training a step."""
    cfg = _cfg(tiny_dir, tmp_path / "run", log_rollouts=False)
    res = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                          "-m", "mmrlvr.cli", "train", str(cfg)],
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert res.returncode != 0 and "Loading weights" not in res.stderr  # stopped before the model loaded
    assert "2-process run" in res.stderr and "runs alone" in res.stderr, res.stderr[-3000:]
    assert "returned non-zero exit status 2" in res.stderr  # accelerate reports our exit 2 (a user error)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# --------------------------------------------------------------------------------------------- FSDP2
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def torchrun(*args: str) -> subprocess.CompletedProcess:
    return run(torchrun_cmd(*args))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_fsdp2_two_ranks_hold_half_of_each_tensor_and_train_like_one_process(tiny_dir, tmp_path, mode):
    script = str(ROOT / "tests" / "scripts" / "fsdp2_step.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, script, tiny_dir, str(tmp_path / "one"), mode], check=True, env=env,
                   capture_output=True, timeout=600)
    res = torchrun(script, tiny_dir, str(tmp_path / "two"), mode, "save")
    assert res.returncode == 0, res.stderr[-4000:]
    info = json.loads((tmp_path / "two" / "shards.json").read_text())
    assert info["world"] == 2
    shards = info["shards"]
    from mmrlvr.models import load_policy

    plain, _ = load_policy(tiny_dir, dtype="float32", device="cpu")
    names = {n.split("base_model.model.")[-1].replace(".base_layer", "") for n in shards}
    assert {n for n, _ in plain.named_parameters()} <= names  # every weight is a DTensor
    for n, s in shards.items():
        rows = s["shape"][0]
        assert s["local"][0] == (rows + 1) // 2, (n, s)  # dim-0 shard: half of it (rank 0's ceil half)
        assert s["local"][1:] == s["shape"][1:]
    a = torch.load(tmp_path / "one" / "params.pt")
    b = torch.load(tmp_path / "two" / "params.pt")
    assert a.keys() == b.keys() and a
    if mode == "lora":
        assert all("lora_" in n for n in a)
    assert_trains_like(a, b)
    one = json.loads((tmp_path / "one" / "shards.json").read_text())
    assert one["norms"][0] > 0.25  # the clip (max norm 0.25) engaged
    assert info["norms"] == pytest.approx(one["norms"], rel=1e-5)

    # the sharded checkpoint: each rank wrote its shard; one process reads it back whole; export consolidates
    from mmrlvr.train.checkpoint import list_checkpoints, load_trainable_into, read_state, verify_checkpoint, weights_kind

    ckpt = list_checkpoints(tmp_path / "two" / "run")[-1]
    assert weights_kind(ckpt) == "dcp" and verify_checkpoint(ckpt) is None
    assert sorted(p.name for p in (ckpt / "sharded").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    manifest = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert {"sharded/__0_0.distcp", "sharded/__1_0.distcp", "sharded/.metadata",
            "training_state/random_states_1.pkl"} <= set(manifest)
    assert read_state(ckpt)["world_size"] == 2 and read_state(ckpt)["weights"] == "dcp"
    model, _ = load_policy(tiny_dir, dtype="float32", device="cpu")
    model = load_trainable_into(model, ckpt)
    params = dict(model.named_parameters())
    for n in b:
        assert torch.equal(params[n].detach(), b[n]), n
    out = tmp_path / "export"
    res = subprocess.run([sys.executable, "-m", "mmrlvr.cli", "export", str(tmp_path / "two" / "run"), "--out", str(out),
                          "--merge"], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    exported, _ = load_policy(str(out), dtype="float32", device="cpu")  # a plain save_pretrained folder
    merged = model.merge_and_unload() if mode == "lora" else model
    from mmrlvr.analysis.checkpoints import checkpoint_weights  # the analyses read the sharded checkpoint too

    analysed = checkpoint_weights(ckpt)
    for n, p in merged.named_parameters():
        torch.testing.assert_close(analysed[n], p.detach().float(), rtol=0, atol=1e-6, msg=n)
    got = dict(exported.named_parameters())
    assert got.keys() == dict(merged.named_parameters()).keys()
    for n, p in merged.named_parameters():
        torch.testing.assert_close(got[n], p.detach(), rtol=0, atol=1e-6, msg=n)
    before = dict(plain.named_parameters())
    assert any(not torch.equal(got[n], before[n]) for n in got)  # trained weights, not the base


def test_fsdp2_refuses_without_a_process_group():
    with pytest.raises(UserError, match="needs a process group"):
        D.shard_model(torch.nn.Linear(2, 2))


# ------------------------------------------------------------------------------ the trainer, several ranks
STEPS2 = dict(max_steps=2, log_rollouts=False, algo__micro_batch_size=4)


@pytest.fixture(scope="module")
def one_process(tiny_dir, tmp_path_factory):
    """1-process reference runs (full fine-tuning and LoRA), trained once for the tests below."""
    out: dict[str, dict[str, torch.Tensor]] = {}

    def get(lora: bool) -> dict[str, torch.Tensor]:
        key = "lora" if lora else "full"
        if key not in out:
            base = tmp_path_factory.mktemp(f"one_{key}")
            cfg = _cfg(tiny_dir, base / "run", **STEPS2, **_lora(lora))
            res = run([sys.executable, *train_cli(cfg)])
            assert res.returncode == 0, res.stderr[-4000:]
            out[key] = final_params(base / "run", tiny_dir)
        return out[key]

    return get


def _lora(on: bool) -> dict:
    return {"model__lora__enabled": on, "model__lora__r": 4, "model__lora__alpha": 8}


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_fsdp2_training_run_on_two_ranks_equals_one_process(tiny_dir, tmp_path, one_process, lora):
    if "save_distributed" not in _trainer_save_source():
        pytest.skip("Trainer.save does not call checkpoint.save_distributed yet (sharded runs cannot save)")
    cfg = _cfg(tiny_dir, tmp_path / "run", **STEPS2, **_lora(lora), distributed__strategy="fsdp2")
    res = run(torchrun_cmd(*train_cli(cfg)))
    assert res.returncode == 0, res.stderr[-4000:]
    topo = topology(tmp_path / "run")
    assert (topo["world_size"], topo["strategy"]) == (2, "fsdp2")
    assert_trains_like(one_process(lora), final_params(tmp_path / "run", tiny_dir))


def _trainer_save_source() -> str:
    import inspect

    from mmrlvr.train.trainer import Trainer

    return inspect.getsource(Trainer.save)


@pytest.mark.slow
def test_two_nodes_of_one_process_over_loopback_equal_one_process(tiny_dir, tmp_path, one_process):
    """docs/scaling.md's multi-node recipe, 2 nodes x 1 process on 127.0.0.1."""
    cfg = _cfg(tiny_dir, tmp_path / "run", **STEPS2)
    port = free_port()
    procs = [subprocess.Popen(torchrun_cmd(*train_cli(cfg), nproc=1, nnodes=2, node_rank=r, port=port),
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_o, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    topo = topology(tmp_path / "run")
    assert (topo["world_size"], topo["num_nodes"], topo["procs_per_node"]) == (2, 2, [1, 1]), topo
    rows = [r for r in (json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]  # one run, not two copies writing one folder
    assert_trains_like(one_process(False), final_params(tmp_path / "run", tiny_dir))


@pytest.mark.slow
def test_accelerate_launch_with_a_config_file_starts_two_processes(tiny_dir, tmp_path, one_process):
    acc = tmp_path / "accelerate_cpu2.yaml"
    # docs/scaling.md's file: MULTI_GPU even on CPU (accelerate 1.16 starts several processes only through its
    # multi-GPU launcher; MULTI_CPU or use_cpu: true start one, which the run refuses)
    doc = (ROOT / "docs" / "scaling.md").read_text()
    text = re.search(r"```yaml\n(compute_environment.*?)```", doc, re.S).group(1)
    acc.write_text(text.replace("main_process_port: 29500", f"main_process_port: {free_port()}"))
    cfg = _cfg(tiny_dir, tmp_path / "run", **STEPS2)
    res = run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(acc), *train_cli(cfg)])
    assert res.returncode == 0, res.stderr[-4000:]
    assert topology(tmp_path / "run")["world_size"] == 2
    assert_trains_like(one_process(False), final_params(tmp_path / "run", tiny_dir))


@pytest.mark.slow
def test_kill_9_of_a_two_rank_fsdp2_run_resumes_exactly(tiny_dir, tmp_path):
    if "save_distributed" not in _trainer_save_source():
        pytest.skip("Trainer.save does not call checkpoint.save_distributed yet (sharded runs cannot save)")
    import signal
    import time

    base = dict(max_steps=4, save_every=2, log_rollouts=False, algo__micro_batch_size=4,
                distributed__strategy="fsdp2")
    straight = _cfg(tiny_dir, tmp_path / "a", **base)
    killed = _cfg(tiny_dir, tmp_path / "b", **base)
    res = run(torchrun_cmd(*train_cli(straight)))
    assert res.returncode == 0, res.stderr[-4000:]
    proc = subprocess.Popen(torchrun_cmd(*train_cli(killed)), env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    first = tmp_path / "b" / "checkpoints" / "step-00000002" / "manifest.json"
    deadline = time.time() + 600
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, at once
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    done = sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("step-*"))
    assert done and done[-1] < "step-00000004"
    res = run(torchrun_cmd(*train_cli(killed, "--resume")))
    assert res.returncode == 0, res.stderr[-4000:]
    assert_same_params(final_params(tmp_path / "a", tiny_dir), final_params(tmp_path / "b", tiny_dir), atol=1e-6)
    steps = [r["step"] for r in (json.loads(ln) for ln in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines())
             if "loss" in r]
    assert steps == [1, 2, 3, 4]
    # the 2-rank checkpoint of step 2 resumes in ONE process (DCP reshards weights and AdamW state)
    import shutil

    from mmrlvr.train.checkpoint import read_state

    one = tmp_path / "c"
    shutil.copytree(tmp_path / "b", one, ignore=shutil.ignore_patterns(".mmrlvr.lock", "step-00000004"))
    assert read_state(one / "checkpoints" / "step-00000002")["world_size"] == 2
    cfg_one = _cfg(tiny_dir, one, **base)
    res = run([sys.executable, *train_cli(cfg_one, "--resume")])
    assert res.returncode == 0, res.stderr[-4000:]
    assert "saved by 2 process(es) and resumes on 1" in res.stderr
    assert_trains_like(final_params(one, tiny_dir), final_params(tmp_path / "a", tiny_dir))


# ------------------------------------------------------------------------------------ paper memory table
def _scaling_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_scaling", ROOT / "benchmarks" / "scaling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_paper_memory_table():
    """docs/scaling.md's computed figures: parameter counts of the published configs, and the per-GPU bytes
    from the stated assumptions (bf16 weights/grads, float32 Adam moments, a bf16 frozen reference)."""
    mod = _scaling_module()
    totals = {k: mod.paper_params(m)["total"] / 1e9 for k, m in mod.PAPER_MODELS.items()}
    # the model cards: 3.75 B, 8.29 B, 33.5 B parameters
    assert totals["3B"] == pytest.approx(3.75, abs=0.01) and totals["7B"] == pytest.approx(8.29, abs=0.01)
    assert totals["32B"] == pytest.approx(33.45, abs=0.06)
    p = mod.paper_params(mod.PAPER_MODELS["7B"])
    trainable = p["total"] - p["vision"]
    ddp = mod.paper_memory("7B", 1, "ddp", lora=False, ckpt=True, vllm=False)
    gib = 2 ** 30
    assert ddp["weights"] == pytest.approx(2 * p["total"] / gib)
    assert ddp["grads"] == pytest.approx(2 * trainable / gib) and ddp["adam"] == pytest.approx(8 * trainable / gib)
    assert ddp["ref"] == pytest.approx(2 * p["total"] / gib)
    assert ddp["activations"] == pytest.approx((28 * 2 + 34) * 8192 * 3584 / gib)  # 28 layers kept + 1 recomputed
    fsdp = mod.paper_memory("7B", 8, "fsdp2", lora=False, ckpt=True, vllm=False)
    for part in ("weights", "grads", "adam", "ref"):
        assert fsdp[part] == pytest.approx(ddp[part] / 8)
    kv = mod.paper_memory("7B", 8, "fsdp2", lora=False, ckpt=True, vllm=True)["vllm"] * gib
    assert kv == pytest.approx(2 * p["total"] + 131072 * 2 * 28 * 4 * 128 * 2)  # K and V, 28 layers, 4 KV heads
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--paper"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and "| 7B | full | fsdp2 | 8 | yes | yes | 41 | yes | yes |" in res.stdout
    doc = (ROOT / "docs" / "scaling.md").read_text()
    assert "| 7B | full | 104 GiB (141 GB only) | 18 GiB | 127 GiB (141 GB only) | 41 GiB |" in doc


# ------------------------------------------------------------------------------- what the launcher asked for
_ACCELERATE_FSDP = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 2
num_machines: 1
machine_rank: 0
main_process_port: {port}
mixed_precision: 'no'
gpu_ids: all
fsdp_config:
  fsdp_version: {version}
"""


def test_honour_launcher_maps_an_accelerate_fsdp2_request_and_refuses_fsdp1():
    from types import SimpleNamespace

    cfg = SimpleNamespace(distributed=SimpleNamespace(strategy="ddp"))
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "OTHER": "x"}
    assert "fsdp2" in D.honour_launcher(cfg, env)
    assert cfg.distributed.strategy == "fsdp2" and env == {"OTHER": "x"}  # accelerate builds no plugin of its own
    assert D.honour_launcher(cfg, {}) is None  # no FSDP request: nothing to do
    with pytest.raises(UserError, match="distributed.strategy.*FSDP version 1"):
        D.honour_launcher(cfg, {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"})


@pytest.mark.matrix  # run beside the multi-process matrix, after the suite (.ci/run)
def test_an_accelerate_fsdp_config_trains_with_fsdp2_and_equals_one_process(tiny_dir, tmp_path, one_process):
    acc = tmp_path / "accelerate_fsdp.yaml"
    acc.write_text(_ACCELERATE_FSDP.format(port=free_port(), version=2))
    cfg = _cfg(tiny_dir, tmp_path / "run", **STEPS2)  # distributed.strategy left at ddp
    res = run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(acc), *train_cli(cfg)])
    assert res.returncode == 0, res.stderr[-4000:]
    topo = topology(tmp_path / "run")
    assert (topo["world_size"], topo["strategy"]) == (2, "fsdp2"), topo  # not a silent DDP
    assert "distributed.strategy: ddp -> fsdp2" in res.stderr
    assert_trains_like(one_process(False), final_params(tmp_path / "run", tiny_dir))


@pytest.mark.matrix  # run beside the multi-process matrix, after the suite (.ci/run)
def test_an_accelerate_fsdp1_config_exits_2_naming_the_key(tiny_dir, tmp_path):
    acc = tmp_path / "accelerate_fsdp1.yaml"
    acc.write_text(_ACCELERATE_FSDP.format(port=free_port(), version=1))
    cfg = _cfg(tiny_dir, tmp_path / "run", **STEPS2)
    res = run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(acc), *train_cli(cfg)])
    assert res.returncode != 0
    assert re.search(r"rank [01] of 2 failed", res.stderr) and "distributed.strategy" in res.stderr, res.stderr[-3000:]
    assert "exitcode  : 2" in res.stderr  # each rank's own status: a user error
    assert "Loading weights" not in res.stderr  # refused before any model loaded


@pytest.mark.matrix  # two 2-process runs and their 1-process twins (~4 min on 2 cores)
@pytest.mark.parametrize("strategy, lora", [("ddp", False), ("fsdp2", False), ("ddp", True), ("fsdp2", True)],
                         ids=["ddp", "fsdp2", "ddp-lora", "fsdp2-lora"])
def test_two_ranks_keep_prefix_sharing_and_equal_one_process(tmp_path, strategy, lora):
    """Prefix sharing on under DDP and FSDP2: the shared passes run through the wrappers' forward, so gradients are
    averaged (DDP's reducer) and root parameters gathered (FSDP2) — a VEPO run (its credit read inside the shared
    policy pass) on 2 ranks equals one process within 1e-5, and both say in their topology that every log-prob pass
    of the first step was shared."""
    from multiproc import assert_two_ranks_train_what_one_process_trains

    extra = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8", "optim.lr=1e-3"] if lora else []
    two = assert_two_ranks_train_what_one_process_trains(
        tmp_path, "max_steps=6", "model.prefix_sharing=true", "credit.scheme=vepo", f"distributed.strategy={strategy}",
        *extra)
    from mmrlvr.train.model_path import resolve_model_path

    model = str(resolve_model_path("tiny:qwen2_5_vl:warm"))
    start, end = final_params(tmp_path / "one", model), final_params(two, model)
    base = dict(__import__("mmrlvr.models", fromlist=["load_policy"]).load_policy(model)[0].named_parameters())
    moved = [n for n in end if (n in base and float((end[n] - base[n].detach()).abs().max()) > 1e-4)
             or ("lora_B" in n and float(end[n].abs().max()) > 1e-4)]  # LoRA's B starts at zero
    assert moved, "nothing trained: the equality above would hold for any run"
    assert start.keys() == end.keys()
    one = topology(tmp_path / "one")
    passes = topology(two)["passes"]
    assert topology(two)["world_size"] == 2 and topology(two)["strategy"] == strategy
    # reference, old-policy (none at 1 epoch: the sampler's) and policy passes all prefix-shared, none whole rows
    assert passes.get("prefix_shared", 0) >= 2 and not passes.get("fused") and not passes.get("logits"), passes
    assert one["passes"] == passes
