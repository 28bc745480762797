"""Methods and their parameters, declared once: the contract of every loss, advantage estimator, clip rule and sampler.

A *method* is a registered implementation chosen by name in a config (``algo.loss: gspo``); its *parameters*
sit beside that name, under one key per kind, addressed the same way for built-ins and plug-ins::

    algo.loss + algo.loss_params                 policy losses        (mmrlvr.algos.losses.POLICY_LOSSES)
    algo.advantage + algo.advantage_params       advantage estimators (mmrlvr.algos.advantages.ADVANTAGES)
    algo.clip + algo.clip_params                 clip rules           (mmrlvr.algos.clipping.CLIP_RULE_REGISTRY)
    algo.rollout_correction + ..._params         rollout corrections  (mmrlvr.algos.rollout_correction)
    rollout.sampler + rollout.sampler_params     prompt samplers      (mmrlvr.train.samplers.SAMPLERS)
    algo.aux_losses: [{name, weight, params}]    auxiliary losses     (mmrlvr.train.aux_losses.AUX_LOSSES),
                                                 a list: each entry names one and holds its parameters

(credit schemes: ``credit.scheme`` + ``credit.scheme_params``; rewards, a list like the auxiliary losses:
``rewards[i].params``.)

Each built-in declares its parameters once, with ``declare`` and ``Param`` values — name, default, one line of
help and the accepted range — so a misspelt parameter, a wrong type or a value out of range is reported at config
load, before torch is imported. The declarations sit beside the code, in modules that import without torch
(``MethodKind.declared_in``: ``mmrlvr.algos.losses``, ``mmrlvr.algos.advantages``, ``mmrlvr.algos.clipping``,
``mmrlvr.algos.kl``, ``mmrlvr.algos.aggregation``, ``mmrlvr.train.samplers``, ``mmrlvr.train.aux_losses``); a
test keeps them equal to the functions' keyword defaults. A plug-in's parameters are read from its signature: the
keyword parameters after the positional inputs, their defaults, and a help line per parameter from
``@describe_params(name="help", ...)`` when it gives one.

Deliberately not here: the implementations (torch) and the choice of stages (``mmrlvr.train.stages.base``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from mmrlvr.errors import did_you_mean


@dataclass(frozen=True)
class Param:
    """One parameter of a method: its default, a line of help, and what values it accepts.

    The type is the default's (bool, int, float — ints are accepted for floats —, str); a ``None`` default
    accepts anything or None. ``choices`` lists the allowed values; ``check`` + ``rule`` a range
    (``check=lambda v: v > 0, rule="> 0"``)."""

    name: str
    default: Any
    help: str = ""
    rule: str = ""
    check: Callable[[Any], bool] | None = field(default=None, compare=False)
    choices: tuple[Any, ...] | None = None
    kind: type | None = None  # the accepted type when the default is None (e.g. float for an optional cap)
    required: bool = False  # no usable default: a run naming the method must give it (OPD's teacher)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not accepted (a phrase), or None."""
        tp = self.kind if self.default is None or self.kind is object else type(self.default)
        if value is None:
            return None if self.default is None else f"expected {_type_word(tp)}, got null"
        if tp is bool and not isinstance(value, bool):
            return f"expected true/false, got {value!r}"
        if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
            if not (isinstance(value, float) and value.is_integer()):
                return f"expected an integer, got {value!r}"
        if tp is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"expected a number, got {value!r}"
        if tp is str and not isinstance(value, str):
            return f"expected a string, got {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}, got {value!r}{did_you_mean(value, self.choices)}"
        if self.check is not None:
            try:
                ok = bool(self.check(value))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                return f"must be {self.rule or 'valid'}, got {value!r}"
        return None

    def coerce(self, value: Any) -> Any:
        """The value in the parameter's type (an integral float for an int, an int for a float)."""
        tp = self.kind if self.default is None or self.kind is object else type(self.default)
        if value is None or isinstance(value, bool):
            return value
        if tp is int and isinstance(value, float):
            return int(value)
        if tp is float and isinstance(value, int):
            return float(value)
        return value

    def line(self) -> str:
        """``name = default  # help [rule]`` for ``--help-config``."""
        extra = f" [{self.rule}]" if self.rule else (f" [{' | '.join(map(str, self.choices))}]" if self.choices else "")
        note = f"{self.help}{extra}".strip()
        shown = "(required)" if self.required else repr(self.default)
        return f"{self.name} = {shown}" + (f"  # {note}" if note else "")


