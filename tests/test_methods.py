"""The method contract: parameters declared once beside their method, one validation, a plan with reasons, conflicts
as errors, inert keys as notes, old keys moved with a note."""

from __future__ import annotations

import inspect
import re
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmrlvr.config import AlgoConfig, collect_config, load, load_config
from mmrlvr.errors import ConfigErrors, UserError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _cli(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", *argv], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=300)


# ------------------------------------------------------------------------------------- declarations = code
@pytest.mark.parametrize("kind,module,fn_of", [
    ("advantage", "mmrlvr.algos.advantages", lambda reg, n: reg.get(n)),
    ("loss", "mmrlvr.algos.losses", lambda reg, n: reg.get(n)),
    ("clip", "mmrlvr.algos.clipping", lambda reg, n: reg.get(n)),
    ("sampler", "mmrlvr.train.samplers", lambda reg, n: reg.get(n)),  # the class: its constructor's keywords
])
def test_every_declared_parameter_is_the_implementations_keyword_with_the_same_default(kind, module, fn_of):
    """The torch-free declarations (``declare`` beside each function) and its keyword defaults cannot drift apart."""
    import importlib

    from mmrlvr.methods import METHOD_KINDS, _declared

    reg = getattr(importlib.import_module(module), METHOD_KINDS[kind].registry[1])
    for name in reg.names():
        if not getattr(reg.get(name), "__module__", "").startswith("mmrlvr."):
            continue  # a plug-in another test registered: its parameters come from its signature
        assert name in _declared(kind), f"{kind} {name!r} is registered but not declared"
        sig = inspect.signature(fn_of(reg, name)).parameters
        for p in _declared(kind)[name].params:
            if p.name in sig:
                assert sig[p.name].default == p.default, (kind, name, p.name)
            else:  # read by the method's stages (POPO's coefficients), not by the pure function
                assert (kind, name) == ("loss", "popo"), (kind, name, p.name)


def test_no_algo_field_is_prefixed_by_a_method_name():
    fields = [f for f in vars(AlgoConfig()) if f.startswith(("acpo_", "popo_", "poise_", "nsr_"))]
    assert fields == []


# --------------------------------------------------------------------------------------- parameter checks
def test_a_misspelt_advantage_parameter_exits_2_naming_the_estimator_and_the_accepted_ones(tmp_path):
    res = _cli("train", "configs/demo-tiny.yaml", "--dry-run", "--config-only", f"output_dir={tmp_path}/r",
               "algo.advantage=reinforce_pp", "algo.advantage_params.baselin=false")
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "algo.advantage_params.baselin: unknown parameter of advantage estimator 'reinforce_pp'" in line
    assert "accepted: baseline, eps, whiten_scope" in line and "did you mean 'baseline'" in line
    assert "Traceback" not in res.stderr


def test_wrong_type_and_range_name_the_accepted_range():
    loaded = collect_config(ROOT / "configs/demo-tiny.yaml",
                            ["algo.loss=nsr", "algo.loss_params.noise=1.5", "algo.advantage=reinforce_pp",
                             "algo.advantage_params.whiten_scope=tokens", "algo.advantage_params.baseline=3"])
    text = "\n".join(str(p) for p in loaded.problems)
    # each problem keeps its key apart from its message
    assert {p.key for p in loaded.problems} >= {"algo.loss_params.noise", "algo.advantage_params.whiten_scope"}
    assert "algo.loss_params.noise: policy loss 'nsr': must be in (0, 1], got 1.5" in text
    assert "algo.advantage_params.whiten_scope: advantage estimator 'reinforce_pp': must be one of batch_tokens, " \
           "sequence" in text
    assert "algo.advantage_params.baseline: advantage estimator 'reinforce_pp': expected true/false, got 3" in text


def _group_stage(overrides: list[str]):
    from mmrlvr.train.stages.advantages import GroupAdvantage

    cfg = load_config(ROOT / "configs/demo-tiny.yaml", overrides)
    rt = SimpleNamespace(cfg=cfg, accel=SimpleNamespace(num_processes=1))
    return GroupAdvantage(rt)


def _batch(rewards, groups, lengths):
    L = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (L - n) for n in lengths])
    return SimpleNamespace(rewards=torch.tensor(rewards), row_mask=None, diagnostics={},
                           rollouts=SimpleNamespace(group_index=torch.tensor(groups), response_mask=mask))


