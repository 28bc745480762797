"""Turn dataset rows into ``Sample`` values, with errors that name the source, row and field.

``load_samples(source, preset=..., columns=...)`` reads
- a folder written by ``datasets``' ``save_to_disk`` (a ``Dataset`` or, with ``split``, a ``DatasetDict``),
- a Parquet file, or a folder of them (e.g. a Hub snapshot with ``data/train-00000-of-00001.parquet``),
- a JSON file (a list of objects) or JSON Lines file, or a folder of them,
- a list of dicts, or a ``datasets.Dataset`` already in memory,
and returns ``(samples, LoadReport)``.

Presets name where each of our fields lives in common dataset layouts (first column present wins):

=========== ======================= ================= ============== ======================================
preset      problem                 answer            images         notes
=========== ======================= ================= ============== ======================================
easyr1      problem                 answer            images         Geometry3K style, ``<image>`` in text
virl        question (problem)      answer            image (images) ViRL39K; id from ``qid``
grounding   problem (question)      solution (answer) image (images) RefCOCO style; answer is a box
choice      question (problem)      answer            image (images) ``options`` list rendered as A. B. ...
mmrlvr      problem                 answer            images         our synthetic format (``synth.py``)
=========== ======================= ================= ============== ======================================

With ``preset=None`` the preset is guessed from the column names (the report says which). ``columns``
maps our field names (problem, answer, images, options, rubric, id, answer_type, solution, meta, task) to
dataset columns and overrides the preset.

Value rules (documented because they change data):
- answers: strings are kept (a whole-answer ``\\boxed{X}`` wrapper is removed: ViRL39K stores answers that
  way); ints and floats are converted to strings (an integral float 3.0 becomes "3"); booleans, dicts and
  lists are errors, except that a box answer may be a list of 4 numbers.
- box answers are in pixels of the original image and are rescaled to the resized image the model sees;
  they become the string ``"[x1, y1, x2, y2]"`` (rounded to integers); the original is kept in meta.
- choice answers become a letter: a letter ("b", "(B)", "B.") is upper-cased, an int is a 0-based option
  index, and a string equal to one option's text becomes that option's letter.
- images are loaded and resized with ``mmrlvr.data.images`` (smart_resize with min/max pixels and factor).

JSON files are parsed with the ``json`` module row by row rather than with ``datasets``' JSON builder:
Arrow needs one type per column, so a single row with a dict answer would fail the whole file with an
error naming no row; row-by-row parsing turns it into a ``DataError`` for that row (or a skip).

Bad input raises ``mmrlvr.errors.DataError`` naming source, row and field. With ``on_error="skip"`` a
bad *row* is skipped and listed in the report; a bad *source* (missing file, unknown preset, a column that
does not exist) always raises, because skipping every row would hide the mistake.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from mmrlvr.data.images import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_PIXELS,
    DEFAULT_MIN_PIXELS,
    IMAGE_FACTOR,
    prepare_image,
)
from mmrlvr.data.answers import (guess_answer_type, location_boxes, looks_like_boxes, parse_gold_boxes, strip_answer_tags,
                                 validate_gold)
from mmrlvr.data.chat import ParsedChat, is_chat, normalise_placeholders, parse_chat
from mmrlvr.data.prompts import (
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    PromptTemplate,
    build_messages,
    count_placeholders,
    get_template,
    load_prompt_template,
)
from mmrlvr.errors import DataError
from mmrlvr.types import Sample

FIELDS: tuple[str, ...] = ("id", "problem", "answer", "images", "videos", "options", "rubric", "answer_type",
                           "solution", "meta", "task", "tools_kwargs")
ANSWER_TYPES: tuple[str, ...] = ("number", "choice", "text", "box", "math")
#: a preset's answer type "auto": guessed per row from the answer (a box list -> box, words -> text, else math)
AUTO = "auto"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class Preset:
    """Where our fields live in one dataset layout: field -> candidate column names (first present wins).

    Candidates may be dotted paths into nested values (``reward_model.ground_truth``). ``problem`` may hold
    a plain string or a chat (a message list; ``mmrlvr.data.chat``); when the answer column is absent the
    chat's last assistant turn is the answer (LLaVA).
    """

    name: str
    columns: dict[str, tuple[str, ...]]
    answer_type: str
    required: tuple[str, ...] = ("problem", "answer")
    description: str = ""


_COMMON: dict[str, tuple[str, ...]] = {"rubric": ("rubric",), "answer_type": ("answer_type",),
                                       "tools_kwargs": ("extra_info.tools_kwargs", "tools_kwargs")}
PRESETS: dict[str, Preset] = {
    "verl": Preset("verl", {**_COMMON, "id": ("extra_info.index", "id", "index"), "problem": ("prompt",),
                            "answer": ("reward_model.ground_truth", "answer", "ground_truth"),
                            "images": ("images",), "videos": ("videos",), "task": ("data_source",)}, "math",
                   description="verl parquet: chat-list prompt, images as {bytes} dicts, reward_model.ground_truth"),
    "easyr1": Preset("easyr1", {**_COMMON, "id": ("id",), "problem": ("problem",), "answer": ("answer",),
                                "images": ("images", "image"), "videos": ("videos", "video")}, "math",
                     description="EasyR1 / Geometry3K: problem (with <image>), answer, images"),
    "vlm_r1": Preset("vlm_r1", {**_COMMON, "id": ("id",), "problem": ("conversations", "problem"),
                                "answer": ("solution", "answer"), "images": ("image", "images"),
                                "videos": ("video", "videos")}, AUTO, required=("problem",),
                     description="VLM-R1 / open-r1 JSONL: conversations (from/value) or problem, solution "
                                 "(<answer> tags stripped), image"),
    "llava": Preset("llava", {**_COMMON, "id": ("id",), "problem": ("conversations",), "answer": ("answer",),
                              "images": ("image", "images"), "videos": ("video", "videos")}, AUTO,
                    required=("problem",),
                    description="LLaVA JSON: conversations (human/gpt), the gpt turn is the answer, image"),
    "visual_rft": Preset("visual_rft", {**_COMMON, "id": ("id",), "problem": ("problem",), "answer": ("solution",),
                                        "images": ("image", "images")}, AUTO,
                         description="Visual-RFT: problem, solution (<answer>boxes or a class name</answer>), image"),
    "virl": Preset("virl", {**_COMMON, "id": ("qid", "id"), "problem": ("question", "problem"),
                            "answer": ("answer",), "images": ("image", "images")}, "math",
                   description="ViRL39K: question, answer, image; id from qid"),
    "grounding": Preset("grounding", {**_COMMON, "id": ("id",), "problem": ("problem", "question"),
                                      "answer": ("solution", "answer"), "images": ("image", "images")}, "box",
                        description="RefCOCO style: problem, solution (a box), image"),
    "choice": Preset("choice", {**_COMMON, "id": ("id",), "problem": ("question", "problem"),
                                "answer": ("answer",), "images": ("image", "images"), "options": ("options",)},
                     "choice", required=("problem", "answer", "options"),
                     description="multiple choice: question, options, answer"),
    "mmrlvr": Preset("mmrlvr", {**_COMMON, "id": ("id",), "problem": ("problem",), "answer": ("answer",),
                                "images": ("images",), "videos": ("videos",), "solution": ("solution",),
                                "meta": ("meta",), "task": ("task",)}, "math",
                     description="our synthetic format (mmrlvr data synth)"),
}
#: names accepted for ``data.format`` (``auto`` detects the layout from the columns and says which it chose)
FORMATS: tuple[str, ...] = ("auto", *PRESETS)
# a generic layout for when nothing is detected but ``columns`` says where things are
_GENERIC = Preset("custom", {f: (f,) for f in FIELDS}, "math")


@dataclass
class SkippedRow:
    row: int
    field: str | None
    message: str


@dataclass
class LoadReport:
    """What ``load_samples`` did: rows read, samples made, and why any row was skipped."""

    source: str
    preset: str
    n_rows: int = 0
    n_loaded: int = 0
    n_skipped: int = 0
    skipped: list[SkippedRow] = field(default_factory=list)
    columns: dict[str, str] = field(default_factory=dict)  # our field -> the column it was read from
    detected: bool = False  # the preset was detected from the columns (data.format auto)

    def summary(self) -> str:
        how = ", detected" if self.detected else ""
        line = f"{self.source}: {self.n_loaded} of {self.n_rows} rows loaded (preset {self.preset}{how})"
        if self.n_skipped:
            first = self.skipped[0]
            line += (f", {self.n_skipped} skipped (first: row {first.row}"
                     + (f", field {first.field!r}" if first.field else "") + f": {first.message})")
        return line


# ----------------------------------------------------------------------------------------------------
# sources -> (name, column names, row iterator, base dir for relative image paths)

@dataclass
class _Source:
    name: str
    columns: list[str]
    rows: Iterator[dict[str, Any]]
    base_dir: Path | None


def _rows_from_arrow_batches(batches: Iterable[Any]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        yield from batch.to_pylist()


def _open_hf_dataset(ds: Any, name: str, split: str | None, base_dir: Path | None) -> _Source:
    import datasets

    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if split is None:
            if len(splits) != 1:
                raise DataError(f"has splits {', '.join(splits)}; pass split=", source=name)
            split = splits[0]
        if split not in ds:
            raise DataError(f"has no split {split!r}; splits: {', '.join(splits)}", source=name)
        ds = ds[split]
    # arrow format: rows come back undecoded (images as {"bytes", "path"} dicts), so a corrupt image is
    # one row's DataError instead of an exception from inside datasets' iterator
    batches = ds.with_format("arrow").iter(batch_size=256)
    return _Source(name, list(ds.column_names), _rows_from_arrow_batches(batches), base_dir)


def _parquet_source(files: list[Path], name: str, base_dir: Path) -> _Source:
    import pyarrow.parquet as pq

    try:
        handles = [pq.ParquetFile(f) for f in files]
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
        raise DataError(f"is not a readable Parquet file ({type(exc).__name__}: {exc})", source=name) from None
    columns = handles[0].schema_arrow.names
    for f, h in zip(files[1:], handles[1:]):
        if h.schema_arrow.names != columns:
            raise DataError(f"{f.name} has columns {h.schema_arrow.names}, unlike {files[0].name}: {columns}",
                            source=name)

    def rows() -> Iterator[dict[str, Any]]:
        for h in handles:
            yield from _rows_from_arrow_batches(h.iter_batches(batch_size=256))

    return _Source(name, list(columns), rows(), base_dir)


class _BadLine:
    """A JSON line that did not parse; turned into a row error by the loader."""

    def __init__(self, message: str) -> None:
        self.message = message


def _json_rows(files: list[Path], name: str) -> tuple[list[str], list[Any]]:
    rows: list[Any] = []
    for f in files:
        text = f.read_text(encoding="utf-8")
        stripped = text.lstrip()
        if f.suffix == ".json" and stripped.startswith("["):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(f"{f.name} is not valid JSON ({exc})", source=name) from None
            rows.extend(data)
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                rows.append(_BadLine(f"{f.name} line {lineno} is not valid JSON ({exc.msg})"))
    columns: list[str] = []
    for r in rows[:1000]:  # column names from the first rows (JSON rows may omit keys)
        if isinstance(r, dict):
            columns.extend(k for k in r if k not in columns)
    return columns, rows


def _files_in(folder: Path, suffixes: tuple[str, ...], split: str | None) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if split is not None:
        files = [p for p in files if p.name.startswith(split) or p.parent.name == split]
    return files


def _open_source(source: Any, split: str | None, image_dir: str | Path | None) -> _Source:
    base = Path(image_dir) if image_dir is not None else None
    if isinstance(source, (list, tuple)):
        return _Source("<rows>", _columns_of(source), iter(source), base)
    # a Dataset in hand means `datasets` is imported already; importing it just to ask costs seconds
    # (pandas, pyarrow), which a JSONL or Parquet path (and a --dry-run's check of the first rows) never needs
    ds_module = sys.modules.get("datasets")
    if ds_module is not None and isinstance(source, (ds_module.Dataset, ds_module.DatasetDict)):
        return _open_hf_dataset(source, "<dataset>", split, base)
    if not isinstance(source, (str, Path)):
        raise DataError(f"cannot load a dataset from a {type(source).__name__}; pass a path, a list of dicts "
                        "or a datasets.Dataset", source=repr(source)[:80])
    path = Path(source).expanduser()
    name = str(source)
    if not path.exists():
        raise DataError("not found", source=name)
    if path.is_dir() and any((path / f).exists() for f in ("state.json", "dataset_dict.json", "dataset_info.json")):
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as exc:  # noqa: BLE001 - datasets raises several types for a broken folder
            raise DataError(f"could not be read with datasets.load_from_disk ({type(exc).__name__}: {exc})",
                            source=name) from None
        return _open_hf_dataset(ds, name, split, base or path)
    if path.is_dir():
        files = _files_in(path, (".parquet",), split)
        if files:
            return _parquet_source(files, name, base or path)
        files = _files_in(path, (".jsonl", ".json"), split)
        if not files:
            which = f" for split {split!r}" if split else ""
            raise DataError(f"holds no save_to_disk dataset, .parquet, .jsonl or .json files{which}", source=name)
        columns, rows = _json_rows(files, name)
        return _Source(name, columns, iter(rows), base or path)
    if path.suffix == ".parquet":
        return _parquet_source([path], name, base or path.parent)
    if path.suffix in (".jsonl", ".json"):
        columns, rows = _json_rows([path], name)
        return _Source(name, columns, iter(rows), base or path.parent)
    raise DataError(f"unsupported file type {path.suffix!r}; use a save_to_disk folder, .parquet, .jsonl or .json",
                    source=name)


def _columns_of(rows: Iterable[Any]) -> list[str]:
    columns: list[str] = []
    for r in list(rows)[:1000]:
        if isinstance(r, dict):
            columns.extend(k for k in r if k not in columns)
    return columns


# ----------------------------------------------------------------------------------------------------
# preset and column resolution

_MISSING = object()


def lookup(row: Any, path: str) -> Any:
    """The value at ``path`` in a row: a column name, or a dotted path into nested dicts / lists
    (``reward_model.ground_truth``, ``conversations.1.value``); an exact column name wins over a dotted
    reading. Returns ``_MISSING`` when a step is absent (so an explicit null stays distinguishable)."""
    if isinstance(row, dict) and path in row:
        return row[path]
    node = row
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _path_present(path: str, columns: set[str], first: Any) -> bool:
    """A candidate column exists: its top-level name is a column, and a nested path resolves in the first row."""
    if path in columns:
        return True
    head = path.split(".", 1)[0]
    if head not in columns or "." not in path:
        return False
    return not isinstance(first, dict) or lookup(first, path) is not _MISSING


def _looks_like_rft_solution(first: Any) -> bool:
    sol = first.get("solution") if isinstance(first, dict) else None
    return isinstance(sol, str) and "<answer>" in sol


def detect_preset(columns: Iterable[str], first: Any = None) -> str | None:
    """The preset whose layout matches these column names (and, where names are ambiguous, the first
    row's values), or None."""
    cols = set(columns)
    if {"problem", "answer", "images", "answer_type", "task"} <= cols:
        return "mmrlvr"
    if "prompt" in cols and ({"reward_model", "data_source"} & cols):
        return "verl"
    if "conversations" in cols:
        return "vlm_r1" if "solution" in cols else "llava"
    if "options" in cols and ({"question", "problem"} & cols):
        return "choice"
    if "question" in cols and "answer" in cols:
        return "virl"
    if "problem" in cols and "solution" in cols and "answer" not in cols:
        return "visual_rft" if _looks_like_rft_solution(first) else "grounding"
    if "problem" in cols and "answer" in cols:
        return "easyr1"
    return None


def _resolve_columns(source: _Source, preset: str | None, columns: dict[str, str] | None,
                     first: Any = None) -> tuple[Preset, dict[str, str]]:
    """(preset, our field -> dataset column or dotted path) for this source; raises for a mapping that cannot work."""
    if preset == "auto":
        preset = None
    if preset is not None and preset not in PRESETS:
        raise DataError(f"unknown preset {preset!r}; known presets: {', '.join(PRESETS)}", source=source.name)
    for key in columns or {}:
        if key not in FIELDS:
            raise DataError(f"unknown field in columns mapping; known fields: {', '.join(FIELDS)}",
                            source=source.name, field=key)
    available = set(source.columns)
    if preset is None:
        detected = detect_preset(available, first)
        if detected is None and not columns:
            raise DataError(f"cannot tell the layout from columns {sorted(available)}; pass preset= (one of "
                            f"{', '.join(PRESETS)}) or columns=", source=source.name)
        spec = PRESETS[detected] if detected else _GENERIC
    else:
        spec = PRESETS[preset]
    mapping: dict[str, str] = {}
    for our, candidates in spec.columns.items():
        found = next((c for c in candidates if _path_present(c, available, first)), None)
        if found is not None:
            mapping[our] = found
    for our, col in (columns or {}).items():
        if not _path_present(col, available, first):
            head = col.split(".", 1)[0]
            if head in available and isinstance(first, dict):
                raise DataError(f"path {col!r} (mapped from field {our!r}) does not resolve in the first row; "
                                f"column {head!r} holds {_shape(first.get(head))}", source=source.name, field=our)
            raise DataError(f"column {col!r} (mapped from field {our!r}) is not in the data; columns: "
                            f"{', '.join(sorted(available))}", source=source.name, field=our)
        mapping[our] = col
    required = [f for f in spec.required if not (f == "answer" and "rubric" in mapping)]
    for our in required:
        if our not in mapping:
            wanted = " or ".join(repr(c) for c in spec.columns.get(our, (our,))) or repr(our)
            raise DataError(f"missing column for field {our!r} (preset {spec.name} looks for {wanted}); "
                            f"columns: {', '.join(sorted(available))}; map it with columns={{{our!r}: ...}}",
                            source=source.name, field=our)
    return spec, mapping


def _shape(value: Any) -> str:
    """A short description of a value's structure, for error messages about paths."""
    if isinstance(value, dict):
        return "an object with keys " + ", ".join(map(repr, list(value)[:8]))
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}"


