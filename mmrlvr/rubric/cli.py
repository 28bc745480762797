"""``mmrlvr rubric``: check a rubric against real responses before a run spends GPU hours on it.

    mmrlvr rubric validate rubrics/chart_qa.yaml [more.yaml ...]
    mmrlvr rubric preview  rubrics/chart_qa.yaml --data DATA --sample 3 [--response TEXT]
    mmrlvr rubric score    rubrics/chart_qa.yaml --responses R.jsonl [--data DATA] [--judge openai
                           --judge-param base_url=http://127.0.0.1:8000/v1 --judge-param model=NAME]
    mmrlvr rubric agreement rubrics/chart_qa.yaml --responses R.jsonl --judge ... [--judge2 ...] [--votes 3]

FILE may be ``-`` to use each sample's own rubric (the dataset's ``rubric`` column).
Responses file: JSON Lines, one object per response with ``response`` (the text) and either ``row`` (an
index into ``--data``; default: the line number) or, without ``--data``, the sample's own columns
(``problem``, ``answer``, ``images`` as paths relative to the file, optional ``rubric``, ``id``).
``preview`` prints each judge prompt exactly as it is sent (images shown as a placeholder with their hash).
``validate`` reports every problem of every file (one line each, naming file, line and key; exit 2 if any).
``score`` warns as soon as the judge's unknown rate passes 10%, ends with a judge summary line, leaves
undetermined responses out of the mean, and exits 1 when the unknown rate is over ``--max-unknown``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from mmrlvr.errors import UserError
from mmrlvr.rubric.loading import RubricError, load_rubric_file, parse_instance_rubric
from mmrlvr.rubric.schema import CATEGORIES, Rubric
from mmrlvr.types import Sample


class _Parser(argparse.ArgumentParser):
    """argparse that raises UserError (one paragraph, exit 2 from mmrlvr.cli) instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message}\n\n{self.format_usage().strip()}")


def _judge_args(p: argparse.ArgumentParser, suffix: str = "", required: bool = False) -> None:
    p.add_argument(f"--judge{suffix}", required=required, metavar="NAME",
                   help="judge backend: openai (any OpenAI-compatible server) or local (a model folder)")
    p.add_argument(f"--judge{suffix}-param", action="append", default=[], metavar="KEY=VALUE",
                   help="judge parameter, repeatable (e.g. base_url=..., model=..., timeout=30, model_path=DIR)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mmrlvr rubric", description="Rubric authoring: validate, preview, score, agreement.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    v = sub.add_parser("validate", help="check rubric files (errors name file, line and field)")
    v.add_argument("files", nargs="+", metavar="FILE")

    pv = sub.add_parser("preview", help="print the judge prompts for one sample exactly as sent")
    pv.add_argument("file", metavar="FILE", help="rubric YAML, or - for the sample's own rubric")
    pv.add_argument("--data", required=True, help="dataset (folder, Parquet, JSON/JSONL) as for training")
    pv.add_argument("--sample", type=int, default=0, metavar="ROW", help="row index (default 0)")
    pv.add_argument("--response", help="response text to preview with (default: the row's solution, else a "
                                       "placeholder)")
    pv.add_argument("--max-chars", type=int, default=8000, help="judge's max_response_chars (default 8000)")

    for name, helptext in (("score", "score responses: a per-criterion table"),
                           ("agreement", "judge vs programs, judge vs judge, and between votes")):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("file", metavar="FILE", help="rubric YAML, or - for each sample's own rubric")
        sp.add_argument("--responses", required=True, help="JSON Lines file of responses (see --help of rubric)")
        sp.add_argument("--data", help="dataset the responses' `row` fields index into")
        _judge_args(sp, required=(name == "agreement"))
        sp.add_argument("--votes", type=int, default=1, help="judge votes per criterion (majority; default 1)")
        sp.add_argument("--cache", help="SQLite file caching judge outputs")
        if name == "score":
            sp.add_argument("--aggregation", default="rar", help="rar or hierarchical (default rar)")
            sp.add_argument("--json", dest="json_out", help="also write per-response results as JSON Lines")
            sp.add_argument("--quiet", action="store_true", help="only the summary table")
            sp.add_argument("--max-unknown", type=_fraction, default=0.2, metavar="RATE",
                            help="exit 1 when more than this fraction of judged criteria got no verdict "
                                 "(default 0.2)")
        else:
            _judge_args(sp, suffix="2")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return {"validate": _validate, "preview": _preview, "score": _score, "agreement": _agreement}[args.command](args)


# ------------------------------------------------------------------------------------------- validate
def _validate(args: argparse.Namespace) -> int:
    """Every file, every problem: one line per problem on stderr; exit 2 when any file has one."""
    failed = 0
    for f in args.files:
        try:
            rubric = load_rubric_file(f)
        except RubricError as exc:
            failed += 1
            for problem in exc.problems:
                print(f"mmrlvr rubric: error: {problem}", file=sys.stderr)
            continue
        print(f"{f}: ok - {summary(rubric)}")
    if failed and len(args.files) > 1:
        print(f"mmrlvr rubric: {failed} of {len(args.files)} files have problems", file=sys.stderr)
    return 2 if failed else 0


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}")
    return value


