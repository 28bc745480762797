"""Seed methods that choose the prompts: the SGAC disagreement curriculum (``rollout.sampler: disagreement``: its
learned selector and its entropy draw, the probe that lets it act from step 1), TRACE's budget allocation and the
default ``uniform`` sampler's name. The formulas by hand, the draw's probabilities, state, refill rounds, and 20
training steps with an exact resume (one process here; two ranks in the matrix marker's tests below)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest

from analysis_helpers import assert_same_final_state, interrupted_copy, train_tiny_run
from mmrlvr.train.samplers import SAMPLERS, StepOutcome, answer_entropy, build_sampler

ROOT = Path(__file__).resolve().parents[1]


def test_answer_entropy_by_hand():
    assert answer_entropy(["1", "1", "2", "2"]) == pytest.approx(math.log(2))
    assert answer_entropy(["3", "3.0", " 3 ", "3."]) == 0.0  # one answer written four ways
    assert answer_entropy([None, None, "1", "1"]) == pytest.approx(math.log(2))  # unparsable is a category
    assert answer_entropy(["a", "b", "c", "d"]) == pytest.approx(math.log(4))
    # 3 of one, 1 of another: -(3/4 ln 3/4 + 1/4 ln 1/4)
    assert answer_entropy(["x", "x", "x", "y"]) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))


def test_uniform_is_the_default_and_sizes_no_groups():
    from mmrlvr.config import RunConfig
    from mmrlvr.train.samplers import Sampler, sampler_class

    cfg = RunConfig()
    assert cfg.rollout.sampler == "uniform" and "shuffle" not in SAMPLERS
    uniform = build_sampler("uniform", 10, 3, 0, {})
    assert not uniform.sizes_groups and uniform.group_sizes([0, 1, 2], 24) is None
    assert sampler_class(cfg).step_budget(cfg, {}) is None and sampler_class(cfg).smallest_group(cfg, {}) is None
    cfg.rollout.sampler = "budget"
    assert sampler_class(cfg).sizes_groups and sampler_class(cfg).step_budget(cfg, {}) == 16 * 8
    assert sampler_class(cfg).smallest_group(cfg, {"g_min": 3})[0] == 3
    cfg.rollout.sampler = "nonesuch"  # validation names it; the traits read as the base class's
    assert sampler_class(cfg) is Sampler


def _observe(sampler, answers_by_prompt: dict[int, list]) -> None:
    prompts = list(answers_by_prompt)
    sampler.observe(StepOutcome(0, prompts, [[0.0] * len(a) for a in answers_by_prompt.values()], None,
                                list(answers_by_prompt.values())))


ENTROPY = {"selector": "entropy", "probe_samples": 0, "floor": 0.05}  # the draw before the selector, no probe


def test_unseen_prompts_come_first_then_draws_follow_the_normalised_entropy():
    s = build_sampler("disagreement", 5, 2, 3, ENTROPY)
    first = s.indices(0)
    assert len(first) == 2 and len(set(first)) == 2
    _observe(s, {i: ["1", "1", "1", "1"] for i in first})  # agreed: entropy 0
    second = s.indices(1)
    assert not set(second) & set(first)  # still-unseen prompts first
    # every prompt seen: 0 and 1 disagree fully (H = ln 4 -> weight 1), 2 half (ln 2 / ln 4 = 0.5), 3 and 4 agree
    _observe(s, {0: ["a", "b", "c", "d"], 1: ["a", "b", "c", "d"], 2: ["a", "a", "b", "b"], 3: ["z"] * 4,
                 4: ["z"] * 4})
    assert s.entropy == pytest.approx({0: 1.0, 1: 1.0, 2: 0.5, 3: 0.0, 4: 0.0})
    # one prompt per step: the draw picks prompt i with probability w_i / sum w (Efraimidis-Spirakis, k = 1)
    one = build_sampler("disagreement", 5, 1, 3, ENTROPY)
    one.load_state_dict(s.state_dict())
    n = 6000
    counts = Counter(one.indices(step)[0] for step in range(n))
    w = [1.0, 1.0, 0.5, 0.05, 0.05]
    for i, wi in enumerate(w):
        p = wi / sum(w)
        assert abs(counts[i] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (i, counts[i] / n, p)
    assert counts[3] > 0 and counts[4] > 0  # the floor keeps every prompt in play


def test_state_round_trip_and_refill_rounds_draw_other_prompts():
    s = build_sampler("disagreement", 8, 3, 1, {})
    _observe(s, {i: [str(i % 3), "0", "1", str(i)] for i in range(8)})
    t = build_sampler("disagreement", 8, 3, 1, {})
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))  # plain data: JSON survives it too
    assert [s.indices(k) for k in range(20)] == [t.indices(k) for k in range(20)]
    r0, r1 = s.indices(4, 0), s.indices(4, 1)
    assert not set(r0) & set(r1)


# ------------------------------------------------------------------------- SGAC's learned selector, the probe
def _observe_table(sampler, step: int, table: dict[int, tuple[list, list]]) -> None:
    """``table``: prompt -> (the verifier's 1/0 per sample, the final answers)."""
    sampler.observe(StepOutcome(step, list(table), [list(map(float, a)) for a, _ in table.values()],
                                [list(map(float, a)) for a, _ in table.values()], [ans for _, ans in table.values()]))


def test_selector_features_and_the_learned_ranking_by_hand():
    import torch

    from mmrlvr.train.samplers import group_features

    # p = 3/4 right, v = p(1 - p) (a 1/0 verifier's population variance), h = entropy of (3 x "2", 1 x "3") / ln 4
    p, v, h = group_features([1, 0, 1, 1], ["2", "3", "2", "2"])
    assert (p, v) == (0.75, 0.1875)
    assert h == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(4))
    assert group_features([0, 0], [None, None]) == (0.0, 0.0, 0.0)  # unparsable twice: one answer, no spread

    s = build_sampler("disagreement", 6, 2, 0, {"probe_samples": 0, "l2": 0.5})
    d = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    s.set_difficulty(d)
    step0 = {0: ([1, 0, 0, 0], ["1", "2", "3", "3"]), 1: ([1, 1, 1, 1], ["4"] * 4),
             2: ([0, 0, 1, 1], ["a", "a", "b", "b"]), 3: ([0, 0, 0, 0], [None] * 4)}
    step1 = {0: ([1, 1, 0, 0], ["1", "1", "3", "2"]), 2: ([1, 1, 1, 1], ["b"] * 4), 4: ([0, 1, 0, 1], ["x", "y"] * 2)}
    _observe_table(s, 0, step0)
    assert s.pairs == 0 and s.weights() == [0.0, 0.0, 0.0, 1.0, 0.0]  # no prompt came back: the entropy prior
    _observe_table(s, 1, step1)
    # prompts 0 and 2 came back: x = [1, p, v, h, d] at step 0, y = p(step 1) - p(step 0)
    feats = {i: group_features(*step0[i]) for i in step0}
    X = torch.tensor([[1.0, *feats[i], d[i]] for i in (0, 2)], dtype=torch.float64)
    y = torch.tensor([group_features(*step1[i])[0] - feats[i][0] for i in (0, 2)], dtype=torch.float64)
    assert y.tolist() == [0.25, 0.5]
    w0 = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    w = torch.linalg.solve(X.T @ X + 0.5 * torch.eye(5, dtype=torch.float64), X.T @ y + 0.5 * w0)
    assert s.pairs == 2 and s.weights() == pytest.approx(w.tolist(), abs=1e-12)
    # each prompt scored from its last group: 0, 2, 4 from step 1, 1 and 3 from step 0
    last = {**{i: step0[i] for i in (1, 3)}, **step1}
    scores = {i: float(w @ torch.tensor([1.0, *group_features(*last[i]), d[i]], dtype=torch.float64)) for i in last}
    assert {i: s.score(i) for i in last} == pytest.approx(scores, abs=1e-12)
    ranked = sorted(scores, key=scores.get, reverse=True)
    assert s.choose(list(last), 3, 9, 0) == ranked[:3]  # the ranking: the highest scores
    # a step: prompt 5 never seen comes first (no probe), then the best of a seeded pool of pool x B = 4 seen
    pool = s.candidate_pool(9, 0, among=[0, 1, 2, 3, 4])
    assert len(pool) == 4 and s.indices(9) == [5, max(pool, key=scores.get)]
    assert s.step_metrics(9) == {"sampler/weighted_draws": 0.5, "sampler/selector_pairs": 2.0}
    # state round trip (plain data: JSON survives it): the same weights, the same draws
    t = build_sampler("disagreement", 6, 2, 0, {"probe_samples": 0, "l2": 0.5})
    t.set_difficulty(d)
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert t.weights() == s.weights() and [t.indices(k) for k in range(20)] == [s.indices(k) for k in range(20)]
    # a prompt seen twice within one step makes no pair (no update between the two groups)
    _observe_table(s, 1, {4: ([1, 1, 1, 1], ["x"] * 4)})
    assert s.pairs == 2