# ----------------------------------------------------------------------------------------------------
# value normalisation (each raises DataError(message); the row loop adds source/row/field)

_BOXED = re.compile(r"^\s*\\boxed\{(.*)\}\s*$", re.DOTALL)


def _number_text(value: int | float) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DataError(f"answer is {value}")
        if value.is_integer():
            return str(int(value))
    return str(value)


def normalise_answer(value: Any) -> str:
    """A string answer (see the module docstring for the conversion rules)."""
    if isinstance(value, str):
        m = _BOXED.match(value)
        return m.group(1).strip() if m else value.strip()
    if isinstance(value, bool):
        raise DataError("answer must be a string or a number, got a boolean")
    if isinstance(value, (int, float)):
        return _number_text(value)
    raise DataError(f"answer must be a string or a number, got {type(value).__name__}: {str(value)[:80]}")


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def parse_box(value: Any) -> list[float]:
    """[x1, y1, x2, y2] from a list of 4 numbers or a string holding exactly 4 numbers."""
    if isinstance(value, str):
        numbers = [float(x) for x in _NUMBER.findall(value)]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        numbers = [float(v) for v in value]
    else:
        raise DataError(f"box answer must be [x1, y1, x2, y2], got {type(value).__name__}: {str(value)[:80]}")
    if len(numbers) != 4:
        raise DataError(f"box answer must have 4 numbers [x1, y1, x2, y2], got {len(numbers)}: {str(value)[:80]}")
    x1, y1, x2, y2 = numbers
    if not (x2 > x1 and y2 > y1):
        raise DataError(f"box answer must have x2 > x1 and y2 > y1, got {numbers}")
    return numbers


