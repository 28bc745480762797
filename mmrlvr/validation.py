"""Pre-flight checks of a training run: everything that can be known before the model loads, at once.

``check_run(path, overrides, ...)`` loads the config and returns it, or raises ``ConfigErrors`` with one
line per problem (file, key, allowed values, a "did you mean" hint). It checks, on top of the config's own
types and ranges (``mmrlvr.config.range_problems``):

- names chosen from registries: policy losses, advantage estimators, aggregation modes, KL estimators,
  credit schemes, perturbations, LoRA inits, rewards, judges, prompt templates and column presets;
- reward parameters (unknown or missing ones; each reward is built with its params, which also reads
  rubric files), and that every reward's answer template matches the prompt template (``data.template:
  boxed`` with a reward reading ``<answer>`` tags scores every response 0);
- data: ``synth:`` task names, or the first rows of a dataset read through ``mmrlvr.data.load_samples``
  (paths, columns, answers);
- the model folder (or ``tiny:`` spec), plugins, optional packages an engine or kernel needs;
- the run folder (``mmrlvr.train.run_dir.check_run_dir``): a file in the way, an existing run without
  ``--resume``/``--overwrite``, a resumed run whose config changed, a folder in use by another run;
- with ``dry_run=True``, that each judge endpoint accepts a TCP connection.

Nothing here imports torch or transformers: the registries of credit schemes and perturbations are read live
(``REGISTRIES``; their modules import without torch), so a plugin's registrations count once the plugin is
imported; LoRA inits are read live once ``mmrlvr.models.lora`` is imported, else from ``PRELOAD_NAMES``.
Rewards are built with torch and transformers imports blocked, so a reward that would load a model (an NLI
judge) is checked by its signature only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import os
import socket
import sys
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

from mmrlvr.config import LoadedConfig, RunConfig, apply_dependent_defaults, collect_config
from mmrlvr.errors import ConfigErrors, UserError, did_you_mean

#: config key -> (what, module, attribute) of the registries that are not ``mmrlvr.methods`` kinds (those declare
#: losses, advantage estimators, clip rules, KL estimators, aggregation modes and samplers); ``registry_names``
#: imports the module and reads the registry, which holds the built-ins and every plugin's registrations
REGISTRIES: dict[str, tuple[str, str, str]] = {
    "credit.scheme": ("credit scheme", "mmrlvr.credit.schemes", "CREDIT_SCHEMES"),
    "credit.perturbation": ("perturbation", "mmrlvr.credit.perturb", "PERTURBATIONS"),
    "model.lora.init": ("LoRA init", "mmrlvr.models.lora", "INITS"),
}
#: config key -> built-in names, for the registries whose module imports without torch but whose package does not
#: (``mmrlvr.models``'s ``__init__`` loads transformers and torch): read from here until the module is imported;
#: ``tests/test_bad_inputs.py`` keeps them equal to the live registry
PRELOAD_NAMES: dict[str, tuple[str, ...]] = {
    "model.lora.init": ("default", "gaussian", "mica", "milora", "olora", "orthogonal", "pissa", "rlmo", "rlpo"),
}

#: prompt template -> the answer shape its instruction asks for (the rewards' ``template`` parameter);
#: templates missing here ask for no particular shape and are not cross-checked
TEMPLATE_ANSWER_FORMAT: dict[str, str] = {"r1": "r1", "r1_user": "r1", "boxed": "boxed"}
_FORMAT_WORDS = {"r1": "<think>/<answer> tags", "boxed": "\\boxed{}", "raw": "the whole response"}

#: packages whose import a config check must never trigger (a model load starts with them)
_HEAVY = ("torch", "transformers", "accelerate", "peft", "vllm", "flash_attn")
#: rows of each dataset read by the check
DATA_ROWS_CHECKED = 4
#: seconds allowed for a judge endpoint to accept a TCP connection in --dry-run
JUDGE_CONNECT_TIMEOUT_S = 3.0


def registry_names(key: str) -> list[str]:
    """Names valid for config ``key`` (a ``REGISTRIES`` key): those of the live registry, built-ins and plugins'
    (its module is imported here, without torch), or ``PRELOAD_NAMES[key]`` while a module listed there is not
    imported yet."""
    _, module, attr = REGISTRIES[key]
    if key in PRELOAD_NAMES and module not in sys.modules:
        return sorted(PRELOAD_NAMES[key])
    live = getattr(importlib.import_module(module), attr)
    return sorted(live.names() if hasattr(live, "names") else live)


def _unknown(where: str, key: str, what: str, value: Any, known: list[str]) -> str:
    return (f"{where}: {key}: unknown {what} {value!r}; allowed: {', '.join(known) or '(none)'}"
            f"{did_you_mean(value, known)}")


class _HeavyImportBlocked(ImportError):
    pass


class _BlockHeavy(importlib.abc.MetaPathFinder):
    """Refuse imports of torch / transformers / ... while a config check builds objects."""

    def find_spec(self, name, path=None, target=None):  # noqa: D102
        if name.split(".")[0] in _HEAVY:
            raise _HeavyImportBlocked(f"{name} is not imported during config checks")
        return None


class _no_heavy_imports:
    """Context manager: ``_BlockHeavy`` first on ``sys.meta_path`` (only for modules not yet imported)."""

    def __enter__(self):
        self.finder = _BlockHeavy()
        sys.meta_path.insert(0, self.finder)
        return self

    def __exit__(self, *exc):
        sys.meta_path.remove(self.finder)
        return False


def _lines(exc: BaseException) -> list[str]:
    """A (possibly multi-line) error message as separate lines, blank lines dropped."""
    text = "\n".join(exc.problems) if isinstance(exc, ConfigErrors) else str(exc)
    return [ln.strip() for ln in text.splitlines() if ln.strip()] or [type(exc).__name__]


# ---------------------------------------------------------------------------------------------- checks
def load_plugins_checked(plugins: list[str], where: str) -> list[str]:
    """Import plugin files/modules (as the trainer will; same module names, so it does not re-run them)."""
    from mmrlvr.plugins import load_plugins

    problems: list[str] = []
    for i, spec in enumerate(plugins):
        key = f"{where}: plugins[{i}]"
        try:
            load_plugins([spec])  # the trainer's own loader: same module names, so nothing runs twice
        except UserError as exc:
            problems += [f"{key}: {spec}: {ln}" for ln in _lines(exc)]
        except ImportError as exc:
            problems.append(f"{key}: cannot import {spec!r}: {exc}")
        except Exception as exc:  # a plugin's own bug: name it, no traceback
            problems.append(f"{key}: {spec} raised {type(exc).__name__}: {exc}")
    return problems


def method_problems(cfg: RunConfig, where: str) -> list[str]:
    """Every method the config names (``mmrlvr.methods``: loss, advantage estimator, clip rule, KL estimator,
    aggregation, sampler) is registered — built-ins, plug-ins and methods a stage serves —, its parameters are
    ones it declares, of the right type and range, and a plug-in method's own ``validate_config(cfg, params)``
    accepts the run (e.g. an estimator whose k must not exceed the group size)."""
    from mmrlvr.methods import (METHOD_KINDS, _dotted, _live, listed_entries, method_names, method_spec,
                                resolve_method)

    out: list[str] = []
    for kind, mk in METHOD_KINDS.items():
        if mk.listed:  # algo.aux_losses: a list of entries, each checked like one method
            out += listed_entries(cfg, kind, where)[1]
            continue
        name = _dotted(cfg, mk.name_key)
        known = method_names(kind)
        if name not in known:
            out.append(_unknown(where, mk.name_key, mk.what, name, known))
            continue
        if not mk.params_key:
            continue
        params, problems = resolve_method(kind, name, _dotted(cfg, mk.params_key), where)
        out += problems
        live = _live(kind)
        obj = live.get(name) if live is not None and name in live else None
        spec = method_spec(kind, name)
        check = getattr(obj, "validate_config", None) or (spec.config_check if spec is not None else None)
        if not problems and callable(check):
            out += [f"{where}: {mk.params_key}: {mk.what} {name!r}: {p}" for p in check(cfg, params)]
    return out


def name_problems(cfg: RunConfig, where: str) -> list[str]:
    """Registry names in the config: methods (``method_problems``), credit, perturbation, LoRA init, judge, prompt
    template, column preset, trackers."""
    out: list[str] = method_problems(cfg, where)
    values = {"credit.scheme": cfg.credit.scheme, "credit.perturbation": cfg.credit.perturbation,
              "model.lora.init": cfg.model.lora.init}
    for key, value in values.items():
        if value is None:
            continue
        known = registry_names(key)
        if value not in known:
            out.append(_unknown(where, key, REGISTRIES[key][0], value, known))
    from mmrlvr.rubric.judges import JUDGES

    judges = ["none", *JUDGES.names()]
    if cfg.rubric.judge not in judges:
        out.append(_unknown(where, "rubric.judge", "judge", cfg.rubric.judge, judges))
    from mmrlvr.data.prompts import TEMPLATES

    if cfg.data.template not in TEMPLATES:
        out.append(_unknown(where, "data.template", "prompt template", cfg.data.template, list(TEMPLATES)))
    from mmrlvr.data.loading import PRESETS

    if cfg.data.preset is not None and cfg.data.preset not in PRESETS:
        out.append(_unknown(where, "data.preset", "column preset", cfg.data.preset, list(PRESETS)))
    layout = getattr(cfg.data, "format", "auto")
    if layout not in ("auto", *PRESETS):
        out.append(_unknown(where, "data.format", "dataset layout", layout, ["auto", *PRESETS]))
    from mmrlvr.train.metrics import TRACKERS

    for i, tracker in enumerate(getattr(cfg, "report_to", []) or []):
        if tracker not in TRACKERS:
            out.append(_unknown(where, f"report_to[{i}]", "tracker", tracker, list(TRACKERS)))
    return out


def _accepted_params(factory: Any) -> tuple[list[str], list[str]] | None:
    """(keyword parameters ``factory`` accepts, required ones), or None when it takes any keyword.

    A class whose ``__init__`` passes ``**kwargs`` on to its base (``OpenAIJudge(**common)`` ->
    ``Judge.__init__``) accepts the base's parameters too: the MRO is followed until an ``__init__``
    without ``**kwargs`` closes the set.
    """
    inits = [vars(k)["__init__"] for k in getattr(factory, "__mro__", ()) if "__init__" in vars(k)
             and k is not object] if isinstance(factory, type) else [factory]
    accepted: list[str] = []
    required: list[str] = []
    for i, fn in enumerate(inits):
        try:
            ps = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return None
        for n, p in ps.items():
            if n == "self" or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                continue
            if n not in accepted:
                accepted.append(n)
            if i == 0 and p.default is p.empty:
                required.append(n)
        if not any(p.kind is p.VAR_KEYWORD for p in ps.values()):
            return accepted, required
    return None if inits else ([], [])


def _signature_problems(factory: Any, params: dict[str, Any], key: str) -> list[str]:
    """Unknown and missing keyword parameters of ``factory`` (a class or function)."""
    found = _accepted_params(factory)
    if found is None:
        return []
    accepted, required = found
    out = []
    for name in params:
        if name not in accepted:
            out.append(f"{key}.{name}: unknown parameter; known: {', '.join(accepted) or '(none)'}"
                       f"{did_you_mean(name, accepted)}")
    for name in required:
        if name not in params:
            out.append(f"{key}.{name}: missing (required parameter)")
    return out


def reward_params(cfg: RunConfig, index: int) -> dict[str, Any]:
    """The params reward ``index`` will be built with: the trainer adds the rubric judge, and the run-wide settings
    (group size) a reward takes (``mmrlvr.train.reward_setup``)."""
    from mmrlvr.rewards.base import REWARDS, takes_param

    spec = cfg.rewards[index]
    params = dict(spec.params)
    if spec.name == "rubric" and cfg.rubric.judge != "none":
        params.setdefault("judge", cfg.rubric.judge)
        params.setdefault("judge_params", dict(cfg.rubric.judge_params))
    if spec.name in REWARDS and takes_param(REWARDS.get(spec.name), "group_size"):
        params.setdefault("group_size", cfg.rollout.group_size)
    return params


def reward_problems(cfg: RunConfig, where: str) -> list[str]:
    """Reward names, parameters (each reward is built; rubric files are read), template consistency."""
    import mmrlvr.consistency.reward  # noqa: F401  (registers "consistency")
    import mmrlvr.rewards  # noqa: F401  (registers the built-in rewards)
    import mmrlvr.rubric.reward  # noqa: F401  (registers "rubric")
    from mmrlvr.rewards.base import REWARDS

    out: list[str] = []
    known = REWARDS.names()
    expected, asked = _expected_answer_format(cfg, where, out)
    for i, spec in enumerate(cfg.rewards):
        key = f"{where}: rewards[{i}]"
        if not spec.name:
            continue  # range_problems reports it
        if spec.name not in known:
            out.append(_unknown(where, f"rewards[{i}].name", "reward", spec.name, known))
            continue
        factory = REWARDS.get(spec.name)
        params = reward_params(cfg, i)
        sig = _signature_problems(factory, params, f"{key}.params")
        if sig:
            out += sig
            continue
        try:
            from mmrlvr.rewards.base import run_settings
            from mmrlvr.train.reward_setup import run_reward_settings

            with _no_heavy_imports(), run_settings(group_size=cfg.rollout.group_size,
                                                   template=run_reward_settings(cfg)["template"] if expected else None):
                built = factory(**params)
            rubric = getattr(built, "rubric", None)
            if spec.name == "rubric" and getattr(rubric, "needs_judge", False) and not params.get("judge"):
                out.append(f"{key} (rubric): rubric {getattr(rubric, 'name', '')!r} has judge criteria but no judge "
                           f"is configured; set rubric.judge (openai | local) and rubric.judge_params")
        except _HeavyImportBlocked:
            pass  # builds a model (e.g. an NLI judge): checked by signature only
        except UserError as exc:
            out += [f"{key} ({spec.name}): {ln}" for ln in _lines(exc)]
        except (TypeError, ValueError, KeyError, OSError) as exc:
            out.append(f"{key} ({spec.name}): bad params {spec.params}: {exc}")
        except Exception as exc:  # a plugin reward's own bug
            out.append(f"{key} ({spec.name}): building it raised {type(exc).__name__}: {exc}")
        fmt = _reward_template(factory, params)
        if expected and fmt in _FORMAT_WORDS and fmt != expected:
            out.append(f"{key} ({spec.name}): reads answers as {_FORMAT_WORDS[fmt]} (template {fmt!r}) but "
                       f"{asked} asks for {_FORMAT_WORDS[expected]}: every response would score 0; set "
                       f"rewards[{i}].params.template to match ({expected}), or change the prompt")
    return out


def _expected_answer_format(cfg: RunConfig, where: str, out: list[str]) -> tuple[str | None, str]:
    """(answer shape the prompts ask for, which setting asks) via ``mmrlvr.data.prompts.answer_format``;
    (None, "") when the prompts ask for no particular shape (``data.template: plain``)."""
    from mmrlvr.data.prompts import answer_format

    d = cfg.data
    explicit = getattr(d, "answer_format", "auto") not in (None, "auto")
    prompt_template = getattr(d, "prompt_template", None)
    if not explicit and not prompt_template and d.template not in TEMPLATE_ANSWER_FORMAT:
        return None, ""
    try:
        fmt = answer_format(d)
    except UserError as exc:
        out.extend(f"{where}: {ln}" for ln in _lines(exc))
        return None, ""
    if explicit:
        asked = f"data.answer_format={d.answer_format!r}"
    elif prompt_template:
        asked = f"data.prompt_template={prompt_template!r}"
    else:
        asked = f"data.template={d.template!r}"
    return fmt, asked


def _reward_template(factory: Any, params: dict[str, Any]) -> str | None:
    """The answer template a reward will parse with: its ``template`` param or that parameter's default."""
    if "template" in params:
        return params["template"] if isinstance(params["template"], str) else None
    try:
        p = inspect.signature(factory).parameters.get("template")
    except (TypeError, ValueError):
        return None
    return p.default if p is not None and isinstance(p.default, str) else None


