"""On-policy distillation (``algo.advantage: opd``): the advantage by hand, two training steps with a larger teacher
and with the student's own earlier checkpoint (the advantages recomputed from what the run logged), a teacher with
another tokenizer refused naming both models, and a teacher with the student's own weights giving exactly 0."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmrlvr.config import load_config
from mmrlvr.errors import ConfigErrors, UserError

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "scripts" / "plugin_rewards.py"


# ------------------------------------------------------------------------------------------------- by hand
def _hand_batch():
    """Two groups of two rows, responses of 3, 2, 3 and 1 tokens (padding to 3)."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    student = torch.tensor([[-0.5, -1.0, -2.0], [-0.2, -3.0, 0.0], [-1.5, -0.1, -0.7], [-0.9, 0.0, 0.0]])
    teacher = torch.tensor([[-0.7, -0.4, -2.5], [-0.2, -1.0, -9.0], [-1.0, -0.6, -0.7], [-2.9, -5.0, -5.0]])
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])  # group 0 has a spread, group 1 none
    rollouts = SimpleNamespace(group_index=torch.tensor([0, 0, 1, 1]), response_mask=mask, old_logprobs=student,
                               num_rows=4, response_extent=lambda i: int(mask[i].sum()))
    b = SimpleNamespace(rewards=rewards, row_mask=None, diagnostics={}, record_fields={},
                        rollouts=rollouts, advantages=None, teacher_logprobs=None)
    return b, student, teacher, mask


def _stages(reward_weight: float, teacher: torch.Tensor):
    from mmrlvr.train.stages.advantages import OpdAdvantage
    from mmrlvr.train.stages.reference import TeacherLogprobs

    cfg = load_config(ROOT / "configs/demo-tiny.yaml", [
        "algo.advantage=opd", f"algo.advantage_params={{teacher: /a/teacher, reward_weight: {reward_weight}}}"])
    adv = OpdAdvantage(SimpleNamespace(cfg=cfg, accel=SimpleNamespace(num_processes=1)))
    ref = TeacherLogprobs.__new__(TeacherLogprobs)  # the teacher's pass replaced by the hand-written log-probs
    ref.reward_weight, ref.logprobs = reward_weight, (lambda b: teacher)
    return adv, ref


@pytest.mark.parametrize("reward_weight", [0.0, 0.5])
def test_the_advantage_is_the_negative_reverse_kl_per_token_plus_the_weighted_grpo_advantage(reward_weight):
    b, student, teacher, mask = _hand_batch()
    adv_stage, ref_stage = _stages(reward_weight, teacher)
    adv_stage(b)
    assert b.advantages.shape == (4,)  # the advantages kind writes the reward term only
    ref_stage(b)
    # GRPO by hand: group 0 rewards (1, 0): mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / (0.70711 + 1e-6);
    # group 1 has no spread -> 0
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    grpo = [a, -a, 0.0, 0.0]
    expected = [
        [(-0.7 + 0.5) + reward_weight * grpo[0], (-0.4 + 1.0) + reward_weight * grpo[0],
         (-2.5 + 2.0) + reward_weight * grpo[0]],
        [(-0.2 + 0.2) + reward_weight * grpo[1], (-1.0 + 3.0) + reward_weight * grpo[1], 0.0],  # padding: 0
        [(-1.0 + 1.5), (-0.6 + 0.1), (-0.7 + 0.7)],  # no spread: the distillation term alone
        [(-2.9 + 0.9), 0.0, 0.0],
    ]
    assert b.advantages.shape == (4, 3)
    torch.testing.assert_close(b.advantages, torch.tensor(expected), rtol=0, atol=1e-6)
    assert torch.equal(b.teacher_logprobs, teacher)
    # opd/reverse_kl: mean of lp_s - lp_t over the 9 response tokens, weighted by them
    kl = [0.2, -0.6, 0.5, 0.0, -2.0, -0.5, 0.5, 0.0, 2.0]
    assert b.diagnostics["opd/reverse_kl"] == pytest.approx(sum(kl) / 9, abs=1e-6)
    assert b.diagnostics["opd/tokens"] == 9.0 and b.diagnostics["opd/reverse_kl"].n == 9.0
    assert [len(v) for v in b.record_fields["teacher_logprob"]] == [3, 2, 3, 1]