def test_prompt_difficulty_is_the_datasets_level_else_the_prompt_length_percentile():
    from types import SimpleNamespace

    from mmrlvr.train.samplers import prompt_difficulty

    def sample(text, **meta):
        return SimpleNamespace(meta=meta, messages=[{"role": "user", "content": [{"type": "image"},
                                                                                 {"type": "text", "text": text}]}])

    levels = [sample("a", level="Level 1"), sample("b", level=3), sample("c", difficulty="5")]
    assert prompt_difficulty(levels) == [0.0, 0.5, 1.0]  # (x - min) / (max - min)
    # no level on one row: lengths in words 3, 5, 5, 9 -> ranks 0, 1.5 (tied 1 and 2), 1.5, 3 -> / (n - 1) = 3
    plain = [sample("one two three"), sample("a b c d e", level=2), sample("v w x y z"), sample(" ".join("x" * 9))]
    assert prompt_difficulty(plain) == [0.0, 0.5, 0.5, 1.0]
    assert prompt_difficulty([sample("same length"), sample("same words")]) == [0.0, 0.0]


def test_a_fresh_curriculum_chooses_at_step_0_with_the_probe_and_not_without():
    # SGAC: a pool of pool x B = 8 candidates, all unknown, is probed; the 4 whose two samples disagree rank
    # first under the entropy prior (w0). Without the probe the step is the first 4 of the unseen permutation.
    fresh = build_sampler("disagreement", 40, 4, 0, {})
    cands = fresh.probe_candidates(0)
    assert cands == fresh.candidate_pool(0, 0) and len(cands) == 8
    acc = [[1.0, 0.0] if j % 2 == 0 else [1.0, 1.0] for j in range(8)]
    answers = [["1", "2"] if j % 2 == 0 else ["1", "1"] for j in range(8)]
    fresh.observe_probe(StepOutcome(0, cands, acc, acc, answers))
    assert fresh.probed[cands[0]] == [0.5, 0.25, 1.0] and fresh.probed[cands[1]] == [1.0, 0.0, 0.0]
    assert sorted(fresh.indices(0)) == cands[0::2]
    assert fresh.step_metrics(0)["sampler/weighted_draws"] == 1.0  # all 4 chosen by the selector
    assert fresh.pairs == 0  # a probe makes no training pair
    plain = build_sampler("disagreement", 40, 4, 0, {"probe_samples": 0})
    assert plain.probe_candidates(0) == [] and plain.indices(0) == plain._order[:4]
    assert plain.step_metrics(0)["sampler/weighted_draws"] == 0.0

    # TRACE: the step's 4 prompts probed twice: p = (right + 1) / (k + 2) = 1/4, 2/4, 3/4, 2/4; scores p(1 - p)
    # 0.1875, 0.25, 0.1875, 0.25; budget 16 in [2, 8]: lambda = 16 / 0.875 -> 3.43, 4.57, 3.43, 4.57 -> floors
    # 3, 4, 3, 4 (14) and the two units left to the largest remainders (.57): 3, 5, 3, 5
    b = build_sampler("budget", 40, 4, 0, {}, group_size=4)
    step = b.indices(0)
    assert b.probe_candidates(0) == step
    right = [[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]
    b.observe_probe(StepOutcome(0, step, right, right, [["0", "0"]] * 4))
    assert [b.pass_rate[i] for i in step] == [0.25, 0.5, 0.75, 0.5]
    assert b.group_sizes(step) == [3, 5, 3, 5] and b.step_metrics(0) == {"sampler/weighted_draws": 1.0}
    assert b.probe_candidates(0) == []  # probed once
    none = build_sampler("budget", 40, 4, 0, {"probe_samples": 0}, group_size=4)
    assert none.probe_candidates(0) == [] and none.group_sizes(step) == [4, 4, 4, 4]
    assert none.step_metrics(0) == {"sampler/weighted_draws": 0.0}


@pytest.mark.parametrize("override, fragments", [
    ("rollout.sampler_params={selector: rank, pool: 0.5}",
     ["rollout.sampler_params.selector: prompt sampler 'disagreement': must be one of learned, entropy, got 'rank'",
      "rollout.sampler_params.pool: prompt sampler 'disagreement': must be >= 1, got 0.5"]),
    ("rollout.sampler_params={probe_tokens: 64}",
     ["rollout.sampler_params.probe_tokens=64 exceeds rollout.max_new_tokens=32"]),
])
def test_selector_and_probe_settings_out_of_range_are_config_errors_naming_the_key(tmp_path, override, fragments):
    from analysis_helpers import cli

    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/r",
              "rollout.sampler=disagreement", override)
    assert res.returncode == 2, res.stderr
    for f in fragments:
        assert f in res.stderr, res.stderr