def choice_letter(answer: Any, options: list[str]) -> str:
    """The option letter an answer names (letter, 0-based index, or the option's text)."""
    n = len(options)
    if isinstance(answer, int) and not isinstance(answer, bool):
        if 0 <= answer < n:
            return LETTERS[answer]
        raise DataError(f"answer index {answer} is out of range for {n} options (0-based)")
    if not isinstance(answer, str):
        raise DataError(f"choice answer must be a letter, an option index or an option's text, got "
                        f"{type(answer).__name__}")
    text = normalise_answer(answer)
    m = re.fullmatch(r"\(?([A-Za-z])[).:]?", text)
    if m and LETTERS.index(m.group(1).upper()) < n:
        return m.group(1).upper()
    for i, opt in enumerate(options):
        if text.strip().lower() == opt.strip().lower():
            return LETTERS[i]
    raise DataError(f"choice answer {text[:40]!r} is neither an option letter (A-{LETTERS[n - 1]}) nor an option's text")


def _options(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise DataError("options must be a list of strings (or a JSON list), got a plain string") from None
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"options must be a non-empty list of strings, got {type(value).__name__}")
    if len(value) > len(LETTERS):
        raise DataError(f"at most {len(LETTERS)} options are supported, got {len(value)}")
    return [_number_text(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v) for v in value]


