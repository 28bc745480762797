"""How fast does the inspector open and filter a big run? (100,000 rollouts by default)

Writes a synthetic run (``mmrlvr.testing.fake_run.make_fake_run``: images, boxes, ~150-token responses with six
per-token signals, rubric results; through the real ``RolloutWriter``), then measures:

* open_s   — ``RolloutReader(run_dir)``: list the shards and build the scalar index (bar: < 1 s)
* filter_s — a typical filter on the index: step range + reward range + component pass/fail + advantage
             sign + finish reason, round-robin ordered, first 200 (bar: < 0.1 s)
and, for information, a regex filter over the response texts, loading one group's full records, the
first render of the Browse tab (with its most-informative-group choice), the Filter tab's answer with
response previews, and a no-change refresh.

    python benchmarks/inspector_scale.py [--rollouts 100000] [--out DIR] [--keep]

The last line is ``open_s: X filter_s: Y``. Run with OMP_NUM_THREADS=1 on shared machines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from mmrlvr.testing.fake_run import make_fake_run  # noqa: E402
from mmrlvr.store.reader import RolloutReader  # noqa: E402


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    """Median wall time of ``repeat`` calls (and the last result)."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=int, default=100_000)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--groups", type=int, default=50, help="prompts per step")
    p.add_argument("--out", default=None, help="run folder to (re)use; default: a temp folder")
    p.add_argument("--keep", action="store_true", help="keep the generated run")
    p.add_argument("--skip-app", action="store_true", help="don't time the Gradio layer")
    args = p.parse_args(argv)

    per_step = args.groups * args.group_size
    steps = max(1, args.rollouts // per_step)
    run_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="mmrlvr_bench_")) / "run"
    try:
        if not (run_dir / "rollouts").is_dir() or len(list((run_dir / "rollouts").glob("step-*.parquet"))) != steps:
            shutil.rmtree(run_dir, ignore_errors=True)
            t0 = time.perf_counter()
            make_fake_run(run_dir, steps=steps, groups=args.groups, group_size=args.group_size, seed=0,
                          filler_sentences=(8, 28))
            print(f"generated {steps * per_step} rollouts ({steps} steps x {per_step}) in "
                  f"{time.perf_counter() - t0:.1f} s")
        size_mb = sum(f.stat().st_size for f in (run_dir / "rollouts").glob("*.parquet")) / 2**20
        print(f"store: {run_dir} ({size_mb:.0f} MiB of Parquet)")

        open_s, reader = timed(lambda: RolloutReader(run_dir))
        print(f"rows in index: {len(reader.index)}, components: {reader.components()}")
        mean_tokens = reader.index["num_response_tokens"].mean()
        print(f"mean response length: {mean_tokens:.0f} tokens")

        def typical_filter():
            return reader.filter(step_range=(steps // 4, steps - 1), reward_range=(0.25, None), component="format",
                                 passed=True, advantage_sign="+", finish_reason="stop", order="round_robin",
                                 limit=200)

        filter_s, rows = timed(typical_filter, repeat=5)
        print(f"typical filter: {len(rows)} rows shown")
        regex_s, hits = timed(lambda: reader.filter(step_range=(0, steps - 1), regex=r"I see [23] (red|blue)",
                                                    limit=200), repeat=1)
        print(f"regex filter over all response texts: {regex_s:.3f} s (first run, reads the text column), "
              f"{len(hits)} rows shown")
        regex2_s, _ = timed(lambda: reader.filter(regex=r"I see [23] (red|blue)", limit=200), repeat=1)
        print(f"regex filter again (texts cached): {regex2_s:.3f} s")
        group_s, group = timed(lambda: reader.group(steps // 2, "p00007"), repeat=3)
        print(f"load one group ({len(group)} full records): {group_s * 1000:.1f} ms")
        refresh_s, _ = timed(reader.refresh, repeat=3)
        print(f"refresh with no new shards: {refresh_s * 1000:.1f} ms")
        if not args.skip_app:
            from mmrlvr.inspector.app import Inspector

            app_open_s, ins = timed(lambda: Inspector(run_dir))
            render_s, _ = timed(lambda: ins.render(steps // 2, "p00007", None), repeat=3)
            first_s, _ = timed(lambda: ins.render(None, None, None), repeat=3)
            ui_filter_s, _ = timed(lambda: ins.run_filter(str(steps // 4), "", "0.25", "", "format", "pass", "+",
                                                          ["stop"], "", "round robin", 200), repeat=3)
            print(f"inspector: open {app_open_s:.3f} s, render one sample (Browse tab) {render_s * 1000:.0f} ms, "
                  f"open on the most informative group of the last step {first_s * 1000:.0f} ms, Filter tab with "
                  f"200 response previews {ui_filter_s * 1000:.0f} ms (first run reads the text column)")
        print(f"bars: open < 1 s {'PASS' if open_s < 1 else 'FAIL'}, filter < 0.1 s "
              f"{'PASS' if filter_s < 0.1 else 'FAIL'}")
        print(f"open_s: {open_s:.3f} filter_s: {filter_s:.3f}")
        return 0
    finally:
        if not args.keep and not args.out:
            shutil.rmtree(run_dir.parent, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