def test_floor_out_of_range_is_a_config_error(tmp_path):
    from analysis_helpers import cli

    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/r",
              "rollout.sampler=disagreement", "rollout.sampler_params={floor: 0}")
    assert res.returncode == 2 and "rollout.sampler_params.floor" in res.stderr and "in (0, 1]" in res.stderr


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"reward/mean"' in ln]


def test_disagreement_trains_20_steps_and_resumes_exactly(tmp_path):
    """The defaults: the learned selector, the pool probed before each step. It chooses from step 1 and fits
    pairs once prompts come back (16 prompts, 2 a step, a pool of 4)."""
    opts = ["rollout.sampler=disagreement", "log_rollouts=false", "save_every=10"]
    straight = _metrics(train_tiny_run(tmp_path / "a", "max_steps=20", *opts))
    assert straight[0]["sampler/weighted_draws"] == 1.0 and straight[0]["sampler/probe_samples"] == 4 * 2
    assert all(r["sampler/weighted_draws"] == 1.0 for r in straight)
    assert straight[-1]["sampler/selector_pairs"] > 0 and straight[-1]["sampler/probe_samples"] < 8
    interrupted_copy(tmp_path / "a", tmp_path / "b", 10)
    resumed = _metrics(train_tiny_run(tmp_path / "b", "max_steps=20", "--resume", *opts))
    clean = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in straight[10:]]
    assert clean == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed[-10:]]
    import torch

    state_a = torch.load(tmp_path / "a" / "checkpoints" / "step-00000020" / "training_state" / "stage_state.pt",
                         weights_only=False)
    state_b = torch.load(tmp_path / "b" / "checkpoints" / "step-00000020" / "training_state" / "stage_state.pt",
                         weights_only=False)
    assert state_a == state_b and state_a  # the sampler's entropies, equal after the resume
    assert "disagreement" in SAMPLERS.names()
    assert_same_final_state(tmp_path / "a", tmp_path / "b")


