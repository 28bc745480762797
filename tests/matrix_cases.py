"""The multi-process matrix: the configs users run and one short variant per registered option.

Built from the registries, so a new loss, advantage estimator, credit scheme, shape stage, reward, auxiliary loss or LoRA init
joins the matrix without editing it. A variant is the smallest config that selects the option: an option
already used by one of the shipped tiny configs runs on that config (a grounding reward needs boxes, a rubric
reward rubrics), any other on ``configs/demo-tiny.yaml``.

Each case: ``Case(name, config, overrides, strategies, expect)``. ``expect``: ``"equal"`` (2 ranks train what
1 process trains, within 1e-5, prefix sharing off on both sides), ``"runs"`` (2 ranks finish and report world
size 2, the result may differ by design; the reason is in ``why``), or ``"refused"`` (exit 2 at validation,
naming the option).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = ROOT / "mmrlvr" / "train" / "demo.yaml"  # the demo's own config (`mmrlvr demo`)
TINY_CONFIGS = sorted((ROOT / "configs").glob("*-tiny.yaml"))

#: short runs: 2 steps of 4 prompts (2 per rank), no eval, no mid-run checkpoint (the final one is compared)
COMMON = ["max_steps=2", "save_every=0", "eval.every=0", "eval.at_start=false", "eval.at_end=false",
          "rollout.prompts_per_step=4", "rollout.max_new_tokens=16", "data.train_size=32", "data.eval_size=8",
          "progress=false", "log_rollouts=false", "tensorboard=false", "model.prefix_sharing=false"]

#: shipped configs whose own warm start is too slow to build for the matrix (zoom-tiny's: ~50 min on 2 cores): they
#: run from the count warm start, every other key as shipped; the test plug-in makes each trajectory's first turn a
#: zoom call, so the 2-rank runs hold real tool turns (tests/forced_zoom_plugin.py)
STAND_INS = {"zoom-tiny": ["model.path=tiny:qwen2_5_vl:warm:count",
                           f"plugins=[{ROOT / 'tests' / 'forced_zoom_plugin.py'}]",
                           "rollout.max_new_tokens=80"]}

#: options whose multi-process run is not the 1-process run by design (the reason is the docs')
NOT_EQUAL = {
    "shape:dynamic_sampling": "refill rounds fill each rank's shard from its own refill prompts (docs/scaling.md)",
    "sampler:budget": "each rank allocates its even share of the budget over its own prompts (docs/methods.md)",
    "loss:clip_cov": "Cov's means, the candidates and the count max(1, floor(r N)) are per micro-batch of one "
                     "process, as in verl (docs/methods.md)",
    "loss:kl_cov": "Cov's means and the top-k count max(1, floor(k N)) are per micro-batch of one process, as in "
                   "verl (docs/methods.md)",
}


@dataclass
class Case:
    name: str
    config: Path
    overrides: list[str] = field(default_factory=list)
    strategies: tuple[str, ...] = ("ddp",)
    expect: str = "equal"  # equal | runs | refused
    why: str = ""

    def argv(self, out: Path, strategy: str) -> list[str]:
        return [str(self.config), *COMMON, *self.overrides, f"distributed.strategy={strategy}",
                f"output_dir={out / f'{self.name}-{strategy}'}"]


def _uses(config: Path) -> dict[str, set[str]]:
    data = yaml.safe_load(config.read_text())
    algo, credit = data.get("algo") or {}, data.get("credit") or {}
    return {"reward": {r["name"] for r in data.get("rewards") or []}, "loss": {algo.get("loss", "ppo_clip")},
            "credit": {credit.get("scheme", "none")}}


def _config_for(kind: str, name: str) -> Path:
    if kind == "credit":  # the credit config carries the perturbation settings every vision scheme reads
        return ROOT / "configs" / "credit-vepo-tiny.yaml"
    for cfg in TINY_CONFIGS:
        if name in _uses(cfg).get(kind, set()):
            return cfg
    return ROOT / "configs" / "demo-tiny.yaml"


def _refused(kind: str, name: str) -> str:
    """The option's one-process-only problem, when a stage it selects refuses several processes (asked of the
    selected stages' own validation with WORLD_SIZE=2, as a torchrun rank sees it)."""
    import os

    from mmrlvr.config import load_config
    from mmrlvr.train.stages.base import STAGES, select_stages

    cfg = load_config(_config_for(kind, name), overrides=_option(kind, name))
    old = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = "2"
    try:
        for k, names in select_stages(cfg).items():
            for n in names:
                problems = [p for p in STAGES[k].get(n).validate(cfg) if "runs on one process only" in p]
                if problems:
                    return problems[0]
    finally:
        if old is None:
            os.environ.pop("WORLD_SIZE", None)
        else:
            os.environ["WORLD_SIZE"] = old
    return ""


#: options whose 2-rank check lives with their own tests, because selecting them needs more than a config key
OWN_MATRIX_TEST = {
    ("shape", "guide"): "tests/test_npo_guide.py::test_guide_on_two_ranks_trains_what_one_process_trains (the guide "
                        "is a later checkpoint of the same run, which the test trains first)",
}

#: advantage stages chosen by another key than ``algo.advantage`` (their own ``selected_by``), or that need a parameter
#: (OPD's teacher: the inconsistent warm start, another model with the student's tokenizer)
ADVANTAGE_STAGE_OPTIONS = {"tree": ["rollout.strategy=tree"],
                           "opd": ["algo.advantage=opd", "algo.advantage_params={teacher: tiny:qwen2_5_vl:warm:noise0.9}"]}