def positive(v: Any) -> bool:
    """A ``Param`` check: > 0."""
    return v > 0


def non_negative(v: Any) -> bool:
    """A ``Param`` check: >= 0."""
    return v >= 0


def _type_word(tp: type | None) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(tp, "a value")


@dataclass(frozen=True)
class Method:
    """A registered method's public face: its name, a line of help, its parameters and its source (paper id).

    ``open_params``: the implementation takes ``**kwargs`` and accepts parameters it does not declare."""

    kind: str
    name: str
    help: str = ""
    params: tuple[Param, ...] = ()
    source: str = ""
    open_params: bool = False
    #: a check across parameters: the resolved values -> a problem phrase or None (e.g. eps_min <= eps_max)
    cross: Callable[[dict[str, Any]], str | None] | None = field(default=None, compare=False)
    #: a check against the rest of the run: (config, resolved values) -> problem phrases (e.g. k <= group size)
    config_check: Callable[[Any, dict[str, Any]], list[str]] | None = field(default=None, compare=False)
    #: lines for the run's plan (printed as ``note:``): (config, resolved values) -> warnings that are not errors,
    #: e.g. a setting that leaves the method inert (KL-Cov at ``algo.epochs: 1``)
    plan_notes: Callable[[Any, dict[str, Any]], list[str]] | None = field(default=None, compare=False)
    #: a policy loss: the aggregation (``algo.agg``) it is defined with, or None (the config's stands)
    agg: str | None = None
    #: a policy loss: why its defaults (clip range, aggregation) are what they are, for the note a run prints
    why: str = ""

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def resolve(self, given: Mapping[str, Any] | None, key: str) -> tuple[dict[str, Any], list[str]]:
        """(the parameters in force: defaults updated by ``given``, problems naming ``key``.<param>)."""
        values, problems = self.defaults(), []
        what = METHOD_KINDS[self.kind].what if self.kind in METHOD_KINDS else self.kind
        names = [p.name for p in self.params]
        for k, v in (given or {}).items():
            p = self.param(k)
            if p is None:
                if self.open_params:
                    values[k] = v
                    continue
                problems.append(f"{key}.{k}: unknown parameter of {what} {self.name!r}; accepted: "
                                f"{', '.join(names) or '(none)'}{did_you_mean(k, names)}")
                continue
            why = p.problem(v)
            if why:
                problems.append(f"{key}.{k}: {what} {self.name!r}: {why}")
                continue
            values[k] = p.coerce(v)
        for p in self.params:  # a required parameter left out (or null) names itself and what it takes
            if p.required and values.get(p.name) is None and not any(x.startswith(f"{key}.{p.name}:")
                                                                       for x in problems):
                problems.append(f"{key}.{p.name}: {what} {self.name!r}: required ({p.help})")
        if not problems and self.cross is not None:
            why = self.cross(values)
            if why:
                problems.append(f"{key}: {what} {self.name!r}: {why}")
        return values, problems

    def lines(self) -> list[str]:
        """``--help-config`` lines: the method, then one indented line per parameter."""
        head = f"{self.name}: {self.help}" + (f" ({self.source})" if self.source else "")
        return [head, *(f"    {p.line()}" for p in self.params)] + (["    (also accepts other keyword parameters)"]
                                                                     if self.open_params else [])


@dataclass(frozen=True)
class MethodKind:
    """One extension point whose methods take parameters: the config keys that name a method and hold its
    parameters, where built-ins are declared, and the live registry plug-ins add to."""

    kind: str
    what: str
    name_key: str
    params_key: str
    declared_in: str  # torch-free module whose import declares the built-ins (``declare``)
    registry: tuple[str, str]  # (module, attribute) of the live registry (may import torch)
    #: keyword parameters of an implementation that the runtime supplies (not user parameters)
    runtime_args: frozenset[str] = frozenset()
    #: positional inputs of an implementation (not parameters)
    positional: int = 0
    #: ``name_key`` holds a list of ``{name, weight, params}`` entries (several methods at once), not one name
    listed: bool = False


