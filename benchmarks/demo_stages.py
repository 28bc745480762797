"""Where `mmrlvr demo`'s time goes: each stage kind's wall time summed over the run, and the held-out evaluations.

Runs ``mmrlvr demo`` in this process with every argument passed through (``--out``, ``--steps``, ``--seed``,
``key=value`` overrides) and, when it ends, prints one line per stage kind (the pipeline records each stage's
wall time in ``StepBatch.timings``) plus the evaluations and the whole command:

    python benchmarks/demo_stages.py --out runs/demo_stages

To compare two versions of the code, run it on each, one after the other on the same machine (the machine's
speed drifts by more than most changes), and compare the runs' ``metrics.jsonl`` for what they compute.
"""

from __future__ import annotations

import collections
import sys
import time


def main(argv: list[str]) -> int:
    from mmrlvr.cli import main as cli
    from mmrlvr.train.stages.base import Pipeline
    from mmrlvr.train.trainer import Trainer

    seconds: collections.Counter[str] = collections.Counter()
    run, evaluate = Pipeline.run, Trainer.heldout_eval

    def timed_run(self, *args, **kwargs):
        batch = run(self, *args, **kwargs)
        for kind, s in batch.timings.items():
            seconds[kind] += s
        return batch

    def timed_evaluate(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return evaluate(self, *args, **kwargs)
        finally:
            seconds["evaluation"] += time.perf_counter() - t

    Pipeline.run, Trainer.heldout_eval = timed_run, timed_evaluate
    t0 = time.perf_counter()
    try:
        code = cli(["demo", *argv])
    finally:
        Pipeline.run, Trainer.heldout_eval = run, evaluate
    print("\nstage            seconds")
    for kind, s in seconds.items():
        print(f"{kind:<16}{s:>8.1f}")
    print(f"{'whole command':<16}{time.perf_counter() - t0:>8.1f}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
