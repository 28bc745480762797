"""Seed methods, part 1 (issue 19): each option trains 20 steps on the tiny Qwen2.5-VL.

Small on purpose (2 prompts x group 4, 8 new tokens): the check is that the option runs through the real
trainer for 20 steps with finite losses, moves the trainable weights, and logs its own metrics.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mmrlvr.config import load_config
from mmrlvr.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def config(model_dir: str, out: Path, algo: dict | None = None, **sections) -> dict:
    cfg = {
        "output_dir": str(out), "seed": 0, "max_steps": 20, "save_every": 0, "progress": False,
        "tensorboard": False, "log_rollouts": False,
        "model": {"path": model_dir, "lora": {"enabled": True, "r": 4, "alpha": 8}},
        "data": {"train": "synth:count", "train_size": 16, "eval_size": 4},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 8},
        "algo": {"kl_coef": 0.0, "micro_batch_size": 8, **(algo or {})},
        "optim": {"lr": 1e-3},
        "eval": {"at_start": False, "at_end": False},
        "plugins": [str(ROOT / "tests" / "scripts" / "plugin_rewards.py")],
        "rewards": [{"name": "format", "weight": 0.2}, {"name": "auto_accuracy", "weight": 1.0},
                    {"name": "distinct_tokens", "weight": 1.0}],
    }
    for section, values in sections.items():
        node = cfg.setdefault(section, {})
        for k, v in values.items():
            if isinstance(v, dict) and isinstance(node.get(k), dict):
                node[k].update(v)
            else:
                node[k] = v
    return cfg


def train(cfg: dict) -> tuple[list[dict], dict, dict]:
    from mmrlvr.train.trainer import Trainer

    trainer = Trainer(load_config(data=cfg))
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}
    trainer.train()
    after = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}
    rows = [r for r in read_metrics(Path(cfg["output_dir"]) / "metrics.jsonl") if "loss" in r]
    return rows, before, after


def _check(rows, before, after):
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert all(r.get("skipped", 0) == 0 for r in rows)
    assert any(not torch.equal(before[n], after[n]) for n in before)


@pytest.mark.parametrize("init", ["rlpo", "rlmo", "milora"])
def test_lora_init_trains_20_steps(tiny_dir, tmp_path, init):
    rows, before, after = train(config(tiny_dir, tmp_path / init, model={"lora": {"init": init}}))
    _check(rows, before, after)


def test_acpo_trains_20_steps_and_logs_offpolicy_diagnostics(tiny_dir, tmp_path):
    rows, before, after = train(config(tiny_dir, tmp_path / "acpo", algo={"clip": "acpo", "epochs": 2}))
    _check(rows, before, after)
    # every step: per pi_old bin ratio mean/std and clip shares; the second pass is off-policy
    assert all("offpolicy/ratio_std" in r for r in rows)
    keys = [k for k in rows[-1] if k.startswith("offpolicy/bin")]
    assert any(k.endswith("/ratio_mean") for k in keys) and any(k.endswith("/clip_high") for k in keys)
    assert max(r["offpolicy/ratio_std"] for r in rows) > 0


def test_delta_credit_trains_20_steps(tiny_dir, tmp_path):
    rows, before, after = train(config(tiny_dir, tmp_path / "delta", credit={"scheme": "delta"}))
    _check(rows, before, after)
    assert all("credit/delta_coef_mean" in r for r in rows)


def test_popo_trains_20_steps_and_counts_groups_without_a_positive(tiny_dir, tmp_path):
    # distinct_tokens (plugin) + format give rewards in [0, 2.2]: a threshold of 0.5 makes some rollouts positive
    rows, before, after = train(config(tiny_dir, tmp_path / "popo", algo={"loss": "popo", "loss_params": {"threshold": 0.5}}))
    _check(rows, before, after)
    assert all("popo/groups_without_positive" in r and r["popo/groups"] == 2 for r in rows)
    assert any("popo/sim_loss" in r and r["popo/sim_loss"] != 0 for r in rows)


def test_poise_trains_20_steps_with_group_size_two_and_logs_probe_quality(tiny_dir, tmp_path):
    cfg = config(tiny_dir, tmp_path / "poise", algo={"advantage": "poise"}, rollout={"group_size": 2})
    rows, before, after = train(cfg)
    _check(rows, before, after)
    assert all("poise/probe_mse" in r for r in rows)
    assert any("poise/probe_auc" in r for r in rows)


def test_seed_study_runs_two_arms_resumes_and_plots(tmp_path, capsys):
    """benchmarks/seed_study.py end to end at a toy budget: one row per (arm, seed), the table and plot written,
    and a rerun keeps the finished rows instead of training them again."""
    import json

    from script_module import load_script

    study = load_script(ROOT / "benchmarks" / "seed_study.py")
    out = tmp_path / "study"
    argv = ["--task", "count", "--steps", "1", "--seeds", "0", "--eval-size", "4", "--k", "2", "--arms", "lr0", "grpo",
            "--out", str(out)]
    assert study.main(argv) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [(r["arm"], r["seed"]) for r in rows] == [("lr0", 0), ("grpo", 0)]
    assert all(0.0 <= r["greedy"] <= 1.0 and 0.0 <= r["avg@2"] <= 1.0 for r in rows)
    assert rows[0]["kl_max"] == 0.0  # the lr-0 control never leaves the reference
    table = (out / "results.md").read_text()
    assert "| lr0 | 1 |" in table and "| grpo | 1 |" in table
    assert (out / "results.png").stat().st_size > 1000
    assert "| grpo − lr0 | 1 × 4 |" in table  # the paired comparison, over the 4 held-out prompts
    assert all(len(r["per_prompt"]) == 4 for r in rows)
    capsys.readouterr()
    assert study.main(argv) == 0  # resumed: nothing retrained
    assert "resuming: 2 finished runs" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["results"] == rows
    # the same study run as parallel processes (a folder each) joins into one report
    assert study.main(["--merge", str(out), "--out", str(tmp_path / "joined"), "--k", "2", "--task", "count"]) == 0
    joined = json.loads((tmp_path / "joined" / "results.json").read_text())["results"]
    assert joined == rows and "| grpo − lr0 | 1 × 4 |" in (tmp_path / "joined" / "results.md").read_text()


def test_seed_study_merge_takes_the_parts_settings_and_refuses_different_studies(tmp_path):
    """--merge records (and titles the plot with) the settings its folders ran, not the merging call's defaults,
    and refuses folders from different studies, naming the setting."""
    import json

    import pytest

    from script_module import load_script

    study = load_script(ROOT / "benchmarks" / "seed_study.py")

    def part(name: str, seed: int, **changed) -> str:
        args = {"task": "zoom", "config": "configs/zoom-tiny.yaml", "steps": 100, "lr": 1e-4, "k": 4,
                "eval_size": 3, "train_size": None, "full_control": False, **changed}
        rows = [{"arm": arm, "seed": seed, "steps": 100, "wall_s": 1.0, "train_s": 1.0, "greedy": 0.5, "avg@4": 0.25, "pass@4": 0.5,
                 "kl_mean": 0.0, "kl_max": 0.0, "grad_spikes": 0, "per_prompt": [[1, 1], [0, 0], [1, 2]]}
                for arm in ("lr0", "grpo")]
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"args": args, "results": rows}))
        return str(tmp_path / name)

    a, b = part("a", 6), part("b", 7)
    assert study.main(["--merge", a, b, "--out", str(tmp_path / "joined")]) == 0
    args = json.loads((tmp_path / "joined" / "results.json").read_text())["args"]
    assert (args["task"], args["steps"], args["k"], args["config"]) == ("zoom", 100, 4, "configs/zoom-tiny.yaml")
    assert args["seeds"] == [6, 7] and args["arms"] == ["lr0", "grpo"]
    assert "| grpo − lr0 | 2 × 3 |" in (tmp_path / "joined" / "results.md").read_text()
    other = part("c", 8, config="elsewhere.yaml")
    with pytest.raises(SystemExit, match="config is .*elsewhere.yaml"):
        study.main(["--merge", a, other, "--out", str(tmp_path / "bad")])


def test_seed_study_paired_differences_by_hand():
    """The paired comparison: per prompt, the difference averaged over seeds; SE over prompts and over seeds."""
    import math
    import statistics

    from script_module import load_script

    study = load_script(ROOT / "benchmarks" / "seed_study.py")
    k = 4
    runs = [  # per prompt [greedy, hits of k]: three prompts, two seeds
        {"arm": "lr0", "seed": 0, "per_prompt": [[0, 1], [1, 2], [0, 0]]},
        {"arm": "lr0", "seed": 1, "per_prompt": [[0, 2], [1, 2], [0, 1]]},
        {"arm": "grpo", "seed": 0, "per_prompt": [[1, 3], [1, 2], [0, 0]]},
        {"arm": "grpo", "seed": 1, "per_prompt": [[1, 4], [1, 3], [0, 1]]},
    ]
    d = study.paired(runs, "grpo", "lr0", "avg@4", k)
    # avg@4 differences: seed 0 [2/4, 0, 0], seed 1 [2/4, 1/4, 0] -> per prompt [0.5, 0.125, 0]
    by_prompt = [0.5, 0.125, 0.0]
    assert d["diff"] == pytest.approx(statistics.mean(by_prompt))
    assert d["se_prompt"] == pytest.approx(statistics.stdev(by_prompt) / math.sqrt(3))
    by_seed = [0.5 / 3, 0.75 / 3]
    assert d["se_seed"] == pytest.approx(statistics.stdev(by_seed) / math.sqrt(2))
    assert d["se"] == max(d["se_prompt"], d["se_seed"]) and (d["seeds"], d["prompts"]) == (2, 3)
    g = study.paired(runs, "grpo", "lr0", "greedy", k)
    assert g["diff"] == pytest.approx(1 / 3)  # prompt 1 greedy flips right in both seeds
    p = study.paired(runs, "grpo", "lr0", "pass@4", k)
    assert p["diff"] == pytest.approx(0.0)  # the same prompts have a hit in both arms
