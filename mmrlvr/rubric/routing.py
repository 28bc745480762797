"""Route each criterion to a program or a judge, exposing only what each needs.

* Program criteria (regex, number, choice, math, iou, json_field): ``verifiers.extract`` reads the
  response alone, then ``verifiers.verify`` compares with the expected value (the only step that may read
  the ground truth). Programs never see images.
* Judge criteria: ``judge_request`` builds a ``JudgeRequest`` holding the criterion, the targeted section
  of the response, the question (unless ``show_question: false``), the reference answer only with
  ``show_reference: true``, and the images only with ``needs_image: true``.

``criterion_verdicts`` runs a whole batch: programs inline, every judge request in one ``judge.judge_batch`` call
(so an HTTP judge can run them concurrently and a local judge can batch them).

Containment: the response is written by the policy, so nothing it contains may stop a run. Every program
check runs under a guard (``run_program``): a ``CheckLimitError`` (response over the length limit, JSON
nested too deep, a regex over its time budget) or any exception an extractor or verifier raises becomes a
*scored failure* with the reason - ``met`` is the outcome that scores worst for the response (not met; met
for a pitfall), status ``check_error`` - so a response can never gain by breaking a check, and the reward
counts it (``rubric/check_errors``). The same holds when the section a judge should see cannot be cut out
of the response. Bad *data* (a sample without the answer a check compares with) is still a ``DataError``:
that is the user's to fix, not the policy's doing. A judge backend that raises leaves its criteria unknown.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, Sequence

from mmrlvr.errors import DataError, UserError
from mmrlvr.rubric import verifiers
from mmrlvr.rubric.prompts import JudgeRequest
from mmrlvr.rubric.schema import ANSWER_REF, CHECK_PARAMS, JUDGE_KIND, Check, Criterion, Rubric
from mmrlvr.rubric.verdicts import ERROR, Verdict
from mmrlvr.types import Sample

PROGRAM, JUDGE = "program", "judge"
CHECK_ERROR = "check_error"  # status of a verdict whose check failed on the response (scored as a failure)


class JudgeLike(Protocol):
    identity: str

    def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[Verdict]: ...


def route(criterion: Criterion) -> str:
    """"program" when a deterministic verifier can decide the criterion, else "judge"."""
    return PROGRAM if criterion.check.is_program else JUDGE


def run_program(criterion: Criterion, response: str, sample: Sample | None,
                limits: verifiers.CheckLimits = verifiers.DEFAULT_LIMITS) -> Verdict:
    """Extract from the response alone, then verify against the expected value - under the guard.

    Any failure caused by the response is a scored failure (``failed_check``), never an exception.
    """
    check = criterion.check
    try:
        expected = verifiers.expected_value(check, sample)
        verifiers.check_expected(check, expected)
    except ValueError as exc:
        sid = sample.id if sample is not None else "?"
        raise DataError(f"criterion {criterion.id!r} ({criterion.where}): {exc}", source=f"sample {sid}",
                        field="answer") from None
    try:
        extracted = verifiers.extract(check, response, limits)  # no sample, no ground truth here
        met, why = verifiers.verify(check, extracted, expected)
    except verifiers.CheckLimitError as exc:
        return failed_check(criterion, str(exc))
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - the policy's text must never stop the run
        return failed_check(criterion, f"the check raised {type(exc).__name__}: {str(exc)[:160]}")
    return Verdict(met=met, rationale=why, source=f"program:{check.kind}")


def failed_check(criterion: Criterion, reason: str) -> Verdict:
    """The worst-scoring verdict for the response, with the reason: not met, or met for a pitfall."""
    met = criterion.category == "pitfall"
    return Verdict(met=met, rationale=f"check failed on this response ({reason}); scored as "
                                      f"{'met (pitfall)' if met else 'not met'}",
                   status=CHECK_ERROR, source=f"{'program' if criterion.check.is_program else 'judge'}:"
                                              f"{criterion.check.kind}")


def judge_request(criterion: Criterion, response: str, sample: Sample | None) -> JudgeRequest:
    """The minimal view of a sample a judge gets for one criterion."""
    check = criterion.check
    question = sample.question if (sample is not None and check.param("show_question")) else None
    reference = None
    if check.param("show_reference"):
        if sample is None or sample.answer is None:
            sid = sample.id if sample is not None else "?"
            raise DataError(f"criterion {criterion.id!r} ({criterion.where}) has show_reference: true "
                            "but the sample has no answer", source=f"sample {sid}", field="answer")
        reference = str(sample.answer)
    images = tuple(sample.images) if (sample is not None and criterion.needs_image) else ()
    return JudgeRequest(criterion=criterion, response_part=verifiers.section(response, check.param("target")),
                        question=question or None, reference=reference, images=images)


def guarded_judge_request(criterion: Criterion, response: str, sample: Sample | None,
                          limits: verifiers.CheckLimits = verifiers.DEFAULT_LIMITS) -> JudgeRequest:
    """``judge_request`` with the program checks' limits on cutting the target section out of the response.

    Raises ``CheckLimitError`` (a scored failure for the caller) when the section cannot be taken.
    """
    if criterion.check.param("target") != "response" and len(response) > limits.max_chars:
        raise verifiers.CheckLimitError(f"the response is {len(response):,} characters, over the "
                                        f"{limits.max_chars:,}-character limit for cutting out its "
                                        f"{criterion.check.param('target')}")
    try:
        return judge_request(criterion, response, sample)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - the policy's text must never stop the run
        raise verifiers.CheckLimitError(f"cutting out the {criterion.check.param('target')} raised "
                                        f"{type(exc).__name__}: {str(exc)[:160]}") from None


def criterion_verdicts(rubrics: Sequence[Rubric], responses: Sequence[str], samples: Sequence[Sample | None],
                       judge: JudgeLike | None, limits: verifiers.CheckLimits = verifiers.DEFAULT_LIMITS
                       ) -> list[list[Verdict]]:
    """Verdicts for every (response, criterion): ``out[i][j]`` for response i and its rubric's criterion j.

    Judge criteria need ``judge``; without one they are an error naming the criterion (a silent
    unknown would quietly turn the rubric into its programmatic part).
    """
    out: list[list[Verdict | None]] = []
    pending: list[tuple[int, int, JudgeRequest]] = []
    for i, (rubric, response, sample) in enumerate(zip(rubrics, responses, samples)):
        row: list[Verdict | None] = []
        for j, crit in enumerate(rubric.criteria):
            if route(crit) == PROGRAM:
                row.append(run_program(crit, response, sample, limits))
                continue
            if judge is None:
                raise DataError(f"criterion {crit.id!r} ({crit.where}) needs a judge but none is "
                                "configured (set the reward's `judge`, or `--judge` on the command line)")
            try:
                req = guarded_judge_request(crit, response, sample, limits)
            except verifiers.CheckLimitError as exc:
                row.append(failed_check(crit, str(exc)))
                continue
            pending.append((i, j, req))
            row.append(None)
        out.append(row)
    if pending:
        try:
            verdicts = judge.judge_batch([req for _, _, req in pending])  # type: ignore[union-attr]
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - a broken judge backend leaves its criteria unknown
            why = f"the judge raised {type(exc).__name__}: {str(exc)[:160]}"
            verdicts = [Verdict(None, why, ERROR, getattr(judge, "identity", ""))] * len(pending)
        for (i, j, _), verdict in zip(pending, verdicts):
            out[i][j] = verdict
    for row in out:
        for j, v in enumerate(row):
            if v is None:  # a judge that returned too few verdicts: unknown, not a pass
                row[j] = Verdict(None, "judge returned no verdict", ERROR, getattr(judge, "identity", ""))
    return out  # type: ignore[return-value]


def judge_twin(criterion: Criterion) -> Criterion:
    """The same criterion put to a judge (for agreement statistics on criteria a program decides).

    The judge sees the program's target section, and the reference answer only when the program compares
    with the ground truth (``expected: "{answer}"``) - the minimum it needs to decide the same property.
    """
    if not criterion.check.is_program:
        return criterion
    params = dict(CHECK_PARAMS[JUDGE_KIND][1])
    params.update(target=criterion.check.param("target"),
                  show_reference=criterion.check.params.get("expected") == ANSWER_REF)
    return replace(criterion, check=Check(JUDGE_KIND, params))
