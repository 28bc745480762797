"""A battery of bad command lines and configs, as users write them: each fails cleanly before the model loads.

Every case must give exit status 2, no traceback, one line per problem (naming the key), no model-side
import (torch, transformers, ... are never imported: the model cannot have loaded) and no run folder.
Cases run in one process (``tests/scripts/bad_inputs_driver.py``) so the battery takes seconds; a few also
run as real ``python -m mmrlvr.cli`` processes. Times are printed (``pytest -s``), not asserted.

The first twenty cases are issue 15's acceptance: twenty broken YAML configs (wrong names, types, ranges,
paths, columns) through ``--dry-run``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "scripts" / "bad_inputs_driver.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MMRLVR_DEBUG": ""}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def _base(out: Path) -> dict:
    return {
        "output_dir": str(out), "max_steps": 2,
        "model": {"path": "tiny:qwen2_5_vl"},
        "data": {"train": "synth:count", "eval": "synth:count", "train_size": 16, "eval_size": 4},
        "rewards": [{"name": "format", "weight": 0.2}, {"name": "auto_accuracy", "weight": 1.0}],
    }


def _deep_update(d: dict, upd: dict) -> dict:
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            _deep_update(d[k], v)
        else:
            d[k] = v
    return d


# (id, changes to the base config, substrings that must all appear in stderr)
YAML_CASES: list[tuple[str, dict, list[str]]] = [
    ("y01_loss_name", {"algo": {"loss": "ppo"}}, ["algo.loss: unknown policy loss 'ppo'", "did you mean 'ppo_clip'"]),
    ("y02_credit_name", {"credit": {"scheme": "vep"}}, ["credit.scheme: unknown credit scheme 'vep'", "'vepo'"]),
    ("y03_advantage_name", {"algo": {"advantage": "gae"}}, ["algo.advantage: unknown advantage estimator 'gae'",
                                                           "allowed: dr_grpo, grpo, opd, pass_at_k, poise, reinforce_pp, rloo"]),
    ("y04_reward_name", {"rewards": [{"name": "acuracy"}]}, ["rewards[0].name: unknown reward 'acuracy'",
                                                            "did you mean 'accuracy'"]),
    ("y05_judge_name", {"rubric": {"judge": "gpt"}}, ["rubric.judge: unknown judge 'gpt'", "openai"]),
    ("y06_perturbation_name", {"credit": {"perturbation": "noise"}}, ["credit.perturbation: unknown perturbation"]),
    ("y07_preset_name", {"algo": {"preset": "dapoo"}}, ["algo.preset: unknown preset 'dapoo'", "'dapo'"]),
    ("y08_lr_type", {"optim": {"lr": "fast"}}, ["optim.lr: expected a number, got 'fast'"]),
    ("y09_group_size_type", {"rollout": {"group_size": "eight"}}, ["rollout.group_size: expected an integer"]),
    ("y10_lora_type", {"model": {"lora": {"enabled": "yes"}}}, ["model.lora.enabled: expected true/false"]),
    ("y11_max_new_tokens_range", {"rollout": {"max_new_tokens": 0}}, ["rollout.max_new_tokens: must be >= 1, got 0"]),
    ("y12_top_p_range", {"rollout": {"top_p": 2}}, ["rollout.top_p: must be in (0, 1], got 2.0"]),
    ("y13_kl_range", {"algo": {"kl_coef": -1}}, ["algo.kl_coef: must be >= 0"]),
    ("y14_eval_k_range", {"eval": {"k": 0}}, ["eval.k: must be >= 1, got 0"]),
    ("y15_data_path", {"data": {"train": "/no/such/train.jsonl"}}, ["data.train: /no/such/train.jsonl: no such file"]),
    ("y16_data_columns", {"data": {"train": "@wrongcols.jsonl"}}, ["data.train:", "question"]),
    ("y17_data_column_map", {"data": {"train": "@good.jsonl", "columns": {"problem": "prompt_text"}}},
     ["data.train:", "column 'prompt_text'"]),
    ("y18_model_path", {"model": {"path": "/no/such/model"}}, ["model.path: /no/such/model: no such folder"]),
    ("y19_unknown_key", {"rollout": {"max_new_token": 16}}, ["rollout.max_new_token: unknown key",
                                                              "did you mean 'max_new_tokens'"]),
    ("y20_template_reward", {"data": {"template": "boxed"}}, ["rewards[0] (format)", "data.template='boxed'",
                                                            "rewards[1] (auto_accuracy)"]),
]

# (id, extra argv after the base config, substrings that must all appear in stderr)
ARGV_CASES: list[tuple[str, list[str], list[str]]] = [
    ("a01_agg_name", ["algo.agg=token_mean"], ["algo.agg: unknown loss aggregation mode", "'token-mean'"]),
    ("a02_kl_estimator", ["algo.kl_estimator=k4"], ["algo.kl_estimator: unknown KL estimator 'k4'"]),
    ("a03_lora_init", ["model.lora.init=pisa"], ["model.lora.init: unknown LoRA init 'pisa'", "'pissa'"]),
    ("a04_template_name", ["data.template=boxd"], ["data.template: unknown prompt template 'boxd'", "'boxed'"]),
    ("a05_data_preset", ["data.preset=easyr"], ["data.preset: unknown column preset 'easyr'", "'easyr1'"]),
    ("a06_engine", ["rollout.engine=vlm"], ["rollout.engine: unknown value 'vlm'", "'vllm'"]),
    ("a07_schedule", ["optim.schedule=cosin"], ["optim.schedule: unknown value 'cosin'", "'cosine'"]),
    ("a08_dtype", ["model.dtype=fp16"], ["model.dtype: unknown value 'fp16'"]),
    ("a09_top_k", ["rollout.top_k=-1"], ["rollout.top_k: must be >= 0"]),
    ("a10_save_every", ["save_every=-1"], ["save_every: must be >= 0"]),
    ("a11_grad_clip", ["optim.grad_clip=-1"], ["optim.grad_clip: must be >= 0"]),
    ("a12_warmup", ["optim.warmup_steps=-3"], ["optim.warmup_steps: must be >= 0, got -3"]),
    ("a13_group_size", ["rollout.group_size=1"], ["rollout.group_size: must be >= 2"]),
    ("a14_temperature", ["rollout.temperature=0"], ["rollout.temperature: must be > 0"]),
    ("a15_lr_nan", ["optim.lr=.nan"], ["optim.lr: expected a finite number"]),
    ("a16_seed_type", ["seed=abc"], ["seed: expected an integer, got 'abc'"]),
    ("a17_max_steps", ["max_steps=-5"], ["max_steps: must be >= 0"]),
    ("a18_lora_r", ["model.lora.r=eight"], ["model.lora.r: expected an integer"]),
    ("a19_unknown_top_key", ["max_step=5"], ["max_step: unknown key", "did you mean 'max_steps'"]),
    ("a20_section_scalar", ["rollout=3"], ["rollout: expected a mapping of RolloutConfig fields"]),
    ("a21_override_into_scalar", ["max_steps.x=1"], ["override 'max_steps.x': max_steps is a single value"]),
    ("a22_override_no_equals", ["--dry-run", "fast"], ["override 'fast': expected key=value"]),
    ("a23_list_index", ["rewards.5.weight=2"], ["rewards.5.weight", "not an index"]),
    ("a24_dual_clip", ["algo.dual_clip=0.5"], ["algo.dual_clip: must be > 1"]),
    ("a25_betas", ["optim.betas=[0.9]"], ["optim.betas: must be two numbers in [0, 1)"]),
    ("a26_min_pixels", ["data.min_pixels=0"], ["data.min_pixels: must be >= 1"]),
    ("a27_eval_temperature", ["eval.temperature=-1"], ["eval.temperature: must be > 0"]),
    ("a28_prompts_per_step", ["rollout.prompts_per_step=0"], ["rollout.prompts_per_step: must be >= 1"]),
    ("a29_eps_low", ["algo.eps_low=1.5"], ["algo.eps_low: must be in [0, 1]"]),
    ("a30_weight_inf", ["rewards.0.weight=.inf"], ["rewards[0].weight: expected a finite number"]),
    ("a31_reward_param_name", ["rewards.0.params.templat=r1"], ["rewards[0].params.templat: unknown parameter",
                                                                "did you mean 'template'"]),
    ("a32_reward_param_value", ["rewards.0.params.template=xml"], ["rewards[0] (format)", "xml"]),
    ("a33_split_advantage", ["consistency.split_advantage=true"], ["needs a reward named 'consistency'"]),
    ("a34_synth_task", ["data.train=synth:cont"], ["data.train: unknown synthetic task 'cont'", "'count'"]),
    ("a35_eval_path", ["data.eval=/no/such/eval"], ["data.eval: /no/such/eval: no such file"]),
    ("a36_data_empty_dir", ["data.train=@emptydir"], ["data.train:", "emptydir"]),
    ("a37_data_corrupt", ["data.train=@bad.parquet"], ["data.train:", "bad.parquet"]),
    ("a38_answer_type", ["data.train=@few.jsonl"], ["data.train:", "a few"]),
    ("a39_tiny_family", ["model.path=tiny:qwen3"], ["model.path: tiny:qwen3", "unknown tiny family"]),
    ("a40_model_not_a_model", ["model.path=@emptydir"], ["model.path:", "not a model folder"]),
    ("a41_model_missing", ["model.path="], ["model.path: expected a string, got None"]),
    ("a42_output_is_file", ["output_dir=@afile.txt"], ["output_dir:", "is a file"]),
    ("a43_output_under_file", ["output_dir=@afile.txt/run"], ["output_dir:", "is a file"]),
    ("a44_existing_run", ["output_dir=@existing_run"], ["already holds a run", "--resume", "--overwrite"]),
    ("a45_non_run_overwrite", ["output_dir=@not_a_run", "--overwrite"], ["not an mmrlvr run", "refusing"]),
    ("a46_resume_and_overwrite", ["output_dir=@existing_run", "--resume", "--overwrite"], ["exclude each other"]),
    ("a47_resume_changed", ["output_dir=@existing_run", "--resume", "seed=5", "optim.lr=0.001"],
     ["breaks exactness", "seed (0 -> 5)", "optim.lr", "--allow-config-change"]),
    ("a48_locked_run", ["output_dir=@locked_run", "--resume"], ["in use by another run", "pid"]),
    ("a49_plugin_missing", ["plugins=[@nope_plugin.py]"], ["plugins[0]:", "no such file"]),
    ("a50_plugin_raises", ["plugins=[@raising_plugin.py]"], ["plugins[0]:", "ZeroDivisionError"]),
    ("a51_rubric_file_missing", ["rewards=[{name: rubric, params: {rubric_file: /no/such/rubric.yaml}}]"],
     ["rewards[0] (rubric)", "/no/such/rubric.yaml"]),
    ("a52_rubric_file_broken", ["rewards=[{name: rubric, params: {rubric_file: @broken_rubric.yaml}}]"],
     ["rewards[0] (rubric)", "broken_rubric.yaml"]),
    ("a53_rubric_needs_judge", ["rewards=[{name: rubric, params: {rubric_file: @judged_rubric.yaml}}]"],
     ["has judge criteria but no judge"]),
    ("a54_judge_unreachable", ["--dry-run", "rubric.judge=openai", "rubric.judge_params.model=m",
                               "rubric.judge_params.base_url=http://127.0.0.1:@port/v1"], ["unreachable"]),
    ("a55_judge_missing_model", ["rubric.judge=openai", "rewards=[{name: rubric}]"],
     ["rubric.judge_params.model: missing"]),
    ("a56_judge_param_typo", ["rubric.judge=openai", "rubric.judge_params.model=m", "rubric.judge_params.timout=3"],
     ["rubric.judge_params.timout: unknown parameter", "did you mean 'timeout'"]),
    ("a57_vllm_missing", ["rollout.engine=vllm"], ["rollout.engine: 'vllm' needs the vllm package"]),
    ("a58_flash_attn_missing", ["model.attn_implementation=flash_attention_2"], ["needs the flash_attn package"]),
    ("a59_eval_limit", ["eval.limit=0"], ["eval.limit: must be >= 1"]),
    ("a60_keep_checkpoints", ["keep_checkpoints=-1"], ["keep_checkpoints: must be >= 0"]),
    ("a61_max_pixels", ["data.max_pixels=10", "data.min_pixels=100"], ["data.max_pixels: must be >= data.min_pixels"]),
    ("a62_overlong_cache", ["algo.overlong_cache=64", "rollout.max_new_tokens=32"], ["algo.overlong_cache"]),
    ("a64_max_prompt_length", ["data.max_prompt_length=-1"], ["data.max_prompt_length: must be >= 0"]),
    ("a65_max_unknown_rate", ["rubric.max_unknown_rate=2"], ["rubric.max_unknown_rate: must be in [0, 1]"]),
    ("a66_tracker_name", ["report_to=[tensorbord]"], ["report_to[0]: unknown tracker 'tensorbord'",
                                                      "did you mean 'tensorboard'"]),
    ("a67_data_format", ["data.format=verll"], ["data.format: unknown dataset layout 'verll'", "'verl'"]),
    ("a68_prompt_template_reward", ["data.prompt_template=boxed_math"],
     ["rewards[0] (format)", "data.prompt_template='boxed_math' asks for \\boxed{}"]),
    ("a69_answer_format", ["data.answer_format=boxd"], ["data.answer_format", "boxd"]),
    ("a70_state_dtype", ["optim.state_dtype=fp8"], ["optim.state_dtype: unknown value 'fp8'"]),
    ("a71_prompt_template_missing", ["data.prompt_template=/no/such/template.jinja"],
     ["data.prompt_template", "/no/such/template.jinja"]),
    ("a72_train_options_key", ["data.train_options.colums.problem=q"], ["data.train_options", "colums"]),
    ("a73_heap_threshold", ["model.heap_mmap_threshold_mib=64"], ["model.heap_mmap_threshold_mib: must be in [0, 32]"]),
    ("a63_many_at_once", ["algo.loss=ppo", "credit.scheme=vep", "rollout.top_p=2", "eval.k=0", "optim.lr=x"],
     ["5 problems found before loading the model", "algo.loss", "credit.scheme", "rollout.top_p", "eval.k",
      "optim.lr"]),
]

# (id, argv after "train", substrings) — the command line itself is wrong (argparse or the config file)
RAW_CASES: list[tuple[str, list[str], list[str]]] = [
    ("r01_config_missing", ["@missing.yaml"], ["missing.yaml: config file not found"]),
    ("r02_config_is_dir", ["@emptydir"], ["is a folder, not a config file"]),
    ("r03_config_bad_yaml", ["@bad_yaml.yaml"], ["not valid YAML"]),
    ("r04_config_list", ["@list.yaml"], ["the top level must be a mapping"]),
    ("r05_config_binary", ["@binary.yaml"], ["not a text file"]),
    ("r06_unknown_flag", ["@base.yaml", "--resum"], ["unrecognized arguments: --resum"]),
    ("r07_no_config", ["--resume"], ["a CONFIG.yaml is required"]),
]


def _sub(text: str, tmp: Path, port: int) -> str:
    return text.replace("@port", str(port)).replace("@", str(tmp) + "/")


def _sub_obj(obj, tmp: Path, port: int):
    if isinstance(obj, str):
        return _sub(obj, tmp, port) if obj.startswith("@") or "@port" in obj else obj
    if isinstance(obj, list):
        return [_sub_obj(v, tmp, port) for v in obj]
    if isinstance(obj, dict):
        return {k: _sub_obj(v, tmp, port) for k, v in obj.items()}
    return obj


def _fixtures(tmp: Path) -> None:
    (tmp / "emptydir").mkdir()
    (tmp / "afile.txt").write_text("not a folder\n")
    (tmp / "wrongcols.jsonl").write_text(json.dumps({"question": "How many?", "solution": "3"}) + "\n")
    (tmp / "good.jsonl").write_text(json.dumps({"problem": "How many?", "answer": "3"}) + "\n")
    (tmp / "few.jsonl").write_text("".join(json.dumps({"problem": "How many?", "answer": w, "answer_type": "number"})
                                           + "\n" for w in ("a few", "several", "many", "lots")))
    (tmp / "bad.parquet").write_bytes(b"this is not parquet")
    (tmp / "bad_yaml.yaml").write_text("seed: [1, 2\nmax_steps: 3\n")
    (tmp / "list.yaml").write_text("- seed: 1\n")
    (tmp / "binary.yaml").write_bytes(b"\xff\xfe\x00\x01binary")
    (tmp / "raising_plugin.py").write_text("x = 1 / 0\n")
    (tmp / "broken_rubric.yaml").write_text("name: broken\ncriteria:\n  - id: a\n    category: essentail\n")
    (tmp / "judged_rubric.yaml").write_text(yaml.safe_dump({"name": "judged", "criteria": [
        {"id": "clear", "text": "The reasoning is clear.", "category": "important", "check": {"type": "judge"}}]}))
    not_a_run = tmp / "not_a_run"
    not_a_run.mkdir()
    (not_a_run / "notes.txt").write_text("my notes\n")
    base = _base(tmp / "runs" / "base")
    (tmp / "base.yaml").write_text(yaml.safe_dump(base))
    for name in ("existing_run", "locked_run"):
        run = tmp / name
        run.mkdir()
        from mmrlvr.config import load_config

        cfg = load_config(data={**base, "output_dir": str(run)})
        (run / "config.yaml").write_text(cfg.to_yaml())
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.1}) + "\n")


def _hold_lock(run: Path) -> subprocess.Popen:
    """A process that owns ``run``'s lock (as a live training run would) until killed."""
    code = (
        "import fcntl, json, os, socket, sys, time\n"
        f"fd = os.open({str(run / '.mmrlvr.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), 'started': 'now'}).encode())\n"
        "print('locked', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _cases(tmp: Path, port: int) -> list[dict]:
    cases = []
    for cid, change, expect in YAML_CASES:
        cfg = _deep_update(_base(tmp / "runs" / cid), _sub_obj(change, tmp, port))
        path = tmp / f"{cid}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        cases.append({"id": cid, "argv": ["train", str(path), "--dry-run"], "expect": expect,
                      "run_dir": str(tmp / "runs" / cid)})
    for cid, extra, expect in ARGV_CASES:
        argv = ["train", str(tmp / "base.yaml"), f"output_dir={tmp / 'runs' / cid}"]
        argv += [_sub(a, tmp, port) if "@" in a else a for a in extra]
        cases.append({"id": cid, "argv": argv, "expect": expect, "run_dir": str(tmp / "runs" / cid)})
    for cid, extra, expect in RAW_CASES:
        argv = ["train", *[_sub(a, tmp, port) if a.startswith("@") else a for a in extra]]
        cases.append({"id": cid, "argv": argv, "expect": expect, "run_dir": str(tmp / "runs" / "base"),
                      "argparse": cid in ("r06_unknown_flag", "r07_no_config")})
    return cases