def _option(kind: str, name: str) -> list[str]:
    if kind == "loss":
        return [f"algo.loss={name}"]
    if kind == "advantage":
        return ADVANTAGE_STAGE_OPTIONS.get(name, [f"algo.advantage={name}"])
    if kind == "credit":
        return [f"credit.scheme={name}"]
    if kind == "shape":
        return [f"stages.shape=[{name}]"]
    if kind == "lora_init":
        return ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8", f"model.lora.init={name}"]
    if kind == "reward":
        return [f"rewards=[{{name: format, weight: 0.2}}, {{name: {name}, weight: 1.0}}]"]
    if kind == "sampler":
        return [f"rollout.sampler={name}"]
    if kind == "aux_loss":
        return [f"algo.aux_losses=[{{name: {name}, weight: 0.1}}]"]
    raise ValueError(kind)


def options() -> list[tuple[str, str]]:
    """(kind, name) of every registered option the matrix covers."""
    import mmrlvr.train.stages  # noqa: F401 - registers every stage
    from mmrlvr.algos import ADVANTAGES, POLICY_LOSSES
    from mmrlvr.credit import CREDIT_SCHEMES
    from mmrlvr.models.lora import INITS
    from mmrlvr.rewards import REWARDS
    from mmrlvr.train.aux_losses import AUX_LOSSES
    from mmrlvr.train.samplers import SAMPLERS
    from mmrlvr.train.stages.base import STAGES

    advantage_stages = [n for n in STAGES["advantages"].names() if n not in ("group", "consistency_split", "popo")]
    return ([("loss", n) for n in POLICY_LOSSES.names()]
            + [("advantage", n) for n in [*ADVANTAGES.names(), *advantage_stages]]
            + [("credit", n) for n in CREDIT_SCHEMES.names() if n != "none"]
            + [("shape", n) for n in STAGES["shape"].names()]
            + [("reward", n) for n in REWARDS.names()]
            + [("lora_init", n) for n in INITS]
            + [("aux_loss", n) for n in AUX_LOSSES.names()]
            + [("sampler", n) for n in SAMPLERS.names() if n != "uniform"])


def cases() -> list[Case]:
    out = [Case(f"config-{c.stem}", c, [], ("ddp", "fsdp2")) for c in [*TINY_CONFIGS, DEMO_CONFIG]]
    out.append(Case("split-advantage", ROOT / "configs" / "consistency-tiny.yaml",
                    ["consistency.split_advantage=true"]))  # the consistency_split advantages stage
    # label-free votes on boxes (majority_vote on the grounding config): a group's votes stay on one rank
    out.append(Case("box-votes", ROOT / "configs" / "grounding-tiny.yaml",
                    ["rewards.1.name=majority_vote", "rewards.1.params={coords: absolute}"]))
    # dynamic sampling without refill rounds: the rank-agreed filtering alone, held to equality
    out.append(Case("dynamic-sampling-no-refill", ROOT / "configs" / "demo-tiny.yaml",
                    ["stages.shape=[dynamic_sampling]", "algo.dynamic_sampling_params.max_rounds=1"]))
    # a sampler that learns from every step's rewards (gathered from both ranks) and keeps its state: the example
    # plug-in, so observe's gather and the agreed draw are held to equality
    out.append(Case("sampler-success_rate", ROOT / "configs" / "demo-tiny.yaml",
                    [f"plugins=[{ROOT / 'docs' / 'examples' / 'success_rate_sampler.py'}]",
                     "rollout.sampler=success_rate"]))
    # a shape stage with per-prompt state (the example plug-in): 4 prompts, so step 2 redraws step 1's, each on
    # either rank; its state is gathered from both ranks (Runtime.gather_values), so 2 ranks pay what 1 process pays
    out.append(Case("stage-first_solve_bonus", ROOT / "configs" / "demo-tiny.yaml",
                    [f"plugins=[{ROOT / 'docs' / 'examples' / 'first_solve_bonus.py'}]",
                     "stages.shape=[first_solve_bonus]", "data.train_size=4"]))
    for kind, name in options():
        if (kind, name) in OWN_MATRIX_TEST:
            continue
        base = _config_for(kind, name)
        overrides = [] if base != ROOT / "configs" / "demo-tiny.yaml" and kind == "reward" else _option(kind, name)
        refused = _refused(kind, name)
        key = f"{kind}:{name}"
        # credit schemes call the backbone for hidden states outside the root's forward, an auxiliary loss's
        # teacher runs its own pass (forward CE's privileged expert is the policy itself): FSDP2 too
        case = Case(f"{kind}-{name}", base, overrides,
                    ("ddp", "fsdp2") if kind in ("credit", "aux_loss") else ("ddp",))
        if refused:
            case.expect, case.why = "refused", refused
        elif key in NOT_EQUAL:
            case.expect, case.why = "runs", NOT_EQUAL[key]
        out.append(case)
    for c in out:  # every case on a config with a stand-in model takes it (a reward the config uses included)
        extra = [o for o in STAND_INS.get(c.config.stem, []) if o not in c.overrides]
        c.overrides = [*extra, *c.overrides]
    seen: dict[tuple, str] = {}
    unique = []
    for c in out:  # an option a shipped config already runs as it stands is covered by that config's case
        key = (c.config, tuple(c.overrides))
        if key not in seen:
            seen[key] = c.name
            unique.append(c)
    return unique
