"""Issue 39's first methods: the label-free ``majority_vote`` reward and the built-in ``pass_at_k`` advantage."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from math import comb
from pathlib import Path

import pytest
import torch

from mmrlvr.algos.advantages import pass_at_k_advantages
from mmrlvr.rewards.base import build_reward, score_batch
from mmrlvr.types import Completion, Sample

ROOT = Path(__file__).resolve().parents[1]


def _s(i: str, gold: str | None = "0.5", kind: str = "number") -> Sample:
    return Sample(id=i, messages=[], images=[], answer=gold, answer_type=kind)


def _r1(answer: str | None) -> Completion:
    return Completion("<think>t</think>" + (f"<answer>{answer}</answer>" if answer is not None else "no answer"))


# ------------------------------------------------------------------------------------------- majority vote
def test_majority_vote_hand_built_groups():
    # group 0: 0.5, \frac{1}{2}, 3, (none) -> {0.5, 1/2} is one answer (2 votes) -> [1, 1, 0, 0]; gold 0.5 -> right
    # group 1: 2, 3, 3.0, 2 -> a 2-2 tie; "2" appears first -> [1, 0, 0, 1]; gold 3 -> the pseudo-label is wrong
    # group 2: (none), (none) -> no pseudo-label -> [0, 0]
    texts = ["0.5", "\\frac{1}{2}", "3", None, "2", "3", "3.0", "2", None, None]
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    golds = {0: "0.5", 1: "3", 2: "1"}
    samples = [_s(str(g), golds[g]) for g in groups]
    fn = build_reward("majority_vote")
    out = score_batch(fn, [_r1(t) for t in texts], samples, group_index=groups)
    assert [r.score for r in out] == [1, 1, 0, 0, 1, 0, 0, 1, 0, 0]
    assert out[0].parsed["pseudo_label"] == "0.5" and out[0].parsed["pseudo_label_correct"] is True
    assert out[4].parsed["tie"] is True and out[4].parsed["pseudo_label_correct"] is False
    assert out[8].parsed["pseudo_label"] is None
    m = fn.metrics()
    # pseudo-label accuracy over groups with a label and a gold: group 0 right, group 1 wrong -> 1/2
    assert m["majority/pseudo_label_accuracy"] == 0.5
    assert m["majority/tie_share"] == pytest.approx(1 / 3) and m["majority/unparsable"] == pytest.approx(3 / 10)


def test_majority_vote_never_reads_the_gold_label():
    rng = torch.Generator().manual_seed(0)
    answers = ["1", "2", "0.5", "\\frac{1}{2}", "3.0", "3", None]
    texts = [answers[int(i)] for i in torch.randint(0, len(answers), (48,), generator=rng)]
    groups = [i // 6 for i in range(48)]
    with_gold = [_s(str(g), gold=str(g % 4)) for g in groups]
    stripped = [dataclasses.replace(s, answer=None) for s in with_gold]
    a = score_batch(build_reward("majority_vote"), [_r1(t) for t in texts], with_gold, group_index=groups)
    b = score_batch(build_reward("majority_vote"), [_r1(t) for t in texts], stripped, group_index=groups)
    assert [r.score for r in a] == [r.score for r in b]
    adv_a = pass_at_k_advantages(torch.tensor([r.score for r in a]), torch.tensor(groups), k=2)
    adv_b = pass_at_k_advantages(torch.tensor([r.score for r in b]), torch.tensor(groups), k=2)
    assert torch.equal(adv_a, adv_b)
    assert all(r.parsed["pseudo_label_correct"] is None for r in b)  # no gold: nothing logged


# ---------------------------------------------------------------------------------------------- pass@k
def _brute_force(correct: list[bool], k: int) -> list[float]:
    """Each rollout's mean normalised advantage over every k-subset it belongs to, by enumeration."""
    n = len(correct)
    subsets = list(itertools.combinations(range(n), k))
    scores = [float(any(correct[i] for i in s)) for s in subsets]
    rho = sum(scores) / len(scores)
    sigma = (rho * (1 - rho)) ** 0.5
    if sigma == 0:
        return [0.0] * n
    out = []
    for i in range(n):
        mine = [(sc - rho) / sigma for s, sc in zip(subsets, scores) if i in s]
        out.append(sum(mine) / len(mine))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_pass_at_k_equals_a_brute_force_count_over_all_k_subsets(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(3, 9, (1,), generator=g))
    correct = (torch.rand(n, generator=g) < 0.4).tolist()
    for k in range(1, n + 1):
        adv = pass_at_k_advantages(torch.tensor([float(c) for c in correct]), torch.zeros(n, dtype=torch.long), k=k)
        torch.testing.assert_close(adv, torch.tensor(_brute_force(correct, k)), rtol=1e-5, atol=1e-6)
    assert comb(n, 1) == n  # the closed form at k = 1 is GRPO with the population std (checked by the loop)


