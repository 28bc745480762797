"""Stages are chosen by name, validated early, and extended from outside the package (docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmrlvr.config import load_config
from mmrlvr.metric import Metric

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "median_advantage.py"
QUICK = ["max_steps=2", "save_every=0", "eval.every=0", "eval.at_start=false", "eval.at_end=false",
         "rollout.prompts_per_step=2", "rollout.group_size=4", "data.train_size=16", "progress=false",
         "log_rollouts=false"]


def test_auto_selection_follows_the_config():
    from mmrlvr.train.stages import select_stages

    s = select_stages(load_config(ROOT / "configs" / "demo-tiny.yaml"))
    assert s["credit"] == ["none"] and s["reference"] == ["frozen"] and s["shape"] == ["drop_unscored"]
    s = select_stages(load_config(ROOT / "configs" / "demo-tiny.yaml", ["algo.preset=dapo"]))
    # dapo preset: overlong shaping + dynamic sampling (after rows a reward could not score leave the batch)
    assert s["shape"] == ["drop_unscored", "overlong", "dynamic_sampling"]
    s = select_stages(load_config(ROOT / "configs" / "demo-tiny.yaml", ["algo.epochs=2"]))
    assert s["reference"] == ["old_policy", "frozen"]  # pi_old recomputed for several epochs, then pi_ref
    s = select_stages(load_config(ROOT / "configs" / "credit-vepo-tiny.yaml", ["credit.scheme=vppo"]))
    assert s["credit"] == ["separate"]
    s = select_stages(load_config(ROOT / "configs" / "consistency-tiny.yaml", ["consistency.split_advantage=true"]))
    assert s["advantages"] == ["consistency_split"]


def test_explicit_stage_names_are_checked():
    from mmrlvr.registry import RegistryError
    from mmrlvr.train.stages import select_stages, validate_stages

    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", ["stages.credit=separat"])
    with pytest.raises(RegistryError, match="unknown credit stage 'separat'.*separate"):
        select_stages(cfg)
    assert validate_stages(cfg) and "separat" in validate_stages(cfg)[0]
    from mmrlvr.validation import method_problems  # method names: checked once plug-ins are loaded

    bad = load_config(ROOT / "configs" / "demo-tiny.yaml", ["algo.advantage=nope"])
    assert any("algo.advantage" in p and "nope" in p for p in method_problems(bad, "config"))


def test_a_registered_stage_runs_in_its_slot(tmp_path):
    """A new shape stage registered from outside runs between score and advantages and sees the rewards."""
    from mmrlvr.train.stages import STAGES, Stage, register_stage
    from mmrlvr.train.trainer import Trainer

    seen = {}
    if "test_double" not in STAGES["shape"]:
        @register_stage("shape", "test_double")
        class Double(Stage):
            @classmethod
            def when(cls, cfg):
                return False  # only when named

            def __call__(self, b):
                seen["before"] = b.rewards.clone()
                b.rewards = 2 * b.rewards
                b.diagnostics["test/doubled"] = Metric.same(1.0)

    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml",
                      [f"output_dir={tmp_path}", *QUICK, "max_steps=1", "stages.shape=[test_double]"])
    t = Trainer(cfg)
    assert t.pipeline.names["shape"] == ["drop_unscored", "test_double"]  # an explicit list extends the automatic one
    b = t.pipeline.run(0, upto="advantages")
    torch.testing.assert_close(b.rewards, 2 * seen["before"])
    assert t.run_step(0)["test/doubled"] == 1.0


def test_documented_plugin_example_trains(tmp_path):
    """The plug-in of docs/architecture.md: registered from its file, configured by name, two steps trained."""
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml",
                      [f"output_dir={tmp_path}", *QUICK, f"plugins=[{EXAMPLE}]", "algo.advantage=group_median"])
    t = Trainer(cfg)
    b = t.pipeline.run(0, upto="advantages")
    # the formula by hand: A_i = r_i - median(r of its group) (torch.median: lower middle of an even group)
    for g in range(2):
        r = b.rewards[g * 4:(g + 1) * 4]
        med = sorted(r.tolist())[1]
        torch.testing.assert_close(b.advantages[g * 4:(g + 1) * 4], r - med)
    summary = t.train()
    assert summary["skipped_steps"] == 0 and summary["last"]["loss"] is not None


def test_a_stage_adds_per_row_fields_to_the_rollout_records(tmp_path):
    """``batch.record_fields``: one value per row, carried into each RolloutRecord's ``extra``."""
    from mmrlvr.store.reader import RolloutReader
    from mmrlvr.train.stages import STAGES, Stage, register_stage
    from mmrlvr.train.trainer import Trainer

    if "test_row_field" not in STAGES["shape"]:
        @register_stage("shape", "test_row_field", priority=-5)
        class RowField(Stage):
            @classmethod
            def when(cls, cfg):
                return False  # only when named

            def __call__(self, b):
                b.record_fields["test_len"] = [int(n) for n in b.rollouts.response_mask.sum(dim=1)]

    quick = [q for q in QUICK if q != "log_rollouts=false"]
    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml",
                      [f"output_dir={tmp_path}", *quick, "max_steps=1", "log_rollouts=true",
                       "stages.shape=[test_row_field]"])
    t = Trainer(cfg)
    t.train()
    reader = RolloutReader(tmp_path)
    recs = reader.records(reader.index)
    assert len(recs) == 2 * 4
    assert all(r.extra["test_len"] == len(r.response_token_ids) for r in recs)