@pytest.mark.matrix
def test_disagreement_on_two_ranks_trains_what_one_process_trains(tmp_path):
    """20 steps under torchrun with 2 DDP ranks: whole groups per rank, every rank's sampler fed the gathered
    answers, so both draw the same prompts and the result equals one process's."""
    from multiproc import assert_two_ranks_train_what_one_process_trains

    assert_two_ranks_train_what_one_process_trains(tmp_path, "rollout.sampler=disagreement")


# ------------------------------------------------------------------------------- TRACE budget allocation
def test_allocate_budget_by_hand():
    from mmrlvr.train.samplers import allocate_budget

    # scores 0.25, 0.09, 0.16, 0.21 (p(1-p) of p = 0.5, 0.1, 0.2, 0.3), budget 32, sizes in [2, 16]:
    # lambda = 32 / 0.71 -> 11.27, 4.06, 7.21, 9.46 -> floors 11, 4, 7, 9 (31) -> the largest remainder (.46) +1
    assert allocate_budget([0.25, 0.09, 0.16, 0.21], 32, 2, 16) == [11, 4, 7, 10]
    # the caps bind: a zero score sits at g_min until the only positive one is full, then the rest goes round
    assert allocate_budget([0.25, 0.0, 0.0, 0.0], 32, 2, 16) == [16, 6, 5, 5]
    assert allocate_budget([0.0, 0.0, 0.0], 10, 2, 16) == [4, 3, 3]  # no contrast anywhere: an even split
    assert allocate_budget([0.2, 0.1], 100, 2, 16) == [16, 16]  # a budget above n * g_max is clamped to it


