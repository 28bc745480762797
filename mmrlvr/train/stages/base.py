"""The stage contract: a training step is a fixed sequence of stage *kinds*, each filled by registered stages.

    generate -> score -> shape -> advantages -> reference -> credit -> update -> record

(reference before credit: the credit schemes read pi_old, which the reference kind may recompute.)

A stage is a small class registered under its kind and a name::

    @register_stage("advantages", "my_baseline", priority=5)
    class MyBaseline(Stage):
        selected_by = ("algo.advantage",)   # the key whose value chooses it (the plan's "why")
        serves = ("advantage", "my_baseline")  # algo.advantage: my_baseline is accepted by validation
        @classmethod
        def when(cls, cfg):            # auto-selection: does the config ask for this stage?
            return cfg.algo.advantage == "my_baseline"
        def __call__(self, batch):     # read and write StepBatch fields
            batch.advantages = ...

The registered stages whose ``when(cfg)`` holds are chosen: the one that applies for single kinds (two that
apply for different config keys are an error naming both keys), all of them in priority order for the
``shape`` and ``reference`` kinds (reward transforms and row filters compose). ``stages.<kind>`` names stages
explicitly: it adds to the automatic ones for those two kinds and replaces a default for the others
(``select_stages``). ``validate(cfg)`` returns the problems with the stage's own config section (checked before
any model load); ``mmrlvr.train.plan`` turns the selection into the plan a run prints and writes.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from mmrlvr.errors import UserError
from mmrlvr.registry import Registry, RegistryError

if TYPE_CHECKING:
    from mmrlvr.config import RunConfig
    from mmrlvr.train.batch import StepBatch
    from mmrlvr.train.runtime import Runtime

#: the stage kinds in the order a step runs them
STAGE_KINDS: tuple[str, ...] = ("generate", "score", "shape", "advantages", "reference", "credit", "update", "record")
#: kinds where every selected stage runs (in priority order) instead of exactly one: shaping transforms compose,
#: and the reference kind computes the log-probs of every other policy the update needs (pi_old recomputed by
#: the training model, pi_ref for the KL term) — before credit, which reads pi_old
MULTI_KINDS: frozenset[str] = frozenset({"shape", "reference"})


class Stage:
    """One step of the pipeline over a ``StepBatch``. Subclasses set up what they need in ``__init__``.

    What a stage declares (class attributes), so the plan can say what runs and why:

    - ``selected_by``: the config keys whose values choose it (``("algo.loss",)`` for POPO's stages); two stages of
      one kind chosen by *different* keys are a conflict (an error naming both), never a silent winner;
    - ``fallback``: runs only when no other stage of its kind applies (plain group advantages, the policy-gradient
      update); a user-set key of a fallback that another stage overrides is a conflict too;
    - ``absorbs``: config keys of the fallback whose choice this stage carries out itself (the tree advantages
      normalise node values with ``algo.advantage``'s estimator), so setting them is no conflict;
    - ``reads``: the config keys it reads (a key ending in ``.`` covers the section); a key the user set that only
      unselected stages read is reported as inert;
    - ``when_text``: when auto-selection picks it, in words (for the inert-key note);
    - ``serves``: ``(method kind, name)`` when the stage *is* a method (POISE's estimator is a stage), so the name
      is accepted where the method is named (``algo.advantage: poise``).

    Hooks: ``after_step(batch)`` runs once the step is recorded (a sampler learns from the step's rewards);
    ``state_dict()`` / ``load_state_dict(state)`` put a stage's state in checkpoints, so resume is exact.
    """

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    selected_by: ClassVar[tuple[str, ...]] = ()
    fallback: ClassVar[bool] = False
    absorbs: ClassVar[tuple[str, ...]] = ()
    reads: ClassVar[tuple[str, ...]] = ()
    when_text: ClassVar[str] = ""
    serves: ClassVar[tuple[str, str] | None] = None

    def __init__(self, rt: "Runtime") -> None:
        self.rt = rt
        self.cfg = rt.cfg

    @classmethod
    def when(cls, cfg: "RunConfig") -> bool:
        """Whether auto-selection picks this stage for ``cfg`` (explicit ``stages.<kind>`` overrides it)."""
        return True

    @classmethod
    def validate(cls, cfg: "RunConfig") -> list[str]:
        """Problems with this stage's config section, one line each ("key: what is wrong")."""
        return []

    @classmethod
    def reason(cls, cfg: "RunConfig") -> str:
        """Why this stage runs, in config terms (``algo.loss: popo``)."""
        if not cls.selected_by:
            return "always" if not cls.fallback else "default"
        return ", ".join(f"{k}: {show_value(_value(cfg, k))}" for k in cls.selected_by)

    @classmethod
    def plan_params(cls, cfg: "RunConfig") -> dict[str, Any]:
        """The settings in force for this stage, by config key (the plan prints them with their source)."""
        return {k: _value(cfg, k) for k in cls.reads if not k.endswith(".")}

    def after_step(self, batch: "StepBatch") -> None:
        """Called once per step after every stage ran (refill rounds excluded)."""

    def state_dict(self) -> dict[str, Any] | None:
        """This stage's state for checkpoints (None: stateless)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s output on resume."""

    def __call__(self, batch: "StepBatch") -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def all_rows(rt: "Runtime", b: "StepBatch") -> dict[str, Any]:
    """Model inputs of every row of the batch (for a stage's own no-grad pass over the whole batch)."""
    return rt.inputs(b.rollouts, b.vision, b.images_per_row, slice(0, b.rollouts.num_rows))


def _value(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


def show_value(v: Any) -> str:
    """A setting's value as the plan prints it: YAML-like (true, false, null; mappings and lists as JSON)."""
    return json.dumps(v, default=str) if isinstance(v, (dict, list, bool)) or v is None else str(v)


STAGES: dict[str, Registry[type[Stage]]] = {kind: Registry(f"{kind} stage") for kind in STAGE_KINDS}


def register_stage(kind: str, name: str, *, priority: int = 0):
    """Class decorator: register a ``Stage`` subclass as ``name`` of ``kind``."""
    if kind not in STAGES:
        raise ValueError(f"unknown stage kind {kind!r}; kinds: {', '.join(STAGE_KINDS)}")

    def deco(cls: type[Stage]) -> type[Stage]:
        cls.kind, cls.name, cls.priority = kind, name, priority
        STAGES[kind].add(name, cls)
        return cls

    return deco


def _candidates(kind: str) -> list[type[Stage]]:
    reg = STAGES[kind]
    return sorted((reg.get(n) for n in reg.names()), key=lambda c: -c.priority)


class StageConflict(UserError):
    """Two stages claim one job, or an explicit stage list drops one the config enables."""


class ExplicitStageError(RegistryError):
    """A ``stages.<kind>`` entry names no registered stage (the message lists the known ones)."""


def _user_set(sources: dict[str, str], key: str) -> bool:
    return sources.get(key) == "user"


def config_sources(cfg: Any, sources: dict[str, str] | None) -> dict[str, str]:
    """The loaded config's sources, or those read from a config built in code (``mmrlvr.config.value_sources``)."""
    if sources is not None:
        return sources
    from mmrlvr.config import RunConfig, value_sources

    return value_sources(cfg) if isinstance(cfg, RunConfig) else {}


def _claim(cls: type[Stage], cfg: Any) -> str:
    return f"{cls.reason(cfg)} (the {cls.kind} stage {cls.name!r})"


def _auto(kind: str, cfg: Any, sources: dict[str, str]) -> list[type[Stage]]:
    """Auto-selection for one kind: every applicable stage (multi kinds), or the one that applies (single kinds),
    raising ``StageConflict`` when stages chosen by different config keys both apply."""
    hits = [c for c in _candidates(kind) if c.when(cfg)]
    if kind in MULTI_KINDS:
        return hits
    specific = [c for c in hits if not c.fallback]
    if not specific:
        return hits[:1]
    winner = specific[0]
    for other in specific[1:] + [c for c in hits if c.fallback]:
        if set(other.selected_by) & set(winner.selected_by):
            continue  # variants of one choice (credit in the update or in its own pass): priority decides
        if other.fallback and not any(_user_set(sources, k) for k in other.selected_by):
            continue  # a default the run did not ask for
        if other.fallback and set(other.selected_by) <= set(winner.absorbs):
            continue  # the winner carries out the fallback's choice itself
        raise StageConflict(f"{_claim(winner, cfg)} and {_claim(other, cfg)} both choose the {kind} stage; "
                            f"unset one of {', '.join(winner.selected_by + other.selected_by)}")
    return [winner]


def select_stages(cfg: "RunConfig", sources: dict[str, str] | None = None) -> dict[str, list[str]]:
    """The stage names each kind runs for ``cfg`` (the first problem raises; ``select_all`` collects them all).

    Auto-selection (``when``; conflicts are errors), extended by explicit ``stages.<kind>`` entries: for the kinds
    where every selected stage runs (shape, reference) the named stages are *added* to the automatic ones and all
    run in priority order; for the others the named stage replaces the automatic one — unless the config enables a
    specific one (``consistency.split_advantage: true``), which an explicit name may not silently drop.
    ``sources``: where the config's values came from (``mmrlvr.config.LoadedConfig.sources``; a conflict with a
    fallback stage counts only for a choice the run asked for); None: read from the values."""
    sources = config_sources(cfg, sources)
    return {kind: _select_kind(kind, cfg, sources) for kind in STAGE_KINDS}


def select_all(cfg: "RunConfig", sources: dict[str, str] | None = None
               ) -> tuple[dict[str, list[str]], list[tuple[str, Exception]]]:
    """(the stages of every kind that could be selected, ``(kind, error)`` for each kind that could not): every
    problem of the selection at once, for the plan."""
    sources = config_sources(cfg, sources)
    chosen: dict[str, list[str]] = {}
    errors: list[tuple[str, Exception]] = []
    for kind in STAGE_KINDS:
        try:
            chosen[kind] = _select_kind(kind, cfg, sources)
        except (StageConflict, RegistryError, ValueError, ImportError) as exc:  # ImportError: a check that
            errors.append((kind, exc))                                       # may not import torch yet
    return chosen, errors


def _select_kind(kind: str, cfg: Any, sources: dict[str, str]) -> list[str]:
    explicit = getattr(cfg, "stages", None)
    named = getattr(explicit, kind, None) if explicit is not None else None
    if named:  # explicit names first: a misspelt one is the problem to report, whatever auto-selection finds
        names = [named] if isinstance(named, str) else list(named)
        classes = []
        for n in names:
            try:
                classes.append(STAGES[kind].get(n))
            except RegistryError as exc:  # unknown name, listing the known ones
                raise ExplicitStageError(f"stages.{kind}: {exc}") from None
        auto = _auto(kind, cfg, sources)
        if kind in MULTI_KINDS:
            merged = {c.name: c for c in [*auto, *classes]}
            return [c.name for c in sorted(merged.values(), key=lambda c: -c.priority)]
        if len(names) != 1:
            raise StageConflict(f"stages.{kind}: one {kind} stage runs, got {names}")
        if auto and not auto[0].fallback and auto[0].name != names[0]:
            raise StageConflict(f"stages.{kind}: {names[0]} would drop {_claim(auto[0], cfg)}; unset "
                                f"{', '.join(auto[0].selected_by)} or remove stages.{kind}")
        return names
    picked = [c.name for c in _auto(kind, cfg, sources)]
    if not picked and kind not in MULTI_KINDS:
        raise ValueError(f"no {kind} stage applies to this config (registered: {', '.join(STAGES[kind].names())})")
    return picked


def validate_stages(cfg: "RunConfig", sources: dict[str, str] | None = None) -> list[str]:
    """Every problem of the stage selection and of the selected stages with the config (before a model loads)."""
    chosen, errors = select_all(cfg, sources)
    problems = [str(exc) if isinstance(exc, (StageConflict, ExplicitStageError)) else f"stages: {exc}"
                for _, exc in errors]
    for kind, names in chosen.items():
        for n in names:
            problems.extend(STAGES[kind].get(n).validate(cfg))
    return problems


class Pipeline:
    """The selected stages, instantiated once per run; ``run(step)`` executes one training step."""

    def __init__(self, rt: "Runtime", names: dict[str, list[str]] | None = None) -> None:
        self.rt = rt
        rt.pipeline = self  # a stage may run earlier kinds again (dynamic sampling's refill rounds)
        self.names = names if names is not None else select_stages(rt.cfg)
        self.stages: list[tuple[str, list[Stage]]] = [
            (kind, [STAGES[kind].get(n)(rt) for n in self.names.get(kind, [])]) for kind in STAGE_KINDS
        ]

    def stage(self, kind: str) -> Stage | None:
        """The (first) stage instance of ``kind``, or None."""
        for k, stages in self.stages:
            if k == kind and stages:
                return stages[0]
        return None

    def run(self, step: int, upto: str | None = None, *, round: int = 0,
            stop_before: Stage | None = None) -> "StepBatch":
        """Run the stages of one step (through kind ``upto`` when given, or up to the stage ``stop_before``)
        and return the batch. ``round`` > 0 is a refill round: the sampler draws other prompts."""
        import time

        from torch.profiler import record_function

        from mmrlvr.train.batch import StepBatch
        from mmrlvr.train.padding import in_stage

        batch = StepBatch(step=step, round=round)
        for kind, stages in self.stages:
            t0 = time.perf_counter()
            for stage in stages:
                if stage is stop_before:
                    return batch
                # names the stage in torch's profiler, and its model calls for the padding meter
                with record_function(f"stage {kind}/{stage.name}"), in_stage(kind):
                    stage(batch)
            batch.timings[kind] = time.perf_counter() - t0
            if kind == upto:
                return batch
        if round == 0:
            self.after_step(batch)
        return batch

    def describe(self) -> str:
        """One line: the stage chosen for each kind."""
        return " -> ".join(f"{k}[{','.join(self.names.get(k, [])) or '-'}]" for k in STAGE_KINDS)

    def all_stages(self) -> list[Stage]:
        return [st for _, stages in self.stages for st in stages]

    def after_step(self, batch: "StepBatch") -> None:
        """Every stage's ``after_step`` hook, in step order (a sampler observes the step's rewards)."""
        for st in self.all_stages():
            st.after_step(batch)

    def state_dict(self) -> dict[str, Any]:
        """``{"kind/name": state}`` of every stage with state (checkpoints)."""
        out = {}
        for st in self.all_stages():
            state = st.state_dict()
            if state is not None:
                out[f"{st.kind}/{st.name}"] = state
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore each stage's state; a stage with state the checkpoint lacks starts afresh (say so)."""
        for st in self.all_stages():
            key = f"{st.kind}/{st.name}"
            if key in state:
                st.load_state_dict(state[key])
            elif type(st).state_dict is not Stage.state_dict and self.rt.is_main:  # stateful (no state copied to ask)
                print(f"note: resume: the checkpoint has no state for the {st.kind} stage {st.name!r}; it starts afresh")
