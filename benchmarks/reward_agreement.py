"""What each accuracy mode does, by category, and what a reward call costs.

    python benchmarks/reward_agreement.py [--repeat 3] [--run RUN_DIR]

1. On the reward corpus (tests/reward_corpus, ≥ 400 hand-written cases), per category: how often the
   hardened default and ``mode: math_verify`` give the expected score, how often ``mode: math_verify``
   agrees with math-verify called directly (math subset), and false positives on the adversarial subset.
2. Cost per call (median, p99, ms) of the rewards the tiny demo trains with (``format`` + ``auto_accuracy``)
   on demo-shaped responses: the demo's synthetic tasks (``make_rows``), answered the way the tiny model
   answers in 32 new tokens — right, off by one, chattering, truncated, two answers. With ``--run``, the
   responses of a real run's rollouts are used instead (``RUN_DIR/rollouts/*.parquet``).
3. Nested ``\\boxed{`` at growing depths: seconds per call and the ratio per doubling (linear: ~2).

Nothing is timed in the tests; this script is where the speed goals are measured (p99 ≤ 50 ms per call).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def corpus_table() -> None:
    from reward_corpus.corpus import build_scorers, load_cases, math_verify_reference, score

    cases = load_cases()
    hard, mv = build_scorers(), build_scorers({"mode": "math_verify"})
    rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    totals: dict[str, float] = defaultdict(float)
    for c in cases:
        h, m = score(c, hard), score(c, mv)
        r = rows[c.category]
        r["n"] += 1
        r["hard_ok"] += abs(h - c.expected) < 1e-9
        r["mv_ok"] += abs(m - c.expected) < 1e-9
        if c.adversarial and c.expected == 0:
            r["adv"] += 1
            r["hard_fp"] += h > 0
            r["mv_fp"] += m > 0
        if c.answer_type == "math":
            ref = math_verify_reference(c)
            r["math"] += 1
            r["mv_agree"] += m == ref
            r["hard_agree"] += h == ref
    print(f"reward corpus: {len(cases)} cases\n")
    head = f"{'category':16} {'n':>4} {'hardened ok':>12} {'math_verify ok':>15} {'mv mode = mv':>13} {'hardened = mv':>14} {'false pos (h/mv)':>17}"
    print(head)
    print("-" * len(head))
    for cat in sorted(rows):
        r = rows[cat]
        for k, v in r.items():
            totals[k] += v
        agree = f"{r['mv_agree']:.0f}/{r['math']:.0f}" if r["math"] else "-"
        hagree = f"{r['hard_agree']:.0f}/{r['math']:.0f}" if r["math"] else "-"
        fp = f"{r['hard_fp']:.0f}/{r['mv_fp']:.0f} of {r['adv']:.0f}" if r["adv"] else "-"
        print(f"{cat:16} {r['n']:4.0f} {r['hard_ok']:6.0f} ({r['hard_ok'] / r['n']:4.0%}) "
              f"{r['mv_ok']:8.0f} ({r['mv_ok'] / r['n']:4.0%}) {agree:>13} {hagree:>14} {fp:>17}")
    t = totals
    print("-" * len(head))
    print(f"{'all':16} {t['n']:4.0f} {t['hard_ok']:6.0f} ({t['hard_ok'] / t['n']:4.0%}) "
          f"{t['mv_ok']:8.0f} ({t['mv_ok'] / t['n']:4.0%}) {t['mv_agree']:.0f}/{t['math']:.0f}".ljust(74)
          + f" {t['hard_agree']:.0f}/{t['math']:.0f}".rjust(14)
          + f" {t['hard_fp']:.0f}/{t['mv_fp']:.0f} of {t['adv']:.0f}".rjust(18))
    print(f"\nmode: math_verify agrees with math-verify on {t['mv_agree'] / t['math']:.1%} of the math subset; "
          f"the hardened default on {t['hard_agree'] / t['math']:.1%} (the rest: tests/reward_corpus/deliberate.txt)")
    print(f"false positives on the adversarial subset: hardened {t['hard_fp']:.0f}, math_verify {t['mv_fp']:.0f} "
          f"(of {t['adv']:.0f})\n")


def demo_responses(run: str | None) -> list[tuple[str, object]]:
    from mmrlvr.types import Sample

    if run:
        import pandas as pd

        out = []
        for f in sorted(Path(run, "rollouts").glob("*.parquet")):
            for row in pd.read_parquet(f).to_dict("records"):
                s = Sample(id=str(row.get("sample_id", "r")), messages=[], images=[], answer=row.get("answer"),
                           answer_type=row.get("answer_type") or "number", meta={})
                out.append((str(row.get("text") or row.get("response") or ""), s))
        return out
    from mmrlvr.data.synth import make_rows

    out = []
    for task in ("count", "count_chatter", "left_right", "largest_colour", "grounding", "geometry"):
        try:
            rows = make_rows(task, "test", 40, image_size=112)
        except Exception:  # noqa: BLE001 - a task this checkout does not have
            continue
        for i, row in enumerate(rows):
            meta = dict(row["meta"])
            meta.setdefault("orig_size", meta.get("image_size"))
            s = Sample(id=row["id"], messages=[], images=[], answer=row["answer"], answer_type=row["answer_type"],
                       meta=meta)
            a = row["answer"]
            wrong = str(int(a) + 1) if a.isdigit() else ("left" if a == "right" else "3")
            shapes = ["<think>I see the shapes and count the red ones.</think><answer>{}</answer>",
                      "<think>so so so the the answer</think><answer>{}</answer>",
                      "<think>{} maybe</think><answer>{}",  # truncated at 32 tokens
                      "<think>hmm</think><answer>{} or {}</answer>",
                      "<think>count</think> The answer is {}."]
            for k, shape in enumerate(shapes):
                ans = a if (i + k) % 2 == 0 else wrong
                out.append((shape.format(ans, ans), s))
    return out


def cost_table(repeat: int, run: str | None) -> None:
    from mmrlvr.rewards import build_reward
    from mmrlvr.rewards.base import score_batch
    from mmrlvr.types import Completion

    data = demo_responses(run)
    print(f"cost per call on {len(data)} demo-shaped responses ({'run ' + run if run else 'synthetic tasks'}), "
          f"{repeat} passes")
    print(f"{'reward':40} {'median ms':>10} {'p99 ms':>8} {'max ms':>8}")
    for label, name, params in [("format", "format", {}), ("auto_accuracy (hardened)", "auto_accuracy", {}),
                                ("auto_accuracy (math: math_verify)", "auto_accuracy", {"math": {"mode": "math_verify"}}),
                                ("accuracy (hardened, math rows)", "accuracy", {}),
                                ("accuracy (math_verify, math rows)", "accuracy", {"mode": "math_verify"})]:
        fn = build_reward(name, **params)
        rows = data if name != "accuracy" else [(t, s) for t, s in data if s.answer_type in ("math", "number")]
        score_batch(fn, [Completion(t) for t, _ in rows[:20]], [s for _, s in rows[:20]])  # warm-up (imports)
        times = []
        for _ in range(repeat):
            for text, s in rows:
                t0 = time.perf_counter()
                score_batch(fn, [Completion(text)], [s])
                times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
        print(f"{label:40} {statistics.median(times):10.2f} {p99:8.2f} {times[-1]:8.2f}")
    print()


def nesting_table() -> None:
    from mmrlvr.rewards import AccuracyReward
    from mmrlvr.types import Sample

    fn = AccuracyReward(template="boxed")
    s = Sample(id="n", messages=[], images=[], answer="2", answer_type="math")
    print("nested \\boxed{ (template boxed): seconds per call")
    prev = None
    for depth in (1250, 2500, 5000, 10000, 20000):
        text = "\\boxed{" * depth + "2" + "}" * depth
        t0 = time.perf_counter()
        for _ in range(3):
            fn(text, s)
        dt = (time.perf_counter() - t0) / 3
        print(f"  depth {depth:6d}: {dt * 1000:8.2f} ms" + (f"   x{dt / prev:.2f} per doubling" if prev else ""))
        prev = dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--run", default=None, help="a run directory whose rollouts to time instead of synthetic ones")
    ap.add_argument("--skip-corpus", action="store_true")
    args = ap.parse_args()
    if not args.skip_corpus:
        corpus_table()
    cost_table(args.repeat, args.run)
    nesting_table()


if __name__ == "__main__":
    main()