def test_budget_sampler_sizes_follow_p_times_one_minus_p_within_the_budget():
    s = build_sampler("budget", 10, 4, 0, {"g_min": 2}, group_size=8)
    assert s.budget == 32 and s.g_max == 16
    # a hand-built history: prompt 0 right 4 of 8 times, 1 right 1 of 8, then 2 of 8 (EMA 0.5), 2 never, 3 always
    s.observe(StepOutcome(0, [0, 1, 2, 3], [[0.0] * 8] * 4, [[1.0] * 4 + [0.0] * 4, [1.0] + [0.0] * 7, [0.0] * 8,
                                                              [1.0] * 8]))
    s.observe(StepOutcome(1, [1], [[0.0] * 8], [[1.0] * 2 + [0.0] * 6]))
    assert s.pass_rate == pytest.approx({0: 0.5, 1: 0.5 * 0.125 + 0.5 * 0.25, 2: 0.0, 3: 1.0})
    sizes = s.group_sizes([0, 1, 2, 3])
    # scores p(1-p): 0.25, 0.1875 * 0.8125 = 0.1523, 0, 0. Prompts 2 and 3 (no contrast) sit at g_min = 2; the
    # water level lambda with clamp(0.25 lambda, 2, 16) + clamp(0.1523 lambda, 2, 16) = 28 is 78.8: prompt 0
    # hits the cap (19.7 -> 16) and prompt 1 takes the rest, 0.1523 * 78.8 = 12
    assert sizes == [16, 12, 2, 2]
    # an unseen prompt gets G = 8; the seen share the rest (24)
    mixed = s.group_sizes([0, 1, 7, 2])
    assert mixed[2] == 8 and sum(mixed) == 32
    # state round trip
    t = build_sampler("budget", 10, 4, 0, {"g_min": 2}, group_size=8)
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert t.group_sizes([0, 1, 2, 3]) == sizes


def test_budget_outside_its_range_is_a_config_error(tmp_path):
    from analysis_helpers import cli

    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/r",
              "rollout.sampler=budget", "rollout.sampler_params={budget: 300, g_max: 12}")
    assert res.returncode == 2, res.stderr
    assert "budget=300 is outside [prompts_per_step x g_min, prompts_per_step x g_max] = [32, 192]" in res.stderr


def test_budget_trains_20_steps_with_groups_of_several_sizes_and_resumes_exactly(tmp_path):
    """Groups of different sizes pass through every stage (advantages, dynamic sampling's filter, records): each
    step's total is the budget, the group sizes differ once prompts are seen, the inspector's records carry each
    row's own group size, and a resumed run equals an uninterrupted one (sampler state included)."""
    opts = ["rollout.sampler=budget", "rollout.prompts_per_step=4", "data.train_size=8", "save_every=10",
            "stages.shape=[dynamic_sampling]", "algo.dynamic_sampling_params.max_rounds=1"]
    straight = _metrics(train_tiny_run(tmp_path / "a", "max_steps=20", *opts))
    interrupted_copy(tmp_path / "a", tmp_path / "b", 10)
    resumed = _metrics(train_tiny_run(tmp_path / "b", "max_steps=20", "--resume", *opts))
    clean = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in straight[10:]]
    assert clean == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed[-10:]]
    assert_same_final_state(tmp_path / "a", tmp_path / "b")  # parameters and the sampler's pass rates
    assert all(r["sampler/samples"] == 16 for r in straight)  # 4 prompts x G 4: the default budget, every step
    assert any(r["group_size/max"] > r["group_size/min"] for r in straight)  # sizes differ once prompts are seen
    assert straight[0]["sampler/weighted_draws"] == 1.0  # the probe sized step 1's prompts
    assert straight[0]["sampler/probe_samples"] == 4 * 2 and straight[-1]["sampler/probe_samples"] == 0
    from mmrlvr.store.reader import RolloutReader

    frame = RolloutReader(tmp_path / "a").index
    sizes = frame.groupby(["step", "prompt_id"])["group_size"].agg(["first", "count"])
    assert (sizes["first"] == sizes["count"]).all() and sizes["first"].nunique() > 1


