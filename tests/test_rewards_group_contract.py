"""The reward contract for group-aware rewards and run-wide settings: whole groups with their group index, and the
answer template / group size reaching rewards a combinator builds itself."""

from __future__ import annotations

from mmrlvr.errors import UserError
from mmrlvr.rewards.base import REWARDS, build_reward, run_settings, score_batch
from mmrlvr.types import Completion, RewardResult, Sample


def _s(i: str) -> Sample:
    return Sample(id=i, messages=[], images=[], answer="3", answer_type="number")


@REWARDS.register("test_group_index_probe")
class GroupIndexProbe:
    """Records the groups it is handed; scores each row by its group's size."""

    group_aware = True

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, completion, sample):
        raise UserError("score_batch only")

    def score_batch(self, completions, samples, *, group_index):
        self.calls.append(list(group_index))
        sizes = {g: group_index.count(g) for g in group_index}
        return [RewardResult(float(sizes[g])) for g in group_index]


def test_a_group_aware_reward_receives_the_group_index():
    fn = build_reward("test_group_index_probe")
    out = score_batch(fn, [Completion("a")] * 5, [_s("x")] * 3 + [_s("y")] * 2, group_index=[0, 0, 0, 1, 1])
    assert fn.calls == [[0, 0, 0, 1, 1]] and [r.score for r in out] == [3, 3, 3, 2, 2]


@REWARDS.register("test_nested_gate")
class NestedGate:
    """A combinator: builds its inner reward itself (as a gated process reward would)."""

    def __init__(self, inner: str = "auto_accuracy") -> None:
        self.inner = build_reward(inner)

    def __call__(self, completion, sample):
        return self.inner(completion, sample)


def test_run_settings_reach_a_reward_built_inside_a_combinator():
    boxed = Completion("so the answer is \\boxed{3}")
    with run_settings(template="boxed", group_size=4):
        gate = build_reward("test_nested_gate")
    assert gate.inner(boxed, _s("x")).score == 1.0  # the inner accuracy reads \boxed{} as the run asks
    assert build_reward("test_nested_gate").inner(boxed, _s("x")).score == 0.0  # outside a run: its own R1 default
    with run_settings(template="boxed"):  # params the user set win over the run's settings
        assert build_reward("auto_accuracy", template="r1")(boxed, _s("x")).score == 0.0


def test_the_trainer_builds_rewards_with_the_runs_template_and_group_size(tmp_path):
    from pathlib import Path

    from mmrlvr.config import load_config
    from mmrlvr.train.reward_setup import build_run_reward

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "configs/demo-tiny.yaml",
                      ["data.template=boxed", "rollout.group_size=4",
                       'rewards=[{"name": "test_nested_gate"}, {"name": "consistency"}]'])
    reward = build_run_reward(cfg)
    gate, consistency = reward.fns
    assert gate.inner(Completion("\\boxed{3}"), _s("x")).score == 1.0 and consistency.group_size == 4