def test_reinforce_pp_baseline_set_from_the_config_changes_the_advantages_as_the_formula_says():
    # two groups of two, rewards [1, 0 | 1, 1], equal lengths (token weighting = sequence weighting)
    b = _batch([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], [2, 2, 2, 2])
    # baseline=true (default): c = R - mean_g = [0.5, -0.5, 0, 0]; mu = 0; var (Bessel over 8 tokens) =
    #   (4 * 0.25) / 8 * 8/7 = 1/7; A = c / sqrt(1/7 + 1e-8) -> [0.5*sqrt7, -0.5*sqrt7, 0, 0]; group 1 has no spread -> 0
    stage = _group_stage(["algo.advantage=reinforce_pp"])
    stage(b)
    s7 = 7 ** 0.5
    torch.testing.assert_close(b.advantages, torch.tensor([0.5 * s7, -0.5 * s7, 0.0, 0.0]), rtol=1e-5, atol=1e-6)
    # baseline=false: c = R = [1, 0, 1, 1]; mu = 3/4 (tokens weigh equally); var = (2*(1/16)*3... by hand:
    #   deviations [1/4, -3/4, 1/4, 1/4], squares [1/16, 9/16, 1/16, 1/16] -> sum 12/16 per token pair x2 tokens = 24/16
    #   var = (24/16) / 8 * 8/7 = 3/14; A = (c - 3/4) / sqrt(3/14); group 1 (no spread) -> 0
    stage = _group_stage(["algo.advantage=reinforce_pp", "algo.advantage_params.baseline=false"])
    b = _batch([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], [2, 2, 2, 2])
    stage(b)
    sd = (3 / 14) ** 0.5
    torch.testing.assert_close(b.advantages, torch.tensor([0.25 / sd, -0.75 / sd, 0.0, 0.0]), rtol=1e-5, atol=1e-6)


def test_grpo_unbiased_std_is_settable_and_presets_use_the_same_path():
    b = _batch([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0], [1, 1, 1, 1])
    _group_stage(["algo.advantage_params.unbiased=false"])(b)
    # population std of [1,0,0,0] = sqrt(3/16) = 0.4330; A_0 = 0.75 / (0.4330 + 1e-6)
    assert float(b.advantages[0]) == pytest.approx(0.75 / (3 / 16) ** 0.5, rel=1e-5)
    loaded = load(ROOT / "configs/demo-tiny.yaml", ["algo.preset=grpo"])
    assert loaded.config.algo.advantage_params == {"unbiased": True, "eps": 1e-6}
    assert loaded.sources["algo.advantage_params.unbiased"] == "preset"


def test_an_estimator_may_return_diagnostics():
    from mmrlvr.algos.advantages import ADVANTAGES

    @ADVANTAGES.register("test_diag_estimator")
    def diag(rewards, group_index, *, scale: float = 2.0):
        return rewards * scale, {"test/scale": scale}

    try:
        b = _batch([1.0, 0.0], [0, 0], [1, 1])
        _group_stage(["algo.advantage=test_diag_estimator", "algo.advantage_params.scale=3"])(b)
        torch.testing.assert_close(b.advantages, torch.tensor([3.0, 0.0]))
        assert b.diagnostics == {"test/scale": 3.0}
    finally:
        ADVANTAGES._items.pop("test_diag_estimator")


# ------------------------------------------------------------------------------------------- old keys
def test_old_method_keys_move_to_their_method_with_a_note():
    loaded = load(ROOT / "configs/demo-tiny.yaml", ["algo.loss=popo", "algo.popo_threshold=0.5"])
    assert loaded.config.algo.loss_params == {"threshold": 0.5}
    assert any("algo.popo_threshold is now algo.loss_params.threshold" in n for n in loaded.notes)
    cfg = load_config(ROOT / "configs/demo-tiny.yaml", ["algo.clip=acpo", "algo.acpo_alpha=2"])
    assert cfg.algo.clip_params == {"alpha": 2}
    loaded = load(ROOT / "configs/demo-tiny.yaml", ["algo.nsr_noise=0.3"])  # the run's loss is not nsr
    assert loaded.config.algo.loss_params == {} and any("algo.nsr_noise is inert" in n for n in loaded.notes)
    with pytest.raises(ConfigErrors, match="algo.popo_threshold and algo.loss_params.threshold are the same"):
        load_config(ROOT / "configs/demo-tiny.yaml",
                    ["algo.loss=popo", "algo.popo_threshold=0.5", "algo.loss_params.threshold=0.7"])


