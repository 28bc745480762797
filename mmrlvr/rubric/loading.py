"""Read rubrics from YAML files and from dataset columns, validating every field.

Two sources, one validator:

* a rubric file (``rubrics/*.yaml``): a mapping with ``name``, optional ``description`` and ``criteria``
  (a list of criterion mappings). Errors name the file, the LINE and the field, e.g.
  ``rubrics/chart_qa.yaml:14: criteria[1] 'reads_axis': field 'category': must be one of ...``. Lines
  come from PyYAML's composed node tree (each node keeps its ``start_mark``), read alongside the
  plain ``safe_load`` result.
* an instance rubric (a dataset column): a list of criterion dicts, the same list as a JSON string, or a
  mapping with a ``criteria`` key. Errors name the row (when given) and the criterion index and field.

Unknown keys are errors (a typo such as ``catagory`` would otherwise silently fall back to a default).
Validation reports EVERY problem of a rubric at once: ``RubricError.problems`` holds one message per
problem (each naming the file, line, criterion and key) and ``str()`` joins them, one per line.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping

import regex as _regex
import yaml

from mmrlvr.errors import UserError
from mmrlvr.rubric.schema import (
    CATEGORIES,
    CHECK_KINDS,
    CHECK_PARAMS,
    CRITERION_KEYS,
    DEFAULT_WEIGHTS,
    JUDGE_KIND,
    TARGETS,
    Check,
    Criterion,
    Rubric,
)

Path_ = tuple[Any, ...]  # ("criteria", 2, "weight")
_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_RUBRIC_KEYS = ("name", "description", "criteria")


class RubricError(UserError):
    """A malformed rubric; the message names file/row, line, criterion and field.

    ``problems``: every problem found, one message each (``str()`` is them joined by newlines).
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems) if problems else [message]


# ----------------------------------------------------------------------------------------------- lines
def _line_map(node: yaml.Node, path: Path_ = (), out: dict[Path_, int] | None = None) -> dict[Path_, int]:
    """Map every path in a composed YAML tree to its 1-based line number."""
    out = {} if out is None else out
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            _line_map(value_node, path + (key,), out)
            out[path + (key, "__key__")] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, path + (i,), out)
    return out


class _Where:
    """Formats error locations: ``file:line: criteria[i] 'id': field 'x': ...`` or ``row 3: ...``."""

    def __init__(self, source: str, lines: dict[Path_, int] | None = None) -> None:
        self.source, self.lines = source, lines or {}
        self.problems: list[str] = []

    def report(self, path: Path_, message: str, crit_id: str | None = None) -> None:
        """Record a problem and carry on validating (all problems are raised together at the end)."""
        self.problems.append(str(self.error(path, message, crit_id)))

    def raise_problems(self) -> None:
        if self.problems:
            raise RubricError("\n".join(self.problems), self.problems)

    def line(self, path: Path_) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())

    def place(self, path: Path_) -> str:
        line = self.line(path)
        return f"{self.source}:{line}" if line is not None else self.source

    def error(self, path: Path_, message: str, crit_id: str | None = None) -> RubricError:
        parts = [self.place(path)]
        if len(path) >= 2 and path[0] == "criteria" and isinstance(path[1], int):
            parts.append(f"criteria[{path[1]}]" + (f" {crit_id!r}" if crit_id else ""))
            rest = [str(p) for p in path[2:]]
        else:
            rest = [str(p) for p in path]
        if rest:
            parts.append("field " + repr(".".join(rest)))
        return RubricError(": ".join(parts) + ": " + message)


