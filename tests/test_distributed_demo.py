"""The demo's config on 2 ranks, as docs/scaling.md tells a user to scale it up: it trains, and its exported
weights equal a one-process run's (prefix sharing off on both sides: several processes take the whole-row
passes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from multiproc import run, torchrun_cmd

ROOT = Path(__file__).resolve().parents[1]


def _exported(run_dir: Path, out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    res = run([sys.executable, "-m", "mmrlvr.cli", "export", str(run_dir), "--out", str(out)])
    assert res.returncode == 0, res.stderr[-3000:]
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(f))
    assert tensors, f"no safetensors in {out}"
    return tensors


@pytest.mark.matrix  # run beside the multi-process matrix, after the suite (.ci/run)
def test_demo_tiny_on_two_ddp_ranks_exports_what_one_process_exports(tmp_path):
    args = ["-m", "mmrlvr.cli", "train", str(ROOT / "configs" / "demo-tiny.yaml"), "distributed.strategy=ddp",
            "max_steps=2", "model.prefix_sharing=false", "progress=false"]
    one = run([sys.executable, *args, f"output_dir={tmp_path / 'one'}"])
    assert one.returncode == 0, one.stderr[-3000:]
    two = run(torchrun_cmd(*args, f"output_dir={tmp_path / 'two'}"))
    assert two.returncode == 0, two.stderr[-3000:]
    topo = json.loads((tmp_path / "two" / "topology.json").read_text())
    assert (topo["world_size"], topo["strategy"]) == (2, "ddp")
    a, b = _exported(tmp_path / "one", tmp_path / "one-export"), _exported(tmp_path / "two", tmp_path / "two-export")
    assert a.keys() == b.keys()
    moved = 0
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-5, msg=name)
    # the premise: training moved the weights (a run that did nothing would also be equal)
    from mmrlvr.train.model_path import resolve_model_path
    from safetensors.torch import load_file

    base = {}
    for f in sorted(Path(resolve_model_path("tiny:qwen2_5_vl:warm")).glob("*.safetensors")):
        base.update(load_file(f))
    moved = sum(not torch.equal(a[n], base[n]) for n in a if n in base)
    assert moved > 0
    rows = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