# ------------------------------------------------------------------------------------- the plan, conflicts
def _plan(path: str, overrides: list[str]):
    from mmrlvr.train.plan import build_plan

    loaded = load(ROOT / path, overrides)
    return build_plan(loaded.config, loaded.sources)


#: every pair of settings that would choose different stages for one job
CONFLICTS = [
    ("configs/consistency-tiny.yaml", ["algo.loss=popo", "consistency.split_advantage=true"],
     ("algo.loss: popo", "consistency.split_advantage: true")),
    ("configs/demo-tiny.yaml", ["algo.loss=popo", "algo.advantage=poise"], ("algo.advantage: poise", "algo.loss: popo")),
    ("configs/consistency-tiny.yaml", ["algo.advantage=poise", "consistency.split_advantage=true"],
     ("algo.advantage: poise", "consistency.split_advantage: true")),
    ("configs/demo-tiny.yaml", ["algo.loss=popo", "algo.advantage=rloo"], ("algo.loss: popo", "algo.advantage: rloo")),
    ("configs/consistency-tiny.yaml", ["consistency.split_advantage=true", "stages.advantages=group"],
     ("stages.advantages: group", "consistency.split_advantage: true")),
]


@pytest.mark.parametrize("path,overrides,keys", CONFLICTS)
def test_two_stages_claiming_one_job_is_an_error_naming_both_keys(path, overrides, keys):
    with pytest.raises(ConfigErrors) as e:
        _plan(path, overrides)
    assert len(e.value.problems) == 1
    assert all(k in e.value.problems[0] for k in keys), e.value.problems[0]


def test_the_conflict_exits_2_in_one_line_before_any_model_loads(tmp_path):
    res = _cli("train", "configs/consistency-tiny.yaml", "algo.loss=popo", "consistency.split_advantage=true",
               "--dry-run", f"output_dir={tmp_path}/r")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "algo.loss: popo" in lines[0] and "consistency.split_advantage: true" in lines[0]
    assert not (tmp_path / "r").exists()


def test_dry_run_prints_the_plan_every_kind_with_reason_and_parameters(tmp_path):
    res = _cli("train", "configs/demo-tiny.yaml", "--dry-run", f"output_dir={tmp_path}/r")
    assert res.returncode == 0, res.stderr
    import yaml

    assert yaml.safe_load(res.stdout)["algo"]["loss"] == "ppo_clip"  # stdout stays the resolved config
    out = "\n".join(ln[2:] for ln in res.stdout[res.stdout.index("# plan ("):].splitlines())
    for kind, name, reason in [("generate", "groups", "default"), ("score", "rewards", "default"),
                               ("shape", "drop_unscored", "always"), ("advantages", "group", "algo.advantage: grpo"),
                               ("reference", "frozen", "algo.kl_coef: 0.05"), ("credit", "none", "credit.scheme: none"),
                               ("update", "policy_gradient", "algo.loss: ppo_clip"),
                               ("record", "metrics_and_rollouts", "default")]:
        assert any(ln.split() [:2] == [kind, name] and reason in ln for ln in out.splitlines()), (kind, out)
    assert "algo.advantage_params.unbiased = true  (preset)" in out and "algo.kl_coef = 0.05  (user)" in out
    assert "rollout.sampler = uniform  (default)" in out


def test_a_misspelt_stage_name_fails_the_dry_run(tmp_path):
    res = _cli("train", "configs/demo-tiny.yaml", "--dry-run", f"output_dir={tmp_path}/r", "stages.credit=separat")
    assert res.returncode == 2 and "unknown credit stage 'separat'" in res.stderr and "did you mean 'separate'" in \
        res.stderr, res.stderr


