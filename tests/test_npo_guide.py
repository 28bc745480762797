"""NPO near-future guides (``rollout.guide``): only groups below the gate get a guide slot, the slot is a
verified-correct response of the later checkpoint, its π_old is the current policy's (checked against an independent
recompute), other groups are untouched; 20 steps with an exact resume; the config checks; two ranks (matrix)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from analysis_helpers import assert_same_final_state, cli, interrupted_copy, train_tiny_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def guide_ckpt(tmp_path_factory) -> Path:
    """A later checkpoint of a tiny run: 4 steps at a higher learning rate."""
    run = train_tiny_run(tmp_path_factory.mktemp("ahead") / "run", "max_steps=4", "save_every=0", "optim.lr=3e-4",
                         "log_rollouts=false")
    return run / "checkpoints" / "step-00000004"


def test_only_groups_below_the_gate_get_a_verified_guide_with_the_policys_old_logprobs(tmp_path, guide_ckpt):
    from mmrlvr.config import load_config
    from mmrlvr.rewards.combine import answer_judge
    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.train.stages.shape import NearFutureGuide, row_accuracy
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", overrides=[
        f"output_dir={tmp_path}/run", "max_steps=1", "rollout.prompts_per_step=6", "rollout.group_size=4",
        "rollout.max_new_tokens=24", "data.train_size=12", "eval.at_start=false", "eval.at_end=false",
        "eval.every=0", "progress=false", "save_every=0", "log_rollouts=false", "tensorboard=false",
        f"rollout.guide={{from: {guide_ckpt}, gate: 0.6, tries: 8}}"])
    trainer = Trainer(cfg)
    pipe = trainer.rt.pipeline
    stage = next(s for s in pipe.all_stages() if isinstance(s, NearFutureGuide))
    b = pipe.run(0, stop_before=stage)
    acc = row_accuracy(b)
    spans = b.rollouts.group_slices()
    before = {i: (b.rollouts.response_ids[s].clone(), float(acc[s].mean())) for i, s in enumerate(spans)}
    stage(b)
    r = b.rollouts
    guided = [i for i in range(r.num_rows) if r.completions[i].meta.get("guide")]
    gated = [g for g, (_, a) in before.items() if a < 0.6]
    assert gated and guided, "the draw should gate and guide at least one group"
    for g, span in enumerate(spans):
        rows = [i for i in guided if span.start <= i < span.stop]
        if before[g][1] >= 0.6:  # a group at or above the gate is untouched
            assert not rows
            L = before[g][0].shape[1]
            assert torch.equal(r.response_ids[span, :L], before[g][0])
            continue
        assert len(rows) <= 1  # one slot at most
        for i in rows:
            sample = r.samples[i]
            assert answer_judge(r.completions[i], sample)[0]  # verified correct
            # the slot is one of the guide's own samples for this prompt (seeded: regenerated identically)
            params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature)
            tries = stage.engine.generate([sample], 8, params, seed=cfg.seed, step=0 + stage.GUIDE_KEY)
            n = int(r.response_mask[i].sum())
            assert any(torch.equal(tries.response_ids[j, :n], r.response_ids[i, :n]) and
                       int(tries.response_mask[j].sum()) == n for j in range(8))
            # pi_old of the guide's tokens: an independent recompute with the policy, full logits, log-softmax
            P = r.prompt_length
            with torch.no_grad():
                inputs = {"input_ids": r.input_ids[i:i + 1], "attention_mask": r.attention_mask[i:i + 1],
                          **{k: v for k, v in trainer.rt.inputs(r, None, b.images_per_row, slice(i, i + 1)).items()
                             if k not in ("input_ids", "attention_mask")}}
                logits = trainer.rt.policy(**inputs, use_cache=False).logits[0, P - 1:P - 1 + n].float()
                expect = torch.log_softmax(logits / cfg.rollout.temperature, -1).gather(
                    -1, r.response_ids[i, :n, None])[:, 0]
            torch.testing.assert_close(r.old_logprobs[i, :n], expect, rtol=1e-4, atol=1e-4)
            assert float(r.old_logprobs[i, n:].abs().sum()) == 0.0
            assert b.results[i].score > 0  # scored again as a right answer
    d = b.diagnostics
    assert d["npo/groups_gated"] == len(gated) and d["npo/groups_guided"] == len(guided)
    assert d["npo/group_accuracy_after"] > d["npo/group_accuracy_before"]
    # a guide response longer than every sampled one widens the batch (ids, masks, per-token vision entries and
    # the vision cache's copies of them); its pi_old is still the policy's
    from mmrlvr.types import Completion

    i, L = guided[0], r.response_ids.shape[1]
    longer = torch.cat([r.response_ids[i, :int(r.response_mask[i].sum()) - 1],
                        torch.full((L,), int(r.response_ids[i, 0])), r.response_ids[i, int(r.response_mask[i].sum()) - 1:
                                                                                        int(r.response_mask[i].sum())]])
    stage.place(b, i, longer, Completion("long"))
    n = len(longer)
    assert r.response_ids.shape[1] == n and r.input_ids.shape[1] == r.prompt_length + n
    if "mm_token_type_ids" in r.vision:  # the processor's per-token entry (transformers 5's Qwen processors)
        assert r.vision["mm_token_type_ids"].shape[1] == r.prompt_length + n
    with torch.no_grad():
        inputs = trainer.rt.inputs(r, b.vision, b.images_per_row, slice(i, i + 1))
        P = r.prompt_length
        logits = trainer.rt.policy(**inputs, use_cache=False).logits[0, P - 1:P - 1 + n].float()
        expect = torch.log_softmax(logits, -1).gather(-1, r.response_ids[i, :n, None])[:, 0]
    torch.testing.assert_close(r.old_logprobs[i, :n], expect, rtol=1e-4, atol=1e-4)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"reward/mean"' in ln]


def test_guide_trains_20_steps_and_resumes_exactly(tmp_path, guide_ckpt):
    opts = [f"rollout.guide={{from: {guide_ckpt}}}", "save_every=10"]
    straight = _metrics(train_tiny_run(tmp_path / "a", "max_steps=20", *opts))
    interrupted_copy(tmp_path / "a", tmp_path / "b", 10)
    resumed = _metrics(train_tiny_run(tmp_path / "b", "max_steps=20", "--resume", *opts))
    clean = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in straight[10:]]
    assert clean == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed[-10:]]
    assert sum(r.get("npo/groups_guided", 0) for r in straight) > 0
    assert_same_final_state(tmp_path / "a", tmp_path / "b")
    # the inspector's records mark the guide slot
    from mmrlvr.store.reader import RolloutReader

    reader = RolloutReader(tmp_path / "a")
    step = next(r["step"] for r in straight if r.get("npo/groups_guided", 0) > 0)
    recs = [rec for rec in reader.read_step(step) if (rec.extra or {}).get("guide")]
    assert recs and all(rec.extra["guide"]["from"] == str(guide_ckpt) for rec in recs)
    from mmrlvr.inspector.views import group_cards_html

    group = reader.group(recs[0].step, recs[0].prompt_id)
    assert 'class="mm-guide"' in group_cards_html(group)


def test_guide_config_problems(tmp_path, guide_ckpt):
    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", f"output_dir={tmp_path}/r",
              f"rollout.guide={{from: {tmp_path}/nowhere, gate: 1.5, tries: 0, delat: 3}}")
    assert res.returncode == 2
    for text in ("is not a checkpoint folder", "rollout.guide.gate", "rollout.guide.tries", "unknown key(s) delat"):
        assert text in res.stderr, res.stderr
    # the run's own checkpoint as its guide, with pruning on: refused (a resumed run needs it again)
    own = guide_ckpt.parent.parent
    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={own}", "--resume",
              f"rollout.guide={{from: {guide_ckpt}}}", "keep_checkpoints=3")
    assert res.returncode == 2 and "keep_checkpoints=3 would prune it" in res.stderr, res.stderr
    ok = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={own}", "--resume",
             f"rollout.guide={{from: {guide_ckpt}}}", "keep_checkpoints=0")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.matrix
def test_guide_on_two_ranks_trains_what_one_process_trains(tmp_path, guide_ckpt):
    from multiproc import assert_two_ranks_train_what_one_process_trains

    two = assert_two_ranks_train_what_one_process_trains(tmp_path, f"rollout.guide={{from: {guide_ckpt}}}")
    assert sum(r.get("npo/groups_guided", 0) for r in _metrics(two)) > 0


def test_automatic_guide_runs_the_same_run_delta_steps_ahead_and_resumes_exactly(tmp_path):
    """``from: auto``: a second process trains the run without guides into RUN_DIR/guide_run; at step t the guide
    is its checkpoint t + delta (the records name it), and a resumed guided run equals an uninterrupted one."""
    opts = ["rollout.guide={from: auto, delta: 2, gate: 1.0}", "save_every=4", "keep_checkpoints=0"]
    straight = _metrics(train_tiny_run(tmp_path / "a", "max_steps=8", *opts))
    ahead = tmp_path / "a" / "guide_run" / "checkpoints"
    assert sorted(p.name for p in ahead.iterdir()) == [f"step-{k:08d}" for k in range(1, 9)]
    assert sum(r.get("npo/groups_guided", 0) for r in straight) > 0
    from mmrlvr.store.reader import RolloutReader

    reader = RolloutReader(tmp_path / "a")
    for row in straight:
        step = row["step"]  # updates done after this step; the step itself ran after step - 1 updates
        for rec in reader.read_step(step):
            if (rec.extra or {}).get("guide"):
                assert rec.extra["guide"]["from"] == str(ahead / f"step-{min(step - 1 + 2, 8):08d}")
    train_tiny_run(tmp_path / "b", "max_steps=4", *opts)
    resumed = _metrics(train_tiny_run(tmp_path / "b", "max_steps=8", "--resume", *opts))
    clean = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in straight[4:]]
    assert clean == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed[-4:]]
    assert_same_final_state(tmp_path / "a", tmp_path / "b")
