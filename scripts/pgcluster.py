#!/usr/bin/env python3
"""A private PostgreSQL cluster in a directory: ``initdb``, ``pg_ctl`` start/stop/restart, one
database per user of it. For the test suite (one cluster per session, one database per test) and
``scripts/devcluster.py`` (a local cluster to try several controllers on).

Debian's ``postgresql`` package (installed by ``scripts/install-system-deps.sh``) puts the server
binaries in ``/usr/lib/postgresql/<major>/bin``. The server refuses to run as root, so as root the
cluster belongs to the ``postgres`` user (made by that package) and every server command runs as
it (``setpriv``); its directory is outside any root-only temp dir. It listens on 127.0.0.1 at a
free port and on a Unix socket in its directory, with ``trust`` authentication for loopback (a
private cluster of a test run or a developer, never a deployment: see docs/postgresql.md).

``python scripts/pgcluster.py DIR`` starts one in ``DIR`` and prints its URL (stop it with
``pg_ctl -D DIR/data stop``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

USER = "aiwg"
SERVER_USER = "postgres"


def server_bin() -> Path | None:
    """The newest installed server's bin directory, None when there is none."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


def missing() -> str | None:
    """Why no cluster can be made here, or None."""
    if server_bin() is None:
        return "PostgreSQL's server is not installed (Debian package postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} user to run the server as"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """One server in ``root`` (made if missing, a fresh private temp dir when None)."""

    def __init__(self, root: Path | None = None, *, port: int | None = None) -> None:
        self.owns_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="aiwg-pg-")) if root is None else root
        self.data = self.root / "data"
        self.port = port or free_port()
        self.bin = server_bin()
        self._dbs = 0
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["setpriv", f"--reuid={SERVER_USER}", f"--regid={SERVER_USER}", "--init-groups", "--"]

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.bin is not None
        cmd = [*self._as, str(self.bin / argv[0]), *argv[1:]]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120, cwd="/")

    def start(self) -> PgCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as:
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o700)
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")
        self._pg_ctl("start")
        return self

    def _pg_ctl(self, action: str, *extra: str) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c max_connections=200 -c full_page_writes=off"
        )
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "-t", "60", action, *extra)

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self._pg_ctl("start")

    def remove(self) -> None:
        self.stop("immediate")
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        if name is None:
            self._dbs += 1
            name = f"t{os.getpid()}_{self._dbs}"
        self._run("psql", "-h", str(self.root), "-p", str(self.port), "-U", USER, "-d", "postgres",
                  "-q", "-c", f'CREATE DATABASE "{name}"')  # fmt: skip
        return self.url(name)

    def psql(self, dbname: str, sql: str) -> str:
        out = self._run("psql", "-h", str(self.root), "-p", str(self.port), "-U", USER, "-d", dbname,
                        "-qAt", "-c", sql)  # fmt: skip
        return out.stdout


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: pgcluster.py DIR", file=sys.stderr)
        return 2
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 1
    cluster = PgCluster(Path(sys.argv[1]).resolve()).start()
    print(cluster.url())
    return 0


if __name__ == "__main__":
    sys.exit(main())
