"""``mmrlvr inspect RUN_DIR [--host 127.0.0.1] [--port 7860]``: open the rollout inspector on a run.

The app only reads the run folder (it can stay open while the run trains) and is bound to 127.0.0.1
unless ``--host`` says otherwise: binding to another address exposes the run's rollouts to that network.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mmrlvr.errors import UserError


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmrlvr inspect", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", help="run folder (with rollouts/step-*.parquet, images/, metrics.jsonl)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; use an SSH tunnel to share)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    p.add_argument("--refresh-seconds", type=float, default=5.0,
                   help="how often the app looks for new steps while following a run (default 5)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run folder {run_dir} does not exist")
    if not (run_dir / "rollouts").is_dir() and not (run_dir / "metrics.jsonl").is_file():
        raise UserError(f"{run_dir} does not look like a run folder (no rollouts/ and no metrics.jsonl); "
                        "pass the folder given as output_dir to `mmrlvr train`")
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be in 1..65535, got {args.port}")
    if args.refresh_seconds <= 0:
        raise UserError("--refresh-seconds must be positive")
    from mmrlvr.inspector.app import build_app, launch  # gradio import is slow: only when needed

    app = build_app(run_dir, refresh_s=args.refresh_seconds)
    print(f"mmrlvr inspect: serving {run_dir.resolve()} on http://{args.host}:{args.port}")
    launch(app, host=args.host, port=args.port)
    return 0