def _judge_specs(cfg: RunConfig) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(config key, judge name, judge params) of every judge the run will call."""
    if cfg.rubric.judge != "none":
        yield "rubric.judge_params", cfg.rubric.judge, dict(cfg.rubric.judge_params)
    for i, spec in enumerate(cfg.rewards):
        if spec.name != "rubric":
            continue
        judge = spec.params.get("judge")
        params = dict(spec.params.get("judge_params") or {})
        if isinstance(judge, dict):
            params = {**{k: v for k, v in judge.items() if k != "name"}, **params}
            judge = judge.get("name")
        if isinstance(judge, str) and judge != "none":
            yield f"rewards[{i}].params.judge_params", judge, params


def judge_problems(cfg: RunConfig, where: str, dry_run: bool) -> list[str]:
    """Judge parameters (by signature) and, in a dry run, that each endpoint accepts a connection."""
    from mmrlvr.rubric.judges import JUDGES

    out: list[str] = []
    seen: set[str] = set()
    for key, name, params in _judge_specs(cfg):
        if name not in JUDGES:
            continue  # name_problems / reward_problems report it
        out += _signature_problems(JUDGES.get(name), params, f"{where}: {key}")
        url = params.get("base_url")
        if name == "openai" and dry_run and url not in seen:
            seen.add(url)
            problem = endpoint_problem(url)
            if problem:
                out.append(f"{where}: {key}.base_url: {problem}")
    return out


def endpoint_problem(url: str | None, timeout: float = JUDGE_CONNECT_TIMEOUT_S) -> str | None:
    """None when ``url``'s host accepts a TCP connection within ``timeout`` s, else why not."""
    if not url:
        url = os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
    parsed = urlparse(str(url))
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"{url!r} is not an http(s) URL (e.g. http://localhost:8000/v1)"
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        return f"{url!r} has a bad port"
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return (f"judge endpoint {parsed.scheme}://{parsed.hostname}:{port} is unreachable ({reason}); "
                f"start the server or fix base_url (checked with --dry-run)")


