"""Methods where they meet: each test here failed on the code before the fix it names, and checks the effect of the
combination (what a sampler learned, which advantages are non-zero), not only that a run finishes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis_helpers import train_tiny_run

ROOT = Path(__file__).resolve().parents[1]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"reward/mean"' in ln]


def _stage_state(run: Path, step: int) -> dict:
    import torch

    path = run / "checkpoints" / f"step-{step:08d}" / "training_state" / "stage_state.pt"
    return torch.load(path, weights_only=False)["generate/groups"]


# ------------------------------------------------------------------ samplers see every group dynamic sampling drew


@pytest.mark.parametrize("sampler, table", [("disagreement", "entropy"), ("budget", "pass_rate")])
def test_a_sampler_observes_every_group_of_every_refill_round(tmp_path, sampler, table):
    """Dynamic sampling with refill rounds rebuilds the batch from kept groups (and fill); the sampler must still
    learn from every group generated, kept or dropped: after one step its table holds every prompt of every round.
    Two-token responses never parse, so every group agrees (all wrong), every round is dropped and the step runs
    all three rounds (the test's premise, asserted)."""
    from mmrlvr.train.samplers import build_sampler

    run = train_tiny_run(tmp_path / "r", "max_steps=1", "save_every=1", f"rollout.sampler={sampler}",
                         "algo.dynamic_sampling=true", "algo.dynamic_sampling_params.max_rounds=3", "rollout.group_size=2",
                         "rollout.max_new_tokens=2", "log_rollouts=false", "rollout.sampler_params={probe_samples: 0}")
    (row,) = _metrics(run)
    assert row["dynamic_sampling/rounds"] == 3.0 and row["dynamic_sampling/kept_groups"] == 0.0
    # FAST_RUN: 16 prompts, 2 per step; seed 0; no probe (its table would hold the probed prompts too)
    replay = build_sampler(sampler, 16, 2, 0, {"probe_samples": 0}, group_size=2)
    drawn = {i for r in range(3) for i in replay.indices(0, r)}
    assert len(drawn) > 2  # the refill rounds drew other prompts than round 0's
    seen = _stage_state(run, 1)[table]
    assert set(seen) == drawn  # before the fix: only the 2 groups of the rebuilt batch
    if table == "entropy":
        assert all(v == 0.0 and str(v) == "0.0" for v in seen.values())  # all agree: entropy 0 (never -0.0)
    else:
        assert all(v == 0.0 for v in seen.values())  # none right: pass rate 0


# ------------------------------------------------------------------------------- trees: dropped leaves, pass@k


def test_a_dropped_leaf_counts_in_no_node_value_by_hand():
    """One prompt, depth 2, branching 2: leaves (A1, A2) under A, (B1, B2) under B, rewards 1, 1, 0, 1, and A2
    dropped (a reward could not score it). V(A) = 1 (its one kept leaf), not 0.5 as a reward of 0 would make it;
    V(B) = 0.5. Siblings A, B: mean 0.75, unbiased std sqrt(2 * 0.25^2 / 1) -> A(A) = +0.7071, A(B) = -0.7071.
    Under A the one kept leaf has no sibling: 0; under B leaves 0, 1 -> -0.7071, +0.7071. The dropped leaf: 0."""
    import math

    import torch

    from mmrlvr.algos.advantages import grpo_advantages
    from mmrlvr.algos.tree import tree_advantages

    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    node = torch.tensor([[0, 10], [0, 11], [1, 12], [1, 13]])
    parents = [torch.zeros(4, dtype=torch.long), node[:, 0]]
    keep = torch.tensor([True, False, True, True])
    adv, per_depth = tree_advantages(rewards, node, parents, starts=[0, 3], lengths=[3, 2], response_length=5,
                                     estimator=lambda v, g: grpo_advantages(v, g), keep=keep)
    a = 0.25 / math.sqrt(2 * 0.25 ** 2)
    expect = torch.tensor([[a] * 3 + [0.0] * 2, [0.0] * 5, [-a] * 3 + [-a] * 2, [-a] * 3 + [a] * 2])
    torch.testing.assert_close(adv, expect, rtol=1e-4, atol=1e-5)
    assert per_depth == pytest.approx([a, 2 * a / 3], rel=1e-4)  # depth 2: nodes A1 (0), B1, B2 (a each)


def _tree_run(tmp_path, *opts) -> list[dict]:
    run = train_tiny_run(tmp_path / "r", "max_steps=1", "save_every=0", "log_rollouts=false", "rollout.strategy=tree",
                         "rollout.prompts_per_step=4", "rollout.max_new_tokens=24", *opts)
    return _metrics(run)


@pytest.mark.parametrize("opts, depth", [
    (["rollout.strategy_params={depth: 3, branching: 2}"], 3),  # GRPO among siblings
    (["rollout.strategy_params={depth: 2, branching: 4}", "algo.advantage=pass_at_k", "algo.advantage_params={k: 2}"],
     2),  # pass@k among siblings: 4 children per node, k = 2 < 4
])
def test_a_trained_tree_step_has_advantages_at_every_depth(tmp_path, opts, depth):
    """The tree stage normalises node values with the run's estimator, pass@k included (before: setting
    algo.advantage with a tree was a stage conflict); every depth of a trained step carries signal."""
    (row,) = _tree_run(tmp_path, *opts)
    assert all(row[f"tree/abs_advantage_depth{d}"] > 0 for d in range(1, depth + 1)), row


def _refusal(tmp_path, *opts) -> str:
    from analysis_helpers import cli

    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/r",
              "algo.advantage=pass_at_k", *opts)
    assert res.returncode == 2, res.stdout + res.stderr
    return res.stderr


