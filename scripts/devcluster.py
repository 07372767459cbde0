#!/usr/bin/env python3
"""``make cluster``: several controllers on one PostgreSQL database beside one hostd, or several
hosts (a hostd each) on it, to try the shared store (docs/postgresql.md) and many hosts
(docs/hosts.md) on one machine.

What it starts, in order, everything in dev mode as ``make run`` does (scripts/devrun.py, whose
:func:`devrun.supervise` runs the daemons here, with its rules for stopping them):

1. PostgreSQL: a private server (scripts/pgcluster.py: ``initdb`` in a fresh temp dir, 127.0.0.1
   on a free port, trust authentication) holding one empty database, ``aiwg``. It is new at every
   start and removed at the end: the controllers adopt hostd's instances into the empty catalog
   (the ``dev`` instance gets a new A2A token). With ``AIWG_DATABASE_URL`` set, that database is
   used instead, and no server is started or stopped.
2. ``agentic-hostd --dev``, as ``make run`` starts it (its podman service, VMs as root); with
   ``--hosts N`` (default 1), N of them, all started before any controller (:func:`host_envs`).
3. One ``agentic-controller --dev`` per port of ``--ports`` (default 8122,8123,8124), each once the
   one before it listens: the same environment but ``AIWG_LISTEN``, so the same
   ``AIWG_DATABASE_URL`` and the same ``AIWG_STATE_DIR`` (default ``./.run``: they share the admin
   token and the task files, as the controllers of one host do). A setting that names a port of its
   own (``AIWG_GRPC_LISTEN``, ``AIWG_LEGACY_PTY_LISTEN``) is given to the first controller only.
   With several hosts, controller i serves host ((i-1) mod N)+1, so every host has one at least,
   with that host's environment (:func:`controller_envs`).

Several hosts: host 1 is the hostd above, on the state dir; host k > 1 is a hostd on
``<state dir>/host-k``, with its own socket (``hostd.sock``), host id, instances and podman
service there (:func:`host_envs`). Each controller gets its host's ``AIWG_STATE_DIR`` (task files
and storage are per host) and ``AIWG_HOSTD_SOCKET``, ``AIWG_HOST_LABELS=host=<k>`` (replacing one
set), and host 1's admin token file (``AIWG_ADMIN_TOKEN_FILE``: one admin token for the cluster,
which the first controller writes). The controllers register their hosts in the database and
forward a request for an instance on another host to that host's controllers.

Then it prints where each controller (and its host) and the database are. Ctrl-C or SIGTERM stops
the controllers, then every hostd, then the PostgreSQL server; a child that exits on its own stops
the rest, and the wrapper exits with its status. ``make run`` and ``make cluster`` share the state
dir and the ports, so one runs at a time.

Run it with the venv's python
(``.venv/bin/python scripts/devcluster.py [--ports P1,P2,...] [--hosts N]``).
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

from agentic_sandbox.proto import dev_hostd_socket

PROG = "devcluster"
DATABASE = "aiwg"
DEFAULT_PORTS = "8122,8123,8124"
HOST = "127.0.0.1"
READY_WAIT_S = 60.0
#: Settings naming a port of their own: the first controller keeps them, the others would collide.
FIRST_ONLY = ("AIWG_GRPC_LISTEN", "AIWG_LEGACY_PTY_LISTEN")

Named = list[tuple[str, dict[str, str]]]


def host_state_dir(state_dir: str, host: int) -> str:
    """Host ``host``'s state dir (from 1): the state dir itself for host 1, ``host-<k>`` in it after."""
    return state_dir if host == 1 else os.path.join(state_dir, f"host-{host}")


def host_envs(env: dict[str, str], hosts: int) -> Named:
    """Each hostd's name and environment: ``env`` itself (and the name ``hostd``) for one host.

    With several, host k > 1 gets its own ``AIWG_STATE_DIR`` (the dev socket, host id, instances,
    spool and podman settings all derive from it) and ``AIWG_HOSTD_SOCKET`` there (one set for host 1
    would name host 1's). Nothing else needs to differ for two hostds on one machine: they share
    the cgroup parent (``AIWG_CGROUP_ROOT``, or the detected ``agentic-sandbox`` subtree), where
    each instance's cgroup is named by its id, unique in the shared catalog, and hostd never
    sweeps the parent; tree marks, container labels and domain metadata carry a namespace
    derived from the state dir; container and domain names carry the instance id.
    """
    if hosts == 1:
        return [("hostd", env)]
    named: Named = [("hostd 1", env)]
    for host in range(2, hosts + 1):
        state_dir = host_state_dir(env["AIWG_STATE_DIR"], host)
        named.append(
            (f"hostd {host}", {**env, "AIWG_STATE_DIR": state_dir, "AIWG_HOSTD_SOCKET": dev_hostd_socket(state_dir)})
        )
    return named