def test_budget_with_refill_rounds_is_refused_on_several_processes(tmp_path):
    import os

    from analysis_helpers import ROOT as R, ENV

    res = __import__("subprocess").run(
        [sys.executable, "-m", "mmrlvr.cli", "train", "configs/demo-tiny.yaml", "--dry-run", "--config-only",
         f"output_dir={tmp_path}/r", "rollout.sampler=budget", "algo.dynamic_sampling=true"],
        capture_output=True, text=True, cwd=R, env={**ENV, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
        timeout=120)
    assert res.returncode == 2 and "runs on one process only" in res.stderr and "budget" in res.stderr, res.stderr


@pytest.mark.matrix
def test_budget_on_two_ranks_keeps_the_budget_and_resumes_exactly(tmp_path):
    """2 DDP ranks, 20 steps: whole groups of several sizes on each rank, each rank's share of the budget, the
    step's total (summed over ranks) equal to the budget every step, and a resumed 2-rank run equal to an
    uninterrupted one (the samplers' state restored on every rank)."""
    from multiproc import run, topology, torchrun_cmd

    args = ["configs/demo-tiny.yaml", "rollout.prompts_per_step=4", "rollout.group_size=4",
            "rollout.max_new_tokens=16", "data.train_size=8", "eval.at_start=false", "eval.at_end=false",
            "eval.every=0", "progress=false", "save_every=10", "log_rollouts=false", "tensorboard=false",
            "rollout.sampler=budget"]

    def train(out, *extra):
        res = run(torchrun_cmd("-m", "mmrlvr.cli", "train", *args, f"output_dir={out}", *extra), timeout=1200)
        assert res.returncode == 0, res.stderr[-3000:]
        return _metrics(out)

    straight = train(tmp_path / "a", "max_steps=20")
    assert topology(tmp_path / "a")["world_size"] == 2
    assert all(r["sampler/samples"] == 16 for r in straight)
    assert any(r["group_size/max"] > r["group_size/min"] for r in straight)
    interrupted_copy(tmp_path / "a", tmp_path / "b", 10)
    resumed = train(tmp_path / "b", "max_steps=20", "--resume")
    clean = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in straight[10:]]
    assert clean == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed[-10:]]
    assert_same_final_state(tmp_path / "a", tmp_path / "b")  # parameters and the samplers' pass rates


def test_a_plugin_sampler_that_sizes_groups_gets_the_same_checks_as_budget(monkeypatch):
    """No check recognises the built-in budget sampler by name: a plug-in that sizes groups declares it and is
    checked alike (pass@k against its smallest group, the tree strategy, the process split of its budget)."""
    from mmrlvr.algos.advantages import smallest_groups
    from mmrlvr.config import RunConfig
    from mmrlvr.train.samplers import Sampler
    from mmrlvr.train.stages.generate import FlatGroups, TreeRollouts

    @SAMPLERS.register("pairs_test")
    class Pairs(Sampler):
        sizes_groups = True

        def indices(self, step, round=0):
            return list(range(self.batch_size))

        def group_sizes(self, prompts, budget=None):
            return [2] * len(prompts)

        @classmethod
        def step_budget(cls, cfg, params):
            return 2 * cfg.rollout.prompts_per_step + 1  # odd: cannot split over two processes

        @classmethod
        def smallest_group(cls, cfg, params):
            return 2, "the pairs_test sampler's pairs"

    cfg = RunConfig()
    cfg.rollout.sampler = "pairs_test"
    assert (2, "the pairs_test sampler's pairs") in smallest_groups(cfg)
    cfg.rollout.strategy = "tree"
    assert any("rollout.sampler: pairs_test sizes groups" in p for p in TreeRollouts.validate(cfg))
    cfg.rollout.strategy = "flat"
    monkeypatch.setenv("WORLD_SIZE", "2")
    problems = FlatGroups.validate(cfg)
    assert any("do not split evenly over 2" in p for p in problems), problems
