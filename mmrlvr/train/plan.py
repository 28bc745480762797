"""The plan of a run: which stage fills each kind of the step, why, and the settings in force with their source.

``build_plan(cfg)`` turns stage selection (``mmrlvr.train.stages.base.select_stages``) into something a user can
read before a run spends compute: ``mmrlvr train CONFIG --dry-run`` prints it, a run prints it at start and
writes ``plan.json`` into its folder, and the inspector's run view shows that file. Building it is also the last
check before a model loads: an unknown stage name, two stages claiming one job, a problem a selected stage finds
with its section, or a method parameter that does not fit its method is a ``ConfigErrors`` naming the keys.

Each setting's source is ``user`` (the file or an override), ``preset`` (``algo.preset``), ``loss default`` (the
defaults a loss brings: GSPO's clip range) or ``default`` (the method's or the config's own default). A key the user
set that no selected stage reads is a ``note:`` saying which stage would read it and when that stage runs; a method
may add its own ``note:`` (``Method.plan_notes``: KL-Cov at ``algo.epochs: 1`` does nothing).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from mmrlvr.errors import ConfigErrors


@dataclass
class PlannedStage:
    kind: str
    name: str
    reason: str
    settings: dict[str, Any] = field(default_factory=dict)  # config key -> value in force
    sources: dict[str, str] = field(default_factory=dict)  # config key -> user | preset | loss default | default


@dataclass
class Plan:
    stages: list[PlannedStage]
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The plan as text: one block per kind, a line per setting (``key = value  (source)``)."""
        from mmrlvr.train.stages.base import show_value

        out = ["plan (stages in step order; why each runs; settings in force and where they come from):"]
        for st in self.stages:
            out.append(f"  {st.kind:<10} {st.name:<22} {st.reason}")
            for k, v in st.settings.items():
                out.append(f"      {k} = {show_value(v)}  ({st.sources.get(k, 'default')})")
        out += [f"note: {n}" for n in self.notes]
        return out

    def names(self) -> dict[str, list[str]]:
        """The stages of each kind, in order (what the trainer's pipeline instantiates); every kind present."""
        from mmrlvr.train.stages.base import STAGE_KINDS

        out: dict[str, list[str]] = {kind: [] for kind in STAGE_KINDS}
        for st in self.stages:
            out.setdefault(st.kind, []).append(st.name)
        return out

    def to_json(self) -> str:
        return json.dumps({"stages": [asdict(s) for s in self.stages], "notes": self.notes}, indent=2, default=str)


def _source(sources: dict[str, str], key: str) -> str:
    if key in sources:
        return sources[key]
    # a whole section set at once (rewards: [...]) or a parent mapping given
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:i]) in sources:
            return sources[".".join(parts[:i])]
    head = key.split("[")[0]
    return sources.get(head, "default")


def _covered(key: str, reads: set[str]) -> bool:
    return any(key == r or (r.endswith(".") and key.startswith(r)) or key.startswith(r + ".") for r in reads)


def inert_notes(sources: dict[str, str], selected: list[type], registered: list[type]) -> list[str]:
    """One note per key the user set that only stages this run does not use read."""
    read_now = {r for cls in selected for r in cls.reads} | {k for cls in selected for k in cls.selected_by}
    notes = []
    for key, src in sorted(sources.items()):
        if src != "user" or _covered(key, read_now):
            continue
        readers = [cls for cls in registered if _covered(key, set(cls.reads))]
        if not readers:
            continue
        who = "; ".join(f"the {c.kind} stage {c.name!r}, which runs when {c.when_text or 'named in stages'}"
                        for c in readers)
        notes.append(f"{key} is set but inert in this run: only {who}")
    return notes


def build_plan(cfg: Any, sources: dict[str, str] | None = None) -> Plan:
    """The run's plan, or ``ConfigErrors`` listing every problem of the stage selection and the selected stages.
    ``sources``: where the config's values came from (``mmrlvr.config.LoadedConfig.sources``); None: read from
    the values (``mmrlvr.config.value_sources``)."""
    import mmrlvr.train.stages  # noqa: F401 - registers the built-in stages
    from mmrlvr.train.stages.base import (STAGE_KINDS, STAGES, ExplicitStageError, StageConflict, config_sources,
                                          select_all)

    sources = config_sources(cfg, sources)
    chosen, errors = select_all(cfg, sources)
    # a conflict or a misspelt stages.<kind> name is the user's to fix; any other lookup a selection made failed on
    # a value another check reports (an unknown credit scheme): "stages: ..."
    problems: list[str] = [str(exc) if isinstance(exc, (StageConflict, ExplicitStageError)) else f"stages: {exc}"
                           for _, exc in errors]
    stages, selected = [], []
    for kind in STAGE_KINDS:
        for name in chosen.get(kind, []):
            cls = STAGES[kind].get(name)
            selected.append(cls)
            try:
                problems += cls.validate(cfg)
                named = getattr(getattr(cfg, "stages", None), kind, None)
                reason = cls.reason(cfg)
                if named and name in ([named] if isinstance(named, str) else named) and not cls.when(cfg):
                    reason = f"stages.{kind} names it"
                settings = cls.plan_params(cfg)
            except ConfigErrors as exc:
                problems += exc.problems
                reason, settings = cls.reason(cfg), {}
            except ImportError as exc:  # a check that may not import torch yet (other problems come first)
                problems.append(f"stages: the {kind} stage {name!r} needs {exc}")
                continue
            from mmrlvr.config import redact_secrets

            settings = redact_secrets(settings)  # a reward's api_key never reaches the log, plan.json or the inspector
            stages.append(PlannedStage(kind, name, reason, settings, {k: _source(sources, k) for k in settings}))
    if problems:
        raise ConfigErrors(list(dict.fromkeys(problems)))
    registered = [STAGES[k].get(n) for k in STAGE_KINDS for n in STAGES[k].names()]
    from mmrlvr.methods import method_notes

    return Plan(stages, inert_notes(sources, selected, registered) + method_notes(cfg))
