"""The stage contract: a training step is a fixed sequence of stage *kinds*, each filled by registered stages.

    generate -> score -> shape -> advantages -> reference -> credit -> update -> record

A stage is a small class registered under its kind and a name::

    @register_stage("advantages", "my_baseline", priority=5)
    class MyBaseline(Stage):
        @classmethod
        def when(cls, cfg):            # auto-selection: does the config ask for this stage?
            return cfg.algo.advantage == "my_baseline"
        def __call__(self, batch):     # read and write StepBatch fields
            batch.advantages = ...

For every kind the config may name the stage(s) explicitly (``stages.<kind>: name``); otherwise the
registered stages whose ``when(cfg)`` holds are chosen: the one with the highest priority for single kinds,
all of them in priority order for the ``shape`` kind (reward transforms and row filters compose).
``validate(cfg)`` returns the problems with the stage's own config section (checked before any model load).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from mmrlvr.registry import Registry

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
    """One step of the pipeline over a ``StepBatch``. Subclasses set up what they need in ``__init__``."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    priority: ClassVar[int] = 0

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

    def __call__(self, batch: "StepBatch") -> None:  # pragma: no cover - abstract
        raise NotImplementedError


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


def select_stages(cfg: "RunConfig") -> dict[str, list[str]]:
    """The stage names each kind runs for ``cfg``: explicit ``stages.<kind>`` entries, else auto-selection."""
    chosen: dict[str, list[str]] = {}
    explicit = getattr(cfg, "stages", None)
    for kind in STAGE_KINDS:
        named = getattr(explicit, kind, None) if explicit is not None else None
        if named:
            names = [named] if isinstance(named, str) else list(named)
            for n in names:
                STAGES[kind].get(n)  # unknown name: RegistryError listing the known ones
            chosen[kind] = names
            continue
        hits = [c.name for c in _candidates(kind) if c.when(cfg)]
        chosen[kind] = hits if kind in MULTI_KINDS else hits[:1]
        if not chosen[kind] and kind not in MULTI_KINDS:
            raise ValueError(f"no {kind} stage applies to this config (registered: {', '.join(STAGES[kind].names())})")
    return chosen


def validate_stages(cfg: "RunConfig") -> list[str]:
    """Every problem the selected stages find with the config (for early validation, before a model loads)."""
    from mmrlvr.registry import RegistryError

    try:
        chosen = select_stages(cfg)
    except (RegistryError, ValueError) as exc:
        return [f"stages: {exc}"]
    problems: list[str] = []
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

        from mmrlvr.train.batch import StepBatch

        batch = StepBatch(step=step, round=round)
        for kind, stages in self.stages:
            t0 = time.perf_counter()
            for stage in stages:
                if stage is stop_before:
                    return batch
                stage(batch)
            batch.timings[kind] = time.perf_counter() - t0
            if kind == upto:
                break
        return batch

    def describe(self) -> str:
        """One line: the stage chosen for each kind."""
        return " -> ".join(f"{k}[{','.join(self.names.get(k, [])) or '-'}]" for k in STAGE_KINDS)
