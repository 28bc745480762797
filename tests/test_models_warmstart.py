"""Warm start: SFT batches, answer noise, caching; the full CLI run is a slow learning check."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrlvr.data import make_rows, rows_to_samples, synth
from mmrlvr.errors import UserError
from mmrlvr.models import build_tiny, load_policy
from mmrlvr.models.warmstart import RESULT_FILE, collate_sft, encode_sft, noisy_target, warm_start


def test_noisy_target_keeps_thinking_and_randomises_answers():
    solution = "<think>I see 2 red, 1 blue.</think><answer>2</answer>"
    rng = random.Random(0)
    assert noisy_target(solution, "count", 0.0, rng) == solution
    outs = [noisy_target(solution, "count", 1.0, rng) for _ in range(200)]
    assert all(o.startswith("<think>I see 2 red, 1 blue.</think><answer>") for o in outs)
    answers = {re.search(r"<answer>(.*)</answer>", o).group(1) for o in outs}
    assert answers == {"0", "1", "2", "3"}  # uniform over the count answers, the true one included


def test_sft_batch_labels_cover_only_the_response(tmp_path):
    _, processor = load_policy(build_tiny("qwen2_5_vl", tmp_path / "m"))
    rows = make_rows("count", "train", 3, seed=0)
    examples = encode_sft(processor, rows_to_samples(rows), [r["solution"] for r in rows])
    tok = processor.tokenizer
    batch = collate_sft(examples, tok.pad_token_id)
    for i, row in enumerate(rows):
        labelled = batch["labels"][i][batch["labels"][i] != -100]
        assert tok.decode(labelled) == row["solution"] + "<|im_end|>"
        assert batch["input_ids"][i, -len(labelled):].tolist() == labelled.tolist()
    assert batch["attention_mask"].sum() == sum(len(e["input_ids"]) for e in examples)
    assert batch["pixel_values"].shape[0] == 3 * 64 and batch["image_grid_thw"].shape == (3, 3)
    assert batch["mm_token_type_ids"].shape == batch["input_ids"].shape


def test_short_warm_start_runs_and_is_cached(tmp_path):
    out = tmp_path / "ws"
    opts = dict(steps=4, eval_every=2, n_train=64, n_val=8, n_test=8, k=2, batch_size=8, stop_at=None, progress=False)
    first = warm_start(out, **opts)
    assert not first["cached"] and first["steps_run"] == 4 and len(first["val_history"]) == 2
    for key in ("greedy_accuracy", "avg@2", "pass@2", "format_rate"):
        assert 0.0 <= first[key] <= 1.0
    assert json.loads((out / RESULT_FILE).read_text())["options_hash"] == first["options_hash"]
    weights = (out / "model.safetensors").stat().st_mtime_ns
    second = warm_start(out, **opts)
    assert second["cached"] and (out / "model.safetensors").stat().st_mtime_ns == weights  # nothing retrained
    assert {k: v for k, v in second.items() if k != "cached"} == {k: v for k, v in first.items() if k != "cached"}
    model, _ = load_policy(out)  # the saved folder is the trained model
    assert torch.isfinite(next(model.parameters())).all()


def test_warm_start_refuses_to_overwrite_another_model(tmp_path):
    build_tiny("qwen2_vl", tmp_path)
    with pytest.raises(UserError, match="force"):
        warm_start(tmp_path, steps=1, progress=False)
    with pytest.raises(UserError, match="answer_noise"):
        warm_start(tmp_path / "x", answer_noise=1.5)


#: the count warm start's build, per kind of machine that built it (``tests/machine_variants.py``): the shipped copy
#: (built on an AMD EPYC) and the machines whose pinned kernels round differently
BUILDS = Path(__file__).parent / "data" / "warm_start_builds.json"
_TIMING = {"train_s", "total_s", "eval_s", "cached", "shipped"}


def build_record(folder: Path) -> dict:
    """What a build is compared by: the sha256 of every file the package ships, and its result minus timings."""
    import hashlib

    from mmrlvr.models.warmstart import RESULT_FILE, SHIPPED_FILES

    result = json.loads((folder / RESULT_FILE).read_text())
    return {"files": {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in SHIPPED_FILES},
            "result": {k: v for k, v in result.items() if k not in _TIMING}}


def build_differences(got: dict, variant: dict) -> list[str]:
    keys = sorted(set(got["result"]) | set(variant["result"]))
    return ([f"{n} has other bytes" for n in got["files"] if got["files"][n] != variant["files"].get(n)]
            + [f"result {k}: {got['result'].get(k)!r} vs {variant['result'].get(k)!r}"
               for k in keys if got["result"].get(k) != variant["result"].get(k)])


def build_unlike(got: dict, variant: dict) -> list[str]:
    """A build alike up to rounding: same options, same non-weight files, held-out figures within 0.1."""
    out = [f"{n} has other bytes" for n in got["files"]
           if n != "model.safetensors" and got["files"][n] != variant["files"][n]]
    if got["result"]["options_hash"] != variant["result"]["options_hash"]:
        out.append("other options")
    for key in ("greedy_accuracy", "avg@8", "pass@8", "format_rate"):
        if abs(got["result"][key] - variant["result"][key]) > 0.1:
            out.append(f"{key} {got['result'][key]} vs {variant['result'][key]}")
    return out


def test_the_recorded_builds_include_the_shipped_one_and_the_rule_tells_rounding_from_change():
    from mmrlvr.models.warmstart import SHIPPED
    from tests.machine_variants import judge

    variants = json.loads(BUILDS.read_text())["qwen2_5_vl-warm-count"]["variants"]
    shipped = build_record(SHIPPED / "qwen2_5_vl-warm-count")
    assert any(not build_differences(shipped, v) for v in variants)  # the shipped copy is one of them

    def verdict(got, here="new | AVX512 | 1"):
        return judge(got, variants, here, differences=build_differences, unlike=build_unlike)

    assert verdict(shipped).how == "exact"
    rounded = json.loads(json.dumps(shipped))
    rounded["files"]["model.safetensors"] = "0" * 64
    rounded["result"]["greedy_accuracy"] += 0.02
    assert verdict(rounded).how == "alike"
    assert not verdict(rounded, here=variants[0]["written_on"]).ok  # that machine's own build must be exact
    worse = json.loads(json.dumps(rounded))
    worse["result"]["greedy_accuracy"] = 0.3
    other_template = json.loads(json.dumps(rounded))
    other_template["files"]["chat_template.jinja"] = "1" * 64
    assert not verdict(worse).ok and not verdict(other_template).ok


@pytest.mark.rebuild
def test_cli_warm_start_beats_chance_reproduces_the_shipped_build_and_second_call_is_cached(tmp_path):
    """The real recipe (~5-7 min on 2 cores), built by the CLI with --force (never the shipped copy): held-out greedy
    accuracy above chance (25% for count), and every file the package ships for it reproduced byte for byte -- the
    shipped build's bytes, or those of the build recorded for this kind of machine (BUILDS; judged like the stage
    goldens: a kind of machine with no recorded build must build one alike up to rounding)."""
    import warnings

    from tests.machine_variants import judge, machine_signature

    out = tmp_path / "built"
    cmd = [sys.executable, "-m", "mmrlvr.cli", "tiny", "build", "--family", "qwen2_5_vl", "--out", str(out),
           "--warm-start", "--quiet"]
    first = subprocess.run(cmd + ["--force"], capture_output=True, text=True, check=True)
    metrics = json.loads(re.search(r"^metrics: (.*)$", first.stdout, re.M).group(1))
    assert metrics["cached"] is False and metrics["steps_run"] > 0  # really built
    assert 0.30 <= metrics["greedy_accuracy"] <= 0.65, first.stdout
    assert metrics["format_rate"] > 0.9
    variants = json.loads(BUILDS.read_text())["qwen2_5_vl-warm-count"]["variants"]
    verdict = judge(build_record(out), variants, machine_signature(), differences=build_differences,
                    unlike=build_unlike)
    assert verdict.ok, verdict.message
    if verdict.how == "alike":
        warnings.warn(f"warm start build: {verdict.message}", stacklevel=1)
    second = subprocess.run(cmd, capture_output=True, text=True, check=True)
    second_metrics = json.loads(re.search(r"^metrics: (.*)$", second.stdout, re.M).group(1))
    assert second_metrics["cached"] is True
    assert {k: v for k, v in second_metrics.items() if k != "cached"} == {k: v for k, v in metrics.items() if k != "cached"}


def test_the_shipped_warm_start_is_installed_instead_of_built(tmp_path, monkeypatch):
    """The demo's warm start ships with the package: a request with its options copies it (no SFT), the copy is a
    finished warm start that loads, an interrupted copy is not taken for one, and other options find no copy."""
    from mmrlvr.models.loading import load_policy
    from mmrlvr.models.warmstart import RESULT_FILE, SHIPPED, SHIPPED_FILES, cached_result, shipped_copy

    shipped = SHIPPED / "qwen2_5_vl-warm-count"
    digest = json.loads((shipped / RESULT_FILE).read_text())["options_hash"]
    assert shipped_copy(digest) == shipped and shipped_copy("0" * 16) is None
    out = tmp_path / "warm"
    result = warm_start(out, family="qwen2_5_vl", task="count", progress=False)  # the demo's options
    assert result["cached"] is True and result["shipped"] is True and result["options_hash"] == digest
    for name in SHIPPED_FILES:
        assert (out / name).read_bytes() == (shipped / name).read_bytes(), name
    model, processor = load_policy(out)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    (out / RESULT_FILE).unlink()  # a copy cut short before its last file: not a finished warm start
    assert cached_result(out, digest) is None
    import mmrlvr.models.warmstart as W

    def would_build(*args, **kwargs):
        raise AssertionError("would build")

    monkeypatch.setattr(W, "_build_in_pinned_child", would_build)
    monkeypatch.setattr(W, "_build", would_build)
    with pytest.raises(AssertionError, match="would build"):  # another recipe (a seed) is built, not copied
        warm_start(tmp_path / "other", family="qwen2_5_vl", task="count", seed=1, progress=False)


def test_every_tiny_config_and_the_demo_start_from_a_shipped_warm_start(tmp_path, monkeypatch):
    """Each warm start a shipped config names is in the package for the recipe this code computes: resolved in an
    empty cache it is copied, never built (a recipe change that leaves a shipped copy stale fails here)."""
    import yaml

    import mmrlvr.models.warmstart as W
    from mmrlvr.train.demo import demo_config_dict
    from mmrlvr.train.model_path import resolve_model_path

    def would_build(*args, **kwargs):
        raise AssertionError("would build")

    monkeypatch.setattr(W, "_build_in_pinned_child", would_build)
    monkeypatch.setattr(W, "_build", would_build)
    monkeypatch.setenv("MMRLVR_CACHE", str(tmp_path / "cache"))
    root = Path(__file__).parents[1]
    specs = {yaml.safe_load(p.read_text())["model"]["path"] for p in (root / "configs").glob("*-tiny.yaml")}
    specs.add(demo_config_dict()["model"]["path"])
    warm = sorted(s for s in specs if s.startswith("tiny:") and ":warm" in s)
    assert {"tiny:qwen2_5_vl:warm", "tiny:qwen2_5_vl:warm:noise0.9", "tiny:qwen2_5_vl:warm:grounding_single",
            "tiny:qwen2_5_vl:warm:zoom"} <= set(warm)
    for spec in warm:
        out = Path(resolve_model_path(spec))
        result = json.loads((out / W.RESULT_FILE).read_text())
        assert W.shipped_copy(result["options_hash"]) is not None, spec


def test_warm_start_is_bit_identical_under_1_and_2_threads(tmp_path):
    """The caller's thread count must not reach the weights (it did: 50 of 57 tensors differed)."""
    from safetensors.torch import load_file

    opts = dict(steps=6, eval_every=6, n_train=64, n_val=4, n_test=4, k=1, batch_size=16, stop_at=None,
                progress=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = warm_start(tmp_path / "two", **opts)
        torch.set_num_threads(1)
        one = warm_start(tmp_path / "one", **opts)
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before  # the build restores the caller's setting
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert one["options_hash"] == two["options_hash"]
    # the cache key names what decides the bits besides the options
    assert one["options"]["threads"] == 1 and one["options"]["torch"] == torch.__version__.split("+")[0]
    from mmrlvr.models.kernels import LABEL

    assert one["options"]["kernels"] == LABEL


def test_warm_start_is_built_on_pinned_kernels_in_a_child_process(tmp_path):
    """Called from an ordinary (unpinned) process, the build runs in a pinned child and says so."""
    from mmrlvr.models.kernels import LABEL, PINNED_STATE, env_pinned

    assert not env_pinned()  # the premise: this process picks the CPU's own kernels
    opts = dict(steps=2, eval_every=2, n_train=32, n_val=4, n_test=4, k=1, batch_size=8, stop_at=None,
                progress=False)
    result = warm_start(tmp_path / "ws", **opts)
    assert result["build_kernels"] == PINNED_STATE and result["options"]["kernels"] == LABEL


def test_warm_start_bytes_do_not_follow_the_instruction_sets_the_cpu_reports(tmp_path, monkeypatch):
    """The same options give the same weights when MKL may use only SSE4.2 and glibc is told there is no AVX,
    AVX2, AVX-512 or FMA (as on an older or another vendor's CPU); the CPU's own kernels give other weights."""
    from safetensors.torch import load_file

    import mmrlvr.models.warmstart as ws

    opts = dict(steps=3, eval_every=3, n_train=32, n_val=4, n_test=4, k=1, batch_size=8, stop_at=None,
                progress=False)
    warm_start(tmp_path / "here", **opts)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "SSE4_2")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F,-AVX")
    warm_start(tmp_path / "older", **opts)
    a, b = load_file(tmp_path / "here" / "model.safetensors"), load_file(tmp_path / "older" / "model.safetensors")
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":  # the pinning is not a no-op on this CPU
        monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS")
        monkeypatch.delenv("GLIBC_TUNABLES")
        monkeypatch.setattr(ws, "env_pinned", lambda: True)  # build here, on this process's own kernels
        monkeypatch.setattr(ws, "check_pinned", lambda state: None)
        warm_start(tmp_path / "native", **opts)
        c = load_file(tmp_path / "native" / "model.safetensors")
        assert [k for k in a if not torch.equal(a[k], c[k])] != []