def test_a_misspelt_plugin_method_name_fails_the_dry_run(tmp_path):
    res = _cli("train", "configs/demo-tiny.yaml", "--dry-run", f"output_dir={tmp_path}/r",
               "plugins=[docs/examples/median_advantage.py]", "algo.advantage=group_media")
    assert res.returncode == 2 and "group_median" in res.stderr, res.stderr


def test_a_key_nothing_reads_is_a_note_saying_why():
    plan = _plan("configs/demo-tiny.yaml", ["algo.rollout_correction=tis", "algo.overlong_penalty=0.5"])
    text = "\n".join(plan.notes)
    assert "algo.rollout_correction is set but inert" in text and "old_policy" in text and "algo.epochs > 1" in text
    assert "algo.overlong_penalty is set but inert" in text and "algo.overlong_cache > 0" in text
    assert not _plan("configs/demo-tiny.yaml", ["algo.rollout_correction=tis", "algo.epochs=2"]).notes


def test_an_explicit_multi_stage_list_extends_the_automatic_one():
    plan = _plan("configs/demo-tiny.yaml", ["algo.preset=dapo", "stages.shape=[mask_truncated]"])
    shape = [s.name for s in plan.stages if s.kind == "shape"]
    assert shape == ["drop_unscored", "overlong", "mask_truncated", "dynamic_sampling"]  # DAPO's stay


def test_help_config_lists_methods_with_parameters_plugins_included():
    res = _cli("train", "configs/demo-tiny.yaml", "--help-config")
    assert res.returncode == 0
    out = res.stdout
    for needle in ("algo.advantage (advantage estimators; parameters under algo.advantage_params):",
                   "  reinforce_pp: ", "    baseline = True", "    whiten_scope = 'batch_tokens'",
                   "  popo: ", "    ema_tau = 0.995", "  acpo: ", "    eps_max = 3.0", "rollout.sampler (prompt samplers"):
        assert needle in out, needle

def test_help_config_lists_a_plugins_methods(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"plugins: [{ROOT / 'docs/examples/median_advantage.py'}]\n")
    res = _cli("train", str(cfg), "--help-config")
    assert res.returncode == 0 and "  group_median: " in res.stdout, res.stdout[-2000:] + res.stderr