def render_options(problem: str, options: list[str]) -> str:
    """The problem followed by one "A. text" line per option."""
    lines = [f"{LETTERS[i]}. {opt}" for i, opt in enumerate(options)]
    return problem.rstrip() + "\n" + "\n".join(lines) + "\nAnswer with the option's letter."


def _rubric(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataError(f"rubric is not valid JSON ({exc.msg})") from None
    if isinstance(value, dict) and isinstance(value.get("criteria"), list):
        value = value["criteria"]
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise DataError("rubric must be a list of criterion objects (or {\"criteria\": [...]})")
    return value


def _json_object(value: Any, name: str, what: str = "an object") -> dict[str, Any]:
    """A row field that holds an object, given as one or as its JSON text ({} when absent)."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataError(f"{name} is not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise DataError(f"{name} must be {what}, got {type(value).__name__}")
    return value


def _meta(value: Any) -> dict[str, Any]:
    return _json_object(value, "meta")


def _tools_kwargs(value: Any) -> dict[str, dict[str, Any]]:
    """A row's per-tool arguments: ``{tool: {arg: value}}``; verl's ``{tool: {create_kwargs: {...}, execute_kwargs:
    {...}}}`` is read as the union of its two dicts (our tools take every argument at the call).

    >>> _tools_kwargs({"zoom": {"create_kwargs": {"coords": "normalized_1000"}}})
    {'zoom': {'coords': 'normalized_1000'}}
    """
    value = _json_object(value, "tools_kwargs", "an object mapping tool names to argument objects")
    out: dict[str, dict[str, Any]] = {}
    for tool, args in value.items():
        if args is None:
            continue
        if not isinstance(args, dict):
            raise DataError(f"tools_kwargs[{tool!r}] must be an object of arguments, got {type(args).__name__}")
        if set(args) & {"create_kwargs", "execute_kwargs"}:  # verl's layout
            merged: dict[str, Any] = {}
            for part in ("create_kwargs", "execute_kwargs"):
                sub = args.get(part) or {}
                if not isinstance(sub, dict):
                    raise DataError(f"tools_kwargs[{tool!r}][{part!r}] must be an object, got {type(sub).__name__}")
                merged.update(sub)
            args = merged
        out[str(tool)] = dict(args)
    return out


def _image_values(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


# ----------------------------------------------------------------------------------------------------
# one row -> one Sample

@dataclass
class _Options:
    template: str
    system: str | None
    factor: int
    min_pixels: int
    max_pixels: int
    max_image_pixels: int
    prompt_template: PromptTemplate | None = None
    video: Any = None  # mmrlvr.data.video.VideoOptions, when the row has videos


class _RowError(Exception):
    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def _get(row: dict[str, Any], mapping: dict[str, str], our: str) -> Any:
    col = mapping.get(our)
    if col is None:
        return None
    value = lookup(row, col)
    return None if value is _MISSING else value


def _field(name: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except DataError as exc:
        raise _RowError(exc.field or name, str(exc).split(": ", 1)[-1] if exc.field else str(exc)) from None


def _scaled_boxes(raw: Any, original: list[int], seen: tuple[int, int]) -> tuple[str, Any]:
    """Gold boxes rescaled from the original image's pixels to the resized image's; (answer text, original).
    Location tokens (PaliGemma, Florence-2, Kosmos-2, MiniGPT-v2) name fractions of the image: read as pixels of the
    original."""
    located = location_boxes(raw) if isinstance(raw, str) else []
    if located:
        raw = [[b[0] * original[0], b[1] * original[1], b[2] * original[0], b[3] * original[1]] for b in located]
        raw = raw[0] if len(raw) == 1 else raw
    if isinstance(raw, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
        boxes = [parse_box(raw)]
    elif isinstance(raw, str) and not looks_like_boxes(raw) and len(_NUMBER.findall(raw)) == 4:
        boxes = [parse_box(raw)]  # "10 20 30 40": four bare numbers
    else:
        boxes = parse_gold_boxes(raw)
    (ow, oh), (w, h) = original, seen
    sx, sy = w / ow, h / oh
    scaled = [[int(round(v)) for v in (b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy)] for b in boxes]
    if len(scaled) == 1:
        return json.dumps(scaled[0]), boxes[0]
    return json.dumps(scaled), boxes


def _row_to_sample(row: Any, index: int, source: _Source, spec: Preset, mapping: dict[str, str],
                   opts: _Options) -> Sample:
    """One row as a ``Sample``; a bad row raises ``_RowError`` naming the field at fault."""
    if isinstance(row, _BadLine):
        raise _RowError(None, row.message)
    if not isinstance(row, dict):
        raise _RowError(None, f"row must be an object, got {type(row).__name__}")
    problem, chat = _read_problem(row, mapping)
    answer_type = _read_answer_type(row, mapping, spec)
    rubric = _field("rubric", _rubric, _get(row, mapping, "rubric"))
    meta = _read_meta(row, mapping, source, index)
    # images first: box answers are rescaled to the resized image
    images, original_sizes = _read_images(row, mapping, chat, source, opts)
    meta["image_sizes"] = [list(im.size) for im in images]
    meta["original_image_sizes"] = original_sizes
    videos = _read_videos(row, mapping, chat, source, opts)
    if videos is not None:
        meta["videos"] = videos
    answer, answer_type, problem = _read_answer(row, mapping, chat, answer_type, rubric, images, original_sizes,
                                                meta, problem)
    n_videos = len(meta.get("videos") or [])
    _check_placeholders(problem, len(images), n_videos)
    messages = _prompt_messages(problem, len(images), n_videos, chat, opts)
    solution = _get(row, mapping, "solution")
    if solution is not None:
        meta["solution"] = str(solution)
    task = _get(row, mapping, "task")
    if task is not None:
        meta["task"] = task
    meta["problem"] = problem
    raw_id = _get(row, mapping, "id")
    sample_id = str(raw_id) if raw_id is not None and raw_id != "" else f"{Path(source.name).stem}-{index}"
    return Sample(id=sample_id, messages=messages, images=images, answer=answer, answer_type=answer_type,
                  rubric=rubric, meta=meta)


def _read_problem(row: dict[str, Any], mapping: dict[str, str]) -> tuple[str, ParsedChat | None]:
    """The problem text and, when the problem column holds a chat (a message list), the parsed chat."""
    raw_problem = _get(row, mapping, "problem")
    chat = None
    if is_chat(raw_problem):
        chat = _field("problem", parse_chat, raw_problem)
        problem: Any = chat.user
    else:
        problem = normalise_placeholders(raw_problem) if isinstance(raw_problem, str) else raw_problem
    if not isinstance(problem, str) or not problem.strip():
        got = "missing" if problem is None else f"a {type(problem).__name__}" if not isinstance(problem, str) else "empty"
        raise _RowError("problem", f"problem text must be a non-empty string or a chat (message list), got {got}")
    return problem, chat


def _read_answer_type(row: dict[str, Any], mapping: dict[str, str], spec: Preset) -> str:
    """The row's answer type (its column, else the preset's; ``AUTO`` is resolved once the answer is read)."""
    answer_type = _get(row, mapping, "answer_type") or spec.answer_type
    if answer_type != AUTO and answer_type not in ANSWER_TYPES:
        raise _RowError("answer_type", f"unknown answer_type {answer_type!r}; known: {', '.join(ANSWER_TYPES)}")
    return answer_type


def _read_meta(row: dict[str, Any], mapping: dict[str, str], source: _Source, index: int) -> dict[str, Any]:
    """The row's meta column plus where the row comes from (source name, row index) and its tools' kwargs."""
    meta: dict[str, Any] = _field("meta", _meta, _get(row, mapping, "meta"))
    meta.update(source=source.name, row=index)
    tools_kwargs = _field("tools_kwargs", _tools_kwargs, _get(row, mapping, "tools_kwargs"))
    if tools_kwargs:  # a column (verl: extra_info.tools_kwargs) wins over meta.tools_kwargs, tool by tool
        meta["tools_kwargs"] = {**_field("meta", _tools_kwargs, meta.get("tools_kwargs")), **tools_kwargs}
    elif meta.get("tools_kwargs") is not None:
        meta["tools_kwargs"] = _field("meta", _tools_kwargs, meta["tools_kwargs"])
    return meta


def _read_images(row: dict[str, Any], mapping: dict[str, str], chat: ParsedChat | None, source: _Source,
                 opts: _Options) -> tuple[list[Any], list[list[int]]]:
    """The row's images (from the chat's content parts or the images column, not both), loaded and resized, and
    each one's original size."""
    column_images = _image_values(_get(row, mapping, "images"))
    if chat is not None and chat.images and column_images:
        raise _RowError("images", f"the prompt's content parts carry {len(chat.images)} image(s) and column "
                                  f"{mapping['images']!r} has {len(column_images)} more; keep images in one place")
    values = (chat.images if chat is not None and chat.images else column_images)
    images, original_sizes = [], []
    for i, value in enumerate(values):
        try:
            image, size = prepare_image(value, source.base_dir, factor=opts.factor, min_pixels=opts.min_pixels,
                                        max_pixels=opts.max_pixels, max_image_pixels=opts.max_image_pixels)
        except DataError as exc:
            raise _RowError("images", f"image {i}: {exc}") from None
        images.append(image)
        original_sizes.append(list(size))
    return images, original_sizes


