"""The rubric data model: criteria, how each is checked, and the meaning of weights.

A rubric is a list of criteria. Each criterion states ONE property of a response in plain words
(``text``), says how much it matters (``category`` + ``weight``) and how it is decided (``check``):

* a *program* (``regex``, ``number``, ``choice``, ``math``, ``iou``, ``json_field``): an extractor reads the
  response alone, then a deterministic verifier compares what was extracted with the expected value;
* or a *judge* (``judge``): a model reads the criterion and only the parts of the sample it needs.

Sign convention (one rule, no double negatives): a check decides whether the property in ``text`` is
**met** by the response. For ``essential``/``important``/``optional`` criteria being met is good. For a
``pitfall`` the text describes the *mistake* ("Mentions an object that is not in the image"), so being met
means the response made that mistake and the criterion's weight is subtracted. ``weight`` is always stored
as a positive magnitude; the category gives the sign. RaR-style files that write ``weight: -0.9`` on a
pitfall are accepted and mean the same as ``0.9``; a negative weight on any other category is an error
(write it as a pitfall instead). Defaults (Rubrics-as-Rewards): essential 1.0, important 0.7, optional 0.3,
pitfall 0.9 (subtracted).

Check parameters (all optional unless marked):

=============  ==========================================================================================
``regex``      ``pattern`` (required), ``target`` (response|thinking|answer, default response),
               ``ignore_case`` (default true), ``min_count`` (default 1). Met when the pattern is found at
               least ``min_count`` times in the target.
``number``     ``expected`` (required; a number or ``"{answer}"`` = the sample's ground truth),
               ``tolerance`` (absolute, default 0), ``rel_tolerance`` (default 0), ``target`` (default
               answer), ``pick`` (only|last|first; default only for the answer, last otherwise: with
               ``only`` an answer stating several different numbers is not met - hedging is no answer).
``choice``     ``expected`` (required; an option letter or ``"{answer}"``), ``target`` (default answer).
``math``       ``expected`` (required; an expression or ``"{answer}"``), ``target`` (default answer);
               equivalence through math-verify.
``iou``        ``expected`` (required; a box ``[x1, y1, x2, y2]`` or ``"{answer}"``), ``threshold`` (τ,
               default 0.5), ``target`` (default answer). Met when IoU(predicted, expected) ≥ τ.
``json_field`` ``field`` (required; dotted path such as ``objects.0.label``), ``expected`` (a value,
               ``"{answer}"``, or absent = the field only has to exist), ``tolerance`` (numbers),
               ``target`` (default answer).
``judge``      ``target`` (what the judge sees of the response: response|thinking|answer, default
               response), ``show_question`` (default true), ``show_reference`` (default false: the ground
               truth is shown only to criteria that need it, e.g. "agrees with the reference solution").
=============  ==========================================================================================

``needs_image`` (default false) sends the sample's images to the judge; programs never see images.
This module only defines the values and their validation; ``loading`` reads files, ``routing`` decides.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

CATEGORIES: tuple[str, ...] = ("essential", "important", "optional", "pitfall")

#: Rubrics-as-Rewards default weights (magnitudes; pitfalls are subtracted).
DEFAULT_WEIGHTS: dict[str, float] = {"essential": 1.0, "important": 0.7, "optional": 0.3, "pitfall": 0.9}

#: Placeholder for the sample's ground truth in ``expected``; resolved by the verifier, never the extractor.
ANSWER_REF = "{answer}"

TARGETS: tuple[str, ...] = ("response", "thinking", "answer")

PROGRAM_KINDS: tuple[str, ...] = ("regex", "number", "choice", "math", "iou", "json_field")
JUDGE_KIND = "judge"
CHECK_KINDS: tuple[str, ...] = PROGRAM_KINDS + (JUDGE_KIND,)

# kind -> (required params, optional params with defaults)
CHECK_PARAMS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "regex": (("pattern",), {"target": "response", "ignore_case": True, "min_count": 1}),
    "number": (("expected",), {"tolerance": 0.0, "rel_tolerance": 0.0, "target": "answer", "pick": None}),
    "choice": (("expected",), {"target": "answer"}),
    "math": (("expected",), {"target": "answer"}),
    "iou": (("expected",), {"threshold": 0.5, "target": "answer"}),
    "json_field": (("field",), {"expected": None, "tolerance": 0.0, "target": "answer"}),
    "judge": ((), {"target": "response", "show_question": True, "show_reference": False}),
}

CRITERION_KEYS: tuple[str, ...] = ("id", "text", "category", "weight", "check", "needs_image")


@dataclass(frozen=True)
class Check:
    """How a criterion is decided: ``kind`` and its parameters (defaults filled in by validation)."""

    kind: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def is_program(self) -> bool:
        return self.kind in PROGRAM_KINDS

    def param(self, name: str) -> Any:
        return self.params.get(name, CHECK_PARAMS[self.kind][1].get(name))

    def canonical(self) -> str:
        """A stable string for cache keys and state keys (sorted JSON)."""
        return json.dumps({"kind": self.kind, **self.params}, sort_keys=True, default=str)


@dataclass(frozen=True)
class Criterion:
    """One rubric line. ``weight`` is a positive magnitude; ``sign`` is -1 for pitfalls.

    ``where`` says where it was defined ("rubrics/x.yaml:12" or "row 3") for error messages.
    """

    id: str
    text: str
    category: str
    weight: float
    check: Check
    needs_image: bool = False
    where: str = ""

    @property
    def sign(self) -> float:
        return -1.0 if self.category == "pitfall" else 1.0

    @property
    def key(self) -> str:
        """Identity across samples: id + a hash of text and check (POW3R state, caches)."""
        digest = hashlib.sha1((self.text + "\x00" + self.check.canonical()).encode()).hexdigest()[:10]
        return f"{self.id}#{digest}"


@dataclass(frozen=True)
class Rubric:
    """A named list of criteria with unique ids."""

    criteria: tuple[Criterion, ...]
    name: str = "rubric"
    description: str = ""
    source: str = ""

    def __len__(self) -> int:
        return len(self.criteria)

    def __iter__(self):
        return iter(self.criteria)

    @property
    def needs_judge(self) -> bool:
        return any(not c.check.is_program for c in self.criteria)
