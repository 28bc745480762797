"""Golden runs for the step pipeline: every metric and every rollout record of short fixed-seed runs.

``tests/test_stage_goldens.py`` reruns each case and compares with ``tests/data/stage_goldens.json``, written by
``python tests/stage_goldens.py --write`` from the trainer as it was before the step became a pipeline of stages
(issue 18), so the refactor is shown to change nothing: every value of metrics.jsonl (wall-clock timings aside) and
a digest of every rollout record column (run-specific ids aside) must match exactly.

When a later change *means* to change results (a new default, a fixed bug), rerun ``--write`` in that commit and
say so in its message.

The runs happen in a child process on pinned CPU kernels (``mmrlvr.models.kernels``), from warm starts built on
the same pinned kernels; the child reports its kernel settings and an unpinned run is an error. Pinned kernels
still differ in the last bits between some kinds of CPU (``tests/machine_variants.py``), so each case keeps one
*variant* per kind of machine it was written on: a run must equal one bit for bit, must equal this machine's if
there is one, and otherwise must behave like them up to rounding (``unlike``). On a new kind of machine,
``python tests/stage_goldens.py --add-machine`` adds its variants (refused where a result behaves differently).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "stage_goldens.json"

# fast settings shared by every case: 4 prompts per step, no eval, no checkpoints, rollouts recorded
_COMMON = ["save_every=0", "eval.every=0", "eval.at_start=false", "eval.at_end=false", "rollout.prompts_per_step=4",
           "progress=false", "log_rollouts=true", "data.train_size=64",
           # the whole-row passes these goldens were first written on (the step's bits since the stage pipeline);
           # the default, prefix sharing, is the "demo-prefix-sharing" case
           "model.prefix_sharing=false"]

#: (case name, config file or "demo", overrides, steps). The five required cases run 20 steps; the variants cover
#: the other paths through the step (split advantages, separate credit passes, extra losses, epochs, micro-batches).
CASES: list[tuple[str, str, list[str], int]] = [
    ("demo", "demo", [], 20),
    ("demo-prefix-sharing", "demo", ["model.prefix_sharing=true"], 20),
    ("demo-tiny", "configs/demo-tiny.yaml", [], 20),
    ("consistency-tiny", "configs/consistency-tiny.yaml", [], 20),
    ("credit-vepo-tiny", "configs/credit-vepo-tiny.yaml", [], 20),
    ("grounding-tiny", "configs/grounding-tiny.yaml", [], 20),
    ("rubric-tiny", "configs/rubric-tiny.yaml", [], 20),
    # multi-turn: zoom-tiny from its shipped warm start, whose own calls hit, miss or break, so the groups differ and the
    # update trains on sequences holding tool turns with returned images
    ("zoom-tiny", "configs/zoom-tiny.yaml", [], 3),
    ("split-answer", "configs/consistency-tiny.yaml", ["consistency.split_advantage=true"], 4),
    ("split-all", "configs/consistency-tiny.yaml", ["consistency.split_advantage=true", "consistency.scope=all"], 3),
    ("vppo", "configs/credit-vepo-tiny.yaml", ["credit.scheme=vppo"], 3),
    ("papo", "configs/credit-vepo-tiny.yaml", ["credit.scheme=papo"], 3),
    ("vepo-separate-2ep-mb", "configs/credit-vepo-tiny.yaml",
     ["credit.in_update=false", "algo.epochs=2", "algo.micro_batch_size=8"], 3),
    ("entropy-deferred-2ep", "configs/credit-vepo-tiny.yaml",
     ["credit.scheme=entropy_topk", "algo.epochs=2", "algo.micro_batch_size=12"], 3),
    ("lora-dapo-trunc", "configs/demo-tiny.yaml",
     ["model.lora.enabled=true", "algo.preset=dapo", "rollout.max_new_tokens=12"], 3),
    ("nsr-overlong", "configs/demo-tiny.yaml", ["algo.loss=nsr", "algo.overlong_cache=8"], 3),
    ("gspo-preset", "configs/demo-tiny.yaml", ["algo.preset=gspo"], 3),
    ("cispo-preset-rpp", "configs/demo-tiny.yaml", ["algo.preset=cispo", "algo.advantage=reinforce_pp"], 3),
]

_VOLATILE_METRICS = ("time/",)
_VOLATILE_COLUMNS = {"run_id", "config_hash", "git_commit"}


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def run_case(name: str, config: str, overrides: list[str], steps: int, out: Path) -> dict[str, Any]:
    """Train one case in ``out`` and return its metrics rows and per-step record digests."""
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    ov = [f"output_dir={out}", f"max_steps={steps}", *_COMMON, *overrides]
    if config == "demo":
        from mmrlvr.train.demo import demo_config_dict

        cfg = load_config(data=demo_config_dict(), overrides=ov)
    else:
        cfg = load_config(ROOT / config, ov)
    from mmrlvr.train.metrics import MetricsWriter

    logged: list[dict[str, Any]] = []  # each step's metrics as the record stage handed them over (Metric values)
    log = MetricsWriter.log
    MetricsWriter.log = lambda self, step, metrics: (logged.append(dict(metrics)), log(self, step, metrics))[1]
    try:
        Trainer(cfg).train()
    finally:
        MetricsWriter.log = log
    rows = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.append({k: _clean(v) for k, v in sorted(row.items()) if not k.startswith(_VOLATILE_METRICS)})
    digests = {}
    import pyarrow.parquet as pq

    for shard in sorted((out / "rollouts").glob("*.parquet")):
        table = pq.read_table(shard)
        h = hashlib.sha256()
        for col in sorted(table.column_names):
            if col in _VOLATILE_COLUMNS:
                continue
            h.update(col.encode())
            h.update(json.dumps(table.column(col).to_pylist(), sort_keys=True, default=str).encode())
        digests[shard.name] = h.hexdigest()
    return {"metrics": rows, "records": digests, "metric_checks": two_process_problems(logged)}


def two_process_problems(steps: list[dict[str, Any]]) -> list[str]:
    """What goes wrong when each step's metrics go through the two-process combine (``mmrlvr.metric.combine``) as
    two processes that each hold the one-process batch: every numeric metric must declare its reduction, and the
    combined values must be those of the doubled batch -- counts twice the one-process value, rates, maxima and
    shared values the same, a population spread the same, a Bessel-corrected spread s * sqrt(2(n-1)/(2n-1))."""
    from mmrlvr.metric import Metric, combine, undeclared

    out = []
    for i, m in enumerate(steps, 1):
        missing = undeclared(m)
        if missing:
            out.append(f"step {i}: no reduction declared for {missing}")
            continue
        got = combine([m, m])
        for key, v in m.items():
            if not isinstance(v, Metric):
                continue
            want = float(v)
            if v.kind == "sum":
                want = 2 * want
            elif v.kind == "std" and v.unbiased and v.n and v.n > 1:
                want = want * math.sqrt(2 * (v.n - 1) / (2 * v.n - 1))
            g = float(got[key])
            if not (math.isclose(g, want, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(g) and math.isnan(want))):
                out.append(f"step {i}: {key} ({v.kind}) combines to {g!r}, the doubled batch's is {want!r}")
    return out


def cpu_signature() -> str:
    """The kind of machine a golden variant is written on (``tests.machine_variants.machine_signature``)."""
    from tests.machine_variants import machine_signature

    return machine_signature()


#: metrics that follow rounding rather than what the run does: optimiser and ratio diagnostics, credit selections
#: decided by near-ties. ``unlike`` leaves them out; ``differences`` (bit for bit) does not.
_ROUNDING_METRICS = ("loss", "kl", "grad_norm", "clip_fraction", "ratio/", "offpolicy/", "credit/", "entropy/",
                     "rollout/is_ratio", "rollout/logprob_abs_diff")
#: how far a behaviour metric's run mean may move on another machine, as a fraction of max(1, its largest value);
#: measured 2026-12-06, AMD EPYC vs Intel Xeon: at most 0.05 (rates of runs from differently built warm starts)
ALIKE_TOLERANCE = 0.15


def differences(got: dict[str, Any], variant: dict[str, Any]) -> list[str]:
    """Every way ``got`` is not bit-identical to ``variant`` (metrics line by line, record digests step by step)."""
    out = []
    if len(got["metrics"]) != len(variant["metrics"]):
        out.append(f"{len(got['metrics'])} metrics lines, the variant has {len(variant['metrics'])}")
    for i, (g, e) in enumerate(zip(got["metrics"], variant["metrics"])):
        diff = {k: (g.get(k), e.get(k)) for k in sorted(set(g) | set(e)) if g.get(k) != e.get(k)}
        if diff:
            out.append(f"metrics line {i + 1} (got, expected): {diff}")
    for shard in sorted(set(got["records"]) | set(variant["records"])):
        if got["records"].get(shard) != variant["records"].get(shard):
            out.append(f"rollout records {shard} differ")
    return out


def unlike(got: dict[str, Any], variant: dict[str, Any]) -> list[str]:
    """The ways ``got`` does not behave like ``variant`` up to rounding: the same steps and records, the same
    metrics (and the same non-finite ones), and every behaviour metric's run mean within ALIKE_TOLERANCE."""
    out = []
    if len(got["metrics"]) != len(variant["metrics"]):
        out.append(f"{len(got['metrics'])} metrics lines, the variant has {len(variant['metrics'])}")
    if sorted(got["records"]) != sorted(variant["records"]):
        out.append(f"record shards {sorted(got['records'])} vs {sorted(variant['records'])}")
    keys_got, keys_exp = set().union(*got["metrics"]), set().union(*variant["metrics"])
    if keys_got != keys_exp:
        out.append(f"metrics only here: {sorted(keys_got - keys_exp)}, "
                   f"only in the variant: {sorted(keys_exp - keys_got)}")
    for key in sorted(keys_got & keys_exp):
        g = [row[key] for row in got["metrics"] if key in row]
        e = [row[key] for row in variant["metrics"] if key in row]
        if any(isinstance(v, str) for v in g + e):  # non-finite values are stored as their repr
            if [isinstance(v, str) for v in g] != [isinstance(v, str) for v in e]:
                out.append(f"{key}: non-finite at other steps")
            continue
        if key.startswith(_ROUNDING_METRICS) or not e or not g:
            continue
        gap = abs(sum(g) / len(g) - sum(e) / len(e))
        bound = ALIKE_TOLERANCE * max(1.0, max(abs(v) for v in e))
        if gap > bound:
            out.append(f"{key}: run mean {sum(g) / len(g):.4g} vs {sum(e) / len(e):.4g} (allowed gap {bound:.3g})")
    return out