def test_dropped_rows_carry_nothing_and_the_pure_function_agrees():
    from mmrlvr.algos.opd import opd_advantages

    b, student, teacher, mask = _hand_batch()
    b.row_mask = torch.tensor([True, True, True, False])
    _, ref_stage = _stages(0.0, teacher)
    b.advantages = torch.zeros(4)
    ref_stage(b)
    assert torch.equal(b.advantages[3], torch.zeros(3))
    assert b.diagnostics["opd/tokens"] == 8.0
    torch.testing.assert_close(b.advantages[:3], opd_advantages(student, teacher, mask)[:3])
    with pytest.raises(ValueError, match="one shape"):
        opd_advantages(student, teacher[:, :2], mask)


# ------------------------------------------------------------------------------------------- configuration
def test_the_teacher_is_required_and_reward_weight_non_negative_naming_the_keys():
    with pytest.raises(ConfigErrors) as e:
        load_config(ROOT / "configs/demo-tiny.yaml", ["algo.advantage=opd"])
    assert any(p.split(": ", 1)[1].startswith("algo.advantage_params.teacher: advantage estimator 'opd': required")
               for p in e.value.problems), e.value.problems
    with pytest.raises(ConfigErrors) as e:
        load_config(ROOT / "configs/demo-tiny.yaml", [
            "algo.advantage=opd", "algo.advantage_params={teacher: x, reward_weight: -1}"])
    assert any("algo.advantage_params.reward_weight: advantage estimator 'opd': must be >= 0" in p
               for p in e.value.problems), e.value.problems


def test_a_missing_teacher_folder_is_reported_before_the_model_loads(tmp_path):
    from mmrlvr.validation import check_run

    with pytest.raises(ConfigErrors) as e:
        check_run(ROOT / "configs/demo-tiny.yaml", [
            f"output_dir={tmp_path}/r", "algo.advantage=opd", f"algo.advantage_params={{teacher: {tmp_path}/none}}"])
    assert any(f"algo.advantage_params.teacher: {tmp_path}/none: no such folder" in p for p in e.value.problems)


def test_the_plan_runs_the_teacher_after_the_recomputed_old_policy_and_conflicts_name_both_keys():
    from mmrlvr.train.plan import build_plan

    cfg = load_config(ROOT / "configs/demo-tiny.yaml", ["algo.advantage=opd",
                                                       "algo.advantage_params={teacher: tiny:qwen2_5_vl}"])
    stages = [(s.kind, s.name) for s in build_plan(cfg).stages]
    assert ("advantages", "opd") in stages
    reference = [n for k, n in stages if k == "reference"]
    assert reference.index("old_policy") < reference.index("teacher")
    cfg = load_config(ROOT / "configs/demo-tiny.yaml", [
        "algo.advantage=opd", "algo.advantage_params={teacher: tiny:qwen2_5_vl}", "algo.recompute_old_logprobs=false"])
    assert ("reference", "old_policy") not in [(s.kind, s.name) for s in build_plan(cfg).stages]
    with pytest.raises(ConfigErrors) as e:
        build_plan(load_config(ROOT / "configs/demo-tiny.yaml", [
            "algo.advantage=opd", "algo.advantage_params={teacher: tiny:qwen2_5_vl}", "algo.loss=popo"]))
    assert "algo.advantage: opd" in e.value.problems[0] and "algo.loss: popo" in e.value.problems[0]
    # a teacher among this run's own checkpoints would be pruned as the run saves newer ones
    with pytest.raises(ConfigErrors) as e:
        build_plan(load_config(ROOT / "configs/demo-tiny.yaml", [
            "output_dir=/r", "algo.advantage=opd", "algo.advantage_params={teacher: /r/checkpoints/step-00000002}"]))
    assert any("algo.advantage_params.teacher: /r/checkpoints/step-00000002 is one of this run's own checkpoints"
               in p for p in e.value.problems), e.value.problems


