"""The ``rubric`` reward: per-criterion verdicts -> one score per rollout, aware of the rollout group.

``REWARDS.get("rubric")(**params)`` gives a ``RubricReward``; the trainer calls ``score_batch(completions,
samples)``. Each rollout is scored against ``sample.rubric`` (an instance rubric: list of dicts, JSON, or a
``Rubric``) or,
when the sample has none, the ``rubric_file`` given as a parameter.

Groups: saturation and POW3R need the G rollouts of one prompt together. Rows of one group must be
contiguous; the group size is the ``group_size`` parameter, else ``sample.meta["group_size"]``, else each
run of consecutive samples with the same ``sample.id`` is a group. A batch of unrelated rows can pass
``group_size=1`` (saturation and POW3R then do nothing).

Undetermined rollouts (every criterion the aggregation needs is unknown, e.g. the judge timed out) score
the mean of the determined rollouts of their group - zero advantage, neither rewarded nor punished - or
``undetermined_score`` when the whole group is undetermined (``undetermined="zero"`` always uses it).
They are counted in ``rubric/undetermined_rate``. Residual risk, by design of "unknown is excluded": a
response that makes the judge fail (too long for its context, say) escapes those criteria for that step -
watch ``judge/unknown_rate`` and keep programmatic essentials and pitfalls (length, format) in training
rubrics; the strict parser already refuses to let quoted verdicts inside a rationale cause an unknown.

What comes back per rollout: ``RewardResult.score`` (the rubric reward), ``components`` ``rubric`` and
``crit/<id>`` (1 = the criterion's property holds, so for a pitfall 1 = the mistake was made; unknown
criteria are left out), and ``parsed["rubric"]``: one dict per criterion with id, text, category, verdict
(met | not_met | unknown), score (+1 met, -1 met pitfall, 0 not met, None unknown), weight, effective
weight, rationale, judge, status, votes, saturated. Batch statistics (``judge/unknown_rate``,
``judge/timeouts``, ``rubric/undetermined_rate``, ``rubric/check_errors``, ...) are in ``metrics()`` after
each batch.

Containment: a program check that fails on a response (over the length limit, JSON nested too deep, a
regex over its time budget, any exception) is a scored failure with the reason (``routing.run_program``),
counted in ``rubric/check_errors``; nothing a response contains stops ``score_batch``.

Judge outages are loud. The reward keeps the unknown/known flags of the last ``unknown_window`` judged
criteria. When their unknown rate passes ``warn_unknown_rate`` it prints a warning naming the endpoint and
the failure kinds (once, again after the rate has recovered); when it passes ``max_unknown_rate`` with at
least ``unknown_min_requests`` judged criteria in the window, ``score_batch`` raises
``JudgeUnavailableError`` (a ``UserError``: the CLI prints it without a traceback and exits 2), naming the
endpoint - a run whose judge is down stops instead of training on the programmatic criteria alone.
``max_unknown_rate: null`` turns the stop off. ``judge_summary()`` is the one-line summary for the end of a
run.
"""

from __future__ import annotations

import copy
import json
import sys
from collections import Counter, deque
from typing import Any, Sequence

from mmrlvr.errors import DataError, UserError
from mmrlvr.metric import Metric
from mmrlvr.rewards.base import REWARDS
from mmrlvr.rubric.aggregate import AGGREGATIONS, Pow3rConfig, pass_rates, pow3r_targets, pow3r_update, score_group
from mmrlvr.rubric.judges import Judge, JudgeStats, JudgeUnavailableError, build_judge, judge_param_problems
from mmrlvr.rubric.loading import load_rubric_file, parse_instance_rubric
from mmrlvr.rubric.routing import CHECK_ERROR, criterion_verdicts, route
from mmrlvr.rubric.verifiers import CheckLimits
from mmrlvr.rubric.schema import Rubric
from mmrlvr.rubric.verdicts import TIMEOUT, Verdict
from mmrlvr.types import Completion, RewardResult, Sample

UNDETERMINED_MODES = ("group_mean", "zero")


