"""demos/grounding_inspector.py trains on configs/grounding-tiny.yaml and leaves a run the inspector reads."""

from pathlib import Path

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_grounding_demo_trains_and_stores_boxes(tmp_path, capsys):
    demo = load_script(ROOT / "demos" / "grounding_inspector.py")
    out = tmp_path / "g"
    assert demo.main(["--steps", "2", "--out", str(out), "--no-control", "--no-inspect"]) == 0
    assert f"mmrlvr inspect {out}" in capsys.readouterr().out
    from mmrlvr.store.reader import RolloutReader

    records = RolloutReader(out).read_step(2)
    assert records and all(r.gt_boxes for r in records)  # ground-truth boxes are stored for the image panel