def judge_case(case: str, got: dict[str, Any]) -> Any:
    """The verdict on one case's result against its recorded variants (``tests.machine_variants.judge``)."""
    from tests.machine_variants import judge

    variants = json.loads(GOLDEN.read_text())[case]["variants"]
    return judge(got, variants, cpu_signature(), differences=differences, unlike=unlike)


def supports_pinned_goldens() -> tuple[bool, str]:
    """Goldens are pinned x86-64 values (``mmrlvr.models.kernels``); elsewhere they cannot be compared."""
    from mmrlvr.models.kernels import comparable_here

    return comparable_here()


def _run_here(out_json: Path, names: list[str]) -> None:
    """The child side of run_all: pin what cannot be set by environment, train the cases, write the results."""
    import tempfile

    from mmrlvr.models.kernels import kernel_state, pin_in_process

    pin_in_process()
    out: dict[str, Any] = {"_kernels": kernel_state()}
    with tempfile.TemporaryDirectory() as tmp:
        for name, config, overrides, steps in CASES:
            if name in names:
                out[name] = run_case(name, config, overrides, steps, Path(tmp) / name)
    out_json.write_text(json.dumps(out))


def run_all(tmp: Path, names: list[str] | None = None, *, show_output: bool = False) -> dict[str, Any]:
    """Run the cases (all by default) in a child process on the pinned kernels: their environment must be set
    before torch starts. ``show_output`` lets the child's progress through instead of keeping it for an error."""
    import subprocess

    from mmrlvr.models.kernels import check_pinned, pinned_env

    names = names or [c[0] for c in CASES]
    unknown = sorted(set(names) - {c[0] for c in CASES})
    if unknown:
        raise ValueError(f"unknown golden case(s) {unknown}; known: {[c[0] for c in CASES]}")
    tmp.mkdir(parents=True, exist_ok=True)
    out_json = tmp / "golden-run.json"
    if not show_output:
        result = _server().run(out_json, names)
        check_pinned(result.pop("_kernels"))
        return result
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--run", str(out_json), *names],
                          cwd=ROOT, env=pinned_env(), capture_output=not show_output, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"golden run {names} failed (exit {proc.returncode}):\n{(proc.stderr or '')[-4000:]}")
    result = json.loads(out_json.read_text())
    check_pinned(result.pop("_kernels"))
    return result


