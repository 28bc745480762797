"""`mmrlvr demo` end to end on a short budget: the table, the run directory, the curves PNG."""

from __future__ import annotations

import json

from mmrlvr.config import load_config
from mmrlvr.train.demo import demo_config_dict, format_table, main


def test_embedded_demo_config_turns_on_every_headline_feature():
    cfg = load_config(data=demo_config_dict())
    names = {r.name for r in cfg.rewards}
    assert cfg.credit.scheme == "vepo"
    assert {"consistency", "rubric", "auto_accuracy", "format"} <= names
    assert cfg.model.path.startswith("tiny:")


def test_format_table_shows_only_shared_metrics():
    table = format_table({"k": 8, "greedy_accuracy": 0.4, "avg@8": 0.3, "rubric": 0.2},
                         {"k": 8, "greedy_accuracy": 0.5, "avg@8": 0.45})
    assert "greedy accuracy" in table and "+0.100" in table and "+0.150" in table
    assert "rubric" not in table  # missing after: not shown rather than shown as a fake change


def test_demo_runs_and_writes_table_plots_and_summary(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["--out", str(out), "--steps", "3", "--save-every", "1", "--keep-all", "data.eval_size=8", "eval.k=2",
                 "eval.every=0", "progress=false", "rollout.prompts_per_step=4"]) == 0
    printed = capsys.readouterr().out
    assert "greedy accuracy" in printed and "inconsistency rate" in printed and "rubric score" in printed
    # coverage beside sharpening: pass@k sits next to avg@k and greedy in the closing table
    table = printed[printed.index("metric"):]
    assert "avg@2 accuracy (T=1)" in table and "pass@2" in table
    assert f"run directory: {out}" in printed
    assert (out / "curves.png").stat().st_size > 10_000
    summary = json.loads((out / "summary.json").read_text())
    assert {"before", "after"} <= set(summary)
    assert sorted(p.name for p in (out / "rollouts").glob("step-*.parquet"))[-1] == "step-00000003.parquet"
    # --save-every 1 --keep-all: every checkpoint kept, for mmrlvr analyze
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == [f"step-{k:08d}" for k in (1, 2, 3)]


def test_demo_eval_scales_with_steps():
    from mmrlvr.train.demo import demo_config_dict, demo_eval_size

    cfg = demo_config_dict()
    full_steps, full_size = cfg["max_steps"], cfg["data"]["eval_size"]
    assert demo_eval_size(cfg, None, None, []) is None  # the full demo keeps its 200-prompt table
    assert demo_eval_size(cfg, full_steps, None, []) is None
    assert demo_eval_size(cfg, 3, None, []) == 16  # not 200 x 8 samples twice for a 3-step try
    assert demo_eval_size(cfg, full_steps // 2, None, []) == full_size // 2
    assert demo_eval_size(cfg, 3, 64, []) == 64
    assert demo_eval_size(cfg, 3, None, ["data.eval_size=8"]) is None  # an explicit override is kept


def test_demo_stages_benchmark_sums_each_stage_and_restores_the_pipeline(tmp_path, capsys):
    """``benchmarks/demo_stages.py`` (docs/performance.md, "Where the demo's time goes") on a short run."""
    from pathlib import Path

    from mmrlvr.train.stages.base import Pipeline
    from tests.script_module import load_script

    bench = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "demo_stages.py")
    run = Pipeline.run
    assert bench.main(["--out", str(tmp_path / "d"), "--steps", "2", "data.eval_size=4", "eval.k=2", "eval.every=0",
                       "progress=false", "rollout.prompts_per_step=2"]) == 0
    assert Pipeline.run is run
    lines = capsys.readouterr().out.split("\nstage            seconds\n")[1].splitlines()
    seconds = {line[:16].strip(): float(line[16:]) for line in lines if line.strip()}
    assert {"generate", "score", "update", "record", "evaluation", "whole command"} <= set(seconds)
    assert all(s > 0 for k, s in seconds.items() if k in ("generate", "update", "evaluation"))
    assert sum(s for k, s in seconds.items() if k != "whole command") <= seconds["whole command"]
