"""Config loading: types, overrides, presets, and errors that name the file and the key."""

import re
from pathlib import Path

import pytest
import yaml

from mmrlvr.config import RunConfig, apply_overrides, describe, load_config
from mmrlvr.errors import ConfigErrors, UserError

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, data) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_defaults_load_and_hash_is_stable():
    a, b = load_config(), load_config()
    assert isinstance(a, RunConfig)
    assert a.hash() == b.hash()
    assert load_config(overrides=["seed=1"]).hash() != a.hash()


def test_overrides_parse_yaml_scalars_and_nested_keys():
    cfg = load_config(overrides=["optim.lr=1e-5", "rollout.group_size=4", "model.lora.enabled=true",
                                 "model.lora.target_modules=[q_proj,v_proj]", "algo.dual_clip=3"])
    assert cfg.optim.lr == pytest.approx(1e-5)
    assert cfg.rollout.group_size == 4
    assert cfg.model.lora.enabled is True
    assert cfg.model.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.algo.dual_clip == 3.0


def test_list_index_overrides():
    data = {"rewards": [{"name": "format", "weight": 0.2}, {"name": "auto_accuracy", "weight": 1.0}]}
    out = apply_overrides(data, ["rewards.1.weight=2"])
    assert out["rewards"][1]["weight"] == 2
    with pytest.raises(UserError, match="not an index"):
        apply_overrides(data, ["rewards.5.weight=2"])


@pytest.mark.parametrize("data, message", [
    ({"algo": {"eps_hgh": 0.3}}, r"run.yaml: algo.eps_hgh: unknown key; known keys here: .*eps_high"),
    ({"optim": {"lr": "fast"}}, r"run.yaml: optim.lr: expected a number, got 'fast'"),
    ({"rollout": {"group_size": 1}}, r"run.yaml: rollout.group_size: must be >= 2"),
    ({"rewards": [{"weight": 1.0}]}, r"rewards\[0\].name"),
    ({"model": {"lora": {"r": "eight"}}}, r"model.lora.r: expected an integer"),
    ({"algo": {"preset": "ppo9"}}, r"algo.preset: unknown preset 'ppo9'; known: .*grpo"),
    ({"consistency": {"split_advantage": True}}, r"needs a reward named 'consistency'"),
])
def test_errors_name_file_and_key(tmp_path, data, message):
    with pytest.raises(UserError, match=message):
        load_config(write(tmp_path, data))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(bad)


def test_preset_fills_fields_but_explicit_keys_win(tmp_path):
    cfg = load_config(write(tmp_path, {"algo": {"preset": "dapo", "eps_low": 0.1}}))
    assert cfg.algo.eps_high == pytest.approx(0.28)  # DAPO clip-higher
    assert cfg.algo.eps_low == pytest.approx(0.1)  # explicit key wins over the preset


def test_every_field_has_help():
    lines = describe()
    assert lines and all("#" in line or line.endswith(":") or ": " in line for line in lines)
    assert all(not line.endswith("# ") for line in lines)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    """Every shipped config validates, and its rewards and credit scheme build with the given params."""
    from mmrlvr.credit import build_scheme
    from mmrlvr.rewards.combine import CombinedReward, RewardSpec

    cfg = load_config(path)
    assert cfg.max_steps > 0
    assert cfg.model.path
    CombinedReward([RewardSpec(s.name, s.weight, dict(s.params)) for s in cfg.rewards])
    build_scheme(cfg.credit.scheme, **cfg.credit.scheme_params)