def data_problems(cfg: RunConfig, where: str) -> list[str]:
    """``synth:`` task names, or the first rows of each dataset through the data loader's public API."""
    out: list[str] = []
    if not cfg.data.train:
        out.append(f"{where}: data.train: missing (a dataset path, or synth:TASK)")
    from mmrlvr.data.from_config import effective_options, layout_name

    for key, spec, split in (("data.train", cfg.data.train, "train"), ("data.eval", cfg.data.eval, "test")):
        if not spec:
            continue
        try:  # per-dataset options (data.train_options / eval_options) and the layout name, for any source
            layout_name(effective_options(cfg.data, split))
        except UserError as exc:
            out += [f"{where}: {ln}" for ln in _lines(exc)]
            continue
        out += [f"{where}: {key}: {ln}" for ln in _data_source_problems(spec, cfg, split)]
    return list(dict.fromkeys(out))


#: as in ``mmrlvr.train.data`` (which imports numpy; a test keeps these equal)
SYNTH_PREFIX = "synth:"
RUBRIC_SYNTH_TASKS: tuple[str, ...] = ("rubric_count",)


def _data_source_problems(spec: str, cfg: RunConfig, split: str) -> list[str]:
    if spec.startswith(SYNTH_PREFIX):
        from mmrlvr.data.synth import TASKS
        from mmrlvr.data.synth_video import VIDEO_TASKS

        task = spec[len(SYNTH_PREFIX):]
        known = [*TASKS, *RUBRIC_SYNTH_TASKS, *VIDEO_TASKS]
        if task not in known:
            return [f"unknown synthetic task {task!r}; allowed: {', '.join(known)}{did_you_mean(task, known)}"]
        return []
    if not Path(spec).exists():
        return [f"{spec}: no such file or folder (a dataset dir, Parquet/JSON(L) file, or synth:TASK)"]
    from mmrlvr.data.from_config import effective_options, layout_name, video_options
    from mmrlvr.data.loading import load_samples

    try:  # what the trainer's loader (mmrlvr.data.from_config.load_configured) does, on the first rows
        opts = effective_options(cfg.data, split)
        samples, report = load_samples(
            spec, preset=layout_name(opts), columns=opts.columns or None, template=opts.template,
            system=opts.system_prompt, prompt_template=opts.prompt_template,
            split=getattr(opts, "train_split" if split == "train" else "eval_split", None),
            limit=DATA_ROWS_CHECKED, min_pixels=opts.min_pixels, max_pixels=opts.max_pixels,
            on_error=opts.on_error, factor=opts.factor, max_image_pixels=opts.max_image_pixels,
            image_dir=opts.image_dir, video=video_options(opts),
        )
    except UserError as exc:
        return _lines(exc)
    except (OSError, ValueError, TypeError, KeyError) as exc:  # a reader's own error on a bad file
        return [f"{spec}: cannot be read as a dataset: {type(exc).__name__}: {exc}"]
    if not samples:
        n = getattr(report, "n_rows", 0)
        if n:
            first = report.skipped[0] if getattr(report, "skipped", None) else None
            why = f" (row {first.row}, field {first.field!r}: {first.message})" if first else ""
            return [f"{spec}: none of the first {n} rows is usable{why}"]
        return [f"{spec}: no rows"]
    return []


