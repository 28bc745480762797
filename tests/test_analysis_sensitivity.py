"""``mmrlvr analyze sensitivity``: answer flip rate under image perturbations, by hand and on a tiny run.

The flip-rate / accuracy math is checked on hand-worked answer lists. That the perturbation reaches the model is
checked on the HF engine's own inputs: with the perturbing processor the engine's pixel values are exactly
``perturb_vision`` of the clean ones (a black image for ``zero``) and the vision features it generates from differ
from the clean run's. Then one CLI run on a tiny run with 2 checkpoints, and the bad inputs (exit 2, one line).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from analysis_helpers import cli as _cli, one_line_exit_2 as _one_line_exit_2, train_tiny_run
from mmrlvr.analysis import sensitivity as sv

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ pure math
def test_flip_stats_by_hand():
    clean = ["2", "1", None, "3", "0"]
    pert = ["2", "0", None, "1", None]  # prompts 1, 3 and 4 change (a lost answer is a flip too)
    clean_ok = [True, True, False, False, True]
    pert_ok = [True, False, False, True, False]
    s = sv.flip_stats(clean, pert, clean_ok, pert_ok)
    assert s["n"] == 5 and s["flips"] == 3 and s["flip_rate"] == pytest.approx(3 / 5)
    assert s["accuracy_clean"] == pytest.approx(3 / 5) and s["accuracy_perturbed"] == pytest.approx(2 / 5)
    assert s["accuracy_drop"] == pytest.approx(1 / 5)
    assert s["correct_to_wrong"] == pytest.approx(2 / 5)  # prompts 1 and 4
    assert s["wrong_to_correct"] == pytest.approx(1 / 5)  # prompt 3
    same = sv.flip_stats(["a", None], ["a", None], [True, False], [True, False])
    assert same["flip_rate"] == 0.0 and same["accuracy_drop"] == 0.0
    assert sv.flip_stats([], [], [], [])["flip_rate"] is None
    with pytest.raises(ValueError):
        sv.flip_stats(["a"], [], [True], [True])


def test_answers_are_compared_after_the_judges_normalisation():
    assert sv.parsed_answer("<think>x</think><answer> 2.0 </answer>") == "2"
    assert sv.parsed_answer("<think>x</think><answer>Red.</answer>") == "red"
    assert sv.parsed_answer("<think>x</think>no tags") is None
    assert sv.parsed_answer("<think>x</think> so \\boxed{3}", "boxed") == "3"
    assert sv.flip_stats([sv.parsed_answer("<answer>2</answer>")], [sv.parsed_answer("<answer>2.0</answer>")],
                         [True], [True])["flips"] == 0


def test_unknown_perturbation_is_a_user_error():
    from mmrlvr.errors import UserError

    assert sv.parse_perturbations("zero, blur,zero") == ["zero", "blur"]
    with pytest.raises(UserError):
        sv.parse_perturbations("zero,nope")


# ------------------------------------------------------------------------------------ it reaches the model
def test_the_perturbed_pixels_are_what_the_engine_generates_from():
    from mmrlvr.config import DataConfig
    from mmrlvr.credit.perturb import PatchLayout, perturb_vision
    from mmrlvr.models import load_policy
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.rollout.hf import HFEngine, encode_prompt_batch
    from mmrlvr.rollout.vision import supports_precomputed_vision
    from mmrlvr.train.data import load_split
    from mmrlvr.train.model_path import resolve_model_path

    model, processor = load_policy(resolve_model_path("tiny:qwen2_5_vl:warm"))
    model.eval()
    samples = load_split("synth:count", DataConfig(train_size=2, eval_size=2), "test")[:2]
    params = SamplingParams(max_new_tokens=6, greedy=True)
    clean = HFEngine(model, processor).generate(samples, 2, params, seed=0, step=0)
    wrapped = sv.PerturbedProcessor(processor, "zero", seed=0)
    assert wrapped.tokenizer is processor.tokenizer  # everything but the pixels is the processor's own
    black = HFEngine(model, wrapped).generate(samples, 2, params, seed=0, step=0)
    # the engine's inputs: perturb_vision of the clean pixels, here every pixel black ((0 - mean) / std)
    inputs = encode_prompt_batch(processor, samples)
    expected = perturb_vision({k: inputs[k] for k in ("pixel_values", "image_grid_thw")}, "zero", seed=0,
                              processor=processor)["pixel_values"]
    pv = black.vision["pixel_values"]  # [rows' patches, D]: the 2 prompts' images, each repeated for its 2 rows
    per_prompt = torch.split(expected, inputs["image_grid_thw"].prod(-1).tolist())
    assert torch.equal(pv, torch.cat([p for p in per_prompt for _ in range(2)]))
    layout = PatchLayout.from_processor(processor)
    cells = pv.reshape(pv.shape[0], layout.channels, -1)
    assert torch.allclose(cells, layout.black()[None, :, None].expand_as(cells))
    assert not torch.equal(clean.vision["pixel_values"], pv)
    assert torch.equal(black.input_ids[:, :black.prompt_length], clean.input_ids[:, :clean.prompt_length])
    # the vision features the model generated from differ (the tower ran on the black pixels)
    assert supports_precomputed_vision(model) and clean.image_features is not None
    for c, b in zip(clean.image_features, black.image_features):
        assert c.pooled.shape == b.pooled.shape and not torch.allclose(c.pooled, b.pooled)


# ------------------------------------------------------------------------------------ CLI on a tiny run
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny full fine-tuning run with checkpoints at steps 2 and 4."""
    return train_tiny_run(tmp_path_factory.mktemp("sens") / "run", "max_steps=4", "save_every=2", "log_rollouts=false")