def _snapshot(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*"))} if path.exists() else {}


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad_inputs")
    _fixtures(tmp)
    port = _free_port()
    cases = _cases(tmp, port)
    holder = _hold_lock(tmp / "locked_run")
    guarded = {name: _snapshot(tmp / name) for name in ("existing_run", "not_a_run")}
    try:
        (tmp / "cases.json").write_text(json.dumps(cases))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(DRIVER), str(tmp / "cases.json"), str(tmp / "results.json")],
                       check=True, env=ENV, cwd=tmp, timeout=900)
        wall = time.perf_counter() - t0
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    results = {r["id"]: r for r in json.loads((tmp / "results.json").read_text())}
    secs = sorted(r["seconds"] for r in results.values())
    print(f"\nbad-input battery: {len(cases)} cases in one process, {wall:.1f} s wall; per case median "
          f"{secs[len(secs) // 2]:.3f} s, max {secs[-1]:.3f} s ({max(results.values(), key=lambda r: r['seconds'])['id']})")
    return {"tmp": tmp, "cases": {c["id"]: c for c in cases}, "results": results, "guarded": guarded}


ALL_IDS = [c[0] for c in YAML_CASES] + [c[0] for c in ARGV_CASES] + [c[0] for c in RAW_CASES]


def test_the_battery_is_large_enough():
    assert len(ALL_IDS) >= 60 and len(YAML_CASES) == 20 and len(set(ALL_IDS)) == len(ALL_IDS)