def model_problems(cfg: RunConfig, where: str) -> list[str]:
    """model.path: a ``tiny:`` spec that parses, or a local model folder (nothing is downloaded)."""
    spec = cfg.model.path
    key = f"{where}: model.path"
    if not spec:
        return [f"{key}: missing (a local model folder, or tiny:FAMILY[:warm] for the offline tiny VLM)"]
    if spec.startswith("tiny:"):
        from mmrlvr.train.model_path import tiny_spec

        try:
            tiny_spec(spec)
        except UserError as exc:
            return [f"{where}: {ln}" for ln in _lines(exc)]
        return []
    p = Path(spec)
    if not p.exists():
        return [f"{key}: {spec}: no such folder (nothing is downloaded; point to a local checkpoint or use "
                f"tiny:qwen2_5_vl:warm)"]
    if not p.is_dir() or not (p / "config.json").is_file():
        return [f"{key}: {spec}: not a model folder (no config.json; expected what save_pretrained writes)"]
    return []


def model_structure_problems(cfg: RunConfig, where: str) -> list[str]:
    """Checks that need the model's structure — a LoRA target that names no language-model module — on the
    architecture built on the meta device from ``config.json`` (no weights read). Imports torch and transformers,
    so it runs once the config's own checks pass; a ``tiny:`` model not built yet is checked when it is."""
    if not cfg.model.lora.enabled:
        return []
    spec = cfg.model.path
    if spec.startswith("tiny:"):
        from mmrlvr.train.model_path import tiny_spec

        folder = tiny_spec(spec)[3]
    else:
        folder = Path(spec)
    if not (folder / "config.json").is_file():
        return []
    from mmrlvr.models.lora import lora_target_problems

    return [f"{where}: model.lora.target_modules: {p}" for p in lora_target_problems(folder, cfg.model.lora.target_modules)]