def summary(rubric: Rubric) -> str:
    cats = [c.category for c in rubric]
    n_prog = sum(c.check.is_program for c in rubric)
    n_img = sum(c.needs_image and not c.check.is_program for c in rubric)
    counts = ", ".join(f"{cats.count(k)} {k}" for k in CATEGORIES if k in cats)
    return (f"{len(rubric)} criteria ({counts}); {n_prog} checked by programs, {len(rubric) - n_prog} by a judge "
            f"({n_img} shown the image)")


# -------------------------------------------------------------------------------------------- preview
def _preview(args: argparse.Namespace) -> int:
    from mmrlvr.rubric.prompts import describe_messages, openai_messages
    from mmrlvr.rubric.routing import PROGRAM, judge_request, route, run_program
    from mmrlvr.rubric.verifiers import extract

    sample = _load_data(args.data, args.sample + 1)[args.sample]
    rubric = _rubrics(args.file, [sample], first_row=args.sample)[0]
    response = args.response if args.response is not None else sample.meta.get("solution")
    if response is None:
        response = "<think>(the reasoning)</think><answer>(the answer)</answer>"
        print("note: the row has no solution column and no --response was given; previewing a placeholder")
    print(f"rubric {rubric.name!r} ({rubric.source}): {summary(rubric)}")
    print(f"sample row {args.sample} (id {sample.id}); response ({len(response)} chars):\n{response}\n")
    for k, crit in enumerate(rubric.criteria, 1):
        head = f"[{k}/{len(rubric)}] {crit.id} ({crit.category}, weight {crit.weight:g})"
        if route(crit) == PROGRAM:
            verdict = run_program(crit, response, sample)
            try:
                ext = extract(crit.check, response)
                got = f"extracted {ext.value!r}{' (' + ext.note + ')' if ext.note else ''} from the response alone"
            except Exception:  # noqa: BLE001 - run_program has the reason: a scored failure
                got = "the check failed on this response"
            print(f"{head} -> program {crit.check.kind}: {got}; "
                  f"{'met' if verdict.met else 'not met'}: {verdict.rationale}\n")
        else:
            req = judge_request(crit, response, sample)
            print(f"{head} -> judge; the prompt as sent:")
            print(describe_messages(openai_messages(req, max_chars=args.max_chars)) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------- score
def _score(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from mmrlvr.rubric.reward import RubricReward

    texts, samples = _load_responses(args.responses, args.data)
    rubrics = _rubrics(args.file, samples)
    samples = [replace(s, rubric=r) for s, r in zip(samples, rubrics)]  # a resolved Rubric per sample
    judge = _build_judge(args.judge, args.judge_param, args.votes, args.cache) \
        if any(r.needs_judge for r in rubrics) or args.judge else None
    # no mid-run stop here: the whole file is scored and the exit status reports the unknown rate
    reward = RubricReward(judge=judge, aggregation=args.aggregation, group_size=1, max_unknown_rate=None)
    results = []
    with tqdm(total=len(texts), desc="scoring", unit="response", disable=len(texts) < 16, file=sys.stderr) as bar:
        for i in range(0, len(texts), 16):
            results += reward.score_batch(texts[i:i + 16], samples[i:i + 16])
            bar.update(len(texts[i:i + 16]))
    if not args.quiet:
        for k, res in enumerate(results):
            shown = "n/a (undetermined: every criterion it needs is unknown)" if res.parsed["undetermined"] \
                else f"{res.score:.3f}"
            print(f"response {k} (sample {samples[k].id}): score {shown} [{args.aggregation}]")
            print(_table(["criterion", "category", "weight", "verdict", "by", "rationale"],
                         [[c["id"], c["category"], f"{c['weight']:g}", c["verdict"], c["judge"],
                           _short(c["rationale"], 70)] for c in res.parsed["rubric"]]))
            print()
    _print_summary(results)
    rc = 0
    if judge is not None:
        st = judge.stats
        rate = st.unknown / st.requests if st.requests else 0.0
        print(f"\njudge {judge.identity}: {st.requests} requests, {st.unknown} unknown "
              f"({rate:.1%}: {st.timeouts} timeouts, {st.errors} errors, "
              f"{st.unparseable} unparseable, {st.refusals} refusals), {st.retries} retries, "
              f"{st.cache_hits} cache hits")
        if rate > args.max_unknown:
            print(f"mmrlvr rubric: error: {rate:.1%} of the judged criteria got no verdict from "
                  f"{judge.endpoint}, over --max-unknown {args.max_unknown:g}; the scores above rest on "
                  "the criteria that were decided. Check the judge (timeouts and errors: the server; "
                  "unparseable: the model's replies) before trusting them.", file=sys.stderr)
            rc = 1
        judge.close()
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            for k, res in enumerate(results):
                fh.write(json.dumps({"index": k, "sample": samples[k].id, "score": res.score,
                                     "undetermined": res.parsed["undetermined"],
                                     "criteria": res.parsed["rubric"]}, default=str) + "\n")
    return rc


def _print_summary(results: list[Any]) -> None:
    stats: dict[str, dict[str, Any]] = {}
    for res in results:
        for c in res.parsed["rubric"]:
            s = stats.setdefault(c["id"], {"category": c["category"], "met": 0, "not_met": 0, "unknown": 0})
            s[c["verdict"]] += 1
    rows = []
    for cid, s in stats.items():
        known = s["met"] + s["not_met"]
        rows.append([cid, s["category"], s["met"], s["not_met"], s["unknown"],
                     f"{s['met'] / known:.2f}" if known else "n/a"])
    determined = [r.score for r in results if not r.parsed["undetermined"]]
    mean = f"{sum(determined) / len(determined):.3f}" if determined else "n/a"
    left_out = len(results) - len(determined)
    print(f"summary over {len(results)} responses: mean score {mean}"
          + (f" over the {len(determined)} determined ({left_out} undetermined: every criterion they need "
             "is unknown; left out)" if left_out else ""))
    print(_table(["criterion", "category", "met", "not met", "unknown", "met rate"], rows))


# ------------------------------------------------------------------------------------------ agreement
def _agreement(args: argparse.Namespace) -> int:
    from mmrlvr.rubric.agreement import agreement, vote_agreement
    from mmrlvr.rubric.routing import guarded_judge_request, judge_twin, run_program
    from mmrlvr.rubric.verdicts import ERROR, Verdict
    from mmrlvr.rubric.verifiers import CheckLimitError

    texts, samples = _load_responses(args.responses, args.data)
    judge = _build_judge(args.judge, args.judge_param, args.votes, args.cache)
    judge2 = _build_judge(args.judge2, args.judge2_param, args.votes, args.cache) if args.judge2 else None
    items, program = [], []  # items: (criterion id, is program, request or the reason there is none)
    for text, sample, rubric in zip(texts, samples, _rubrics(args.file, samples)):
        for crit in rubric.criteria:
            try:
                req: Any = guarded_judge_request(judge_twin(crit), text, sample)
            except CheckLimitError as exc:  # a degenerate response: no judge call, an unknown pair
                req = str(exc)
            items.append((crit.id, crit.check.is_program, req))
            program.append(run_program(crit, text, sample).met if crit.check.is_program else None)

    def ask(j: Any) -> list[Any]:
        asked = [k for k, (_, _, req) in enumerate(items) if not isinstance(req, str)]
        got = dict(zip(asked, j.judge_batch([items[k][2] for k in asked])))
        return [got.get(k) or Verdict(None, str(items[k][2]), ERROR) for k in range(len(items))]

    v1 = ask(judge)
    print(f"{len(texts)} responses, {len(items)} (response, criterion) pairs; judge {judge.identity}")
    prog_idx = [k for k, (_, is_prog, _) in enumerate(items) if is_prog]
    if prog_idx:
        overall = agreement([program[k] for k in prog_idx], [v1[k].met for k in prog_idx])
        print(f"\njudge vs programs (criteria a program decides): {overall}")
        rows = []
        for cid in dict.fromkeys(items[k][0] for k in prog_idx):
            ks = [k for k in prog_idx if items[k][0] == cid]
            a = agreement([program[k] for k in ks], [v1[k].met for k in ks])
            rows.append([cid, a.n, _pct(a.percent), _kappa(a.kappa)])
        print(_table(["criterion", "pairs", "agreement", "kappa"], rows))
    else:
        print("\njudge vs programs: the rubric has no programmatic criteria")
    if judge2 is not None:
        v2 = ask(judge2)
        print(f"\njudge vs judge2 ({judge2.identity}), all criteria: "
              f"{agreement([v.met for v in v1], [v.met for v in v2])}")
        judge2.close()
    if args.votes > 1:
        print(f"\nbetween the {args.votes} votes of the judge: {vote_agreement([list(v.votes) for v in v1])}")
    unknown = sum(v.met is None for v in v1)
    print(f"\njudge unknown verdicts: {unknown}/{len(v1)} ({unknown / len(v1):.1%})" if v1 else "")
    judge.close()
    return 0


# -------------------------------------------------------------------------------------------- helpers
def _build_judge(name: str | None, params: list[str], votes: int, cache: str | None):
    from mmrlvr.rubric.judges import build_judge

    if not name:
        raise UserError("this rubric has judge criteria: pass --judge openai|local with --judge-param KEY=VALUE "
                        "(e.g. --judge-param base_url=http://127.0.0.1:8000/v1 --judge-param model=NAME)")
    kwargs: dict[str, Any] = {}
    for item in params:
        if "=" not in item:
            raise UserError(f"--judge-param {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        kwargs[key.strip().replace("-", "_")] = yaml.safe_load(value) if value else ""
    kwargs.setdefault("votes", votes)
    if cache:
        kwargs.setdefault("cache", cache)
    try:
        return build_judge(name, **kwargs)
    except TypeError as exc:
        raise UserError(f"judge {name!r}: {exc}") from None


def _load_data(path: str, limit: int | None = None) -> list[Sample]:
    from mmrlvr.data.loading import load_samples

    samples, _ = load_samples(path, limit=limit)
    if limit is not None and len(samples) < limit:
        raise UserError(f"{path}: has {len(samples)} rows, row {limit - 1} was asked for")
    return samples


def _load_responses(path: str, data: str | None) -> tuple[list[str], list[Sample]]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: responses file not found")
    lines = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("response"), str):
            raise UserError(f"{path}:{n}: each line needs a string field 'response'")
        lines.append((n, obj))
    if not lines:
        raise UserError(f"{path}: no responses")
    texts = [obj["response"] for _, obj in lines]
    if data:
        rows = [obj.get("row", k) for k, (_, obj) in enumerate(lines)]
        for (n, _), row in zip(lines, rows):
            if not isinstance(row, int) or row < 0:
                raise UserError(f"{path}:{n}: field 'row' must be a row index, got {row!r}")
        dataset = _load_data(data, max(rows) + 1)
        return texts, [dataset[r] for r in rows]
    from mmrlvr.data.loading import load_samples

    samples, _ = load_samples(str(p))
    return texts, samples


def _rubrics(file: str, samples: list[Sample], first_row: int = 0) -> list[Rubric]:
    """The rubric file for every sample, or with FILE "-" each sample's own rubric."""
    if file != "-":
        rubric = load_rubric_file(file)
        return [rubric] * len(samples)
    out = []
    for row, sample in enumerate(samples, first_row):
        if sample.rubric is None:
            raise UserError(f"sample {sample.id!r} (row {row}) has no rubric; give a rubric FILE instead of -")
        out.append(parse_instance_rubric(sample.rubric, source=f"sample {sample.id!r}", row=row))
    return out


def _short(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def _kappa(x: float) -> str:
    return "n/a" if x != x else f"{x:.3f}"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