METHOD_KINDS: dict[str, MethodKind] = {
    "loss": MethodKind("loss", "policy loss", "algo.loss", "algo.loss_params", "mmrlvr.algos.losses",
                       ("mmrlvr.algos.losses", "POLICY_LOSSES"),
                       frozenset({"generator", "clip", "clip_params", "eps_low", "eps_high", "dual_clip"}), 4),
    "advantage": MethodKind("advantage", "advantage estimator", "algo.advantage", "algo.advantage_params",
                            "mmrlvr.algos.advantages", ("mmrlvr.algos.advantages", "ADVANTAGES"),
                            frozenset({"token_counts", "reduce"}), 2),
    "clip": MethodKind("clip", "clip rule", "algo.clip", "algo.clip_params", "mmrlvr.algos.clipping",
                       ("mmrlvr.algos.clipping", "CLIP_RULE_REGISTRY"), frozenset({"bins"}), 5),
    "kl": MethodKind("kl", "KL estimator", "algo.kl_estimator", "", "mmrlvr.algos.kl",
                     ("mmrlvr.algos.kl", "KL_ESTIMATORS")),
    "agg": MethodKind("agg", "loss aggregation mode", "algo.agg", "", "mmrlvr.algos.aggregation",
                      ("mmrlvr.algos.aggregation", "AGG_MODES")),
    "sampler": MethodKind("sampler", "prompt sampler", "rollout.sampler", "rollout.sampler_params",
                          "mmrlvr.train.samplers", ("mmrlvr.train.samplers", "SAMPLERS"),
                          frozenset({"n", "batch_size", "seed", "group_size"}), 0),
    "rollout_correction": MethodKind("rollout_correction", "rollout correction", "algo.rollout_correction",
                                     "algo.rollout_correction_params", "mmrlvr.algos.rollout_correction",
                                     ("mmrlvr.algos.rollout_correction", "ROLLOUT_CORRECTIONS"), frozenset(), 3),
    "aux_loss": MethodKind("aux_loss", "auxiliary loss", "algo.aux_losses", "algo.aux_losses.<i>.params",
                           "mmrlvr.train.aux_losses", ("mmrlvr.train.aux_losses", "AUX_LOSSES"),
                           frozenset({"rt", "weight"}), 0, listed=True),
}

_DECLARED: dict[str, dict[str, Method]] = {k: {} for k in METHOD_KINDS}


def declare(kind: str, name: str, help: str, *params: Param, source: str = "",
            cross: Callable[[dict[str, Any]], str | None] | None = None,
            config_check: Callable[[Any, dict[str, Any]], list[str]] | None = None,
            plan_notes: Callable[[Any, dict[str, Any]], list[str]] | None = None, agg: str | None = None,
            why: str = "") -> Method:
    """Declare built-in method ``name`` of ``kind`` with its parameters, beside its implementation (in a module
    that imports without torch: ``torch = lazy_module("torch")``)."""
    if kind not in METHOD_KINDS:
        raise ValueError(f"unknown method kind {kind!r}; kinds: {', '.join(METHOD_KINDS)}")
    m = Method(kind, name, help, tuple(params), source, cross=cross, config_check=config_check,
               plan_notes=plan_notes, agg=agg, why=why)
    _DECLARED[kind][name] = m
    return m


def describe_params(**help: str) -> Callable[[Any], Any]:
    """Decorator for a plug-in method: one line of help per keyword parameter (shown by ``--help-config``)::

        @describe_params(k="samples whose best counts (k <= G)")
        @ADVANTAGES.register("pass_at_k")
        def pass_at_k(rewards, group_index, *, k: int = 4): ...
    """

    def deco(obj: Any) -> Any:
        obj.param_help = dict(help)
        return obj

    return deco


def _declared(kind: str) -> dict[str, Method]:
    importlib.import_module(METHOD_KINDS[kind].declared_in)  # torch-free: declares the built-ins
    return _DECLARED[kind]


def _live(kind: str) -> Any:
    """The live registry of ``kind`` if its module is imported (a plug-in registering a method imports it)."""
    module, attr = METHOD_KINDS[kind].registry
    mod = sys.modules.get(module)
    return getattr(mod, attr, None) if mod is not None else None