@pytest.mark.parametrize("k", [8, 9])
def test_pass_at_k_refuses_k_at_or_above_the_group_size_before_the_model_loads(tmp_path, k):
    """k = G is refused too: one k-subset per group, so every advantage would be 0."""
    res = subprocess.run([sys.executable, "-m", "mmrlvr.cli", "train", "configs/demo-tiny.yaml", "--dry-run",
                          "--config-only", f"output_dir={tmp_path}/r", "algo.advantage=pass_at_k",
                          f"algo.advantage_params.k={k}"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 2 and f"k={k} needs groups of more than k members, but rollout.group_size=8" \
        in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------------ CoCoV
def _thought(count: str | None, answer: str | None) -> Completion:
    think = f"<think>I count {count}.</think>" if count is not None else "<think>hmm</think>"
    return Completion(think + (f"<answer>{answer}</answer>" if answer is not None else ""))


def test_cocov_modes_by_the_majority_share():
    # high (share 6/8 >= 0.75): the majority 1, a parsable dissenter the bonus 0.2, an unparsable row 0
    high = [_thought("2", "2")] * 6 + [_thought("3", "3"), _thought(None, None)]
    # mid (share 4/8, in [0.5, 0.75)): plain majority vote
    mid = [_thought("1", "1")] * 4 + [_thought("2", "2")] * 2 + [_thought("3", "3"), _thought(None, None)]
    # low (share 3/8 < 0.5): three rows answer 1 against their own thinking (which says 2), two answer 2 and
    # their thinking agrees -> the verifier (plain consistency) picks "2", not the plain majority "1"
    low = [_thought("2", "1")] * 3 + [_thought("2", "2")] * 2 + [_thought("3", "3"), _thought("0", "0"),
                                                                  _thought(None, None)]
    comps = high + mid + low
    groups = [0] * 8 + [1] * 8 + [2] * 8
    samples = [_s(str(g), gold=["2", "1", "2"][g], kind="number") for g in groups]
    fn = build_reward("cocov")
    out = score_batch(fn, comps, samples, group_index=groups)
    assert [r.score for r in out[:8]] == pytest.approx([1] * 6 + [0.2, 0])
    assert [r.score for r in out[8:16]] == [1] * 4 + [0] * 4
    assert [r.score for r in out[16:]] == [0, 0, 0, 1, 1, 0, 0, 0]
    assert [out[i].parsed["cocov_mode"] for i in (0, 8, 16)] == ["explore", "majority", "verified"]
    assert out[16].parsed["pseudo_label"] == "2" and out[16].parsed["pseudo_label_correct"] is True
    m = fn.metrics()
    assert m["cocov/low_share"] == pytest.approx(1 / 3) and m["cocov/high_share"] == pytest.approx(1 / 3)
    assert m["cocov/verifier_changed"] == 1.0 and m["majority/pseudo_label_accuracy"] == 1.0


def test_cocov_reads_no_gold_label():
    rng = torch.Generator().manual_seed(1)
    pool = [_thought("2", "2"), _thought("2", "1"), _thought("1", "1"), _thought("3", "3.0"), _thought(None, None),
            _thought("0", "0")]
    comps = [pool[int(i)] for i in torch.randint(0, len(pool), (64,), generator=rng)]
    groups = [i // 8 for i in range(64)]
    with_gold = [_s(str(g), gold=str(g % 4)) for g in groups]
    stripped = [dataclasses.replace(s, answer=None) for s in with_gold]
    a = score_batch(build_reward("cocov"), comps, with_gold, group_index=groups)
    b = score_batch(build_reward("cocov"), comps, stripped, group_index=groups)
    assert [r.score for r in a] == [r.score for r in b]
    assert {r.parsed["cocov_mode"] for r in a} >= {"verified", "majority"}  # the draw reaches the verifier


def test_cocov_refuses_thresholds_out_of_order():
    with pytest.raises(ValueError, match="low <= high"):
        build_reward("cocov", low=0.8, high=0.5)


# ----------------------------------------------------------------------------------- 20 steps and resume
def _train(out: Path, *extra: str) -> list[dict]:
    cmd = [sys.executable, "-m", "mmrlvr.cli", "train", "configs/demo-tiny.yaml", f"output_dir={out}",
           "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=16", "data.train_size=16",
           "eval.at_start=false", "eval.at_end=false", "eval.every=0", "progress=false", "save_every=10",
           "log_rollouts=false", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in ln]


@pytest.mark.parametrize("option", [
    ["rewards.1.name=majority_vote"],
    ["algo.advantage=pass_at_k", "algo.advantage_params.k=2"],
    ["rewards.1.name=gated_process"],
    ["rewards.1.name=cocov", "algo.advantage=pass_at_k", "algo.advantage_params.k=2"],
    ["algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {horizon: progressive, horizon_steps: 20, top_k: 5}}]"],
    ["algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {expert: 'tiny:qwen2_5_vl:warm', horizon: 0.25}}]",
     "algo.micro_batch_size=3"],
], ids=["majority_vote", "pass_at_k", "gated_process", "cocov", "forward_ce_privileged_progressive",
        "forward_ce_model_folder_quarter_horizon"])
def test_trains_20_steps_and_resumes_exactly(tmp_path, option):
    straight = _train(tmp_path / "a", "max_steps=20", *option)
    from analysis_helpers import interrupted_copy

    interrupted_copy(tmp_path / "a", tmp_path / "b", 10)
    resumed = _train(tmp_path / "b", "max_steps=20", "--resume", *option)
    assert [r["step"] for r in straight] == list(range(1, 21))
    clean = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in straight[10:]]
    assert clean == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in resumed[-10:]]
    from analysis_helpers import assert_same_final_state

    assert_same_final_state(tmp_path / "a", tmp_path / "b")  # parameters too, not only the logged numbers
    if "majority_vote" in option[0]:
        assert all("majority/tie_share" in r and "reward/majority_vote" in r for r in straight)
    if "cocov" in option[0]:
        assert all("cocov/low_share" in r for r in straight)
    if "forward_ce" in option[0]:
        assert all(r["distill/ce"] > 0 and r["distill/teacher_tokens"] > 0 for r in straight)
        shares = [r["distill/horizon"] for r in straight]
        if "progressive" in option[0]:  # grows from 0.25 to 1 over the 20 steps, token cost with it
            assert shares[0] == pytest.approx(0.25) and shares[-1] == pytest.approx(1.0) and shares == sorted(shares)
            assert straight[0]["distill/teacher_token_share"] < 0.5 < straight[-1]["distill/teacher_token_share"]
        else:
            assert set(shares) == {0.25} and all(r["distill/teacher_token_share"] < 0.5 for r in straight)
    if "gated_process" in option[0]:
        assert all("reward/gated_process" in r for r in straight)


# ------------------------------------------------------------------------------------------ gated process
def test_gated_process_hand_worked():
    from mmrlvr.rewards.process import gate

    # one group: outcomes [1, 1, 0], process [0.5, 1.0, 1.0]; best process 1.0
    # -> [0.7*1 + 0.3*0.5, 0.7*1 + 0.3*1, 0 (wrong: gated)] = [0.85, 1.0, 0]
    assert gate([1, 1, 0], [0.5, 1.0, 1.0], [0, 0, 0]) == pytest.approx([0.85, 1.0, 0.0])
    # a group without any process score: the blend keeps (1 - eta) of the outcome
    assert gate([1, 0], [0, 0], [3, 3]) == pytest.approx([0.7, 0.0])


def test_a_wrong_answer_never_earns_whatever_the_process_scores():
    from mmrlvr.rewards.process import gate

    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(2, 9, (1,), generator=g))
        outcome = (torch.rand(n, generator=g) < 0.5).float().tolist()
        process = (torch.rand(n, generator=g) * float(torch.rand(1, generator=g) * 10)).tolist()
        groups = sorted(torch.randint(0, 3, (n,), generator=g).tolist())
        eta = float(torch.rand(1, generator=g))
        r = gate(outcome, process, groups, eta=eta)
        assert all(ri == 0.0 for ri, o in zip(r, outcome) if o < 1.0)
        assert all(1.0 - eta - 1e-9 <= ri <= 1.0 + 1e-9 for ri, o in zip(r, outcome) if o >= 1.0)


def test_gated_process_with_named_objects_on_a_synthetic_scene():
    sample = Sample(id="s", messages=[], images=[], answer="3", answer_type="number",
                    meta={"shapes": [{"colour": "red", "shape": "triangle"}, {"colour": "red", "shape": "circle"}]})
    fn = build_reward("gated_process", outcome={"name": "auto_accuracy"}, process={"name": "named_objects"})
    texts = ["<think>two red triangles and a red circle</think><answer>3</answer>",   # right, names both -> 1.0
             "<think>a red circle</think><answer>3</answer>",                           # right, names 1 of 2
             "<think>red triangles, red circle</think><answer>4</answer>"]              # wrong: 0 whatever it names
    out = score_batch(fn, [Completion(t) for t in texts], [sample] * 3, group_index=[0, 0, 0])
    # process scores [1.0, 0.5, 1.0], best 1.0: [0.7 + 0.3, 0.7 + 0.15, 0]
    assert [r.score for r in out] == pytest.approx([1.0, 0.85, 0.0])
    assert out[2].parsed["gated"] is True and out[0].components["process"] == 1.0