def test_every_problem_is_reported_at_once(tmp_path):
    """Four independent mistakes: four lines, each naming the file and the key (a user fixes them in one pass)."""
    from mmrlvr.errors import ConfigErrors

    path = write(tmp_path, {"algo": {"eps_hgh": 0.3}, "optim": {"lr": "fast", "grad_clip": -1},
                            "rollout": {"top_p": 2}})
    with pytest.raises(ConfigErrors) as err:
        load_config(path, ["eval.k=0"])
    problems = err.value.problems
    assert len(problems) == 5, problems
    assert all(p.startswith(f"{path}: ") for p in problems)
    joined = "\n".join(problems)
    for key in ("algo.eps_hgh: unknown key", "did you mean 'eps_high'", "optim.lr: expected a number",
                "optim.grad_clip: must be >= 0", "rollout.top_p: must be in (0, 1]", "eval.k: must be >= 1"):
        assert key in joined
    assert str(err.value).splitlines()[0] == "5 problems found before loading the model:"


@pytest.mark.parametrize("override, message", [
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens: must be >= 1, got 0"),
    ("rollout.top_p=2", "rollout.top_p: must be in (0, 1], got 2.0"),
    ("rollout.top_p=0", "rollout.top_p: must be in (0, 1], got 0.0"),
    ("rollout.top_k=-1", "rollout.top_k: must be >= 0"),
    ("save_every=-1", "save_every: must be >= 0"),
    ("optim.grad_clip=-1", "optim.grad_clip: must be >= 0"),
    ("optim.warmup_steps=-3", "optim.warmup_steps: must be >= 0, got -3"),
    ("algo.kl_coef=-1", "algo.kl_coef: must be >= 0"),
    ("eval.k=0", "eval.k: must be >= 1, got 0"),
    ("optim.lr=.nan", "optim.lr: expected a finite number"),
    ("optim.lr=.inf", "optim.lr: expected a finite number"),
    ("seed=-1", "seed: must be >= 0"),
    ("max_steps.x=1", "override 'max_steps.x': max_steps is a single value"),
    ("=3", "expected a dotted key"),
])
def test_ranges_and_overrides(override, message):
    with pytest.raises(UserError, match=re.escape(message)):
        load_config(data={"max_steps": 2}, overrides=[override])


def test_yaml_1_1_exponent_strings_are_numbers(tmp_path):
    """YAML 1.1 (PyYAML) reads `lr: 1e-4` as the string "1e-4"; a number field takes it as the number."""
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  lr: 1e-4\n  weight_decay: 5E-2\n")
    cfg = load_config(path)
    assert cfg.optim.lr == 1e-4 and cfg.optim.weight_decay == 0.05


def test_secrets_are_redacted_in_the_written_config():
    cfg = load_config(data={"rubric": {"judge_params": {"api_key": "sk-SECRET", "model": "m",
                                                        "base_url": "http://me:pw@127.0.0.1:8000/v1"}},
                            "rewards": [{"name": "format", "params": {"template": "r1"}}]})
    text = cfg.to_yaml()
    assert "sk-SECRET" not in text and "me:pw" not in text and "<redacted>" in text
    assert cfg.rubric.judge_params["api_key"] == "sk-SECRET"  # the run itself still has the key
    assert yaml.safe_load(text)["rubric"]["judge_params"]["model"] == "m"


def test_credit_params_is_credit_scheme_params_and_the_old_name_loads_with_a_note():
    """A method's parameters sit beside its name (``X`` + ``X_params``): a run folder's config.yaml written with the
    old ``credit.params`` still loads, moved, with a note; set both ways it is a problem naming both keys."""
    from mmrlvr.config import load

    loaded = load(ROOT / "configs" / "demo-tiny.yaml", ["credit.scheme=vepo", "credit.params={rho: 0.3}"])
    assert loaded.config.credit.scheme_params == {"rho": 0.3}
    assert any("credit.params is now credit.scheme_params" in n for n in loaded.notes)
    with pytest.raises(ConfigErrors, match="credit.params and credit.scheme_params are the same setting"):
        load_config(ROOT / "configs" / "credit-vepo-tiny.yaml", ["credit.params={rho: 0.3}",
                                                                 "credit.scheme_params={rho: 0.2}"])