def test_tiny_build_waits_for_another_builder_of_the_same_folder(tmp_path):
    """`mmrlvr tiny build` takes the folder's build lock (as a run's tiny: spec does): it never writes a folder
    another process is building; it waits, then goes on."""
    import time

    from mmrlvr.models.warmstart import build_lock

    out = tmp_path / "tiny"
    cmd = [sys.executable, "-m", "mmrlvr.cli", "tiny", "build", "--family", "qwen2_vl", "--out", str(out)]
    with build_lock(out):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()  # the command says it waits (it would build, or fail, otherwise)
        assert first.startswith("waiting for another process building") and str(out) in first, first
        time.sleep(1)
        assert proc.poll() is None and not (out / "config.json").exists()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert (out / "config.json").exists() and "built" in stdout


def test_multi_turn_sft_labels_the_model_turns_and_encodes_the_tool_turn_as_a_rollout_does(tmp_path, monkeypatch):
    """``synth:zoom``'s two-turn references: the labels cover exactly the two model turns (each with its end-of-turn
    token); the tool turn between them is the real zoom's answer, token for token what a multi-turn rollout that
    makes the same call produces (so SFT trains on the sequences RL samples)."""
    import mmrlvr.rollout.sampling as sampling
    from mmrlvr.models.warmstart import encode_sft_turns
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.rollout.hf import HFEngine
    from mmrlvr.rollout.multiturn import ToolUse, generate_multiturn
    from mmrlvr.tools import TOOLS
    from scripted_policy import scripted_sampler

    model, processor = load_policy(build_tiny("qwen2_5_vl", tmp_path / "m"))
    tok = processor.tokenizer
    samples = rows_to_samples(make_rows("zoom", "train", 2, seed=0))
    examples = encode_sft_turns(processor, samples, ["zoom"])
    batch = collate_sft(examples, tok.pad_token_id)
    for i, s in enumerate(samples):
        labelled = batch["labels"][i][batch["labels"][i] != -100]
        first, final = s.meta["reference_turns"]
        assert tok.decode(labelled) == first + "<|im_end|>" + final + "<|im_end|>"
    assert batch["image_grid_thw"].shape == (4, 3)  # each example: the scene and the zoom's crop
    # stored in bfloat16 (two 224-px images per example), handed to the model in float32
    assert examples[0]["pixel_values"].dtype == torch.bfloat16 and batch["pixel_values"].dtype == torch.float32
    # decoys: the look into the wrong cell and the answer from its crop are trained like a reference
    decoys = collate_sft(encode_sft_turns(processor, samples, ["zoom"], decoy_share=1.0), tok.pad_token_id)
    for i, s in enumerate(samples):
        labelled = decoys["labels"][i][decoys["labels"][i] != -100]
        first, final = s.meta["decoy_turns"]
        assert tok.decode(labelled) == first + "<|im_end|>" + final + "<|im_end|>"
        context = tok.decode(decoys["input_ids"][i])
        assert s.meta["decoy_turns"][0] in context and s.meta["reference_turns"][0] not in context
    # the same trajectory through a rollout: identical real tokens
    monkeypatch.setattr(sampling, "RowSampler", scripted_sampler(tok, list(samples[0].meta["reference_turns"])))
    out = generate_multiturn(HFEngine(model, processor), samples[:1], 1, SamplingParams(max_new_tokens=128),
                             ToolUse(tools={"zoom": TOOLS.get("zoom")}, describe=False), seed=0, step=0)
    rollout_ids = out.input_ids[0][out.attention_mask[0] > 0].tolist()
    assert rollout_ids == examples[0]["input_ids"].tolist()


