"""Open the rollout inspector on a run folder (read-only; bound to 127.0.0.1 unless --host says otherwise).

``mmrlvr inspect RUN_DIR [--host 127.0.0.1] [--port 7860] [--auth USER:PASS | --insecure]``.

The app only reads the run folder (it can stay open while the run trains) and is bound to 127.0.0.1
unless ``--host`` says otherwise. Binding to any other address exposes the run's rollouts to that
network, so it needs either ``--auth USER:PASS`` (Gradio's login page) or an explicit ``--insecure``,
and always prints a warning. Whatever the host, only ``images/`` and ``rollouts/`` of the run are served
as files: never ``config.yaml`` (it may name endpoints or keys), checkpoints or logs.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from mmrlvr.errors import UserError

#: environment variable read when --auth is not given (keeps the password out of the shell history / ps)
AUTH_ENV = "MMRLVR_INSPECT_AUTH"


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, ``localhost``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything: treat it as exposed


def parse_auth(value: str, where: str = "--auth") -> tuple[str, str]:
    """``"user:pass"`` -> ``("user", "pass")`` (the password may contain ':'); both parts non-empty."""
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise UserError(f"{where}: expected USER:PASS with a non-empty user and password, got "
                        f"{'an empty value' if not value else 'no password' if sep or user else repr(value)}")
    return user, password


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmrlvr inspect", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", help="run folder (with rollouts/step-*.parquet, images/, metrics.jsonl)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; use an SSH tunnel to share). "
                        "Any other address needs --auth or --insecure")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    p.add_argument("--auth", default=None, metavar="USER:PASS",
                   help=f"require this login (Gradio's auth); default: ${AUTH_ENV} when set")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --host without a login (anyone who can reach it reads the rollouts)")
    p.add_argument("--refresh-seconds", type=float, default=5.0,
                   help="how often the app looks for new steps while following a run (default 5)")
    return p.parse_args(argv)


def resolve_auth(args: argparse.Namespace) -> tuple[str, str] | None:
    """The login from ``--auth`` or ``$MMRLVR_INSPECT_AUTH``; refuses an exposed host without one (unless
    ``--insecure``). Runs before gradio is imported, so a mistake costs nothing."""
    if args.auth is not None:
        auth = parse_auth(args.auth)
    elif os.environ.get(AUTH_ENV):
        auth = parse_auth(os.environ[AUTH_ENV], where=f"${AUTH_ENV}")
    else:
        auth = None
    if not is_loopback(args.host) and auth is None and not args.insecure:
        raise UserError(f"--host {args.host} makes the inspector reachable from other machines; pass --auth USER:PASS "
                        f"(or set ${AUTH_ENV}) to require a login, or --insecure to serve it without one")
    return auth


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
    auth = resolve_auth(args)
    if not is_loopback(args.host):
        print(f"mmrlvr inspect: WARNING: binding {args.host}:{args.port} exposes this run's rollouts and images to "
              f"every machine that can reach it ({'login required' if auth else 'NO login: --insecure'}); "
              "only images/ and rollouts/ are served, never config.yaml or checkpoints", file=sys.stderr)
    from mmrlvr.inspector import app as inspector_app  # gradio import is slow: only when needed

    app = inspector_app.build_app(run_dir, refresh_s=args.refresh_seconds)
    print(f"mmrlvr inspect: serving {run_dir.resolve()} on http://{args.host}:{args.port}"
          + (" (login required)" if auth else ""))
    inspector_app.launch(app, host=args.host, port=args.port, auth=auth)
    return 0