_PROBLEM_LINE = re.compile(r"^  \S")


@pytest.mark.parametrize("case_id", ALL_IDS)
def test_bad_input_fails_cleanly_before_the_model_loads(battery, case_id):
    case, res = battery["cases"][case_id], battery["results"][case_id]
    err = res["stderr"]
    assert res["rc"] == 2, f"{case_id}: exit {res['rc']}\n{err}"
    assert "Traceback" not in err, err
    assert res["heavy"] == [], f"{case_id} imported {res['heavy']} (a model load starts there)"
    for needle in case["expect"]:
        assert needle in err, f"{case_id}: {needle!r} not in:\n{err}"
    lines = err.rstrip("\n").split("\n")
    if case.get("argparse"):
        assert lines[-1].startswith("mmrlvr train: error:"), err
    else:  # one line, or a header then one indented line per problem
        assert lines[0].startswith("mmrlvr train: error: "), err
        m = re.match(r"mmrlvr train: error: (\d+) problems found before loading the model:$", lines[0])
        if m:
            assert len(lines) == 1 + int(m.group(1)) and all(_PROBLEM_LINE.match(ln) for ln in lines[1:]), err
        else:
            assert len(lines) == 1, err
    assert not res["created"], f"{case_id} created its run folder"


def test_folders_in_the_way_are_left_untouched(battery):
    for name, before in battery["guarded"].items():
        assert _snapshot(battery["tmp"] / name) == before, name