def test_a_short_tool_task_warm_start_samples_with_its_tool(tmp_path):
    out = tmp_path / "zoom"
    result = warm_start(out, task="zoom", steps=2, eval_every=2, n_train=8, n_val=2, n_test=2, k=1, batch_size=4,
                        stop_at=None, progress=False)
    assert result["steps_run"] == 2 and result["options"]["tools"] == ["zoom"]
    # validation says how the model used the tool, not only how often it was right (a wrong first look shows here)
    assert {"val_greedy_tool_calls_per_response", "val_greedy_tool_error_rate",
            "val_greedy_zoom_hit_rate"} <= set(result["val_history"][0])
    assert result["options"]["task_data"] == synth.DATA_VERSIONS["zoom"]  # a redrawn task is a new recipe
    direct = warm_start(tmp_path / "direct", task="zoom", steps=2, eval_every=2, n_train=8, n_val=2, n_test=2, k=1,
                        batch_size=4, stop_at=None, progress=False, tools=False)
    assert direct["options"]["tools"] == [] and direct["options_hash"] != result["options_hash"]


def test_examples_do_not_depend_on_how_the_rows_are_chunked(tmp_path):
    """The build draws and encodes its training rows a chunk at a time (``ENCODE_CHUNK``); the examples equal
    those of one call over all rows, so the chunk size is not part of the recipe."""
    from mmrlvr.models.warmstart import encode_sft

    _, processor = load_policy(build_tiny("qwen2_5_vl", tmp_path / "m"))
    samples = rows_to_samples(make_rows("count", "train", 5, seed=0))
    targets = [s.meta.get("solution") or "<think>x</think><answer>1</answer>" for s in samples]
    whole = encode_sft(processor, samples, targets)
    parts = encode_sft(processor, samples[:2], targets[:2]) + encode_sft(processor, samples[2:], targets[2:])
    for a, b in zip(whole, parts, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["pixel_values"], b["pixel_values"])
        assert a["n_resp"] == b["n_resp"]


