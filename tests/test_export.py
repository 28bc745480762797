"""``mmrlvr export``: a trained tiny VLM loads in a fresh process with plain transformers (mmrlvr blocked)
and generates exactly what the run's model generates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from test_checkpoint import run_config, train

PLAIN_SCRIPT = r'''
import json, sys

class NoMmrlvr:  # the export must work where mmrlvr is not installed
    def find_spec(self, name, path=None, target=None):
        if name == "mmrlvr" or name.startswith("mmrlvr."):
            raise ImportError("mmrlvr is not installed here")

sys.meta_path.insert(0, NoMmrlvr())
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

items, folders = json.load(open(sys.argv[1])), sys.argv[2:]
try:
    import torchvision  # noqa: F401
    remote = False
except Exception:
    remote = True  # CPU-only torch: the export's image-only processor (auto_map)
results = {}
for folder in folders:
    processor = AutoProcessor.from_pretrained(folder, trust_remote_code=remote)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    out = []
    for item in items:
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": item["prompt"]}]}]
        text = processor.apply_chat_template(msgs, add_generation_prompt=True)
        inputs = processor(text=[text], images=[Image.open(item["image"])], return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**inputs, max_new_tokens=12, do_sample=False)
        out.append({"prompt_ids": inputs["input_ids"][0].tolist(),
                    "ids": ids[0, inputs["input_ids"].shape[1]:].tolist()})
    results[folder] = {"out": out, "peft": bool(getattr(model, "_hf_peft_config_loaded", False)),
                       "dtype": str(next(model.parameters()).dtype)}
print("RESULT " + json.dumps({"results": results, "mmrlvr": any(m.startswith("mmrlvr") for m in sys.modules)}))
'''


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("prompts")
    items = []
    for i, (colour, n) in enumerate([("red", 2), ("blue", 3), ("green", 1)]):
        img = Image.new("RGB", (112, 112), "white")
        draw = ImageDraw.Draw(img)
        for j in range(n):
            draw.rectangle([10 + 30 * j, 20 + 10 * i, 30 + 30 * j, 40 + 10 * i], fill=colour)
        img.save(folder / f"{i}.png")
        items.append({"image": str(folder / f"{i}.png"), "prompt": f"How many {colour} squares are there?"})
    (folder / "items.json").write_text(json.dumps(items))
    return folder / "items.json"


def greedy_in_process(model, processor, items_file: Path) -> list[dict]:
    out = []
    model.eval()
    for item in json.loads(items_file.read_text()):
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": item["prompt"]}]}]
        text = processor.apply_chat_template(msgs, add_generation_prompt=True)
        inputs = processor(text=[text], images=[Image.open(item["image"])], return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**inputs, max_new_tokens=12, do_sample=False)
        out.append({"prompt_ids": inputs["input_ids"][0].tolist(), "ids": ids[0, inputs["input_ids"].shape[1]:].tolist()})
    return out


def plain_transformers(folders: list[Path], items_file: Path, tmp_path: Path) -> dict:
    """Greedy generations of each export folder in ONE fresh process with plain transformers."""
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(script), str(items_file), *map(str, folders)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    data = json.loads(line[len("RESULT "):])
    assert not data["mmrlvr"]
    return {Path(k).name: v for k, v in data["results"].items()}


def export(run: Path, out: Path, *extra: str) -> None:
    from mmrlvr.cli import main

    assert main(["export", str(run), "--out", str(out), *extra]) == 0


@pytest.fixture(scope="module")
def exported(tiny_dir, prompts, tmp_path_factory):
    """A LoRA run and a full fine-tuning run (2 steps each), exported three ways, loaded in one fresh process."""
    from mmrlvr.models.compat import load_processor

    root = tmp_path_factory.mktemp("export")
    processor = load_processor(tiny_dir, "qwen2_5_vl")
    lora_run, full_run = root / "lora", root / "full"
    lora = train(run_config(tiny_dir, lora_run, lora=True, max_steps=2, save_every=0, optim={"lr": 0.05}))
    want_lora = greedy_in_process(lora.policy, processor, prompts)
    with lora.policy.disable_adapter():
        base = greedy_in_process(lora.policy, processor, prompts)
    full = train(run_config(tiny_dir, full_run, max_steps=2, save_every=0))
    want_full = greedy_in_process(full.policy, processor, prompts)
    export(lora_run, root / "lora-adapter")
    export(lora_run, root / "lora-merged", "--merge")
    export(full_run, root / "full-fp32", "--step", "2")
    got = plain_transformers([root / "lora-adapter", root / "lora-merged", root / "full-fp32"], prompts, root)
    return {"root": root, "lora_run": lora_run, "full_run": full_run, "got": got, "want_lora": want_lora,
            "base": base, "want_full": want_full}


def test_lora_export_with_embedded_adapter_generates_like_the_run(exported):
    out = exported["root"] / "lora-adapter"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert (out / "chat_template.jinja").is_file() or (out / "chat_template.json").is_file()
    got = exported["got"]["lora-adapter"]
    assert got["peft"]
    assert got["out"] == exported["want_lora"]
    assert exported["base"] != exported["want_lora"]  # the adapter changes generations: the check means something


def test_lora_merged_export_is_a_plain_model(exported):
    out = exported["root"] / "lora-merged"
    assert not (out / "adapter_config.json").exists()
    got = exported["got"]["lora-merged"]
    assert not got["peft"] and got["out"] == exported["want_lora"]
    assert json.loads((out / "mmrlvr_export.json").read_text())["merged"] is True


def test_full_finetuning_export_and_bf16(exported):
    got = exported["got"]["full-fp32"]
    assert got["out"] == exported["want_full"] and got["dtype"] == "torch.float32"
    half = exported["root"] / "bf16"
    export(exported["full_run"], half, "--dtype", "bf16")
    from safetensors import safe_open

    with safe_open(str(half / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def test_export_refuses_to_overwrite_and_names_missing_steps(exported, tmp_path, capsys):
    from mmrlvr.cli import main

    run = exported["lora_run"]
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(run), "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "keep.txt").exists()
    assert main(["export", str(run), "--step", "7", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "step 7" in err and "2" in err and not (tmp_path / "x").exists()
    assert main(["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "y")]) == 2


def test_push_to_hub_with_hub_access_off_is_one_clear_message(exported, tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants as hub_constants

    from mmrlvr.cli import main

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    out = tmp_path / "e"
    assert main(["export", str(exported["lora_run"]), "--out", str(out), "--merge",
                 "--push-to-hub", "someone/tiny-run"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if "error" in ln]) == 1
    assert "--push-to-hub someone/tiny-run" in err and "export itself is complete" in err
    assert (out / "model.safetensors").is_file()