class _Server:
    """One pinned child that stays up and trains the cases it is sent, one request at a time.

    A fresh child per case spent ~5 s of each case starting up (torch and transformers, the tiny models): the
    goldens' file took 305 s of the suite's worker time with a child per case, 201 s with this one (2026-12-07). The cases do not depend on what ran before them in a process (``--write`` trains them all in one
    child; each test then reproduces its case alone), so one child per test process serves them all. Protocol: a
    JSON line ``{"out": ..., "cases": [...]}`` on the child's stdin; the child answers a JSON line (``ok``, or the
    error's traceback) on its original stdout, while its own output (fd 1 and 2) goes to a log beside ``out``, which
    an error message includes."""

    def __init__(self) -> None:
        import subprocess

        from mmrlvr.models.kernels import pinned_env

        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve"], cwd=ROOT,
                                     env=pinned_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, out_json: Path, names: list[str]) -> dict[str, Any]:
        log = out_json.with_suffix(".log")
        try:
            self.proc.stdin.write(json.dumps({"out": str(out_json), "cases": names}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        try:
            answer = json.loads(line) if line.strip() else None
        except ValueError:  # not an answer: the channel is broken, as good as dead
            answer = None
        if not (answer and answer["ok"]):
            output = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            if answer is None:
                code = self.proc.poll()
                if code is None:  # alive, but what it wrote is no answer: of no further use
                    self.proc.kill()
                    self.proc.wait()
                    raise RuntimeError(f"golden run {names}: the child answered {line[:200]!r}; its output:\n{output}")
                raise RuntimeError(f"golden run {names}: the child died (exit {code}); its output:\n{output}")
            raise RuntimeError(f"golden run {names} failed:\n{answer['error']}\nits output:\n{output}")
        return json.loads(out_json.read_text())

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except Exception:  # pragma: no cover - a child that does not exit on end of input
                self.proc.kill()


_SERVER: _Server | None = None


def _server() -> _Server:
    """This process's golden child, started on first use (again if it died); closed when the process exits."""
    global _SERVER
    if _SERVER is None or not _SERVER.alive():
        import atexit

        _SERVER = _Server()
        atexit.register(_SERVER.close)
    return _SERVER


def _serve() -> None:
    """The child side of ``_Server``: one request a line until its input ends (each pinned by ``_run_here``)."""
    import os
    import traceback

    reply = os.fdopen(os.dup(1), "w")  # the answers' channel; fd 1 and 2 go to each request's log
    os.dup2(2, 1)  # until the first request, whatever is printed goes to stderr, never into the answers
    for line in sys.stdin:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            request = json.loads(line)
            out_json = Path(request["out"])
            with open(out_json.with_suffix(".log"), "w") as log:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
            _run_here(out_json, request["cases"])
            answer = {"ok": True}
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it with the log
            answer = {"ok": False, "error": traceback.format_exc()[-4000:]}
        sys.stdout.flush()
        sys.stderr.flush()
        reply.write(json.dumps(answer) + "\n")
        reply.flush()


def write(names: list[str] | None = None, *, add_machine: bool = False) -> list[str]:
    """Run the named cases (all by default) and record them into GOLDEN (``file_results``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = run_all(Path(tmp), names, show_output=True)
    return file_results(result, add_machine=add_machine)


def file_results(result: dict[str, Any], *, add_machine: bool = False) -> list[str]:
    """Record ``run_all`` results into GOLDEN, keeping the other cases; returns the cases that changed.

    By default a result replaces every variant of its case: the commit means to change results, and the other
    machines' variants are stale (rerun ``--add-machine`` there). With ``add_machine`` it is added as this kind of
    machine's variant beside the others -- unless one already equals it bit for bit -- and only where it behaves
    like them (``unlike`` finds nothing): a changed result is never filed as another machine's rounding."""
    from mmrlvr.models.kernels import LABEL

    old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    here, changed = cpu_signature(), []
    for name, case in result.items():
        case = {k: v for k, v in case.items() if k != "metric_checks"}  # checked by the test, not recorded
        recorded = old.get(name, {}).get("variants", [])
        others = [v for v in recorded if v["written_on"] != here] if add_machine else []
        if any(not differences(case, v) for v in others):  # reproduced: at most a stale one of this machine's goes
            if len(others) < len(recorded):
                old[name] = {"variants": others}
                changed.append(name)
            continue
        for v in others:
            found = unlike(case, v)
            if found:
                raise SystemExit(f"{name}: not filed as this machine's variant, it behaves unlike the one written on "
                                 f"{v['written_on']!r}: {'; '.join(found[:5])} (a change of results: use --write)")
        old[name] = {"variants": others + [{**case, "kernels": LABEL, "written_on": here}]}
        changed.append(name)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
    return changed


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python tests/stage_goldens.py", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true",
                      help="results are meant to change: the new results replace every machine's variant")
    mode.add_argument("--add-machine", action="store_true",
                      help="add this kind of machine's variant beside the others "
                           "(refused where it behaves unlike them)")
    mode.add_argument("--run", metavar="OUT_JSON", help=argparse.SUPPRESS)  # the pinned child (run_all)
    mode.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the pinned child that stays up
    parser.add_argument("cases", nargs="*", metavar="CASE",
                        help=f"cases to run (default: all): {[c[0] for c in CASES]}")
    args = parser.parse_args(argv)
    if args.run:
        _run_here(Path(args.run), args.cases)
        return
    if args.serve:
        _serve()
        return
    written = write(args.cases or None, add_machine=args.add_machine)
    print(f"wrote {GOLDEN} ({', '.join(written) or 'nothing new'})")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