def test_a_warm_start_can_fine_tune_another_warm_start(tmp_path):
    """``base``: the build starts from that finished warm start's weights (lr 0 keeps them: the saved model equals
    the base's), and the base's identity is part of the recipe; a folder that is not a finished warm start is
    refused by name."""
    from safetensors.torch import load_file

    base = tmp_path / "count"
    warm_start(base, task="count", steps=1, eval_every=1, n_train=4, n_val=2, n_test=2, k=1, batch_size=2,
               stop_at=None, progress=False)
    out = tmp_path / "zoom"
    result = warm_start(out, task="zoom", steps=1, eval_every=1, n_train=2, n_val=1, n_test=1, k=1, batch_size=2,
                        stop_at=None, progress=False, lr=0.0, base=base)
    assert result["options"]["base"] == json.loads((base / "warmstart.json").read_text())["options_hash"]
    a, b = load_file(base / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(UserError, match="not a finished warm start"):
        warm_start(tmp_path / "x", task="zoom", steps=1, base=tmp_path / "nothing")


def test_a_tool_task_spec_builds_its_base_warm_start_first(tmp_path, monkeypatch):
    """``tiny:FAMILY:warm:zoom`` resolves the count warm start of the same family first and fine-tunes it (the
    builds themselves are replaced by a recorder here: each takes minutes)."""
    import mmrlvr.models.warmstart as ws
    from mmrlvr.train.model_path import resolve_model_path

    monkeypatch.setenv("MMRLVR_CACHE", str(tmp_path))
    calls = []

    def record(out, *, family, task, answer_noise, base=None):
        calls.append((Path(out).name, family, task, None if base is None else Path(base).name))

    monkeypatch.setattr(ws, "warm_start", record)
    resolve_model_path("tiny:qwen3_vl:warm:zoom")
    assert calls == [("qwen3_vl-warm", "qwen3_vl", "count", None),
                     ("qwen3_vl-warm-zoom", "qwen3_vl", "zoom", "qwen3_vl-warm")]