def _read_videos(row: dict[str, Any], mapping: dict[str, str], chat: ParsedChat | None, source: _Source,
                 opts: _Options) -> list[Any] | None:
    """The row's videos (from the chat's content parts or the videos column, not both), loaded; None when it has
    none."""
    video_values = _image_values(_get(row, mapping, "videos"))
    if chat is not None and chat.videos:
        if video_values:
            raise _RowError("videos", "the prompt's content parts carry videos and the videos column has more; "
                                      "keep videos in one place")
        video_values = chat.videos
    if not video_values:
        return None
    from mmrlvr.data.video import load_videos_for_row  # opencv is imported only for rows with videos

    try:
        return load_videos_for_row(video_values, source.base_dir, opts.video, factor=opts.factor)
    except DataError as exc:
        raise _RowError("videos", str(exc)) from None


def _read_answer(row: dict[str, Any], mapping: dict[str, str], chat: ParsedChat | None, answer_type: str,
                 rubric: list[dict[str, Any]] | None, images: list[Any], original_sizes: list[list[int]],
                 meta: dict[str, Any], problem: str) -> tuple[str | None, str, str]:
    """The gold answer in our form, checked by the rewards' own parsers, with the answer type (``AUTO`` resolved)
    and the problem (a choice row's options rendered into it)."""
    raw_answer = _get(row, mapping, "answer")
    if raw_answer is None and chat is not None and chat.assistant:
        raw_answer = chat.assistant  # LLaVA: the reference reply is the answer
    if isinstance(raw_answer, str):
        raw_answer = strip_answer_tags(raw_answer)
    options = None
    if "options" in mapping:
        options = _field("options", _options, _get(row, mapping, "options"))
    if answer_type == AUTO:
        answer_type = "choice" if options else guess_answer_type(raw_answer)
    answer, problem = _gold(raw_answer, answer_type, options, rubric, images, original_sizes, meta, problem)
    _field("answer", validate_gold, answer, answer_type, meta)
    return answer, answer_type, problem


