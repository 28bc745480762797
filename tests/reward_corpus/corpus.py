"""Load the reward corpus and score it: the hardened default, ``mode: math_verify``, and math-verify itself.

Data files (``*.txt`` here), one case a line, fields separated by `` ;; ``::

    answer_type ;; category ;; gold ;; answer ;; expected ;; reason [;; {"meta": {...}, "params": {...}}]

``answer`` is what the model wrote inside ``<answer>…</answer>`` (after a short ``<think>`` block), or,
prefixed ``RESPONSE:``, the whole response. ``{{text*N}}`` repeats ``text`` N times. ``expected`` is the
score the hardened default must give (0/1; a fraction for partial box matches). Lines starting with ``#``
are comments. The cases were written for this project from what each answer format is.

Used by ``tests/test_rewards_corpus.py`` and ``benchmarks/reward_agreement.py``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FILES = ("math", "other", "boxes", "adversarial")
_REPEAT_RE = re.compile(r"\{\{(.*?)\*(\d+)\}\}")
THINK = "<think>I work it out step by step.</think>"


@dataclass
class Case:
    id: str
    answer_type: str
    category: str
    gold: str
    answer: str
    expected: float
    reason: str
    meta: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def response(self) -> str:
        if self.answer.startswith("RESPONSE:"):
            return self.answer[len("RESPONSE:"):]
        return f"{THINK}<answer>{self.answer}</answer>"

    @property
    def adversarial(self) -> bool:
        return self.category == "adversarial"


def _expand(text: str) -> str:
    return _REPEAT_RE.sub(lambda m: m.group(1) * int(m.group(2)), text)


def load_cases(folder: Path = HERE) -> list[Case]:
    cases: list[Case] = []
    for stem in FILES:
        n = 0
        for lineno, line in enumerate((folder / f"{stem}.txt").read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split(" ;; ")
            if len(parts) not in (6, 7):
                raise ValueError(f"{stem}.txt:{lineno}: expected 6 or 7 fields, got {len(parts)}: {line!r}")
            answer_type, category, gold, answer, expected, reason = (p.strip() if i != 3 else p for i, p in enumerate(parts[:6]))
            extra = json.loads(parts[6]) if len(parts) == 7 else {}
            n += 1
            cases.append(Case(f"{stem}-{n:03d}", answer_type, category, _expand(gold), _expand(answer.strip(" ")),
                              float(expected), reason, extra.get("meta", {}), extra.get("params", {})))
    return cases


def build_scorers(math_params: dict[str, Any] | None = None):
    """One ``AutoAccuracyReward`` per distinct params, built lazily: ``scorer(case) -> RewardFn``."""
    from mmrlvr.rewards import AutoAccuracyReward

    built: dict[str, Any] = {}

    def scorer(case: Case):
        key = json.dumps([case.answer_type, case.params], sort_keys=True)
        if key not in built:
            per_type: dict[str, Any] = {"math": dict(math_params or {})}
            if case.answer_type == "box":
                per_type["box"] = {"threshold": 0.5, **case.params}
            elif case.answer_type == "math":
                per_type["math"].update(case.params)
            else:
                per_type[case.answer_type] = dict(case.params)
            built[key] = AutoAccuracyReward(**per_type)
        return built[key]

    return scorer


def sample_of(case: Case):
    from mmrlvr.types import Sample

    return Sample(id=case.id, messages=[], images=[], answer=case.gold, answer_type=case.answer_type,
                  meta=dict(case.meta))


def score(case: Case, scorer) -> float:
    """The reward's score under the guard (as the trainer calls it)."""
    from mmrlvr.rewards.base import score_batch
    from mmrlvr.types import Completion

    return score_batch(scorer(case), [Completion(case.response)], [sample_of(case)])[0].score


def math_verify_reference(case: Case, timeout_s: int = 5) -> float:
    """math-verify's own verdict on the answer our template located: ``verify(parse(gold), parse(answer))``
    with the explicit LaTeX anchor math-verify needs on bare strings (``wrap_for_parse``); 0.0 when the
    response has no single answer."""
    from math_verify import parse, verify

    from mmrlvr.rewards.mathverify import wrap_for_parse
    from mmrlvr.rewards.parsing import extract_final_answer

    answer = extract_final_answer(case.response)
    if answer is None:
        return 0.0
    gold = parse(wrap_for_parse(case.gold), parsing_timeout=timeout_s)
    pred = parse(wrap_for_parse(answer), parsing_timeout=timeout_s)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=timeout_s))
