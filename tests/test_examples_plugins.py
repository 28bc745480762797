"""The example plug-ins of docs/extending.md (docs/examples/*.py), each as a user would load it from the docs.

For each: its formula on a hand-worked case (the expected numbers worked out in the comments, never by calling the
plug-in twice), two training steps on the tiny VLM through the real trainer (with a check that the plug-in is what
ran), and an exact resume: 1 step, then ``resume`` to step 2, logs the same step-2 metrics and ends with the same
weights as 2 uninterrupted steps. The sampler's state is shown to matter: resumed without it, step 2 draws other
prompts. One uninterrupted and one interrupted run per example, a few seconds each.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmrlvr.config import load_config
from mmrlvr.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
#: the tiny warm-started VLM of configs/demo-tiny.yaml, 4 prompts x 4 rollouts of 16 tokens per step
FAST = ["eval.every=0", "eval.at_start=false", "eval.at_end=false", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_new_tokens=16", "data.train_size=8", "progress=false",
        "tensorboard=false", "log_rollouts=true", "save_every=1", "keep_checkpoints=0"]


@pytest.fixture(autouse=True, scope="module")
def _unregister_the_examples():
    """What the examples register is taken out of the registries when this file is done: a later test file in the
    same worker lists the registries (built-in names only) and must not see the examples' names."""
    import mmrlvr.plugins as plugins
    import mmrlvr.train.stages  # noqa: F401 - the built-in stages
    from mmrlvr.algos import ADVANTAGES, POLICY_LOSSES
    from mmrlvr.train.samplers import SAMPLERS
    from mmrlvr.train.stages import STAGES

    registries = [ADVANTAGES, POLICY_LOSSES, SAMPLERS, *STAGES.values()]
    before = [dict(r._items) for r in registries]
    modules, loaded = set(sys.modules), dict(plugins._LOADED)
    yield
    for reg, items in zip(registries, before):
        reg._items.clear()
        reg._items.update(items)
    for name in set(sys.modules) - modules:
        if name.startswith("mmrlvr_plugin_"):
            del sys.modules[name]
    plugins._LOADED.clear()
    plugins._LOADED.update(loaded)


def plug(stem: str) -> str:
    """The ``plugins=[...]`` override naming an example (by absolute path: the tests may run from any folder)."""
    return f"plugins=[{EXAMPLES / stem}.py]"


def example(stem: str):
    """The example's module, imported as the trainer imports a plug-in (once per process, whatever the path)."""
    from mmrlvr.plugins import load_plugins, plugin_module_name

    spec = str(EXAMPLES / f"{stem}.py")
    load_plugins([spec])
    return sys.modules[plugin_module_name(spec)]


def _cfg(out: Path, overrides: list[str], steps: int):
    return load_config(ROOT / "configs" / "demo-tiny.yaml", [f"output_dir={out}", *FAST, *overrides,
                                                             f"max_steps={steps}"])


def _trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}


def _steps(run: Path) -> dict[int, dict]:
    """The run's step metrics by step, without the wall-clock timings."""
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("time/")}
            for r in read_metrics(run / "metrics.jsonl") if "loss" in r}


def _records(run: Path, step: int):
    from mmrlvr.store.reader import RolloutReader

    return RolloutReader(run).read_step(step)


def _accuracy_by_prompt(run: Path, step: int, index: dict[str, int]) -> dict[int, list[float]]:
    """Each prompt's (dataset index) recorded accuracy components at ``step``."""
    out: dict[int, list[float]] = {}
    for r in _records(run, step):
        out.setdefault(index[r.prompt_id], []).append(r.reward_components["auto_accuracy"])
    return out


def _prompts(run: Path, step: int) -> list[str]:
    return sorted({r.prompt_id for r in _records(run, step)})


def _drop_stage_state(run: Path, step: int) -> None:
    """Delete a checkpoint's stage state and re-sign its manifest (a checkpoint saved without it)."""
    from mmrlvr.train.checkpoint import write_manifest

    ckpt = run / "checkpoints" / f"step-{step:08d}"
    (ckpt / "training_state" / "stage_state.pt").unlink()
    write_manifest(ckpt, step)