def _gold(raw_answer: Any, answer_type: str, options: list[str] | None, rubric: list[dict[str, Any]] | None,
          images: list[Any], original_sizes: list[list[int]], meta: dict[str, Any], problem: str
          ) -> tuple[str | None, str]:
    """The raw answer converted for its type (box: rescaled to the resized image; choice: a letter) and the problem
    (with a choice row's options); records the original box or the options in ``meta``."""
    if raw_answer is None:
        if rubric is None:
            raise _RowError("answer", "answer is missing (and the row has no rubric)")
        return None, problem
    if answer_type == "box":
        if len(images) != 1:
            raise _RowError("images", f"a box answer needs exactly one image, the row has {len(images)}")
        answer, meta["answer_original"] = _field("answer", _scaled_boxes, raw_answer, original_sizes[0],
                                                 images[0].size)
        return answer, problem
    if answer_type == "choice":
        if options is None:
            raise _RowError("options", "a choice answer needs an options column")
        answer = _field("answer", choice_letter, raw_answer, options)
        meta["options"] = options
        return answer, render_options(problem, options)
    return _field("answer", normalise_answer, raw_answer), problem


def _check_placeholders(problem: str, n_images: int, n_videos: int) -> None:
    """A problem that places its images or videos must place each one exactly once."""
    for kind, placeholder, n in (("images", IMAGE_PLACEHOLDER, n_images), ("videos", VIDEO_PLACEHOLDER, n_videos)):
        n_placeholders = count_placeholders(problem, placeholder)
        if n_placeholders and n_placeholders != n:
            raise _RowError(kind, f"the problem has {n_placeholders} {placeholder} placeholder(s) but the row has "
                                  f"{n} {kind[:-1]}(s)")


