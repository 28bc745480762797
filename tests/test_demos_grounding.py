"""demos/grounding_inspector.py trains on configs/grounding-tiny.yaml and leaves a run the inspector reads."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_grounding_demo_trains_and_stores_boxes(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("grounding_demo", ROOT / "demos" / "grounding_inspector.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    out = tmp_path / "g"
    assert demo.main(["--steps", "2", "--out", str(out), "--no-control", "--no-inspect"]) == 0
    assert f"mmrlvr inspect {out}" in capsys.readouterr().out
    from mmrlvr.store.reader import RolloutReader

    records = RolloutReader(out).read_step(2)
    assert records and all(r.gt_boxes for r in records)  # ground-truth boxes are stored for the image panel