@REWARDS.register("rubric")
class RubricReward:
    group_aware = True  # saturation dropping and POW3R weights read the whole group (mmrlvr.rewards.base)
    """Rubric reward (RLR³ / Rubrics-as-Rewards), group-aware.

    rubric_file: YAML rubric used for samples without their own ``rubric``.
    judge: a judge name ("openai", "local"), a dict ``{"name": ..., **params}``, or a built ``Judge``;
        needed only when a rubric has judge criteria. judge_params: parameters when ``judge`` is a name.
    aggregation: "rar" or "hierarchical"; aggregation_params: e.g. ``{"essential_share": 0.5}``.
    group_size: rollouts per prompt (see module docstring). drop_saturated: RLR³ saturation dropping.
    pow3r: False, True, or a dict of ``Pow3rConfig`` fields. criterion_components: add ``crit/<id>``.
    undetermined: "group_mean" or "zero"; undetermined_score: used when nothing in the group is known.
    check_limits: ``verifiers.CheckLimits`` fields, e.g. ``{"max_chars": 50000}``.
    warn_unknown_rate / max_unknown_rate / unknown_window / unknown_min_requests: the judge-outage warning
    and stop (module docstring); ``max_unknown_rate: None`` never stops.
    """

    def __init__(self, rubric_file: str | None = None, judge: str | dict[str, Any] | Judge | None = None,
                 judge_params: dict[str, Any] | None = None, aggregation: str = "rar",
                 aggregation_params: dict[str, float] | None = None, group_size: int | None = None,
                 drop_saturated: bool = False, pow3r: bool | dict[str, Any] = False,
                 criterion_components: bool = True, undetermined: str = "group_mean",
                 undetermined_score: float = 0.0, check_limits: dict[str, Any] | None = None,
                 warn_unknown_rate: float = 0.1, max_unknown_rate: float | None = 0.5,
                 unknown_window: int = 200, unknown_min_requests: int = 20) -> None:
        AGGREGATIONS.get(aggregation)  # unknown name -> error listing the known ones
        if undetermined not in UNDETERMINED_MODES:
            raise UserError(f"rubric reward: undetermined must be one of {', '.join(UNDETERMINED_MODES)}, "
                            f"got {undetermined!r}")
        if group_size is not None and int(group_size) < 1:
            raise UserError(f"rubric reward: group_size must be >= 1, got {group_size}")
        for key, value in (("warn_unknown_rate", warn_unknown_rate), ("max_unknown_rate", max_unknown_rate)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 <= value <= 1):
                raise UserError(f"rubric reward: {key} must be a fraction in [0, 1]"
                                f"{' or null (off)' if key == 'max_unknown_rate' else ''}, got {value!r}")
        for key, value in (("unknown_window", unknown_window), ("unknown_min_requests", unknown_min_requests)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"rubric reward: {key} must be an integer >= 1, got {value!r}")
        try:
            self.limits = CheckLimits(**(check_limits or {}))
        except TypeError as exc:
            raise UserError(f"rubric reward: check_limits: {exc}") from None
        self.warn_unknown_rate, self.max_unknown_rate = float(warn_unknown_rate), max_unknown_rate
        self.unknown_min_requests = int(unknown_min_requests)
        self._recent: deque[tuple[bool, str]] = deque(maxlen=int(unknown_window))  # (unknown, status)
        self._warned = False
        _check_judge_spec(judge, judge_params)  # bad judge names / parameters fail here, before any model loads
        self.rubric = load_rubric_file(rubric_file) if rubric_file else None
        self.aggregation, self.aggregation_params = aggregation, dict(aggregation_params or {})
        self.group_size = int(group_size) if group_size is not None else None
        self.drop_saturated = bool(drop_saturated)
        self.pow3r = Pow3rConfig(**pow3r) if isinstance(pow3r, dict) else (Pow3rConfig() if pow3r else None)
        self.alphas: dict[str, float] = {}  # POW3R state: criterion key -> α
        self.criterion_components = criterion_components
        self.undetermined, self.undetermined_score = undetermined, float(undetermined_score)
        self._judge_spec, self._judge_params = judge, dict(judge_params or {})
        self._judge: Judge | None = judge if isinstance(judge, Judge) else None
        self._instance_cache: dict[str, Rubric] = {}
        self._metrics: dict[str, float] = {}

    # ------------------------------------------------------------------------------------ public API
    def __call__(self, completion: Completion, sample: Sample) -> RewardResult:
        return self.score_batch([completion], [sample])[0]

    def score_batch(self, completions: Sequence[Completion | str], samples: Sequence[Sample]) -> list[RewardResult]:
        if len(completions) != len(samples):
            raise ValueError(f"{len(completions)} completions for {len(samples)} samples")
        texts = [c if isinstance(c, str) else c.text for c in completions]
        rubrics = [self.rubric_for(s, i) for i, s in enumerate(samples)]
        judge = self.judge if any(r.needs_judge for r in rubrics) else None
        before = JudgeStats(**vars(judge.stats)) if judge is not None else None
        verdicts = criterion_verdicts(rubrics, texts, samples, judge, self.limits)
        results: list[RewardResult | None] = [None] * len(texts)
        n_undetermined, n_saturated, n_crit = 0, 0, 0
        for idx in self.groups(samples):
            for sub in _split_by_rubric(idx, rubrics):
                out, und, sat = self._score_group(sub, rubrics[sub[0]], verdicts)
                for i, res in zip(sub, out):
                    results[i] = res
                n_undetermined += und
                n_saturated += sum(sat)
                n_crit += len(sat)
        self._metrics = self._batch_metrics(rubrics, verdicts, judge, before, n_undetermined, len(texts),
                                            n_saturated, n_crit)
        if judge is not None:
            self._watch_judge(judge, rubrics, verdicts)
        return results  # type: ignore[return-value]

    @property
    def time_budget_s(self) -> float:
        """Per-row wall-clock budget for the rewards guard (``mmrlvr.rewards.base.score_batch``).

        Programs: 30 s. With a judge, a row may wait for every vote of every judged criterion through all
        retries, so the budget grows by (max_retries + 1) x timeout x votes (a local judge: 600 s) - the
        guard must not throw away a batch a slow but working judge finished; a judge that is down is
        stopped by ``max_unknown_rate`` instead.
        """
        spec = self._judge if self._judge is not None else self._judge_spec
        if spec is None:
            return 30.0
        params = dict(spec) if isinstance(spec, dict) else dict(self._judge_params)

        def get(name: str, default: float) -> float:
            value = getattr(spec, name, None) if isinstance(spec, Judge) else params.get(name)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

        name = getattr(spec, "name", None) if isinstance(spec, Judge) else params.get("name", spec)
        per_call = 600.0 if name == "local" else (get("max_retries", 2) + 1) * (get("timeout", 60.0) + 8.0)
        return 30.0 + per_call * get("votes", 1)

    # ------------------------------------------------------------------------------- judge outages
    def _watch_judge(self, judge: Judge, rubrics: list[Rubric], verdicts: list[list[Verdict]]) -> None:
        """Update the window of recent judged criteria; warn, or raise ``JudgeUnavailableError``."""
        for rubric, row in zip(rubrics, verdicts):
            for crit, v in zip(rubric.criteria, row):
                if route(crit) == "judge" and v.status != CHECK_ERROR:
                    self._recent.append((v.met is None, v.status))
        n = len(self._recent)
        unknown = [status for is_unknown, status in self._recent if is_unknown]
        rate = len(unknown) / n if n else 0.0
        self._metrics["judge/unknown_rate_recent"] = Metric.mean(rate, n=n)
        kinds = ", ".join(f"{c} {k}" for k, c in Counter(unknown).most_common()) or "none"
        where = getattr(judge, "endpoint", judge.identity)
        if (self.max_unknown_rate is not None and n >= self.unknown_min_requests
                and rate > self.max_unknown_rate):
            raise JudgeUnavailableError(
                f"the rubric judge at {where} is effectively down: {len(unknown)} of the last {n} judged "
                f"criteria got no verdict ({rate:.0%}: {kinds}), over rubric.max_unknown_rate "
                f"{self.max_unknown_rate:g}. Check that the server is up and answering (mmrlvr rubric score "
                "with --judge shows its verdicts), or raise rubric.max_unknown_rate (null never stops).")
        if rate > self.warn_unknown_rate and not self._warned:
            self._warned = True
            print(f"warning: rubric judge at {where}: {len(unknown)} of the last {n} judged criteria got no "
                  f"verdict ({rate:.0%}: {kinds}); unknown criteria are left out of the score. "
                  f"Training stops above {self.max_unknown_rate if self.max_unknown_rate is not None else 'never'}"
                  f"{'' if self.max_unknown_rate is None else ' (rubric.max_unknown_rate)'}.",
                  file=sys.stderr, flush=True)
        elif rate <= self.warn_unknown_rate / 2:
            self._warned = False

    def judge_summary(self) -> str | None:
        """One line on the judge since it was built (for the end of a run); None when no judge was used."""
        if self._judge is None or self._judge.stats.requests == 0:
            return None
        st, j = self._judge.stats, self._judge
        return (f"rubric judge {getattr(j, 'endpoint', j.identity)}: {st.requests} requests, {st.unknown} unknown "
                f"({st.unknown / st.requests:.1%}: {st.timeouts} timeouts, {st.errors} errors, "
                f"{st.unparseable} unparseable, {st.refusals} refusals), {st.retries} retries, "
                f"{st.cache_hits} cache hits")

    def metrics(self) -> dict[str, float]:
        """Statistics of the last ``score_batch`` call (``judge/unknown_rate``, timeouts, undetermined, ...)."""
        return dict(self._metrics)

    @property
    def judge(self) -> Judge:
        if self._judge is None:
            spec = self._judge_spec
            if spec is None:
                raise UserError("a rubric has judge criteria but the rubric reward has no `judge` "
                                "(set e.g. judge: openai with judge_params: {base_url: ..., model: ...})")
            if isinstance(spec, dict):
                params = dict(spec)
                name = params.pop("name", None)
                if not name:
                    raise UserError("rubric reward: judge given as a mapping needs a `name`")
                self._judge = build_judge(name, **params)
            else:
                self._judge = build_judge(str(spec), **self._judge_params)
        return self._judge

    def rubric_for(self, sample: Sample, row: int) -> Rubric:
        if isinstance(sample.rubric, Rubric):  # already validated (the CLI, notebooks)
            return sample.rubric
        if sample.rubric is not None:
            raw = sample.rubric
            key = raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True, default=str)
            if key not in self._instance_cache:
                if len(self._instance_cache) > 4096:
                    self._instance_cache.clear()
                self._instance_cache[key] = parse_instance_rubric(raw, source=f"sample {sample.id!r}", row=row)
            return self._instance_cache[key]
        if self.rubric is None:
            raise DataError("the sample has no rubric and the rubric reward has no rubric_file",
                            source=f"sample {sample.id!r}", row=row, field="rubric")
        return self.rubric

    def groups(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Contiguous index groups: group_size param > meta["group_size"] > runs of equal sample ids."""
        n = len(samples)
        size = self.group_size or (samples[0].meta.get("group_size") if samples else None)
        if size:
            size = int(size)
            if n % size:
                raise DataError(f"a batch of {n} rollouts does not split into groups of {size} "
                                "(rows of one group must be contiguous)", field="group_size")
            return [list(range(s, s + size)) for s in range(0, n, size)]
        out: list[list[int]] = []
        for i, s in enumerate(samples):
            if out and samples[out[-1][0]].id == s.id:
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def state_dict(self) -> dict[str, Any]:
        """POW3R α per criterion key (save with checkpoints so a resumed run continues identically)."""
        return {"alphas": dict(self.alphas)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alphas = {str(k): float(v) for k, v in state.get("alphas", {}).items()}

    def for_evaluation(self, group_size: int | None = None) -> "RubricReward":
        """A copy for held-out scoring that leaves training state alone and is comparable across steps.

        Same rubric, judge, aggregation and saturation setting, but static weights (no POW3R, so the
        training α are neither read nor updated) and its own metrics; ``group_size`` = samples per prompt
        of the evaluation (e.g. ``eval.k``). Scoring eval responses with the training reward itself would
        move α with eval groups and group rows by the training group size.
        """
        view = copy.copy(self)
        view.pow3r, view.alphas, view._metrics = None, {}, {}
        view.group_size = int(group_size) if group_size is not None else self.group_size
        return view

    def close(self) -> None:
        if self._judge is not None:
            self._judge.close()

    # ------------------------------------------------------------------------------------- internals
    def _score_group(self, idx: list[int], rubric: Rubric, verdicts: list[list[Verdict]]):
        crits = rubric.criteria
        values = [[None if v.met is None else float(v.met) for v in verdicts[i]] for i in idx]  # [G][J]
        weights = [c.weight for c in crits]
        cats = [c.category for c in crits]
        alphas = None
        if self.pow3r is not None:
            current = [self.alphas.get(c.key, 1.0) for c in crits]
            targets = pow3r_targets(pass_rates(values, self.pow3r.min_known), cats, self.pow3r.blend)
            alphas = pow3r_update(current, targets, self.pow3r)
            self.alphas.update({c.key: a for c, a in zip(crits, alphas)})
        scores, eff, sat = score_group(values, weights, cats, method=self.aggregation,
                                       drop_saturated=self.drop_saturated, alphas=alphas,
                                       **self.aggregation_params)
        static, *_ = score_group(values, weights, cats, method=self.aggregation, **self.aggregation_params)
        known = [s for s in scores if s is not None]
        fill = (sum(known) / len(known) if known and self.undetermined == "group_mean"
                else self.undetermined_score)
        out = []
        for g, i in enumerate(idx):
            score = scores[g] if scores[g] is not None else fill
            out.append(self._result(crits, verdicts[i], values[g], eff, sat, score, static[g], scores[g] is None,
                                    rubric.name))
        return out, sum(s is None for s in scores), sat

    def _result(self, crits, verdicts, values, eff, sat, score, static, undetermined, name) -> RewardResult:
        components = {"rubric": float(score)}
        rows = []
        for c, v, val, w, s in zip(crits, verdicts, values, eff, sat):
            if val is not None and self.criterion_components:
                components[f"crit/{c.id}"] = val
            rows.append({
                "id": c.id, "text": c.text, "category": c.category,
                "verdict": "unknown" if v.met is None else ("met" if v.met else "not_met"),
                "score": None if val is None else c.sign * val,
                "weight": c.weight, "effective_weight": w, "rationale": v.rationale, "judge": v.source,
                "route": route(c), "status": v.status, "votes": [None if m is None else bool(m) for m in v.votes],
                "saturated": s, "raw": v.raw,
            })
        parsed = {"rubric": rows, "rubric_name": name, "rubric_score": float(score),
                  "rubric_static": static, "undetermined": undetermined,
                  "judge_unknown": sum(1 for r in rows if r["route"] == "judge" and r["verdict"] == "unknown")}
        return RewardResult(float(score), components, parsed)

    def _batch_metrics(self, rubrics, verdicts, judge, before, n_und, n, n_sat, n_crit) -> dict[str, float]:
        judged = [v for r, row in zip(rubrics, verdicts) for c, v in zip(r.criteria, row) if route(c) == "judge"]
        unknown = [v for v in judged if v.met is None]
        out = {
            "judge/requests": Metric.sum(float(len(judged))),
            "judge/unknown_rate": Metric.mean(len(unknown) / len(judged) if judged else 0.0, n=len(judged)),
            "judge/timeouts": Metric.sum(float(sum(v.status == TIMEOUT for v in unknown))),
            "judge/errors": Metric.sum(float(sum(v.status == "error" for v in unknown))),
            "judge/unparseable": Metric.sum(float(sum(v.status in ("unparseable", "contradiction", "refusal", "tie")
                                                      for v in unknown))),
            "rubric/undetermined_rate": Metric.mean(n_und / n if n else 0.0, n=n),
            "rubric/check_errors": Metric.sum(float(sum(v.status == CHECK_ERROR for row in verdicts for v in row))),
            "rubric/saturated_fraction": Metric.mean(n_sat / n_crit if n_crit else 0.0, n=n_crit),
        }
        if judge is not None and before is not None:
            now = judge.stats
            out["judge/calls"] = Metric.sum(float(now.calls - before.calls))
            out["judge/cache_hits"] = Metric.sum(float(now.cache_hits - before.cache_hits))
            out["judge/retries"] = Metric.sum(float(now.retries - before.retries))
        if self.pow3r is not None and self.alphas:
            vals = list(self.alphas.values())
            out["rubric/pow3r_alpha_min"] = Metric.min(min(vals))
            out["rubric/pow3r_alpha_max"] = Metric.max(max(vals))
        return out


def judge_summaries(reward: Any) -> list[str]:
    """The end-of-run judge summary line of every rubric reward in ``reward`` (a ``CombinedReward``, a
    ``RubricReward`` or a list of rewards); rewards that never asked a judge give none."""
    fns = getattr(reward, "fns", reward if isinstance(reward, (list, tuple)) else [reward])
    return [line for fn in fns if isinstance(fn, RubricReward) for line in [fn.judge_summary()] if line]


def _check_judge_spec(judge: Any, judge_params: dict[str, Any] | None) -> None:
    """Judge name and parameter problems as one ``UserError`` at construction (no model, no network)."""
    if judge is None or isinstance(judge, Judge):
        return
    if isinstance(judge, dict):
        params = dict(judge)
        name = params.pop("name", None)
        if not name:
            raise UserError("rubric reward: judge given as a mapping needs a `name`")
    else:
        name, params = str(judge), dict(judge_params or {})
    problems = judge_param_problems(str(name), params)
    if problems:
        raise UserError("rubric reward: " + "; ".join(problems))


def _split_by_rubric(idx: list[int], rubrics: list[Rubric]) -> list[list[int]]:
    """A group whose rows carry different rubrics is scored per rubric (it should not happen)."""
    out: dict[int, list[int]] = {}
    for i in idx:
        out.setdefault(id(rubrics[i]), []).append(i)
    return list(out.values())