def prepare_podman(hostds: Named) -> None:
    """Give every hostd a podman service of its own (devrun's, in its state dir), as separate
    hosts have; with ``AIWG_PODMAN_SOCKET`` set by hand, every hostd uses that one as it is."""
    first = hostds[0][1]
    configured = bool(first.get("AIWG_PODMAN_SOCKET"))
    devrun.prepare_podman(first)  # or a note that there is no container runtime, said once
    if configured or not first.get("AIWG_PODMAN_SOCKET"):
        return
    for _, env in hostds[1:]:
        devrun.prepare_podman(env)


def controller_envs(env: dict[str, str], url: str, ports: list[int], hostds: Named | None = None) -> Named:
    """Each controller's name and environment (see the module docstring); ``hostds`` (from
    :func:`host_envs`) as many as the ports at most, None for one host."""
    hostds = hostds or [("hostd", env)]
    several = len(hostds) > 1
    admin_token_file = env.get("AIWG_ADMIN_TOKEN_FILE") or os.path.join(env["AIWG_STATE_DIR"], "admin-token")
    named: Named = []
    for number, port in enumerate(ports, 1):
        host = (number - 1) % len(hostds) + 1
        own = {**hostds[host - 1][1], "AIWG_LISTEN": f"{HOST}:{port}", "AIWG_DATABASE_URL": url}
        if several:
            own["AIWG_HOSTD_SOCKET"] = own.get("AIWG_HOSTD_SOCKET") or dev_hostd_socket(own["AIWG_STATE_DIR"])
            own["AIWG_ADMIN_TOKEN_FILE"] = admin_token_file
            own["AIWG_HOST_LABELS"] = f"host={host}"
        if number > 1:
            for key in FIRST_ONLY:
                own.pop(key, None)
        named.append((f"controller {number} (host {host})" if several else f"controller {number}", own))
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


def announce(controllers: Named, hostds: Named, database: str) -> None:
    """devrun's lines for the first controller (the dev token, the console), then, once every
    controller is ready (or the wait is over), the cluster's: the last lines a person sees."""
    state_dir = hostds[0][1]["AIWG_STATE_DIR"]
    devrun.announce(controllers[0][1], state_dir)
    if len(hostds) == 1:
        lines = [
            f"cluster: {len(controllers)} controllers, one hostd, one database (any controller answers any request)"
        ]
    else:
        lines = [
            f"cluster: {len(controllers)} controllers on {len(hostds)} hosts (a hostd each), one database "
            "(any controller answers any request, forwarding it to the instance's host)"
        ]
    for name, env in controllers:
        base = f"http://{env['AIWG_LISTEN']}"
        said = "ready" if _ready(base) else "NOT READY (see its log)"
        lines.append(f"  {name}: {base}   {said}: {base}/readyz")
    lines.append(f"  database:     {database}")
    if len(hostds) == 1:
        lines.append(f"  shared state: {state_dir}   admin token: {os.path.join(state_dir, 'admin-token')}")
        lines.append("  put an HTTP load balancer in front of them, or kill one and use another: docs/postgresql.md")
    else:
        for host, (_, env) in enumerate(hostds, 1):
            lines.append(f"  host {host} state: {env['AIWG_STATE_DIR']}")
        token_file = controllers[0][1]["AIWG_ADMIN_TOKEN_FILE"]
        lines.append(f"  admin token:  {token_file}   (the hosts: GET /api/v2/admin/hosts at any controller)")
        lines.append("  provision on a host (host_label host=2), call it at any controller: docs/hosts.md")
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
    parser.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="hosts (a hostd each), the controllers spread over them in the order of --ports (default 1)",
    )
    args = parser.parse_args(argv)
    if args.hosts < 1:
        parser.error(f"argument --hosts: {args.hosts} hosts: give 1 or more")
    if args.hosts > len(args.ports):
        parser.error(
            f"argument --hosts: {args.hosts} hosts need {args.hosts} controllers at least, "
            f"one per port of --ports ({len(args.ports)} given)"
        )
    # A stop while the database server starts (before devrun's handlers are in place) cleans up too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    env = dict(os.environ)
    env.setdefault("AIWG_STATE_DIR", str(devrun.ROOT / ".run"))
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
        hostds = host_envs(env, args.hosts)
        prepare_podman(hostds)
        controllers = controller_envs(env, url, args.ports, hostds)
        return devrun.supervise(hostds, controllers, lambda: announce(controllers, hostds, shown))
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