def package_problems(cfg: RunConfig, where: str) -> list[str]:
    """Optional packages a setting needs (looked up, not imported)."""
    out = []
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        out.append(f"{where}: rollout.engine: 'vllm' needs the vllm package: on a GPU pip install 'mmrlvr[vllm]'; "
                   f"on CPU `bash .ci/vllm-env DIR` builds an environment with it (docs/vllm.md); or engine: hf")
    from mmrlvr.train.metrics import TRACKERS, check_report_to

    for tracker in getattr(cfg, "report_to", []) or []:
        if tracker in TRACKERS:  # unknown names: name_problems
            try:
                check_report_to([tracker])  # the trainer's own check: is its package installed
            except UserError as exc:
                out.append(f"{where}: {exc}")
    if cfg.model.attn_implementation in ("flash_attention_2", "flash_attention_3") and \
            importlib.util.find_spec("flash_attn") is None:
        out.append(f"{where}: model.attn_implementation: {cfg.model.attn_implementation!r} needs the flash_attn "
                   f"package; use sdpa or eager")
    return out


def _plugins_here(plugins: list[str]) -> bool:
    """Whether every plug-in is on this machine: files that exist, modules that resolve (looked up, not run)."""
    for spec in plugins:
        if spec.endswith(".py"):
            if not Path(spec).is_file():
                return False
        elif importlib.util.find_spec(spec.split(".")[0]) is None:
            return False
    return True