def test_config_mistakes_are_reported_without_importing_torch(tmp_path):
    code = ("import sys; from mmrlvr.validation import check_run\n"
            "from mmrlvr.errors import ConfigErrors\n"
            "try:\n"
            "    check_run('configs/consistency-tiny.yaml', ['algo.loss_params.nois=1', 'algo.clip=acpo', "
            "'algo.clip_params.eps_max=-1', 'rollout.sampler=shufle', 'algo.loss=popo', "
            "'consistency.split_advantage=true', 'stages.shape=[overlongg]', 'credit.scheme=vepoo'], "
            "environment=False)\n"
            "except ConfigErrors as e: print(len(e.problems), 'overlongg' in str(e), 'vepoo' in str(e))\n"
            "print('torch' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
    # the unknown loss parameter, the clip range, the sampler name, the credit scheme, the misspelt stage and the
    # stage conflict, all at once, and none of them needs torch
    assert res.stdout.split() == ["6", "True", "True", "False"], res.stdout + res.stderr


def test_every_shipped_config_reports_a_stage_mistake_beside_another_without_torch():
    """A module on the plan's import path that pulls in torch makes the check drop the plan's problems once another
    problem is known (the stages wait for torch-free checks): every shipped config, one misspelt stage beside one
    misspelt sampler, both reported, torch never imported."""
    code = ("import glob, sys; from mmrlvr.validation import check_run\n"
            "from mmrlvr.errors import ConfigErrors\n"
            "for path in sorted(glob.glob('configs/*.yaml')):\n"
            "    try:\n"
            "        check_run(path, ['rollout.sampler=shufle', 'stages.shape=[overlongg]'], environment=False)\n"
            "        print(path, 'accepted')\n"
            "    except ConfigErrors as e: print(path, 'shufle' in str(e), 'overlongg' in str(e))\n"
            "print('torch', 'torch' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    lines = res.stdout.splitlines()
    assert len(lines) == len(list((ROOT / "configs").glob("*.yaml"))) + 1 >= 3, res.stdout + res.stderr
    for line in lines[:-1]:
        assert line.endswith(" True True"), line
    assert lines[-1] == "torch False", res.stdout + res.stderr


def test_the_config_help_of_each_method_key_names_every_built_in_method():
    from mmrlvr.config import describe
    from mmrlvr.methods import METHOD_KINDS, _declared

    lines = {ln.split(" = ")[0]: ln for ln in describe() if " = " in ln}
    for kind, mk in METHOD_KINDS.items():
        help_text = lines[mk.name_key].split("  # ", 1)[1]
        named = set(re.findall(r"[a-z][a-z0-9_-]*", help_text))
        missing = set(_declared(kind)) - named
        assert not missing, f"{mk.name_key}'s help misses {sorted(missing)}"


def test_a_lora_target_naming_no_language_module_is_found_on_the_meta_architecture(tmp_path):
    """The model's structure from config.json on the meta device: no weights are read (the folder has none)."""
    from mmrlvr.models.tiny import build_tiny
    from mmrlvr.validation import check_run

    full = build_tiny("qwen2_5_vl", tmp_path / "m")
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_bytes((Path(full) / "config.json").read_bytes())  # no weights, no processor
    base = ["model.lora.enabled=true", f"model.path={folder}", f"output_dir={tmp_path}/r"]
    cases = {"[q_prj]": "no Linear module named any of ['q_prj']",
             "[qkv]": "all modules named ['qkv'] are in the vision tower"}  # Qwen's vision attention
    for targets, needle in cases.items():
        with pytest.raises(ConfigErrors) as e:
            check_run(ROOT / "configs/demo-tiny.yaml", [*base, f"model.lora.target_modules={targets}"])
        assert any(needle in p and "model.lora.target_modules" in p for p in e.value.problems), e.value


def test_resum_segments_share_their_trajectory_s_advantage_counted_once_in_the_group():
    # one group, three trajectories with rewards 1, 0, 0; the first has two segments (rows 0, 1), so 4 rows.
    # GRPO over the *trajectories* (1, 0, 0): mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3);
    # A = (1 - 1/3) / sqrt(1/3) = 1.1547 for trajectory 0 (both segments), (0 - 1/3) / sqrt(1/3) = -0.5774 for the
    # others. Counting the extra segment as a row would give mean 1/2 and different values.
    b = _batch([1.0, 1.0, 0.0, 0.0], [0, 0, 0, 0], [2, 2, 2, 2])
    b.rollouts.trajectory_index = torch.tensor([0, 0, 1, 2])
    b.rollouts.final_segment = torch.tensor([False, True, True, True])
    _group_stage([])(b)
    third = (1 / 3) ** 0.5
    torch.testing.assert_close(b.advantages, torch.tensor([(2 / 3) / third, (2 / 3) / third, -(1 / 3) / third,
                                                           -(1 / 3) / third]), rtol=1e-4, atol=1e-5)


_ONE_FILE_LOSS = '''
"""A built-in loss as a new one is added: its declaration, its registration and its code, in one file."""
from mmrlvr.algos.losses import POLICY_LOSSES, ppo_clip_loss
from mmrlvr.methods import Param, declare

declare("loss", "scaled_ppo_test", "PPO-clip times a constant", Param("scale", 0.5, "the constant", "> 0",
        lambda v: v > 0), source="test", agg="seq-mean-token-mean", why="the test loss's own range")


@POLICY_LOSSES.register("scaled_ppo_test")
def scaled_ppo_test(logprobs, old_logprobs, advantages, response_mask, *, eps_low: float = 0.1,
                    eps_high: float = 0.3, scale: float = 0.5):
    loss, stats = ppo_clip_loss(logprobs, old_logprobs, advantages, response_mask, eps_low=eps_low,
                                eps_high=eps_high)
    return scale * loss, stats
'''


def test_a_loss_declared_in_one_file_reaches_help_validation_defaults_notes_and_the_table(tmp_path):
    """What adding a built-in loss takes: one file (declaration beside the code), read by every consumer."""
    from mmrlvr.algos.losses import POLICY_LOSSES
    from mmrlvr.algos.presets import loss_defaults, loss_defaults_table_markdown
    from mmrlvr.config import describe
    from mmrlvr.methods import _DECLARED

    from mmrlvr.plugins import load_plugins

    path = tmp_path / "scaled_ppo_test.py"
    path.write_text(_ONE_FILE_LOSS)
    try:
        load_plugins([str(path)])  # imported before the config is read, as mmrlvr.algos.losses is
        loaded = load(ROOT / "configs" / "demo-tiny.yaml", ["algo.loss=scaled_ppo_test"])
        cfg = loaded.config
        # its clip range (the signature's defaults) and its aggregation (the declaration's), with its reason
        assert (cfg.algo.eps_low, cfg.algo.eps_high, cfg.algo.agg) == (0.1, 0.3, "seq-mean-token-mean")
        assert any("the test loss's own range" in n for n in loaded.notes)
        assert loss_defaults("scaled_ppo_test") == {"eps_low": 0.1, "eps_high": 0.3, "agg": "seq-mean-token-mean"}
        line = next(ln for ln in describe() if ln.startswith("algo.loss = "))
        assert "scaled_ppo_test" in line
        assert "| `scaled_ppo_test` | 0.1 / 0.3 | `loss_params.scale` 0.5 |" in loss_defaults_table_markdown()
        with pytest.raises(ConfigErrors, match=r"algo.loss_params.scale: policy loss 'scaled_ppo_test': must be > 0"):
            load_config(ROOT / "configs" / "demo-tiny.yaml", ["algo.loss=scaled_ppo_test", "algo.loss_params={scale: -1}"])
    finally:
        POLICY_LOSSES._items.pop("scaled_ppo_test", None)
        _DECLARED["loss"].pop("scaled_ppo_test", None)


def test_dapo_and_rollout_correction_settings_are_parameters_of_what_uses_them():
    """algo.rollout_correction + algo.rollout_correction_params (a method kind: none | tis | mis, each with cap and
    level) and algo.dynamic_sampling + algo.dynamic_sampling_params (metric, max_rounds); the old flat keys of a saved
    config load, moved, with a note."""
    from mmrlvr.config import describe
    from mmrlvr.methods import help_lines

    loaded = load(ROOT / "configs/demo-tiny.yaml", ["algo.rollout_correction=mis", "algo.rollout_correction_cap=2.0",
                                                    "algo.dynamic_sampling=true",
                                                    "algo.dynamic_sampling_max_rounds=1"])
    assert loaded.config.algo.rollout_correction_params == {"cap": 2.0}
    assert loaded.config.algo.dynamic_sampling_params == {"max_rounds": 1}
    assert any("algo.rollout_correction_cap is now algo.rollout_correction_params.cap" in n for n in loaded.notes)
    assert any("algo.dynamic_sampling_max_rounds is now algo.dynamic_sampling_params.max_rounds" in n
               for n in loaded.notes)
    problems = "\n".join(str(p) for p in collect_config(
        ROOT / "configs/demo-tiny.yaml", ["algo.rollout_correction=tis", "algo.rollout_correction_params={cap: 0}"]
    ).problems)
    assert "algo.rollout_correction_params.cap: rollout correction 'tis': must be > 0, got 0" in problems
    from mmrlvr.validation import check_run

    with pytest.raises(ConfigErrors, match="algo.rollout_correction: unknown rollout correction 'tiss'.*'tis'"):
        check_run(ROOT / "configs/demo-tiny.yaml", ["algo.rollout_correction=tiss"], environment=False)
    with pytest.raises(ConfigErrors, match=r"algo.dynamic_sampling_params.metric: shape stage 'dynamic_sampling': "
                                           r"must be one of accuracy, reward"):
        check_run(ROOT / "configs/demo-tiny.yaml", ["algo.dynamic_sampling=true",
                                                     "algo.dynamic_sampling_params={metric: acc}"], environment=False)
    help_text = "\n".join(describe() + help_lines())
    assert "tis: truncated importance sampling" in help_text and "cap = 3.0" in help_text