def _prompt_messages(problem: str, n_images: int, n_videos: int, chat: ParsedChat | None,
                     opts: _Options) -> list[dict[str, Any]]:
    """The prompt's chat messages; the system turn is ``opts.system``, else the one the row's chat holds."""
    system = opts.system if opts.system is not None else (chat.system if chat is not None else None)
    try:
        return build_messages(problem, n_images, opts.template, system, n_videos=n_videos,
                              prompt_template=opts.prompt_template)
    except ValueError as exc:  # a prompt template that adds placeholders
        raise _RowError("problem", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - Jinja runtime errors (filters on odd content, ...)
        raise _RowError("problem", f"prompt template failed: {type(exc).__name__}: {exc}") from None


def load_samples(
    source: Any,
    *,
    preset: str | None = None,
    columns: dict[str, str] | None = None,
    template: str = "r1",
    system: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    factor: int = IMAGE_FACTOR,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    image_dir: str | Path | None = None,
    on_error: str = "raise",
    progress: bool = False,
    prompt_template: str | None = None,
    video: Any = None,
) -> tuple[list[Sample], LoadReport]:
    """Load a dataset as ``Sample`` values (see the module docstring for sources, presets and rules).

    preset: a layout name (``PRESETS``), or None / "auto" to detect it from the columns (the report's
        ``preset`` and ``detected`` say what was chosen).
    columns: our field -> column name or dotted path (``{"answer": "reward_model.ground_truth"}``).
    template / system: prompt template name and system-prompt override (``mmrlvr.data.prompts``); a
        system turn stored in a chat prompt is used when ``system`` is None.
    prompt_template: a Jinja prompt template (shipped name, file or string with ``{{ content }}``).
    video: ``mmrlvr.data.video.VideoOptions`` for rows with videos (default options when None).
    split: the split of a ``DatasetDict`` folder, or a file-name prefix (``train`` matches
        ``train-00000.parquet`` and ``train.jsonl``) in a folder of files.
    limit: read at most this many rows.
    min_pixels / max_pixels / factor: image resizing (``mmrlvr.data.images.smart_resize``).
    max_image_pixels: images larger than this are errors, refused before decoding.
    image_dir: base folder for relative image paths (default: the dataset's folder; the current folder
        for in-memory rows).
    on_error: "raise" (first bad row raises ``DataError``) or "skip" (bad rows are counted in the report).
    progress: show a tqdm progress bar.
    """
    _check_load_options(source, on_error, limit, template)
    ptpl = _load_prompt_template(prompt_template, str(source) if isinstance(source, (str, Path)) else None)
    src = _open_source(source, split, image_dir)
    first = _first_row(src)
    spec, mapping = _resolve_columns(src, preset, columns, first)
    opts = _Options(template, system, factor, min_pixels, max_pixels, max_image_pixels, ptpl, video)
    report = LoadReport(source=src.name, preset=spec.name, columns=dict(mapping),
                        detected=preset in (None, "auto"))
    samples = _read_rows(src, spec, mapping, opts, report, limit=limit, on_error=on_error, progress=progress)
    report.n_loaded = len(samples)
    return samples, report


def _check_load_options(source: Any, on_error: str, limit: int | None, template: str) -> None:
    """``load_samples``' own options, checked before the source is opened."""
    if on_error not in ("raise", "skip"):
        raise DataError(f"on_error must be 'raise' or 'skip', got {on_error!r}", field="on_error")
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0, got {limit}", field="limit")
    try:
        get_template(template)
    except Exception as exc:  # UserError: turn into a DataError naming the source
        raise DataError(str(exc), source=str(source) if isinstance(source, (str, Path)) else None,
                        field="template") from None


def _load_prompt_template(prompt_template: str | None, where: str | None) -> PromptTemplate | None:
    """The Jinja prompt template named by ``prompt_template`` (None when not given); its errors name ``where``."""
    if not prompt_template:
        return None
    try:
        return load_prompt_template(prompt_template)
    except DataError:
        raise
    except Exception as exc:  # UserError from the template: name the source too
        raise DataError(str(exc), source=where, field="prompt_template") from None


def _first_row(src: _Source) -> Any:
    """The source's first row (None when it has none), put back in front of its rows: what detection reads."""
    try:
        first = next(src.rows)
    except StopIteration:
        return None
    src.rows = itertools.chain([first], src.rows)
    return first


def _read_rows(src: _Source, spec: Preset, mapping: dict[str, str], opts: _Options, report: LoadReport, *,
               limit: int | None, on_error: str, progress: bool) -> list[Sample]:
    """The source's rows (at most ``limit``) as samples; a bad row raises ``DataError`` naming the source, row and
    field, or with ``on_error="skip"`` is counted and listed in ``report``."""
    samples: list[Sample] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=limit, desc=f"loading {Path(src.name).name}", unit="row")
    for index, row in enumerate(src.rows):
        if limit is not None and index >= limit:
            break
        report.n_rows += 1
        try:
            samples.append(_row_to_sample(row, index, src, spec, mapping, opts))
        except _RowError as exc:
            if on_error == "raise":
                raise DataError(exc.message, source=src.name, row=index, field=exc.field) from None
            report.n_skipped += 1
            report.skipped.append(SkippedRow(index, exc.field, exc.message))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return samples


