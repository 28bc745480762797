"""TTRL's vote/train split: ``votes`` on ``majority_vote`` / ``cocov`` (arXiv 2504.16084; the official code votes over
64 samples per prompt and trains on the first 32 of them).

The generate stage samples ``votes`` responses per prompt, the reward votes the pseudo-label over all of them and
scores every row against it, and the ``vote_split`` shape stage keeps ``rollout.group_size`` rows per prompt — the
others leave the batch. ``votes: 0`` is today's behaviour, value for value."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from analysis_helpers import FAST_RUN, cli, interrupted_copy, one_line_exit_2, train_tiny_run
from mmrlvr.config import load_config
from mmrlvr.types import Completion, Sample

ROOT = Path(__file__).resolve().parents[1]
VOTES = ["rewards.1.name=majority_vote", "rewards.1.params={votes: 8}"]


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if "loss" in r]


# ------------------------------------------------------------------------------------------------ by hand
def _rows(answers: list[list[str | None]], lengths: list[list[int]]):
    """A scored-batch stand-in: prompt p's rows answer ``answers[p]`` with responses of ``lengths[p]`` tokens
    (P = 2 prompt tokens, no images)."""
    from mmrlvr.rollout.base import RolloutBatch

    samples = [Sample(id=f"p{p}", messages=[], images=[], answer="7", answer_type="number")
               for p in range(len(answers))]
    flat = [(p, j, a, n) for p, group in enumerate(answers) for j, (a, n) in enumerate(zip(group, lengths[p]))]
    L, P = max(n for *_, n in flat), 2
    mask = torch.tensor([[1.0] * n + [0.0] * (L - n) for *_, n in flat])
    ids = torch.where(mask > 0, torch.full(mask.shape, 5), torch.zeros(mask.shape, dtype=torch.long))
    return RolloutBatch(
        samples=[samples[p] for p, *_ in flat], group_index=torch.tensor([p for p, *_ in flat]),
        sample_index=torch.tensor([j for _, j, *_ in flat]),
        input_ids=torch.cat([torch.full((len(flat), P), 3), ids], dim=1),
        attention_mask=torch.cat([torch.ones(len(flat), P, dtype=torch.long), mask.long()], dim=1),
        response_ids=ids, response_mask=mask, old_logprobs=-mask, vision={}, prompt_length=P,
        completions=[Completion("<think>t</think>" + (f"<answer>{a}</answer>" if a is not None else ""))
                     for _, _, a, _ in flat])


def _runtime(overrides: list[str]):
    from mmrlvr.rewards.base import build_reward

    cfg = load_config(ROOT / "configs/demo-tiny.yaml", ["rollout.group_size=4", *overrides])
    reward = build_reward("majority_vote", votes=8)
    return SimpleNamespace(cfg=cfg, reward=reward, reward_fns=lambda: [reward], data_reports=[], vision_start_id=-1,
                           processor=SimpleNamespace(pad_token_id=0), policy=None,
                           accel=SimpleNamespace(num_processes=1, process_index=0))


def _majority(answers: list[str | None]) -> str:
    """The most common parsable answer, the first to appear among equals (the reward's tie rule)."""
    counts = Counter(a for a in answers if a is not None)
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def test_the_trained_rows_are_scored_against_the_majority_of_every_vote():
    """Two prompts, 8 votes each, 4 train (the first 4, as TTRL's code keeps). Prompt 0: the first 4 say 1, 1, 1, 2
    — their own majority is 1 — but over all 8 votes 2 wins (4 to 3), so the trained rows score [0, 0, 0, 1], not
    [1, 1, 1, 0]. Prompt 1: 3 leads in the first 4 (2 of them) and over the 8 (4 of 8). The dropped rows leave the
    batch, and so does the response width only they used (a dropped row is the longest)."""
    from mmrlvr.train.batch import StepBatch
    from mmrlvr.train.stages.score import Rewards
    from mmrlvr.train.stages.shape import VoteSplit

    answers = [["1", "1", "1", "2", "2", "2", "2", "3"], ["3", "0", "3", None, "3", "0", "3", "1"]]
    lengths = [[3, 4, 5, 6, 9, 3, 3, 3], [2, 2, 2, 2, 2, 2, 2, 7]]
    rt = _runtime(VOTES)
    b = StepBatch(step=0)
    b.rollouts = _rows(answers, lengths)
    b.token_weights = b.rollouts.response_mask.clone()
    Rewards(rt)(b)
    assert b.reward_metrics["majority/votes"] == 8.0  # the vote was over all 8
    VoteSplit(rt)(b)

    expected = []
    for group in answers:
        label = _majority(group)
        expected += [float(a == label) for a in group[:4]]
    assert expected == [0, 0, 0, 1, 1, 0, 1, 0]
    own = [float(a == _majority(answers[0][:4])) for a in answers[0][:4]]
    assert own == [1, 1, 1, 0] and own != expected[:4]  # a vote over the trained rows alone: the other label
    assert [r.score for r in b.results] == expected and b.rewards.tolist() == expected
    assert [r.parsed["pseudo_label"] for r in b.results] == ["2"] * 4 + ["3"] * 4
    assert b.rollouts.num_rows == 8 and b.rollouts.group_index.tolist() == [0] * 4 + [1] * 4
    assert b.rollouts.sample_index.tolist() == [0, 1, 2, 3] * 2
    assert [s.id for s in b.samples] == ["p0", "p1"]
    # width: the kept rows' longest response (6 tokens), not the dropped rows' (9)
    assert b.rollouts.response_ids.shape[1] == 6 and b.token_weights.shape == (8, 6)
    assert b.rollouts.input_ids.shape[1] == 2 + 6
    assert b.token_weights.sum(dim=1).tolist() == [3, 4, 5, 6, 2, 2, 2, 2]
    # what the step generated stays for the sampler: all 8 votes of each prompt, as scored
    (generated,) = b.generated_rounds()
    assert generated.rollouts.num_rows == 16 and len(generated.rewards) == 16


def test_the_sampler_observes_every_vote():
    from mmrlvr.train.batch import StepBatch
    from mmrlvr.train.samplers import Sampler
    from mmrlvr.train.stages.generate import FlatGroups
    from mmrlvr.train.stages.score import Rewards
    from mmrlvr.train.stages.shape import VoteSplit

    class Recorder(Sampler):
        def __init__(self):
            self.seen = []

        def observe(self, outcome):
            self.seen.append(outcome)

    answers = [["1", "1", "1", "2", "2", "2", "2", "3"]]
    rt = _runtime(VOTES)
    b = StepBatch(step=0)
    b.rollouts = _rows(answers, [[3] * 8])
    b.token_weights = b.rollouts.response_mask.clone()
    Rewards(rt)(b)
    VoteSplit(rt)(b)
    gen = FlatGroups.__new__(FlatGroups)  # the real after_step, without a model behind the stage
    gen.rt, gen.cfg, gen.sampler = rt, rt.cfg, Recorder()
    gen._index = {id(b.rollouts.samples[0]): 5}
    gen.after_step(b)
    (seen,) = gen.sampler.seen
    assert seen.prompts == [5] and seen.rewards == [[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]]
    assert seen.answers == [answers[0]]


def test_dynamic_sampling_refills_from_split_rounds_and_the_sampler_sees_every_vote():
    """votes=8, G=4, dynamic sampling on accuracy (gold 7). Round 0: prompt 0's first 4 rows vary (kept), prompt
    1's do not (dropped; its dropped votes hold a 7, which must not matter: the filter sees the trained rows).
    The refill round (the earlier stages again, the split included) brings a prompt whose first 4 vary. The step
    trains 2 x 4 rows; the sampler observes all 4 generated groups with their 8 votes each."""
    from mmrlvr.train.batch import StepBatch
    from mmrlvr.train.samplers import Sampler
    from mmrlvr.train.stages.generate import FlatGroups
    from mmrlvr.train.stages.score import Rewards
    from mmrlvr.train.stages.shape import DynamicSampling, VoteSplit

    rounds = {0: [["7", "1", "7", "7", "1", "1", "1", "1"], ["2", "2", "2", "2", "7", "7", "7", "7"]],
              1: [["7", "2", "2", "2", "2", "2", "2", "2"], ["3", "3", "3", "3", "3", "3", "3", "3"]]}
    rt = _runtime([*VOTES, "algo.dynamic_sampling=true"])

    def earlier_stages(step, round=0, stop_before=None):
        b = StepBatch(step=step, round=round)
        b.rollouts = _rows(rounds[round], [[3] * 8, [3] * 8])
        b.token_weights = b.rollouts.response_mask.clone()
        Rewards(rt)(b)
        VoteSplit(rt)(b)
        return b

    rt.pipeline, rt.any_rank = SimpleNamespace(run=earlier_stages), lambda flag: flag
    b = earlier_stages(0)
    DynamicSampling(rt)(b)
    assert b.diagnostics["dynamic_sampling/rounds"] == 2.0 and b.diagnostics["dynamic_sampling/kept_groups"] == 2
    assert b.rollouts.num_rows == 8 and b.row_mask.all()
    assert [r.parsed["answer"] for r in b.results] == ["7", "1", "7", "7", "7", "2", "2", "2"]
    generated = b.generated_rounds()
    assert [g.rollouts.num_rows for g in generated] == [16, 16]  # every vote of both rounds

    class Recorder(Sampler):
        def __init__(self):
            self.seen = []

        def observe(self, outcome):
            self.seen.append(outcome)

    gen = FlatGroups.__new__(FlatGroups)
    gen.rt, gen.cfg, gen.sampler, gen._index = rt, rt.cfg, Recorder(), {}
    gen.after_step(b)
    (seen,) = gen.sampler.seen
    assert seen.answers == rounds[0] + rounds[1] and [len(r) for r in seen.rewards] == [8, 8, 8, 8]


def test_a_nested_or_foreign_group_of_another_size_is_refused():
    from mmrlvr.errors import UserError
    from mmrlvr.rewards.base import build_reward, score_batch

    fn = build_reward("majority_vote", votes=8)
    rows = _rows([["1", "2", "1", "1"]], [[2] * 4])
    with pytest.raises(UserError, match="votes=8 but a group of 4 rows"):
        score_batch(fn, rows.completions, rows.samples, group_index=[0] * 4)
    assert build_reward("cocov", votes=8).votes == 8  # CoCoV takes it too


# --------------------------------------------------------------------------------- two steps and a resume
def test_two_steps_train_group_size_rows_and_resume_exactly(tmp_path):
    """votes=8, group_size=4, 2 prompts a step: 16 samples generated, 8 rows trained (records and metrics), the
    vote over 8; the run killed after step 1 and resumed equals the straight run (metrics, parameters, the
    disagreement sampler's state, which it learned from every vote)."""
    from analysis_helpers import assert_same_final_state
    from mmrlvr.store.reader import RolloutReader

    args = ["max_steps=2", "save_every=1", "rollout.sampler=disagreement", *VOTES]
    straight = train_tiny_run(tmp_path / "a", *args)
    interrupted_copy(straight, tmp_path / "b", 1)
    res = cli("train", "configs/demo-tiny.yaml", f"output_dir={tmp_path / 'b'}", "--resume", *FAST_RUN, *args)
    assert res.returncode == 0, res.stderr[-2000:]
    a, b = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
    assert [r["step"] for r in a] == [1, 2] and a == b[-2:]
    assert_same_final_state(tmp_path / "a", tmp_path / "b")
    for r in a:
        assert r["majority/votes"] == 8.0
        assert r["rollout/samples"] == 16.0  # generated: 2 prompts x 8 votes
        assert r["group_size/mean"] == r["group_size/max"] == 4.0  # trained: 4 per prompt
    reader = RolloutReader(tmp_path / "a")
    for step in (1, 2):
        recs = reader.read_step(step)
        assert len(recs) == 2 * 4
        assert sorted(r.sample_index for r in recs) == [0, 0, 1, 1, 2, 2, 3, 3]
    state = torch.load(tmp_path / "a" / "checkpoints" / "step-00000002" / "training_state" / "stage_state.pt",
                       weights_only=False)
    assert state["generate/groups"]["entropy"]  # the sampler observed the votes


def test_votes_zero_is_todays_run_value_for_value(tmp_path):
    from analysis_helpers import assert_same_final_state

    plain = train_tiny_run(tmp_path / "plain", "max_steps=2", "rewards.1.name=majority_vote")
    zero = train_tiny_run(tmp_path / "zero", "max_steps=2", "rewards.1.name=majority_vote",
                          "rewards.1.params={votes: 0}")
    a, b = _metrics(plain), _metrics(zero)
    assert a == b and "majority/votes" not in a[0] and a[0]["rollout/samples"] == 8.0
    assert_same_final_state(plain, zero)


# --------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("overrides,fragments", [
    (["rewards.1.params={votes: 4}"], ["rewards[1].params.votes: 4 must be 0", "rollout.group_size (8)"]),
    (["rewards.1.params={votes: 8}"], ["rewards[1].params.votes: 8 must be 0", "rollout.group_size (8)"]),
    (["rewards.1.params={votes: many}"], ["rewards[1] (majority_vote)", "votes must be 0", "'many'"]),
    (["rewards.1.params={votes: 16}", "rollout.sampler=budget"],
     ["rewards[1].params.votes: 16 and rollout.sampler: budget cannot be combined"]),
    (["rewards.1.params={votes: 16}", "rollout.strategy=tree"],
     ["rewards[1].params.votes: 16 and rollout.strategy: tree cannot be combined"]),
    (["rewards.1.params={votes: 16}", "rollout.tools=[zoom]"],
     ["rewards[1].params.votes: 16 and rollout.tools cannot be combined"]),
    (["rewards.1.params={votes: 16}", "rollout.summarize={at_tokens: 16}", "rollout.max_turns=3"],
     ["rewards[1].params.votes: 16 and rollout.summarize cannot be combined"]),
    (["rewards.1.params={votes: 16}", "rollout.guide={from: auto}"],
     ["rewards[1].params.votes: 16 and rollout.guide cannot be combined"]),
    (["rewards.1.params={votes: 16}", "rewards.0={name: cocov, params: {votes: 12}}"],
     ["rewards[0].params.votes (12) and rewards[1].params.votes (16) differ"]),
], ids=["below", "equal", "type", "budget", "tree", "tools", "resum", "guide", "two"])
def test_refused_before_the_model_loads_naming_both_keys(tmp_path, overrides, fragments):
    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/r",
              "rewards.1.name=majority_vote", *overrides)
    one_line_exit_2(res, *fragments)