def test_cli_on_a_tiny_run_writes_flip_rates_per_checkpoint(tiny_run):
    res = _cli("analyze", "sensitivity", str(tiny_run), "--limit", "4")
    assert res.returncode == 0, res.stderr[-2000:]
    out = tiny_run / "analysis" / "sensitivity"
    for name in ("results.json", "results.md", "sensitivity.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    n = json.loads((out / "results.json").read_text())
    assert n["prompts"] == 4 and n["perturbations"] == ["gaussian", "zero", "patch_blackout", "blur"]
    assert [c["step"] for c in n["checkpoints"]] == [2, 4]
    for c in n["checkpoints"]:
        assert len(c["answers_clean"]) == 4 and 0.0 <= c["accuracy_clean"] <= 1.0
        for name, p in c["perturbations"].items():
            flips = sum(a != b for a, b in zip(c["answers_clean"], p["answers"]))
            assert p["flips"] == flips and p["flip_rate"] == pytest.approx(flips / 4)
            assert p["accuracy_clean"] == c["accuracy_clean"] and 0.0 <= p["accuracy_perturbed"] <= 1.0
            assert p["accuracy_drop"] == pytest.approx(p["correct_to_wrong"] - p["wrong_to_correct"])
        # a black image shows no shapes: a model that counts from the picture changes some answers
        assert c["perturbations"]["zero"]["flip_rate"] > 0
    assert "flip rate" in (out / "results.md").read_text()
    # the Python function behind it, one checkpoint and one perturbation: the same numbers as the CLI's
    one = sv.analyse(tiny_run, perturbations="zero", steps=[4], limit=4)
    assert [c["step"] for c in one["checkpoints"]] == [4] and list(one["checkpoints"][0]["perturbations"]) == ["zero"]
    assert one["checkpoints"][0]["perturbations"]["zero"] == n["checkpoints"][1]["perturbations"]["zero"]


def test_bad_inputs_exit_2_in_one_line(tiny_run, tmp_path):
    from mmrlvr.errors import UserError

    no_ckpt = tmp_path / "no_ckpt"
    no_ckpt.mkdir()
    shutil.copy2(tiny_run / "config.yaml", no_ckpt / "config.yaml")
    _one_line_exit_2(_cli("analyze", "sensitivity", str(no_ckpt)), "no checkpoints/ folder")
    _one_line_exit_2(_cli("analyze", "sensitivity", str(tiny_run), "--perturbations", "zero,nope"), "nope")
    with pytest.raises(UserError, match="no verified checkpoint at step 3"):
        sv.analyse(tiny_run, steps=[3])
    with pytest.raises(UserError, match="--limit must be at least 1"):
        sv.analyse(tiny_run, limit=0)