def test_pass_at_k_in_groups_of_k_or_fewer_is_refused_naming_both_keys(tmp_path):
    """Depth 3, branching 2, k = 4: every sibling group has 2 members, so every advantage would be 0 at every
    depth; a budget sampler whose smallest group is k likewise. Refused before the model loads, naming k and the
    setting that makes the groups small."""
    err = _refusal(tmp_path, "rollout.strategy=tree", "rollout.strategy_params={depth: 3, branching: 2}",
                   "algo.advantage_params={k: 4}")
    assert "k=4 needs groups of more than k members" in err and "rollout.strategy_params.branching=2" in err, err
    assert "algo.advantage_params.k" in err
    err = _refusal(tmp_path, "rollout.sampler=budget", "rollout.sampler_params={g_min: 2}",
                   "algo.advantage_params={k: 2}")
    assert "k=2 needs groups of more than k members" in err and "rollout.sampler_params.g_min=2" in err, err
    ok = __import__("analysis_helpers").cli(
        "train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/ok",
        "algo.advantage=pass_at_k", "rollout.sampler=budget", "rollout.sampler_params={g_min: 3}",
        "algo.advantage_params={k: 2}")
    assert ok.returncode == 0, ok.stderr


# ------------------------------------------------------------------------------------------- CoCoV with pass@k


def _documented_cocov_commands() -> list[str]:
    text = (ROOT / "docs" / "methods.md").read_text()
    section = text[text.index("## CoCoV"):]
    section = section[:section.index("\n## ", 1)]
    return [ln for ln in section.splitlines() if ln.startswith("mmrlvr train") and "rewards.1.name=cocov" in ln]


def test_cocov_bonus_moves_the_documented_pairings_advantages(tmp_path):
    """A confident group (6 of 8 agree): the majority scores 1, a parsable dissenter the bonus 0.2, an unparsable
    row 0. Under GRPO (the documented pairing) the bonus lifts the dissenter above the unparsable row:
    rewards [1]*6 + [0.2, 0]: mean 0.775, unbiased std sqrt((6 * 0.225^2 + 0.575^2 + 0.775^2) / 7) = 0.3955,
    dissenter (0.2 - 0.775) / 0.3955 = -1.4538 against the unparsable row's -1.9595; without the bonus both are
    (0 - 0.75) / 0.4629 = -1.6202. Under pass@k (k 4, threshold 1) the bonus row counts as wrong either way, so
    its advantages are identical — the first documented command must be one the bonus acts on, and the plan of
    the second says the bonus is inert."""
    import math

    import torch

    from mmrlvr.algos.advantages import ADVANTAGES

    commands = _documented_cocov_commands()
    assert commands and "algo.advantage" not in commands[0]  # the first documented pairing: the default, GRPO
    bonus, plain = torch.tensor([1.0] * 6 + [0.2, 0.0]), torch.tensor([1.0] * 6 + [0.0, 0.0])
    g = torch.zeros(8, dtype=torch.long)
    a_bonus, a_plain = ADVANTAGES.get("grpo")(bonus, g), ADVANTAGES.get("grpo")(plain, g)
    std = math.sqrt((6 * 0.225 ** 2 + 0.575 ** 2 + 0.775 ** 2) / 7)
    assert float(a_bonus[6]) == pytest.approx((0.2 - 0.775) / std, rel=1e-4)
    assert float(a_bonus[7]) == pytest.approx(-0.775 / std, rel=1e-4)
    assert float(a_plain[6]) == pytest.approx(-0.75 / math.sqrt(6 * 0.25 ** 2 / 7 + 2 * 0.75 ** 2 / 7), rel=1e-4)
    assert float(a_bonus[6]) > float(a_bonus[7])  # the explorer ranks above the unparsable row
    passk = ADVANTAGES.get("pass_at_k")
    assert torch.equal(passk(bonus, g, k=4), passk(plain, g, k=4))  # inert under pass@k, as documented

    from analysis_helpers import cli

    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", f"output_dir={tmp_path}/r",
              "rewards.1.name=cocov", "algo.advantage=pass_at_k", "algo.advantage_params={k: 4}")
    assert res.returncode == 0, res.stderr
    assert "note:" in res.stdout and "bonus" in res.stdout and "cocov" in res.stdout, res.stdout