def test_several_processes_pass_the_checks_and_votes_zero_selects_no_stage(monkeypatch):
    """Groups stay whole on one rank, so each rank votes over and keeps its own prompts' rows: a launch of several
    processes passes the checks (2 processes train as 1: ``test_two_processes_train_as_one``)."""
    from mmrlvr.train.stages.base import select_stages, validate_stages

    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = load_config(ROOT / "configs/demo-tiny.yaml", ["rewards.1.name=majority_vote", "rewards.1.params={votes: 16}"])
    assert "vote_split" in select_stages(cfg)["shape"] and validate_stages(cfg) == []
    zero = load_config(ROOT / "configs/demo-tiny.yaml", ["rewards.1.name=majority_vote", "rewards.1.params={votes: 0}"])
    assert "vote_split" not in select_stages(zero)["shape"]


@pytest.mark.slow
def test_two_processes_train_as_one(tmp_path):
    """2 DDP processes over gloo (torchrun), one prompt each, train what 1 process trains with votes."""
    import sys

    from multiproc import assert_trains_like, final_params, run, torchrun_cmd, train_cli
    from mmrlvr.train.model_path import resolve_model_path

    common = [*FAST_RUN, "max_steps=2", "save_every=0", "log_rollouts=false", "algo.micro_batch_size=4",
              "model.prefix_sharing=false", *VOTES]
    res = run([sys.executable, *train_cli("configs/demo-tiny.yaml", f"output_dir={tmp_path / 'one'}", *common)])
    assert res.returncode == 0, res.stderr[-4000:]
    res = run(torchrun_cmd(*train_cli("configs/demo-tiny.yaml", f"output_dir={tmp_path / 'two'}", *common)))
    assert res.returncode == 0, res.stderr[-4000:]
    model = str(resolve_model_path("tiny:qwen2_5_vl:warm"))
    assert_trains_like(final_params(tmp_path / "one", model), final_params(tmp_path / "two", model))
    one, two = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2] and two[0]["dist/world_size"] == 2.0
    for a, b in zip(one, two):
        assert b["majority/votes"] == 8.0 and b["rollout/samples"] == 16.0 and b["group_size/mean"] == 4.0
        assert b["reward/mean"] == pytest.approx(a["reward/mean"], abs=1e-6)