@pytest.mark.parametrize("case_id", ["y01_loss_name", "a44_existing_run", "a63_many_at_once", "r03_config_bad_yaml"])
def test_real_process_prints_no_traceback(battery, case_id):
    """The same cases as separate ``python -m mmrlvr.cli`` processes (the console entry point's path)."""
    case = battery["cases"][case_id]
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "mmrlvr.cli", *case["argv"]], capture_output=True, text=True,
                         env=ENV, cwd=battery["tmp"], timeout=120)
    print(f"\n{case_id}: real process {time.perf_counter() - t0:.2f} s")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert all(needle in res.stderr for needle in case["expect"]), res.stderr
    assert not Path(case["run_dir"]).exists()


_NO_TORCH = """
import sys
from dataclasses import fields
import mmrlvr.credit, mmrlvr.credit.schemes, mmrlvr.credit.perturb
from mmrlvr.credit import CREDIT_SCHEMES
traits = {}
for name in CREDIT_SCHEMES.names():
    cls = type(CREDIT_SCHEMES.get(name))
    traits[name] = (cls.needs_perturbed, cls.needs_distribution, cls.perturbation,
                    getattr(cls, "needs_hidden", False), [f.name for f in fields(cls)])
assert traits["delta"][3] and traits["vepo"][1] and traits["vppo"][2][0] == "patch_blackout", traits
print(sorted({"torch", "transformers", "peft"} & set(sys.modules)))
"""
# mmrlvr.models.lora alone, its package mmrlvr.models (whose __init__ loads transformers) stood in for
_LORA_NO_TORCH = """
import sys, types
import mmrlvr
pkg = types.ModuleType("mmrlvr.models")
pkg.__path__ = [mmrlvr.__path__[0] + "/models"]
sys.modules["mmrlvr.models"] = pkg
from mmrlvr.models.lora import INITS
assert "default" in INITS
print(sorted({"torch", "transformers", "peft"} & set(sys.modules)))
"""


@pytest.mark.parametrize("code", [_NO_TORCH, _LORA_NO_TORCH], ids=["credit", "lora"])
def test_registry_modules_import_without_torch(code):
    """Config checks import the registries' modules: the modules (and a credit scheme's class traits: fields,
    needs_* and perturbation) must not need torch, transformers or peft."""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=ROOT,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


def test_config_checks_accept_the_live_registries_names():
    """The names config checks accept are the registries' own (``PRELOAD_NAMES`` equal to them too)."""
    import importlib

    from mmrlvr import validation

    for key, (_, module, attr) in validation.REGISTRIES.items():
        live = getattr(importlib.import_module(module), attr)
        names = sorted(live.names() if hasattr(live, "names") else live)
        assert validation.registry_names(key) == names, key
        if key in validation.PRELOAD_NAMES:
            assert sorted(validation.PRELOAD_NAMES[key]) == names, key
    from mmrlvr.train import data

    assert validation.SYNTH_PREFIX == data.SYNTH_PREFIX
    assert tuple(validation.RUBRIC_SYNTH_TASKS) == tuple(data.RUBRIC_SYNTH_TASKS)