def rows_to_samples(rows: Iterable[dict[str, Any]], template: str = "r1", system: str | None = None,
                    prompt_template: str | None = None) -> list[Sample]:
    """Samples from rows made by ``mmrlvr.data.synth.make_rows`` (images already PIL, already sized).

    A fast path without validation or resizing, for generated rows. ``meta`` gets the row's meta plus
    ``task``, ``problem`` and ``solution`` (the reference response, used for SFT warm starts).
    """
    ptpl = load_prompt_template(prompt_template) if prompt_template else None
    samples = []
    for row in rows:
        images = [im if im.mode == "RGB" else im.convert("RGB") for im in row["images"]]
        meta = dict(row.get("meta") or {})
        meta.update(task=row.get("task"), problem=row["problem"], solution=row.get("solution"))
        if row.get("videos"):
            meta["videos"] = row["videos"]  # mmrlvr.data.synth_video rows
        samples.append(Sample(
            id=str(row["id"]),
            messages=build_messages(row["problem"], len(images), template, system, prompt_template=ptpl,
                                    n_videos=len(meta.get("videos") or [])),
            images=images,
            answer=str(row["answer"]),
            answer_type=row.get("answer_type", "math"),
            rubric=row.get("rubric"),
            meta=meta,
        ))
    return samples