def guide_problems(cfg: RunConfig, where: str) -> list[str]:
    """``rollout.guide.from`` names a finished checkpoint folder on this machine (NPO's guide)."""
    src = cfg.rollout.guide.get("from") if isinstance(cfg.rollout.guide, dict) else None
    if not isinstance(src, str) or not src or src == "auto" or (Path(src) / "state.json").is_file():
        return []
    return [f"{where}: rollout.guide.from: {src} is not a checkpoint folder (no state.json); name a "
            "RUN_DIR/checkpoints/step-K of a finished save"]


def teacher_problems(cfg: RunConfig, where: str) -> list[str]:
    """``algo.advantage_params.teacher`` (OPD) names a folder on this machine or a ``tiny:`` spec that parses."""
    if cfg.algo.advantage != "opd" or not isinstance(cfg.algo.advantage_params, dict):
        return []
    spec = cfg.algo.advantage_params.get("teacher")
    if not isinstance(spec, str) or not spec.strip():
        return []  # the parameter check reports it
    if spec.startswith("tiny:"):
        from mmrlvr.train.model_path import tiny_spec

        try:
            tiny_spec(spec)
        except UserError as exc:
            return [f"{where}: algo.advantage_params.teacher: {str(exc).split(': ', 1)[-1]}"]
        return []
    folder = Path(spec)
    if not folder.is_dir():
        return [f"{where}: algo.advantage_params.teacher: {spec}: no such folder (a model folder, a "
                "RUN_DIR/checkpoints/step-K or a tiny: spec; nothing is downloaded)"]
    if not ((folder / "config.json").is_file() or (folder / "state.json").is_file()):
        return [f"{where}: algo.advantage_params.teacher: {spec} is neither a model folder (config.json) nor a "
                "checkpoint of a run (state.json)"]
    return []


