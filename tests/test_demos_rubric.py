"""demos/rubric_authoring.py runs offline, quickly, and shows what its header promises."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_rubric_authoring_demo_runs_offline_and_ranks_honest_answers_first(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "demos" / "rubric_authoring.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert elapsed < 60, f"the demo took {elapsed:.0f} s"

    # 1. every library rubric validates; the typo copy fails naming file, line and field
    assert len(re.findall(r"rubrics/\w+\.yaml: ok - \d+ criteria", out)) == len(list((ROOT / "rubrics").glob("*.yaml")))
    assert re.search(r"chart_qa_typo\.yaml:\d+: criteria\[1\] 'reads_right_series': field 'catagory': unknown key", out)

    # 2. preview uses the row's reference solution; programs extract from it, the judge prompt is fenced
    assert "<think>I see 3 yellow, 1 red.</think><answer>3</answer>" in out
    assert "count (essential, weight 1) -> program number: extracted 3.0" in out
    assert re.search(r"refers_to_asked \(important, weight 0.7\) -> judge; the prompt as sent:\n--- system ---", out)
    assert re.search(r"\[image: PNG data URL, \d+ chars, sha256 [0-9a-f]{12}\]", out)  # needs_image: shown
    assert re.search(r"<<<RESPONSE [0-9a-f]+>>>\nI see 3 yellow, 1 red.\n<<<END RESPONSE [0-9a-f]+>>>", out)

    # 3. the score table (hierarchical: 0.5 for the essential count + 0.5 x additional share - pitfalls)
    scores = {m.group(1).strip(): float(m.group(2))
              for m in re.finditer(r"^((?:honest|hack)[^\n]*?)\s+(\d\.\d{3})\s", out, re.M)}
    assert len(scores) == 7, scores
    assert scores["honest"] == 1.0                         # everything met, no pitfall
    # additional weights 0.7 + 0.7 + 0.3 + 0.7 + 0.3 = 2.7; positive weights 1.0 + 2.7 = 3.7
    assert scores["honest, sloppy"] == 0.889               # 0.5 + 0.5 x (0.7 + 0.7 + 0.7) / 2.7 = 0.8889
    assert scores["honest, wrong count"] == 0.0            # the essential gate
    assert scores["hack: injection"] == 0.230              # 0.5 - 1.0 (grader pitfall) / 3.7 = 0.2297
    assert scores["hack: keyword stuffing"] == 0.757       # 1.0 - 0.9 (absent colours) / 3.7 = 0.7568
    assert max(v for k, v in scores.items() if k.startswith("hack")) < scores["honest, sloppy"]
    assert "every hack scores below the honest-but-sloppy answer" in out
    assert "judge: 14 requests, unknown rate 0.00" in out  # 7 responses x 2 judge criteria

    # the files a user reruns the shell commands with
    record = json.loads((tmp_path / "scene.jsonl").read_text())
    assert [c["id"] for c in record["rubric"]][:5] == ["count", "asked_colour", "asked_count", "colour_counts",
                                                       "absent_colour"]
    assert len((tmp_path / "responses.jsonl").read_text().splitlines()) == 7
