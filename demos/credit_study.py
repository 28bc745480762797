"""Token credit, side by side: a short version of ``benchmarks/credit_study.py``.

What to look at: the token probe table (which response tokens each scheme keeps, and how uncertain and
how image-dependent each kind of token is on the warm-started tiny VLM), then the held-out accuracy of
`none` (plain GRPO), `entropy_topk` (the 80/20 rule), `vepo` and `vppo` after the same short budget, and
``credit_study.png``. The task is ``synth:count_chatter``: counting whose thinking opens with random
filler words, so the most uncertain tokens are noise and the answer-deciding count digits read the image
— watch entropy top-20% keep the fillers and lose accuracy while VEPO and VPPO keep the digits. The
first run builds that task's warm start (~2 min, cached). One seed and 20 steps take a few minutes on a
laptop CPU; the full study (3 seeds, 60 steps, 200 held-out prompts × 8 samples) is
``python benchmarks/credit_study.py`` and its result is in docs/credit.md (``--task count`` runs the
plain counting task, where the premise does not hold).

    python demos/credit_study.py [--steps 20] [--out runs/demo-credit] [any credit_study.py option]
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--steps", "20", "--seeds", "0", "--eval-size", "64", "--k", "4", "--probe-prompts", "4",
         "--out", "runs/demo-credit"]


def load_study():
    spec = importlib.util.spec_from_file_location("credit_study", ROOT / "benchmarks" / "credit_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    # the short budget first: any option given on the command line comes later and wins
    return load_study().main(SHORT + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