def resume_pair(tmp_path: Path, overrides: list[str], *, control: bool = False) -> SimpleNamespace:
    """2 uninterrupted steps (``a``) vs 1 step then ``resume`` to 2 (``b``), same config; with ``control``, also
    a copy of the 1-step run resumed after its stage state was dropped (``c``)."""
    from mmrlvr.train.trainer import Trainer

    a = Trainer(_cfg(tmp_path / "a", overrides, 2))
    before = _trainable(a)
    summary = a.train()
    Trainer(_cfg(tmp_path / "b", overrides, 1)).train()
    if control:
        shutil.copytree(tmp_path / "b", tmp_path / "c")
        _drop_stage_state(tmp_path / "c", 1)
    b = Trainer(_cfg(tmp_path / "b", overrides, 2), resume=True)
    b.train()
    c = None
    if control:
        c = Trainer(_cfg(tmp_path / "c", overrides, 2), resume=True)
        c.train()
    return SimpleNamespace(a=a, b=b, c=c, before=before, summary=summary, dir_a=tmp_path / "a",
                           dir_b=tmp_path / "b", dir_c=tmp_path / "c")


def assert_trained_and_resumed_exactly(runs: SimpleNamespace) -> None:
    """a trained 2 steps (finite, weights moved); b's resumed step 2 equals a's step 2 exactly, as do the weights."""
    assert runs.summary["skipped_steps"] == 0
    ma, mb = _steps(runs.dir_a), _steps(runs.dir_b)
    assert sorted(ma) == sorted(mb) == [1, 2]  # no step lost or repeated by the resume
    assert all(math.isfinite(ma[s]["loss"]) for s in ma)
    after = _trainable(runs.a)
    assert any(not torch.equal(runs.before[n], after[n]) for n in after), "two steps left every weight as it was"
    assert mb[2] == ma[2]  # exactly: every metric of the resumed step
    got = _trainable(runs.b)
    assert got.keys() == after.keys()
    for n in after:
        assert torch.equal(got[n], after[n]), n


