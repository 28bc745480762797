"""heldout_accuracy(): judge table, metric arithmetic on a scripted engine, sane values on a real tiny model."""

from __future__ import annotations

import pytest
import torch

from mmrlvr.data import make_rows, rows_to_samples
from mmrlvr.evaluation import heldout_accuracy, normalise_answer, r1_judge
from mmrlvr.models import build_tiny, load_policy
from mmrlvr.rollout.base import RolloutBatch, SamplingParams
from mmrlvr.rollout.hf import HFEngine
from mmrlvr.types import Completion, Sample
from scripted_engine import ScriptedEngine  # noqa: E402  (tests/ is on sys.path under pytest)


def _sample(answer: str, sid: str = "s") -> Sample:
    return Sample(id=sid, messages=[{"role": "user", "content": "q"}], images=[], answer=answer)


@pytest.mark.parametrize("text, answer, expected", [
    ("<think>I see 2 red.</think><answer>2</answer>", "2", (True, True)),
    ("<think>x</think>\n<answer> 2.0 </answer>\n", "2", (True, True)),
    ("<think>x</think><answer>Red.</answer>", "red", (True, True)),
    ("<think>x</think><answer>[12,30, 56 ,80]</answer>", "[12, 30, 56, 80]", (True, True)),
    ("<think>x</think><answer>3</answer>", "2", (False, True)),
    ("<answer>2</answer>", "2", (False, False)),  # no thinking
    ("<think>x</think><answer>2</answer> extra", "2", (False, False)),  # text after the answer
    ("<think>x<answer>2</answer>", "2", (False, False)),  # unclosed think
    ("", "2", (False, False)),
])
def test_r1_judge_table(text, answer, expected):
    assert r1_judge(text, _sample(answer)) == expected


def test_normalise_answer():
    assert normalise_answer("  Left ") == "left"
    assert normalise_answer("7.50") == "7.5"
    assert normalise_answer("x y") == "x y"


def test_metric_arithmetic():
    ok, bad, unformatted = "<think>t</think><answer>1</answer>", "<think>t</think><answer>0</answer>", "1"
    engine = ScriptedEngine(
        greedy={"a": ok, "b": bad},
        sampled={"a": [ok, ok, bad, unformatted], "b": [bad, bad, bad, bad]},
    )
    samples = [_sample("1", "a"), _sample("1", "b")]
    m = heldout_accuracy(engine, samples, k=4, batch_size=4, progress=False)
    # greedy: a right, b wrong -> 1/2. avg@4: a 2/4, b 0/4 -> (0.5 + 0) / 2 = 0.25
    # pass@4: a yes, b no -> 0.5. format: a 3/4, b 4/4 -> (0.75 + 1) / 2 = 0.875
    assert m == {"n": 2, "k": 4, "greedy_accuracy": 0.5, "greedy_format_rate": 1.0, "avg@4": 0.25,
                 "pass@4": 0.5, "format_rate": 0.875}
    # per prompt (what a paired comparison of two runs needs): a greedy right with 2 of 4, b wrong with 0 of 4
    per = heldout_accuracy(engine, samples, k=4, batch_size=4, progress=False, per_prompt=True)["per_prompt"]
    assert per == [{"id": "a", "greedy": 1, "hits": 2}, {"id": "b", "greedy": 0, "hits": 0}]


def test_custom_judge_and_k_zero():
    engine = ScriptedEngine(greedy={"a": "anything"}, sampled={})
    m = heldout_accuracy(engine, [_sample("1", "a")], k=0, judge=lambda text, s: (True, False), progress=False)
    assert m == {"n": 1, "k": 0, "greedy_accuracy": 1.0, "greedy_format_rate": 0.0}


def test_evaluate_on_a_tiny_model(tmp_path):
    model, processor = load_policy(build_tiny("qwen2_5_vl", tmp_path / "m", seed=0))
    samples = rows_to_samples(make_rows("count", "test", 4, seed=0))
    m = heldout_accuracy(HFEngine(model, processor), samples, k=2, max_new_tokens=8, batch_size=4, progress=False)
    assert m["n"] == 4 and m["k"] == 2
    for key in ("greedy_accuracy", "greedy_format_rate", "avg@2", "pass@2", "format_rate"):
        assert 0.0 <= m[key] <= 1.0
    # an untrained model does not write "<think>...</think><answer>...</answer>" in 8 tokens
    assert m["format_rate"] == 0.0 and m["pass@2"] == 0.0