# ------------------------------------------------------------------------------------------- training runs
@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """The student (the tiny Qwen2.5-VL), a larger teacher of the same family and processor (3 layers, width 192,
    a deeper and wider vision tower: a shape-true stand-in for a bigger model), and one with another vocabulary."""
    from mmrlvr.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("opd-models")
    return {"student": str(build_tiny("qwen2_5_vl", root / "student")),
            "large": str(build_tiny("qwen2_5_vl", root / "large", seed=1, hidden_size=192, intermediate_size=384,
                                    num_hidden_layers=3, vision_depth=3, vision_hidden_size=96,
                                    vision_intermediate_size=192)),
            "other_vocab": str(build_tiny("qwen2_5_vl", root / "other", vocab_size=600))}


def _run_cfg(student: str, out: Path, teacher: str | None, params: dict | None = None, **algo):
    data = {"output_dir": str(out), "seed": 0, "max_steps": 2, "save_every": 0, "progress": False,
            "tensorboard": False, "model": {"path": student},
            "data": {"train": "synth:count", "train_size": 8, "image_size": 56},
            "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 10},
            "algo": {"kl_coef": 0.0, "micro_batch_size": 3, **algo},  # 3 rows cut the groups of 4
            "optim": {"lr": 1e-3},
            "eval": {"at_start": False, "at_end": False, "every": 0},
            # distinct_tokens varies between samples of a random policy: the reward term is non-zero too
            "plugins": [str(PLUGIN)], "rewards": [{"name": "distinct_tokens", "weight": 1.0}]}
    if teacher is not None:
        data["algo"].update(advantage="opd", advantage_params={"teacher": teacher, **(params or {})})
    return load_config(data=data)


def _train(cfg):
    from mmrlvr.train.trainer import Trainer

    trainer = Trainer(cfg)
    trainer.train()
    return trainer


def _records(run: Path):
    from mmrlvr.store.reader import RolloutReader

    reader = RolloutReader(run)
    return {step: reader.read_step(step) for step in reader.steps()}


def _grpo(records) -> dict[tuple[str, int], float]:
    """GRPO advantages of a step's rows from their logged rewards (unbiased std + 1e-6, 0 without spread)."""
    out, groups = {}, {}
    for r in records:
        groups.setdefault(r.prompt_id, []).append(r)
    for pid, rows in groups.items():
        rw = torch.tensor([r.reward for r in rows], dtype=torch.float32)
        std = rw.std()
        for r, x in zip(rows, rw.tolist()):
            out[(pid, r.sample_index)] = 0.0 if float(rw.max() - rw.min()) == 0 else \
                (x - float(rw.mean())) / (float(std) + 1e-6)
    return out


def _check_logged(run: Path, reward_weight: float) -> list[float]:
    """Every logged token advantage equals the formula recomputed from the logged log-probs and rewards; returns
    the teacher - student differences."""
    from mmrlvr.train.metrics import read_metrics

    by_step = _records(run)
    metrics = {r["step"]: r for r in read_metrics(run / "metrics.jsonl") if "loss" in r}
    assert sorted(by_step) == sorted(metrics) and len(by_step) == 2
    diffs = []
    for step, records in by_step.items():
        grpo = _grpo(records)
        kl_sum, tokens = 0.0, 0
        for r in records:
            t = r.extra["teacher_logprob"]
            assert len(t) == len(r.token_logprob) == len(r.token_advantage) > 0
            for s_lp, t_lp, adv in zip(r.token_logprob, t, r.token_advantage):
                want = -(s_lp - t_lp) + reward_weight * grpo[(r.prompt_id, r.sample_index)]
                assert adv == pytest.approx(want, abs=2e-5), (step, r.prompt_id, r.sample_index)
                diffs.append(t_lp - s_lp)
                kl_sum += s_lp - t_lp
                tokens += 1
        assert metrics[step]["opd/reverse_kl"] == pytest.approx(kl_sum / tokens, rel=1e-4, abs=1e-5)
        assert metrics[step]["opd/tokens"] == tokens
    return diffs