# ------------------------------------------------------------------------------------ 1. pass@k advantage
def _passk_by_enumeration(correct: list[bool], k: int) -> list[float]:
    """The pass@k advantages by brute force (independent of the example's closed form): every k-subset of the
    group scores max(correct), normalised by the subsets' mean and (population) std; a rollout's advantage is the
    mean over the subsets that hold it."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    score = {s: float(any(correct[i] for i in s)) for s in subsets}
    mean = sum(score.values()) / len(score)
    std = math.sqrt(sum((v - mean) ** 2 for v in score.values()) / len(score))
    if std == 0:
        return [0.0] * len(correct)
    return [sum((score[s] - mean) / std for s in subsets if i in s) / sum(1 for s in subsets if i in s)
            for i in range(len(correct))]


def test_pass_at_k_hand_worked():
    passk = example("passk_advantage").pass_at_k_advantages
    # rewards as demo-tiny gives them: 1.2 = right and formatted, 0.2 = formatted only (threshold 1.0)
    rewards = torch.tensor([1.2, 0.2, 0.2, 0.2,   1.2, 1.2, 0.2, 0.2,   1.2, 1.2, 1.2, 1.2])
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    # k = 2. group 0 (1 right, 3 wrong): rho = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2, sigma = sqrt(1/4) = 1/2;
    #   A_pos = (1/2)/(1/2) = 1; A_neg = (1 - 1/2 - C(2,1)/C(3,1)) / (1/2) = (1/2 - 2/3) * 2 = -1/3
    # group 1 (2 right, 2 wrong): rho = 1 - C(2,2)/C(4,2) = 5/6, sigma = sqrt(5/36) = sqrt(5)/6;
    #   A_pos = (1/6)/(sqrt(5)/6) = 1/sqrt(5); A_neg = (1 - 5/6 - C(1,1)/C(3,1)) / (sqrt(5)/6) = -1/sqrt(5)
    # group 2 (all right): rho = 1, sigma = 0 -> 0
    s5 = 1 / math.sqrt(5)
    want = [1.0, -1 / 3, -1 / 3, -1 / 3, s5, s5, -s5, -s5, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(passk(rewards, groups, k=2), torch.tensor(want), rtol=1e-6, atol=1e-6)
    # k = 3, group 0: rho = 1 - C(3,3)/C(4,3) = 3/4, sigma = sqrt(3/16) = sqrt(3)/4;
    #   A_pos = (1/4)/(sqrt(3)/4) = 1/sqrt(3); A_neg = (1 - 3/4 - C(2,2)/C(3,2)) / (sqrt(3)/4) = -1/(3 sqrt(3))
    s3 = 1 / math.sqrt(3)
    torch.testing.assert_close(passk(rewards[:4], groups[:4], k=3), torch.tensor([s3, -s3 / 3, -s3 / 3, -s3 / 3]),
                               rtol=1e-6, atol=1e-6)
    # k = 4 = G with 3 wrong: every 4-subset is the whole group, which passes: rho = 1 -> no signal
    assert passk(rewards[:4], groups[:4], k=4).tolist() == [0.0] * 4
    # the threshold decides what "right" is: at 0.2 every row of group 0 is right -> no signal
    assert passk(rewards[:4], groups[:4], k=2, threshold=0.2).tolist() == [0.0] * 4
    # k = 1 is GRPO with the population std (up to GRPO's eps)
    from mmrlvr.algos import grpo_advantages

    torch.testing.assert_close(passk(rewards, groups, k=1), grpo_advantages(rewards, groups, unbiased=False),
                               rtol=1e-4, atol=1e-5)
    # the closed form equals the brute-force average over k-subsets, for every mix of a group of 6 and every k
    for n_pos in range(7):
        correct = [True] * n_pos + [False] * (6 - n_pos)
        r = torch.tensor([1.0 if c else 0.0 for c in correct])
        for k in range(1, 7):
            torch.testing.assert_close(passk(r, torch.zeros(6, dtype=torch.long), k=k),
                                       torch.tensor(_passk_by_enumeration(correct, k)), rtol=1e-5, atol=1e-6,
                                       msg=f"n_pos={n_pos} k={k}")


def test_pass_at_k_declares_k_and_refuses_k_above_the_group_size_at_the_dry_run(tmp_path):
    from mmrlvr.methods import method_spec

    example("passk_advantage")
    spec = method_spec("advantage", "my_pass_at_k")
    assert [p.name for p in spec.params] == ["k", "threshold"] and spec.param("k").default == 4
    assert spec.lines()[1].startswith("    k = 4  # rollouts per pass@k subset")  # --help-config's line

    def dry_run(*overrides: str) -> subprocess.CompletedProcess:
        # --dry-run without --config-only: --config-only does not import plug-in files (files of the target
        # machine), so it cannot know my_pass_at_k; the dry run checks the rest of this machine too
        return subprocess.run([sys.executable, "-m", "mmrlvr.cli", "train", "configs/demo-tiny.yaml", "--dry-run",
                               f"output_dir={tmp_path}/run", "plugins=[docs/examples/passk_advantage.py]",
                               "algo.advantage=my_pass_at_k", *overrides], capture_output=True, text=True, env=ENV,
                              cwd=ROOT, timeout=300)

    res = dry_run("algo.advantage_params.k=9", "rollout.group_size=8")
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "algo.advantage_params: advantage estimator 'my_pass_at_k': k=9 exceeds rollout.group_size=8" in line, line
    assert "Traceback" not in res.stderr
    res = dry_run("algo.advantage_params.k=8", "rollout.group_size=8")
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "run").exists()


def test_pass_at_k_trains_and_resumes_exactly(tmp_path):
    runs = resume_pair(tmp_path, [plug("passk_advantage"), "algo.advantage=my_pass_at_k", "algo.advantage_params={k: 2}"])
    assert_trained_and_resumed_exactly(runs)
    # what ran is the plug-in: each recorded group's advantages are the brute-force pass@2 advantages of its rewards
    signal = 0
    for step in (1, 2):
        by_prompt: dict[str, list] = {}
        for r in _records(runs.dir_a, step):
            by_prompt.setdefault(r.prompt_id, []).append(r)
        for rows in by_prompt.values():
            rows.sort(key=lambda r: r.sample_index)
            want = _passk_by_enumeration([r.reward >= 1.0 for r in rows], 2)
            assert [r.advantage for r in rows] == pytest.approx(want, abs=1e-5)
            signal += any(w != 0 for w in want)
    assert signal, "no group with a pass@2 signal: the check above proved nothing"


# ------------------------------------------------------------------------------- 2. success-rate sampler
def test_success_rate_sampler_hand_worked():
    from mmrlvr.train.samplers import SAMPLERS, StepOutcome, build_sampler

    example("success_rate_sampler")
    assert "success_rate" in SAMPLERS
    s = build_sampler("success_rate", 4, 2, 0, {"ema": 0.5, "prior": 0.5, "floor": 0.01})
    assert s.weights().tolist() == [0.25] * 4  # unseen: p = prior = 0.5 -> 0.5 * 0.5
    # prompt 0 all right: p = 0.5 * 0.5 + 0.5 * 1 = 0.75 -> w = 0.75 * 0.25 = 0.1875
    # prompt 1 all wrong: p = 0.5 * 0.5 + 0.5 * 0 = 0.25 -> w = 0.1875
    s.observe(StepOutcome(0, [0, 1], [[1.2] * 4, [0.2] * 4], [[1.0] * 4, [0.0] * 4]))
    assert s.weights().tolist() == [0.1875, 0.1875, 0.25, 0.25]
    # prompt 0 all right again: p = 0.5 * 0.75 + 0.5 = 0.875 -> w = 0.875 * 0.125 = 0.109375
    # prompt 2 half right: p = 0.5 * 0.5 + 0.5 * 0.5 = 0.5 -> w = 0.25
    s.observe(StepOutcome(1, [0, 2], [[1.2] * 4, [1.2, 0.2, 1.2, 0.2]], [[1.0] * 4, [1.0, 0.0, 1.0, 0.0]]))
    assert s.weights().tolist() == [0.109375, 0.1875, 0.25, 0.25]
    # no accuracy (no gold answers): success = reward > 0; prompt 3 one of four: p = 0.25 + 0.5 * 0.25 = 0.375
    #   -> w = 0.375 * 0.625 = 0.234375
    s.observe(StepOutcome(2, [3], [[0.7, 0.0, 0.0, 0.0]], None))
    assert s.weights()[3] == 0.234375
    assert s.state_dict() == {"p_hat": {0: 0.875, 1: 0.25, 2: 0.5, 3: 0.375}}
    # ema = 1: p = the last step's share; a solved prompt keeps the floor, not 0
    solved = build_sampler("success_rate", 4, 2, 0, {"ema": 1.0, "floor": 0.001})
    solved.observe(StepOutcome(0, [0, 1], [[1.2] * 4, [0.0] * 4], [[1.0] * 4, [0.0] * 4]))
    assert solved.weights().tolist() == [0.001, 0.001, 0.25, 0.25]


def test_success_rate_sampler_draws_refills_and_round_trips_its_state():
    from mmrlvr.train.samplers import StepOutcome, build_sampler

    example("success_rate_sampler")

    def make():
        return build_sampler("success_rate", 4, 2, 0, {"ema": 1.0, "floor": 0.001})

    s = make()
    s.observe(StepOutcome(0, [0, 1], [[1.2] * 4, [0.0] * 4], [[1.0] * 4, [0.0] * 4]))  # weights [.001, .001, .25, .25]
    for step in range(5):
        first = s.indices(step, 0)
        assert first == s.indices(step, 0) and len(set(first)) == 2  # a pure function of (state, seed, step, round)
        # a refill round draws the prompts round 0 did not (4 prompts, 2 per round: exactly the other two)
        assert sorted(s.indices(step, 1)) == sorted(set(range(4)) - set(first))
    # the state decides the draw: the two prompts worth drawing almost always, unlike a sampler without the state
    informed = sum(sorted(s.indices(step)) == [2, 3] for step in range(20))
    blind = sum(sorted(make().indices(step)) == [2, 3] for step in range(20))
    assert informed >= 18 and blind <= 10, (informed, blind)
    # state_dict / load_state_dict: a fresh sampler with the state draws what this one draws
    other = make()
    other.load_state_dict(s.state_dict())
    assert [other.indices(t, r) for t in range(10) for r in (0, 1)] == [s.indices(t, r) for t in range(10)
                                                                          for r in (0, 1)]
    # parameters out of range: refused by the dry run's method check (before any model loads), naming the parameter
    from mmrlvr.validation import method_problems

    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", ["rollout.sampler=success_rate",
                                                            "rollout.sampler_params.ema=0"])
    assert method_problems(cfg, "c.yaml") == [
        "c.yaml: rollout.sampler_params: prompt sampler 'success_rate': ema must be in (0, 1], got 0.0"]


def test_success_rate_sampler_trains_and_resumes_exactly_and_its_state_changes_the_draw(tmp_path):
    # prior 0.2 (weight 0.16): any observed share s gives p = 0.1 + 0.5 s, whose weight differs from 0.16, so
    # step 1's observations change every observed prompt's weight
    runs = resume_pair(tmp_path, [plug("success_rate_sampler"), "rollout.sampler=success_rate",
                                  "rollout.sampler_params={ema: 0.5, prior: 0.2}"], control=True)
    assert_trained_and_resumed_exactly(runs)
    ckpt = runs.dir_b / "checkpoints" / "step-00000001" / "training_state" / "stage_state.pt"
    assert "generate/groups" in torch.load(ckpt, weights_only=False)
    # the sampler observed the real steps: p = 0.2 + 0.5 * (s - 0.2) per observation, s the recorded accuracy share
    state = runs.a.pipeline.state_dict()["generate/groups"]["p_hat"]
    index = {s.id: i for i, s in enumerate(runs.a.train_samples)}
    want: dict[int, float] = {}
    for step in (1, 2):
        by_prompt: dict[str, list[float]] = {}
        for r in _records(runs.dir_a, step):
            by_prompt.setdefault(r.prompt_id, []).append(r.reward_components["auto_accuracy"])
        for pid, acc in by_prompt.items():
            i = index[pid]
            want[i] = 0.5 * want.get(i, 0.2) + 0.5 * sum(acc) / len(acc)
    assert state == pytest.approx(want)
    # its diagnostics reach metrics.jsonl: step 1 draws 4 unseen prompts of 8 (p̂ = prior 0.2); step 2's share seen
    # is the share of its prompts step 1 drew, and their mean p̂ is after step 1's observations
    steps, drawn_1 = _steps(runs.dir_a), {index[p] for p in _prompts(runs.dir_a, 1)}
    assert (steps[1]["sampler/seen_share"], steps[1]["sampler/mean_p_hat"]) == (0.0, pytest.approx(0.2))
    step_2 = [index[p] for p in _prompts(runs.dir_a, 2)]
    after_1 = {i: 0.5 * 0.2 + 0.5 * sum(a) / len(a) for i, a in _accuracy_by_prompt(runs.dir_a, 1, index).items()}
    assert steps[2]["sampler/seen_share"] == pytest.approx(sum(i in drawn_1 for i in step_2) / len(step_2))
    assert steps[2]["sampler/mean_p_hat"] == pytest.approx(sum(after_1.get(i, 0.2) for i in step_2) / len(step_2))
    # resume: step 2 draws the same prompts, and the sampler ends in the same state
    assert _prompts(runs.dir_b, 2) == _prompts(runs.dir_a, 2)
    assert runs.b.pipeline.state_dict()["generate/groups"] == runs.a.pipeline.state_dict()["generate/groups"]
    # negative control: resumed without the sampler's state, step 2 draws other prompts (and metrics differ)
    assert _prompts(runs.dir_c, 1) == _prompts(runs.dir_a, 1)
    assert _prompts(runs.dir_c, 2) != _prompts(runs.dir_a, 2)
    assert _steps(runs.dir_c)[2] != _steps(runs.dir_a)[2]


# -------------------------------------------------------------------------------------- 3. reward gate
def _gate(overrides: list[str] | None = None):
    gate = example("reward_gate")
    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", overrides or [])
    return gate, gate.GateOnAccuracy(SimpleNamespace(cfg=cfg))


def test_reward_gate_hand_worked():
    gate, stage = _gate()
    assert gate.GAMMA == 0.5 and stage.component == "auto_accuracy"  # demo-tiny's accuracy reward
    comps = [{"format": 1.0, "auto_accuracy": 1.0}, {"format": 1.0, "auto_accuracy": 0.0},
             {"format": 0.0, "auto_accuracy": 0.0}, {"format": 0.0, "auto_accuracy": 1.0}]
    b = SimpleNamespace(results=[SimpleNamespace(components=c) for c in comps],
                        rewards=torch.tensor([1.2, 0.2, 0.0, 1.0]), diagnostics={})
    stage(b)
    # right answers keep their reward; wrong ones keep GAMMA = 0.5 of it: 0.2 -> 0.1, 0.0 -> 0.0
    torch.testing.assert_close(b.rewards, torch.tensor([1.2, 0.1, 0.0, 1.0]))
    assert b.diagnostics == {"gate/gated_rows": 2.0}
    # a run whose accuracy reward is named `accuracy` gates on that component
    _, stage = _gate(["rewards=[{name: format, weight: 0.2}, {name: accuracy, weight: 1.0}]"])
    assert stage.component == "accuracy"
    # selected only when named; refused (before any model loads) without an accuracy reward
    from mmrlvr.train.stages import select_stages, validate_stages

    assert "gate_on_accuracy" not in select_stages(load_config(ROOT / "configs" / "demo-tiny.yaml"))["shape"]
    named = load_config(ROOT / "configs" / "demo-tiny.yaml", ["stages.shape=[gate_on_accuracy]"])
    assert select_stages(named)["shape"] == ["drop_unscored", "gate_on_accuracy"]
    bad = load_config(ROOT / "configs" / "demo-tiny.yaml", ["stages.shape=[gate_on_accuracy]",
                                                            "rewards=[{name: format, weight: 1.0}]"])
    assert any("gate_on_accuracy needs one of the rewards accuracy, auto_accuracy" in p for p in validate_stages(bad))


def test_reward_gate_trains_and_resumes_exactly(tmp_path):
    runs = resume_pair(tmp_path, [plug("reward_gate"), "stages.shape=[gate_on_accuracy]"])
    assert_trained_and_resumed_exactly(runs)
    assert runs.a.pipeline.names["shape"] == ["drop_unscored", "gate_on_accuracy"]
    # every recorded reward is the gated total: 0.2 * format + 1.0 * accuracy, halved where accuracy is 0
    gated = 0
    for step in (1, 2):
        records = _records(runs.dir_a, step)
        for r in records:
            c = r.reward_components
            total = 0.2 * c["format"] + 1.0 * c["auto_accuracy"]
            assert r.reward == pytest.approx(total if c["auto_accuracy"] > 0 else 0.5 * total, abs=1e-6)
        wrong = sum(r.reward_components["auto_accuracy"] <= 0 for r in records)
        assert _steps(runs.dir_a)[step]["gate/gated_rows"] == wrong
        gated += sum(r.reward_components["auto_accuracy"] <= 0 and r.reward_components["format"] > 0
                     for r in records)
    assert gated, "no wrong, formatted answer was gated: the check above proved nothing"


def test_first_solve_bonus_hand_worked():
    mod = example("first_solve_bonus")
    assert mod.BONUS == 0.5
    stage = mod.FirstSolveBonus(SimpleNamespace(cfg=None, gather_values=lambda v: (list(v), slice(0, len(v)))))
    stage.solved = {"q0"}  # solved at an earlier step

    def batch(ids, acc, rewards, row_mask=None):
        return SimpleNamespace(rollouts=SimpleNamespace(samples=[SimpleNamespace(id=i) for i in ids]),
                               results=[SimpleNamespace(components={"auto_accuracy": a}) for a in acc],
                               rewards=torch.tensor(rewards), row_mask=row_mask, diagnostics={})

    # q0 solved before: no bonus; q1 solved here twice: both correct rows +0.5; q2 wrong; q3's correct row dropped
    b = batch(["q0", "q0", "q1", "q1", "q2", "q3"], [1.0, 0.0, 1.0, 1.0, 0.0, 1.0], [1.2, 0.2, 1.2, 1.0, 0.0, 1.2],
              row_mask=torch.tensor([True, True, True, True, True, False]))
    stage(b)
    torch.testing.assert_close(b.rewards, torch.tensor([1.2, 0.2, 1.7, 1.5, 0.0, 1.2]))
    assert stage.solved == {"q0", "q1"}
    m = b.diagnostics
    assert (float(m["first_solve/bonus_rows"]), m["first_solve/bonus_rows"].kind) == (2.0, "sum")
    assert (float(m["first_solve/solved_prompts"]), m["first_solve/solved_prompts"].kind) == (2.0, "same")
    # the next step: q1 is paid no more; the state round-trips
    b = batch(["q1", "q2"], [1.0, 1.0], [1.0, 1.0])
    stage(b)
    torch.testing.assert_close(b.rewards, torch.tensor([1.0, 1.5]))
    fresh = mod.FirstSolveBonus(SimpleNamespace(cfg=None))
    fresh.load_state_dict(stage.state_dict())
    assert fresh.solved == {"q0", "q1", "q2"}


def test_first_solve_bonus_trains_and_resumes_exactly_and_its_state_matters(tmp_path):
    # 4 prompts, 4 per step: step 2 draws step 1's prompts again, so what step 1 solved decides step 2's bonus
    runs = resume_pair(tmp_path, [plug("first_solve_bonus"), "stages.shape=[first_solve_bonus]",
                                  "data.train_size=4"], control=True)
    assert_trained_and_resumed_exactly(runs)
    assert runs.a.pipeline.names["shape"] == ["drop_unscored", "first_solve_bonus"]
    steps = _steps(runs.dir_a)
    solved_1 = {r.prompt_id for r in _records(runs.dir_a, 1) if r.reward_components["auto_accuracy"] >= 1.0}
    assert solved_1, "no prompt solved at step 1: the state would hold nothing"
    assert steps[1]["first_solve/solved_prompts"] == len(solved_1)
    # step 2 pays only correct rows of prompts step 1 left unsolved
    correct_2 = [r.prompt_id for r in _records(runs.dir_a, 2) if r.reward_components["auto_accuracy"] >= 1.0]
    paid = sum(i not in solved_1 for i in correct_2)
    assert steps[2]["first_solve/bonus_rows"] == paid
    assert paid < len(correct_2), "no solved prompt was solved again at step 2: the state decided nothing"
    # resumed without the stage's state (the same step-2 responses), step 2 pays every correct row
    assert _steps(runs.dir_c)[2]["first_solve/bonus_rows"] == len(correct_2)


# ------------------------------------------------------------------------------------------ 4. the loss
def test_clipped_pg_loss_hand_worked():
    from mmrlvr.algos import POLICY_LOSSES, call_policy_loss, ppo_clip_loss

    loss_fn = example("clipped_pg_loss").neg_weighted_ppo_clip
    assert POLICY_LOSSES.get("neg_weighted_ppo_clip") is loss_fn
    old = torch.zeros(2, 3)
    # row 0, A = +1: ratios 1.5 (above 1 + 0.2: clipped), 1.0, and a padded position (-inf, mask 0)
    # row 1, A = -2: ratios 0.5 (below 1 - 0.2: clipped), 1.1, and a padded position
    logp = torch.log(torch.tensor([[1.5, 1.0, 1.0], [0.5, 1.1, 1.0]]))
    logp[:, 2] = -float("inf")
    logp.requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, stats = loss_fn(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, neg_weight=0.5)
    # row 0: max(-1.5 * 1, -1.2 * 1) = -1.2; max(-1 * 1, -1 * 1) = -1; padding 0
    # row 1: max(-0.5 * -2, -0.8 * -2) = max(1.0, 1.6) = 1.6, times 0.5 = 0.8;
    #        max(-1.1 * -2, -1.1 * -2) = 2.2, times 0.5 = 1.1; padding 0
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -1.0, 0.0], [0.8, 1.1, 0.0]]))
    # gradients d loss / d logp = d loss / d r * r: clipped tokens 0; (0, 1): -A r = -1; (1, 1): 0.5 * 2 * 1.1 = 1.1
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.0, 0.0], [0.0, 1.1, 0.0]]))
    # stats over the 4 response tokens: 2 clipped; ratios 1.5, 1.0, 0.5, 1.1 -> mean 1.025, max 1.5, min 0.5;
    # k3 = mean(r - 1 - log r) = (0.5 - log 1.5 + 0 + (-0.5 - log 0.5) + (0.1 - log 1.1)) / 4
    assert float(stats.clip_fraction) == pytest.approx(0.5)
    assert float(stats.ratio_mean) == pytest.approx(1.025)
    assert (float(stats.ratio_max), float(stats.ratio_min)) == pytest.approx((1.5, 0.5))
    k3 = (0.5 - math.log(1.5) + (-0.5 - math.log(0.5)) + (0.1 - math.log(1.1))) / 4
    assert float(stats.approx_kl) == pytest.approx(k3, rel=1e-5)
    assert float(stats.recovered_fraction) == 0.0
    # its own diagnostic: 2 of the 4 response tokens (row 1's) have A < 0, a mean over those 4 tokens
    share = stats.diagnostics["neg_weighted/negative_share"]
    assert (float(share), share.kind, share.n) == (0.5, "mean", 4.0)
    # neg_weight = 1 is ppo_clip, on random inputs, through the trainer's call path
    g = torch.Generator().manual_seed(0)
    lp, olp = torch.randn(4, 6, generator=g) * 0.3, torch.randn(4, 6, generator=g) * 0.3
    a, m = torch.randn(4, generator=g), (torch.rand(4, 6, generator=g) > 0.2).float()
    mine, _ = call_policy_loss("neg_weighted_ppo_clip", lp, olp, a, m, eps_low=0.2, eps_high=0.28, neg_weight=1.0)
    ref, _ = ppo_clip_loss(lp, olp, a, m, eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(mine, ref)


def test_clipped_pg_loss_trains_and_resumes_exactly(tmp_path):
    overrides = [plug("clipped_pg_loss"), "algo.loss=neg_weighted_ppo_clip",
                 "algo.loss_params={neg_weight: 0.5}"]
    runs = resume_pair(tmp_path, overrides)
    assert_trained_and_resumed_exactly(runs)
    stage = runs.a.pipeline.stage("update")
    assert stage.loss_name == "neg_weighted_ppo_clip"
    assert stage.loss_params == {"eps_low": 0.2, "eps_high": 0.2, "neg_weight": 0.5}  # eps_* from algo (grpo preset)
    # the loss's own diagnostic reaches metrics.jsonl every step: the share of response tokens with A < 0 over the
    # step's micro-batches and passes, so a share strictly inside (0, 1) where the groups had both signs
    for row in read_metrics(runs.dir_a / "metrics.jsonl"):
        assert 0.0 <= row["neg_weighted/negative_share"] <= 1.0, row
    assert any(0.0 < row["neg_weighted/negative_share"] < 1.0
               for row in read_metrics(runs.dir_a / "metrics.jsonl"))
