"""The reward corpus (tests/reward_corpus/*.txt): ≥ 400 hand-written (gold, response, expected) cases.

- the hardened default gives every case its expected score (each case has a one-line reason);
- no adversarial case scores (0 false positives);
- ``mode: math_verify`` agrees with math-verify called directly on ≥ 99 % of the math subset;
- the hardened default disagrees with math-verify exactly on the cases listed, with their rule, in
  tests/reward_corpus/deliberate.txt — and docs/rewards.md names every rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reward_corpus.corpus import HERE, build_scorers, load_cases, math_verify_reference, score

CASES = load_cases()
BY_ID = {c.id: c for c in CASES}
MATH = [c for c in CASES if c.answer_type == "math"]
DOCS = Path(__file__).resolve().parents[1] / "docs" / "rewards.md"


def deliberate() -> dict[str, str]:
    out = {}
    for line in (HERE / "deliberate.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            case_id, rule, _why = line.split(" ;; ")
            out[case_id.strip()] = rule.strip()
    return out


@pytest.fixture(scope="module")
def hardened_scores() -> dict[str, float]:
    scorer = build_scorers()
    return {c.id: score(c, scorer) for c in CASES}


@pytest.fixture(scope="module")
def reference() -> dict[str, float]:
    return {c.id: math_verify_reference(c) for c in MATH}


def test_the_corpus_is_large_varied_and_explained():
    assert len(CASES) >= 400 and len(BY_ID) == len(CASES)
    assert all(c.reason and c.expected in (0.0, 0.5, 1.0) for c in CASES)
    categories = {c.category for c in CASES}
    for needed in ("fractions", "radicals", "pi", "degrees", "units", "percent", "currency", "scientific",
                   "mixed_numbers", "decimal_commas", "sets_intervals", "matrices", "choice", "yes_no",
                   "box_list", "box_json", "box_visual_rft", "box_qwen2vl", "box_norm1", "box_resized",
                   "box_unparsed", "adversarial", "operators", "nested_boxed"):
        assert needed in categories, needed
    assert sum(c.adversarial for c in CASES) >= 60


def test_the_hardened_default_scores_every_case_as_expected(hardened_scores):
    wrong = [(c.id, c.gold, c.answer[:60], c.expected, hardened_scores[c.id], c.reason)
             for c in CASES if hardened_scores[c.id] != pytest.approx(c.expected)]
    assert not wrong, "\n".join(map(repr, wrong))


def test_no_adversarial_case_scores(hardened_scores):
    false_positives = [c.id for c in CASES if c.adversarial and c.expected == 0 and hardened_scores[c.id] > 0]
    assert false_positives == []


def test_math_verify_mode_agrees_with_math_verify(reference):
    scorer = build_scorers({"mode": "math_verify"})
    agree = sum(score(c, scorer) == reference[c.id] for c in MATH)
    assert agree / len(MATH) >= 0.99, f"{agree}/{len(MATH)}"


def test_the_hardened_default_departs_from_math_verify_only_where_documented(hardened_scores, reference):
    listed = deliberate()
    differ = {c.id for c in MATH if hardened_scores[c.id] != reference[c.id]}
    assert differ == set(listed), (sorted(differ - set(listed)), sorted(set(listed) - differ))
    doc = DOCS.read_text(encoding="utf-8")
    missing = sorted({rule for rule in listed.values() if f"`{rule}`" not in doc})
    assert not missing, f"docs/rewards.md does not explain the rules {missing}"


def test_agreement_benchmark_runs(capsys, monkeypatch):
    """``python benchmarks/reward_agreement.py`` (its corpus table is what the tests above check)."""
    import runpy

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "reward_agreement.py"
    monkeypatch.setattr("sys.argv", [str(script), "--skip-corpus", "--repeat", "1"])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "auto_accuracy (hardened)" in out and "p99 ms" in out and "per doubling" in out