def _stage_served(kind: str) -> dict[str, Any]:
    """Methods of ``kind`` served by a registered stage (``Stage.serves = (kind, name)``), e.g. POISE's estimator."""
    base = sys.modules.get("mmrlvr.train.stages.base")
    out: dict[str, Any] = {}
    if base is None:
        return out
    for reg in base.STAGES.values():
        for n in reg.names():
            cls = reg.get(n)
            served = getattr(cls, "serves", None)
            if served and served[0] == kind:
                out[served[1]] = cls
    return out


def method_names(kind: str) -> list[str]:
    """Every name ``kind`` accepts: built-ins, the live registry's (plug-ins) and stage-served methods."""
    names = set(_declared(kind))
    live = _live(kind)
    if live is not None:
        names |= set(live.names())
    names |= set(_stage_served(kind))
    return sorted(names)


def method_spec(kind: str, name: str) -> Method | None:
    """The declaration of ``name``: a built-in's, a plug-in's ``method`` attribute, or read from its signature."""
    declared = _declared(kind)
    if name in declared:
        return declared[name]
    live = _live(kind)
    obj = live.get(name) if live is not None and name in live else _stage_served(kind).get(name)
    if obj is None:
        return None
    if isinstance(getattr(obj, "method", None), Method):
        return obj.method
    return spec_from_signature(kind, name, obj)


def spec_from_signature(kind: str, name: str, obj: Any) -> Method:
    """A plug-in's parameters from its signature: keyword parameters with defaults after the positional inputs,
    minus the ones the runtime supplies; help from ``@describe_params``."""
    mk = METHOD_KINDS[kind]
    params, open_params = signature_params(obj, mk.positional, mk.runtime_args)
    return Method(kind, name, _first_line(obj), params, open_params=open_params)


def signature_params(obj: Any, positional: int = 0, runtime: frozenset[str] = frozenset()
                     ) -> tuple[tuple[Param, ...], bool]:
    """(the keyword parameters with defaults of ``obj``'s signature — a class's ``__init__`` —, whether it takes
    ``**kwargs``), skipping its first ``positional`` required inputs and the names the runtime supplies."""
    fn = obj.__init__ if isinstance(obj, type) else obj
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return (), True
    helps = getattr(obj, "param_help", {}) or {}
    params, open_params, skipped = [], False, 0
    for p in sig.parameters.values():
        if p.name == "self" or p.kind is p.VAR_POSITIONAL:
            continue
        if p.kind is p.VAR_KEYWORD:
            open_params = True
            continue
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty and skipped < positional:
            skipped += 1
            continue
        if p.name in runtime or p.default is p.empty:
            continue
        kind_hint = type(p.default) if p.default is not None else None
        params.append(Param(p.name, p.default, helps.get(p.name, ""), kind=kind_hint))
    return tuple(params), open_params


def _first_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def resolve_method(kind: str, name: str, given: Mapping[str, Any] | None, where: str = "config"
                   ) -> tuple[dict[str, Any], list[str]]:
    """(parameters in force for method ``name`` of ``kind``, problems). An unknown name is reported by the
    name check, not here (returns the given parameters unchecked)."""
    spec = method_spec(kind, name)
    if spec is None:
        return dict(given or {}), []
    values, problems = spec.resolve(given, METHOD_KINDS[kind].params_key)
    return values, [f"{where}: {p}" for p in problems]