def preflight_problems(cfg: RunConfig, where: str, *, dry_run: bool = False, resume: bool = False,
                       overwrite: bool = False, allow_config_change: bool = False,
                       environment: bool = True) -> list[str]:
    """Every problem of a typed config that can be found before the model loads (none raised).

    ``environment=False`` keeps to what the config alone decides (names, parameters, templates) and skips
    what depends on this machine: the model folder, the data, optional packages, the run folder and
    judge endpoints (``--config-only``: a config written for another machine).
    """
    from mmrlvr.train.run_dir import check_run_dir

    if resume and environment and cfg.plugins:  # a plug-in file gone from here: the run folder's start folder / copy
        from mmrlvr.plugins import use_run_plugins

        use_run_plugins(cfg.output_dir, list(cfg.plugins), resume=True)
    if plugins_checkable(cfg, environment):
        problems = load_plugins_checked(cfg.plugins, where)
        checks = [name_problems, reward_problems]
    else:  # plugins are files of the target machine: names they register cannot be checked here
        problems, checks = [], []
    if environment:
        checks += [model_problems, data_problems, package_problems, guide_problems, teacher_problems]
    for check in checks:
        try:
            problems += check(cfg, where)
        except UserError as exc:  # a check's own lookup failing on a bad value: still one line
            problems += [f"{where}: {ln}" for ln in _lines(exc)]
    problems += judge_problems(cfg, where, dry_run and environment)
    if environment:
        problems += check_run_dir(cfg, resume=resume, overwrite=overwrite,
                                  allow_config_change=allow_config_change, where=where)
    return problems