# -------------------------------------------------------------------------------------------- public
def load_rubric_file(path: str | Path) -> Rubric:
    """Load and validate a rubric YAML file (errors name the file, line and field)."""
    path = Path(path)
    if not path.is_file():
        raise RubricError(f"{path}: rubric file not found")
    text = path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise RubricError(f"{path}{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    where = _Where(str(path), _line_map(node) if node is not None else {})
    return rubric_from_data(data, where=where, default_name=path.stem)


def load_rubric_text(text: str, source: str = "<string>") -> Rubric:
    """Like ``load_rubric_file`` for YAML text (tests, the CLI's stdin)."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    data = yaml.safe_load(text)
    return rubric_from_data(data, where=_Where(source, _line_map(node) if node is not None else {}))


def parse_instance_rubric(value: Any, *, source: str = "dataset", row: int | None = None) -> Rubric:
    """Validate a per-sample rubric from a dataset column: list of dicts, JSON string, or a mapping."""
    place = f"{source}, row {row}, field 'rubric'" if row is not None else f"{source}, field 'rubric'"
    if isinstance(value, Rubric):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RubricError(f"{place}: not valid JSON ({exc.msg} at char {exc.pos})") from None
    if isinstance(value, (list, tuple)):
        value = {"criteria": list(value)}
    return rubric_from_data(value, where=_Where(place), default_name="instance")


def rubric_from_data(data: Any, *, where: _Where, default_name: str = "rubric") -> Rubric:
    """Validate plain data (already parsed) into a ``Rubric``; every problem is reported at once."""
    if not isinstance(data, Mapping):
        raise where.error((), f"a rubric must be a mapping with 'criteria', got {type(data).__name__}")
    for key in data:
        if key not in _RUBRIC_KEYS:
            where.report((key,), f"unknown key; known: {', '.join(_RUBRIC_KEYS)}")
    name = data.get("name", default_name)
    if not isinstance(name, str):
        where.report(("name",), "must be a string")
    raw = data.get("criteria")
    if not isinstance(raw, list) or not raw:
        where.report(("criteria",), "must be a non-empty list of criteria")
        where.raise_problems()
    criteria, seen = [], {}
    for i, item in enumerate(raw):
        crit = _criterion(item, i, where)
        cid = item.get("id") if isinstance(item, Mapping) else None
        if isinstance(cid, str) and _ID_RE.match(cid):
            if cid in seen:
                where.report(("criteria", i, "id"), f"duplicate id (first used by criteria[{seen[cid]}])", cid)
            else:
                seen[cid] = i
        if crit is not None:
            criteria.append(crit)
    where.raise_problems()
    return Rubric(tuple(criteria), name=name, description=str(data.get("description") or ""),
                  source=where.source)


# --------------------------------------------------------------------------------------- validation
def _criterion(item: Any, i: int, where: _Where) -> Criterion | None:
    """A validated criterion, or None after reporting every problem it has."""
    base: Path_ = ("criteria", i)
    if not isinstance(item, Mapping):
        where.report(base, f"a criterion must be a mapping, got {type(item).__name__}")
        return None
    before = len(where.problems)
    cid = item.get("id")
    err: Callable[[str, str], None] = lambda fld, msg: where.report(  # noqa: E731
        base + (fld,), msg, cid if isinstance(cid, str) else None)
    for key in item:
        if key not in CRITERION_KEYS:
            err(key, f"unknown key; known: {', '.join(CRITERION_KEYS)}")
    if not isinstance(cid, str) or not _ID_RE.match(cid):
        err("id", f"required: a short name of letters, digits, '_', '-', '.', got {cid!r}")
    text = item.get("text")
    if not isinstance(text, str) or not text.strip():
        err("text", "required: a non-empty sentence stating the property checked")
    category = item.get("category")
    if category not in CATEGORIES:
        err("category", f"must be one of {', '.join(CATEGORIES)}, got {category!r}")
    weight = item.get("weight", DEFAULT_WEIGHTS.get(category, 1.0))
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        err("weight", f"must be a finite number, got {weight!r}")
    elif weight < 0 and category in CATEGORIES and category != "pitfall":
        err("weight", "negative weights are only meaningful for pitfalls; use category: pitfall "
                      "with a positive weight (the pitfall's weight is subtracted when it is met)")
    elif weight == 0:
        err("weight", "must not be 0 (remove the criterion instead)")
    needs_image = item.get("needs_image", False)
    if not isinstance(needs_image, bool):
        err("needs_image", f"must be true or false, got {needs_image!r}")
    check = _check(item.get("check", JUDGE_KIND), base + ("check",), where, cid if isinstance(cid, str) else None)
    if check is None or len(where.problems) > before:
        return None
    return Criterion(id=cid, text=" ".join(text.split()), category=category, weight=abs(float(weight)),
                     check=check, needs_image=needs_image, where=where.place(base))


def _check(raw: Any, path: Path_, where: _Where, cid: str | None) -> Check | None:
    if isinstance(raw, str):
        raw = {"type": raw}
    if not isinstance(raw, Mapping):
        where.report(path, f"must be a check type or a mapping with 'type', got {type(raw).__name__}", cid)
        return None
    kind = raw.get("type")
    if kind not in CHECK_KINDS:
        where.report(path + ("type",), f"must be one of {', '.join(CHECK_KINDS)}, got {kind!r}", cid)
        return None
    before = len(where.problems)
    required, optional = CHECK_PARAMS[kind]
    params: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "type":
            continue
        if key not in required and key not in optional:
            known = ", ".join(("type",) + required + tuple(optional))
            where.report(path + (key,), f"unknown parameter for a {kind} check; known: {known}", cid)
            continue
        params[key] = value
    for key in required:
        if key not in params:
            where.report(path, f"a {kind} check needs '{key}'", cid)
    for key, default in optional.items():
        params.setdefault(key, default)
    _check_values(kind, params, path, where, cid)
    return None if len(where.problems) > before else Check(kind, params)


def _check_values(kind: str, p: dict[str, Any], path: Path_, where: _Where, cid: str | None) -> None:
    """Report every bad value among the parameters present (missing required ones were reported)."""
    def bad(key: str, msg: str) -> None:
        where.report(path + (key,), msg, cid)

    if p.get("target") not in TARGETS:
        bad("target", f"must be one of {', '.join(TARGETS)}, got {p.get('target')!r}")
    for key in ("tolerance", "rel_tolerance", "threshold"):
        if key in p and (isinstance(p[key], bool) or not isinstance(p[key], (int, float)) or p[key] < 0):
            bad(key, f"must be a non-negative number, got {p[key]!r}")
    if kind == "regex":
        if "pattern" in p and not isinstance(p["pattern"], str):
            bad("pattern", "must be a string")
        elif "pattern" in p:
            try:  # checks run with the `regex` module (time budget); both must accept the pattern
                re.compile(p["pattern"])
                _regex.compile(p["pattern"])
            except (re.error, _regex.error) as exc:
                bad("pattern", f"not a valid regular expression: {exc}")
        if isinstance(p["min_count"], bool) or not isinstance(p["min_count"], int) or p["min_count"] < 1:
            bad("min_count", "must be an integer >= 1")
        if not isinstance(p["ignore_case"], bool):
            bad("ignore_case", "must be true or false")
    if kind == "number":
        if p["pick"] is None:
            p["pick"] = "only" if p["target"] == "answer" else "last"
        if p["pick"] not in ("only", "last", "first"):
            bad("pick", f"must be only, last or first, got {p['pick']!r}")
        if "expected" in p:
            _expect_number_or_ref(p["expected"], lambda m: bad("expected", m))
    if kind == "iou":
        t = p.get("threshold")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 and not 0 < t <= 1:
            bad("threshold", "must be in (0, 1]")
        e = p.get("expected", "{answer}")
        if e != "{answer}" and not (isinstance(e, list) and len(e) == 4
                                    and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in e)):
            bad("expected", "must be a box [x1, y1, x2, y2] or \"{answer}\"")
    if kind in ("choice", "math") and "expected" in p and not isinstance(p["expected"], (str, int, float)):
        bad("expected", "must be a string (or \"{answer}\")")
    if kind == "json_field" and "field" in p and (not isinstance(p["field"], str) or not p["field"]):
        bad("field", "must be a dotted path such as 'objects.0.label'")
    if kind == "judge":
        for key in ("show_question", "show_reference"):
            if not isinstance(p[key], bool):
                bad(key, "must be true or false")


def _expect_number_or_ref(value: Any, bad: Callable[[str], None]) -> None:
    if value == "{answer}" or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return
    try:
        float(str(value))
    except ValueError:
        bad(f"must be a number or \"{{answer}}\", got {value!r}")
