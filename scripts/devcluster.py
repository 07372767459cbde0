#!/usr/bin/env python3
"""``make cluster``: several controllers on one PostgreSQL database beside one hostd, to try the
shared store (docs/postgresql.md) on one machine.

What it starts, in order, everything in dev mode as ``make run`` does (scripts/devrun.py, whose
:func:`devrun.supervise` runs the daemons here, with its rules for stopping them):

1. PostgreSQL: a private server (scripts/pgcluster.py: ``initdb`` in a fresh temp dir, 127.0.0.1
   on a free port, trust authentication) holding one empty database, ``aiwg``. It is new at every
   start and removed at the end: the controllers adopt hostd's instances into the empty catalog
   (the ``dev`` instance gets a new A2A token). With ``AIWG_DATABASE_URL`` set, that database is
   used instead, and no server is started or stopped.
2. ``agentic-hostd --dev``, as ``make run`` starts it (its podman service, VMs as root).
3. One ``agentic-controller --dev`` per port of ``--ports`` (default 8122,8123,8124), each once the
   one before it listens: the same environment but ``AIWG_LISTEN``, so the same
   ``AIWG_DATABASE_URL`` and the same ``AIWG_STATE_DIR`` (default ``./.run``: they share the admin
   token and the task files, as the controllers of one host do). A setting that names a port of its
   own (``AIWG_GRPC_LISTEN``, ``AIWG_LEGACY_PTY_LISTEN``) is given to the first controller only.

Then it prints where each controller and the database are. Ctrl-C or SIGTERM stops the
controllers, then hostd, then the PostgreSQL server; a child that exits on its own stops the rest,
and the wrapper exits with its status. ``make run`` and ``make cluster`` share the state dir and the
ports, so one runs at a time.

Run it with the venv's python (``.venv/bin/python scripts/devcluster.py [--ports P1,P2,...]``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import devrun  # beside this script
import pgcluster  # beside this script

PROG = "devcluster"
DATABASE = "aiwg"
DEFAULT_PORTS = "8122,8123,8124"
HOST = "127.0.0.1"
READY_WAIT_S = 60.0
#: Settings naming a port of their own: the first controller keeps them, the others would collide.
FIRST_ONLY = ("AIWG_GRPC_LISTEN", "AIWG_LEGACY_PTY_LISTEN")

Named = list[tuple[str, dict[str, str]]]


def controller_envs(env: dict[str, str], url: str, ports: list[int]) -> Named:
    """Each controller's name and environment (see the module docstring)."""
    named: Named = []
    for number, port in enumerate(ports, 1):
        own = {**env, "AIWG_LISTEN": f"{HOST}:{port}", "AIWG_DATABASE_URL": url}
        if number > 1:
            for key in FIRST_ONLY:
                own.pop(key, None)
        named.append((f"controller {number}", own))
    return named


def _ready(base: str) -> bool:
    """Until ``base/readyz`` says ready (up to ``READY_WAIT_S``): whether it did."""
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=1):
                return True
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    return False


def announce(controllers: Named, state_dir: str, database: str) -> None:
    """devrun's lines for the first controller (the dev token, the console), then, once every
    controller is ready (or the wait is over), the cluster's: the last lines a person sees."""
    devrun.announce(controllers[0][1], state_dir)
    lines = [f"cluster: {len(controllers)} controllers, one hostd, one database (any controller answers any request)"]
    for name, env in controllers:
        base = f"http://{env['AIWG_LISTEN']}"
        said = "ready" if _ready(base) else "NOT READY (see its log)"
        lines.append(f"  {name}: {base}   {said}: {base}/readyz")
    lines.append(f"  database:     {database}")
    lines.append(f"  shared state: {state_dir}   admin token: {os.path.join(state_dir, 'admin-token')}")
    lines.append("  put an HTTP load balancer in front of them, or kill one and use another: docs/postgresql.md")
    print("\n".join(lines), flush=True)


def _ports(text: str) -> list[int]:
    try:
        ports = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ports") from None
    if not ports or len(set(ports)) != len(ports) or not all(0 < p < 65536 for p in ports):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct ports between 1 and 65535")
    return ports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0].strip("`: "))
    parser.add_argument(
        "--ports", type=_ports, default=_ports(DEFAULT_PORTS), help=f"one controller per port (default {DEFAULT_PORTS})"
    )
    args = parser.parse_args(argv)
    # A stop while the database server starts (before devrun's handlers are in place) cleans up too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    env = dict(os.environ)
    env.setdefault("AIWG_STATE_DIR", str(devrun.ROOT / ".run"))
    state_dir = env["AIWG_STATE_DIR"]
    server: pgcluster.PgCluster | None = None
    try:
        url = env.get("AIWG_DATABASE_URL")
        if url:
            shown = "AIWG_DATABASE_URL (as set; kept as it is at the end)"
        else:
            missing = pgcluster.missing()
            if missing is not None:
                print(f"{PROG}: {missing}; install it (make sysdeps) or set AIWG_DATABASE_URL", file=sys.stderr)
                return 1
            server = pgcluster.PgCluster()
            try:
                url = server.start().create_database(DATABASE)
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", None) or exc
                print(f"{PROG}: the PostgreSQL server did not start: {str(detail).strip()}", file=sys.stderr)
                return 1
            shown = f"{url}   (a private server in {server.root}, removed at the end)"
        devrun.prepare_podman(env)
        controllers = controller_envs(env, url, args.ports)
        return devrun.supervise(env, controllers, lambda: announce(controllers, state_dir, shown))
    except KeyboardInterrupt:
        return 0
    finally:
        # Last, once the controllers and hostd are gone; a second signal must not cut it short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if server is not None:
            server.stop()
            server.remove()


if __name__ == "__main__":
    sys.exit(main())