def plugins_checkable(cfg: RunConfig, environment: bool) -> bool:
    """Whether the plug-ins can be imported here: always for a run of this machine; with ``environment=False``
    (``--config-only``) only when the files are here (else the names they register cannot be checked, nor the
    plan)."""
    return environment or not cfg.plugins or _plugins_here(cfg.plugins)


def check_run(path: str | Path | None = None, overrides: list[str] | None = None, *,
              data: dict[str, Any] | None = None, dry_run: bool = False, resume: bool = False,
              overwrite: bool = False, allow_config_change: bool = False, environment: bool = True) -> LoadedConfig:
    """Load and check a run's config: the config with its sources, notes and plan (``LoadedConfig``), or
    ``ConfigErrors`` listing every problem.

    Creates nothing on disk and loads no model. ``environment=False``: see ``preflight_problems``.
    """
    loaded = collect_config(path, overrides, data)
    cfg, where = loaded.config, loaded.where
    loaded.add(preflight_problems(cfg, where, dry_run=dry_run, resume=resume, overwrite=overwrite,
                                  allow_config_change=allow_config_change, environment=environment))
    # the plan: stage selection, conflicts, each selected stage's checks (torch-free unless a credit scheme is set);
    # with plug-ins of another machine (--config-only) the stages they register are unknown here
    if plugins_checkable(cfg, environment):
        loaded.add(plan_check(loaded, partial=bool(loaded.problems)))
    if not loaded.problems and environment:  # the model's structure (torch): once everything the config decides
        loaded.add(model_structure_problems(cfg, where))  # is right
    loaded.raise_problems()
    apply_dependent_defaults(cfg)
    return loaded


def plan_check(loaded: LoadedConfig, *, partial: bool = False) -> list[str]:
    """Build the run's plan into ``loaded.plan`` (``mmrlvr.train.plan``); its problems, one line each.
    ``partial``: the config already has problems (bad values were replaced by defaults), so a stage lookup that
    fails on them is left to the check that reported them."""
    import contextlib

    from mmrlvr.train.plan import build_plan

    where = loaded.where
    try:
        # with other problems found, a stage lookup that would import torch (a plug-in's) waits for their fix
        with _no_heavy_imports() if partial else contextlib.nullcontext():
            loaded.plan = build_plan(loaded.config, loaded.sources)  # printed by --dry-run, handed to the trainer
    except _HeavyImportBlocked:
        return []
    except ConfigErrors as exc:
        # a method's parameters checked again by the plan ("config: ..."): named like the check that found them first
        out = [p if p.startswith(where) else f"{where}: {p.removeprefix('config: ')}" for p in exc.problems]
        return [p for p in out if not (partial and p.startswith(f"{where}: stages: "))]
    except UserError as exc:  # a lookup a selection needs failed on a value another check reports
        return [] if partial else [f"{where}: {ln}" for ln in _lines(exc)]
    return []