# ------------------------------------------------------------------------------ mmrlvr eval RUN_DIR
@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """A LoRA run from a briefly warm-started tiny VLM (it writes the format, so eval numbers are not all 0),
    with the trainer's own final evaluation in metrics.jsonl."""
    from mmrlvr.models.warmstart import warm_start
    from mmrlvr.train.trainer import Trainer
    from mmrlvr.config import load_config

    root = tmp_path_factory.mktemp("evalrun")
    warm = root / "warm"
    warm_start(warm, steps=40, eval_every=1000, n_train=256, n_val=4, n_test=4, k=1, batch_size=16, stop_at=None,
               lr=3e-3, progress=False)
    run = root / "run"
    cfg = {"output_dir": str(run), "seed": 3, "max_steps": 1, "save_every": 0, "progress": False,
           "tensorboard": False, "log_rollouts": False,
           "model": {"path": str(warm), "lora": {"enabled": True, "r": 4, "alpha": 8}},
           "data": {"train": "synth:count", "eval": "synth:count", "train_size": 16, "eval_size": 12},
           "rollout": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 30},
           "optim": {"lr": 1e-2},
           "eval": {"at_start": False, "at_end": True, "k": 3, "temperature": 0.9, "limit": 10}}
    summary = Trainer(load_config(data=cfg)).train()
    return run, summary["after"]


def _eval_cli(args: list[str], tmp_path) -> dict:
    import json

    from mmrlvr.cli import main

    out = tmp_path / "result.json"
    assert main(["eval", *args, "--no-progress", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_eval_run_dir_reproduces_the_runs_final_eval_exactly(evaluated_run, tmp_path):
    from mmrlvr.train.metrics import read_metrics

    run, after = evaluated_run
    assert after["format_rate"] > 0 and after["n"] == 10 and after["k"] == 3  # run's eval.limit and eval.k
    # each prompt's outcome, in the run folder; they add up to the logged means
    import json

    per = [json.loads(line) for line in (run / "eval" / "step_000001.jsonl").read_text().splitlines()]
    assert len(per) == 10 and all(p["k"] == 3 for p in per)
    assert sum(p["greedy"] for p in per) / 10 == after["greedy_accuracy"]
    assert sum(p["hits"] for p in per) / 30 == pytest.approx(after["avg@3"])
    assert sum(p["hits"] > 0 for p in per) / 10 == after["pass@3"]
    logged = [r for r in read_metrics(run / "metrics.jsonl") if "eval/greedy_accuracy" in r][-1]
    got = _eval_cli([str(run)], tmp_path)
    for key, value in after.items():
        assert got[key] == value, key
        assert logged[f"eval/{key}"] == value, key
    # the checkpoint folder itself gives the same numbers
    got_ckpt = _eval_cli([str(run / "checkpoints" / "step-00000001")], tmp_path)
    assert {k: got_ckpt[k] for k in after} == after
    # a flag overrides one setting; everything else stays the run's
    one = _eval_cli([str(run), "--k", "1"], tmp_path)
    assert one["k"] == 1 and "avg@1" in one and one["n"] == 10
    assert one["greedy_accuracy"] == after["greedy_accuracy"]
    # past the run's synthetic held-out set (eval_size 12): more rows of the same split, the run's own first
    more = _eval_cli([str(run), "--k", "1", "--limit", "16"], tmp_path)
    assert more["n"] == 16


def test_eval_accepts_an_export_folder(evaluated_run, tmp_path):
    from mmrlvr.cli import main

    run, after = evaluated_run
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out)]) == 0
    got = _eval_cli([str(out), "--k", "0"], tmp_path)  # the run's data and max_new_tokens via mmrlvr_export.json
    assert got["n"] == 10 and got["greedy_accuracy"] == after["greedy_accuracy"]


def test_eval_old_form_model_and_data_still_works(tmp_path):
    tiny = build_tiny("qwen2_5_vl", tmp_path / "m", seed=0)
    got = _eval_cli(["--model", str(tiny), "--data", "synth:count", "--limit", "2", "--k", "1",
                     "--max-new-tokens", "4"], tmp_path)
    assert got["n"] == 2 and got["k"] == 1 and "avg@1" in got


def test_eval_limit_past_a_files_rows_evaluates_them_all_and_says_so(tmp_path, capsys):
    import json

    from PIL import Image

    tiny = build_tiny("qwen2_5_vl", tmp_path / "m", seed=0)
    Image.new("RGB", (56, 56), (200, 30, 30)).save(tmp_path / "red.png")
    (tmp_path / "three.jsonl").write_text("".join(
        json.dumps({"question": "<image>How many red squares?", "answer": "1", "image": "red.png"}) + "\n"
        for _ in range(3)))
    got = _eval_cli(["--model", str(tiny), "--data", str(tmp_path / "three.jsonl"), "--limit", "5", "--k", "1",
                     "--max-new-tokens", "4"], tmp_path)
    assert got["n"] == 3
    assert "warning: --limit 5, but" in capsys.readouterr().err
    _eval_cli(["--model", str(tiny), "--data", str(tmp_path / "three.jsonl"), "--limit", "3", "--k", "1",
               "--max-new-tokens", "4"], tmp_path)
    assert "warning" not in capsys.readouterr().err  # exactly the file's rows: nothing to say


def test_eval_errors_are_one_line(tmp_path, capsys):
    from mmrlvr.cli import main

    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    tiny = build_tiny("qwen2_5_vl", tmp_path / "m", seed=0)
    assert main(["eval", str(tiny)]) == 2  # a bare model folder needs --data
    assert "--data" in capsys.readouterr().err