def test_two_steps_with_a_larger_teacher_of_the_family(models, tmp_path):
    run = tmp_path / "large"
    trainer = _train(_run_cfg(models["student"], run, models["large"], params={"reward_weight": 0.5}))
    stage = next(s for s in trainer.rt.pipeline.all_stages() if s.name == "teacher")
    assert stage.teacher.config.text_config.num_hidden_layers == 3 and not stage.shares_vision  # its own tower
    diffs = _check_logged(run, 0.5)
    assert max(abs(d) for d in diffs) > 0.1  # the teacher's log-probs are not the student's
    # the reward term: at least one group has a spread, so some advantages differ from the distillation term alone
    assert any(abs(r.token_advantage[0] - (r.extra["teacher_logprob"][0] - r.token_logprob[0])) > 1e-3
               for recs in _records(run).values() for r in recs)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_steps_with_the_students_own_earlier_checkpoint_as_teacher(models, tmp_path, lora):
    def cfg(out, teacher):
        c = _run_cfg(models["student"], out, teacher)
        if lora:  # the teacher is the base model with the checkpoint's adapter, merged
            c.model.lora.enabled, c.model.lora.r, c.model.lora.alpha = True, 8, 16
        return c

    ahead = tmp_path / "ahead"
    _train(cfg(ahead, None))  # plain GRPO, 2 steps: the final checkpoint is the teacher
    ckpt = ahead / "checkpoints" / "step-00000002"
    assert (ckpt / "state.json").is_file() and (ckpt / "adapter_config.json").is_file() == lora
    run = tmp_path / "opd"
    trainer = _train(cfg(run, str(ckpt)))
    stage = next(s for s in trainer.rt.pipeline.all_stages() if s.name == "teacher")
    assert stage.shares_vision  # the frozen tower is the student's: its cached features serve the teacher
    diffs = _check_logged(run, 0.0)
    assert max(abs(d) for d in diffs) > 1e-3 and any(d != 0.0 for d in diffs)


def test_a_teacher_with_another_tokenizer_is_refused_naming_it(models, tmp_path):
    from mmrlvr.train.trainer import Trainer

    with pytest.raises(UserError) as e:
        Trainer(_run_cfg(models["student"], tmp_path / "r", models["other_vocab"]))
    msg = str(e.value)
    assert "algo.advantage_params.teacher" in msg and models["other_vocab"] in msg and models["student"] in msg
    assert "vocabularies differ" in msg


@pytest.mark.parametrize("freeze_vision", [True, False], ids=["vision-cache", "raw-pixels"])
def test_a_teacher_with_the_students_current_weights_gives_advantages_of_exactly_zero(models, tmp_path, freeze_vision):
    run = tmp_path / "self"
    cfg = _run_cfg(models["student"], run, models["student"])
    cfg.model.freeze_vision = freeze_vision  # no cache: both passes take the raw pixels through their own tower
    _train(cfg)
    by_step = _records(run)
    first = by_step[min(by_step)]  # the first step: the teacher's weights are the student's
    assert first and all(a == 0.0 for r in first for a in r.token_advantage)
    assert all(t == s for r in first for t, s in zip(r.extra["teacher_logprob"], r.token_logprob))
    from mmrlvr.train.metrics import read_metrics

    assert next(r for r in read_metrics(run / "metrics.jsonl") if "loss" in r)["opd/reverse_kl"] == 0.0