def _dotted(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


#: the keys an ``algo.aux_losses`` entry takes
ENTRY_KEYS = ("name", "weight", "params")


def listed_entries(cfg: Any, kind: str, where: str = "config") -> tuple[list[tuple[str, float, dict[str, Any]]],
                                                                          list[str]]:
    """The entries of a listed kind (``algo.aux_losses``) as (name, weight, parameters in force), and every
    problem with them: an entry that is not a mapping, a missing or unknown name, a weight that is not a positive
    number, unknown keys, and each method's own parameter checks (``<key>.<i>.params.<param>``)."""
    mk = METHOD_KINDS[kind]
    raw = _dotted(cfg, mk.name_key)
    out: list[tuple[str, float, dict[str, Any]]] = []
    problems: list[str] = []
    if not isinstance(raw, (list, tuple)):
        return [], [f"{where}: {mk.name_key}: expected a list of {{name, weight, params}}, got {raw!r}"]
    known = method_names(kind)
    for i, entry in enumerate(raw):
        key = f"{mk.name_key}.{i}"
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: {key}: expected {{name: ..., weight: ..., params: {{...}}}}, got {entry!r}")
            continue
        extra = [k for k in entry if k not in ENTRY_KEYS]
        if extra:
            problems.append(f"{where}: {key}: unknown key(s) {', '.join(map(str, extra))}; an entry takes "
                            f"{', '.join(ENTRY_KEYS)}{did_you_mean(str(extra[0]), ENTRY_KEYS)}")
        name = entry.get("name")
        if name not in known:
            problems.append(f"{where}: {key}.name: unknown {mk.what} {name!r}; known: {', '.join(known) or '(none)'}"
                            f"{did_you_mean(str(name), known)}")
            continue
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            problems.append(f"{where}: {key}.weight: expected a number > 0, got {weight!r}")
            continue
        given = entry.get("params") or {}
        if not isinstance(given, Mapping):
            problems.append(f"{where}: {key}.params: expected a mapping, got {given!r}")
            continue
        spec = method_spec(kind, name)
        values, bad = spec.resolve(given, f"{key}.params") if spec is not None else (dict(given), [])
        problems += [f"{where}: {p}" for p in bad]
        if not bad and spec is not None and spec.config_check is not None:
            problems += [f"{where}: {key}.params: {mk.what} {name!r}: {p}" for p in spec.config_check(cfg, values)]
        out.append((name, float(weight), values))
    return out, problems


def configured(cfg: Any, kind: str) -> tuple[str, dict[str, Any]]:
    """(the method ``cfg`` names for ``kind``, its parameters in force): what a stage builds the method with.
    Config load has validated them; a problem here (a config built in code) raises ``UserError``."""
    from mmrlvr.errors import ConfigErrors

    mk = METHOD_KINDS[kind]
    name = _dotted(cfg, mk.name_key)
    given = _dotted(cfg, mk.params_key) if mk.params_key else {}
    values, problems = resolve_method(kind, name, given)
    if problems:
        raise ConfigErrors(problems)
    return name, values


def method_notes(cfg: Any) -> list[str]:
    """The plan's notes from the methods ``cfg`` names (``Method.plan_notes``, e.g. KL-Cov inert at one epoch);
    a method whose parameters have problems adds none (the problems are reported)."""
    out: list[str] = []
    for kind, mk in METHOD_KINDS.items():
        if mk.listed:
            continue
        name = _dotted(cfg, mk.name_key)
        spec = method_spec(kind, name) if isinstance(name, str) else None
        if spec is None or spec.plan_notes is None:
            continue
        values, problems = spec.resolve(_dotted(cfg, mk.params_key) if mk.params_key else {}, mk.params_key)
        if not problems:
            out += spec.plan_notes(cfg, values)
    return out


def parameter_lines(title: str, entries: Iterable[tuple[str, Any]]) -> list[str]:
    """``--help-config`` lines for a registry that already took a ``params`` mapping (rewards, credit schemes):
    each ``(name, factory)`` with the keyword parameters its signature (or dataclass fields) declares."""
    import dataclasses

    out = [title]
    for name, obj in entries:
        if dataclasses.is_dataclass(obj):
            params = [Param(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init]
            doc = _first_line(type(obj))
        else:
            params, doc = list(signature_params(obj)[0]), _first_line(obj)
        out.append(f"  {name}: {doc}".rstrip(": ").rstrip())
        out += [f"    {p.line()}" for p in params]
    return out


def help_lines(kinds: Iterable[str] | None = None) -> list[str]:
    """``--help-config``: every registered method of each kind with its parameters (plug-ins included)."""
    out: list[str] = []
    for kind in kinds or METHOD_KINDS:
        mk = METHOD_KINDS[kind]
        where = f"; parameters under {mk.params_key}" if mk.params_key else ""
        if mk.listed:
            where = "; a list of {name, weight, params} entries"
        plural = mk.what + ("es" if mk.what.endswith("s") else "s")
        out.append(f"{mk.name_key} ({plural}{where}):")
        for name in method_names(kind):
            spec = method_spec(kind, name)
            out.extend(f"  {ln}" for ln in (spec.lines() if spec else [name]))
    return out