# -------------------------------------------------- distillation horizon and experts on multi-turn rollouts


def test_the_horizon_counts_response_tokens_not_positions():
    """A multi-turn row: model tokens at 0-1, a masked tool turn at 2-4, model tokens at 5-9 (7 counted). Share 0.5
    keeps ceil(3.5) = 4 counted tokens: positions 0, 1, 5, 6 (cutting by position kept 0 and 1 only). Weights
    (credit) are kept as they are; a row without a gap is cut as before."""
    import torch

    from mmrlvr.algos.distill import horizon_mask

    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    mask[0, 5] = 0.5  # a credit weight: still a response token
    got = horizon_mask(mask, 0.5)
    assert got[0].tolist() == [1, 1, 0, 0, 0, 0.5, 1, 0, 0, 0]
    assert got[1].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("grown", ["rollout.summarize={at_tokens: 1000}", "rollout.tools=[zoom]"])
def test_a_privileged_expert_on_grown_contexts_is_refused(tmp_path, grown):
    """The privileged expert re-encodes the sample's original prompt: a ReSum segment (restarted from a summary) or a
    tool turn (images the prompt lacks) would be scored against the wrong context (tools: a crash of the vision
    tower before). Refused before the model loads, naming the setting; a model-folder expert is accepted."""
    from analysis_helpers import cli

    key = grown.split("=")[0]
    res = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/r", grown,
              "algo.aux_losses=[{name: forward_ce, weight: 0.1}]")
    assert res.returncode == 2 and "expert: privileged re-encodes" in res.stderr and key in res.stderr, res.stderr
    ok = cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/ok", grown,
             "algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {expert: 'tiny:qwen2_5_vl:warm'}}]")
    assert ok.returncode == 0, ok.stderr


def test_a_model_expert_scores_half_of_each_zoom_trajectory(tmp_path):
    """zoom-tiny's rows hold a tool turn with an image after the first model turn; a model-folder expert at horizon
    0.5 scores exactly half of the counted model tokens (the tool image past the cut no longer breaks its forward:
    'Image features and image tokens do not match' before)."""
    from analysis_helpers import cli

    run = tmp_path / "z"
    res = cli("train", "configs/zoom-tiny.yaml", f"output_dir={run}", "max_steps=1", "rollout.prompts_per_step=2",
              "eval.at_start=false", "eval.at_end=false", "eval.every=0", "progress=false", "log_rollouts=false",
              "algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {expert: 'tiny:qwen2_5_vl:warm', "
              "horizon: 0.5}}]")
    assert res.returncode == 0, res.stderr[-2000:]
    (row,) = _metrics(run)
    assert row["tools/calls"] > 0 and row["distill/teacher_tokens"] > 0 and row["distill/ce"] > 0
    assert row["distill/teacher_token_share"] == pytest.approx(0.5, abs=0.02)  # ceil per row: just above 0.5


def test_zero_std_group_fraction_counts_equal_rewards_exactly():
    """Six rewards of 1.2 are all equal, yet their float32 std is 1.19e-7, above the 1e-8 cutoff the metric used:
    groups of sizes other than powers of two were missed (a budget run logged 0.003 where its records gave 0.178).
    The metric now compares each group's max and min, as the estimators' spread test does; groups of one size and
    of several sizes alike."""
    import torch

    from mmrlvr.rewards.base import RewardResult
    from mmrlvr.rollout.base import Completion, RolloutBatch
    from mmrlvr.train.step_metrics import rollout_metrics
    from mmrlvr.types import Sample

    assert float(torch.full((6,), 1.2).std(unbiased=False)) > 1e-8  # the premise: the std misses

    def metrics(rewards: list[float], groups: list[int]) -> dict:
        n = len(rewards)
        z = torch.zeros(n, 2)
        batch = RolloutBatch(samples=[Sample(id=f"q{g}", messages=[], images=[], answer="1", answer_type="number")
                                      for g in groups],
                             group_index=torch.tensor(groups), sample_index=torch.arange(n), input_ids=z.long(),
                             attention_mask=z.long(), response_ids=z.long(), response_mask=torch.ones(n, 2),
                             old_logprobs=z, vision={}, prompt_length=1,
                             completions=[Completion(text="<answer>1</answer>", finish_reason="stop")] * n)
        return rollout_metrics(batch, torch.tensor(rewards), [RewardResult(score=r) for r in rewards], 6)

    assert metrics([1.2] * 6 + [1.2] * 5 + [0.2], [0] * 6 + [1] * 6)["zero_std_group_fraction"] == 0.5
    assert metrics([1.2] * 6 + [1.2] * 3, [0] * 6 + [1] * 3)["zero_std_group_fraction"] == 1.0  # sizes 6 and 3
