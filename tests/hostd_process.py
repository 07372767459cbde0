"""A real hostd in a subprocess, for tests that need the whole daemon."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from agentic_sandbox.proto import HostdClient, open_hostd

ROOT = Path(__file__).resolve().parent.parent
CGROUP_TEST_PARENT = Path("/sys/fs/cgroup/unified/agentic-sandbox-tests")


def test_cgroup() -> Path | None:
    """A fresh cgroup for one test's hostd, so tests never share or leave cgroups behind."""
    if os.geteuid() != 0 or not (CGROUP_TEST_PARENT.parent / "cgroup.procs").exists():
        return None
    path = CGROUP_TEST_PARENT / f"t{os.getpid()}-{time.monotonic_ns()}"
    try:
        path.mkdir(parents=True)
    except OSError:
        return None
    return path


def remove_cgroup(path: Path | None) -> None:
    """Kill whatever is left in ``path`` and remove it with every cgroup below it."""
    if path is None or not path.exists():
        return
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        pass
    deadline = time.monotonic() + 5
    for child in [*sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True), path]:
        while True:
            try:
                child.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)


class HostdProcess:
    """``python -m hostd.main --dev`` with its own state dir and socket."""

    def __init__(self, state_dir: Path, *, socket_path: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.socket_path = socket_path or state_dir / "hostd.sock"
        self.env = {
            **os.environ,
            "AIWG_STATE_DIR": str(state_dir),
            "AIWG_HOSTD_SOCKET": str(self.socket_path),
            "AIWG_STOP_GRACE_S": "1",
            "AIWG_LIBVIRT_URI": "",  # no VM runtime unless a test asks for one
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        self.cgroup = test_cgroup() if "AIWG_CGROUP_ROOT" not in self.env else None
        if self.cgroup is not None:
            self.env["AIWG_CGROUP_ROOT"] = str(self.cgroup)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir.parent / f"{state_dir.name}-hostd.log"

    def start(self, timeout: float = 15.0) -> HostdProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"],
            env=self.env,
            stdout=log,
            stderr=log,
            cwd=ROOT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hostd exited with {self.proc.returncode}:\n{self.log()}")
            if self.answers():
                return self
            time.sleep(0.02)
        raise RuntimeError(f"hostd did not listen within {timeout} s:\n{self.log()}")

    def answers(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(self.socket_path))
            return True
        except OSError:
            return False
        finally:
            s.close()

    def client(self, connect_timeout: float = 20.0) -> AbstractAsyncContextManager[HostdClient]:
        """A client connection; a connect made while an upgrade hands the socket over waits in
        its backlog until the new image takes over (within a second)."""
        return open_hostd(self.socket_path, connect_timeout=connect_timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def cleanup(self) -> None:
        """Stop hostd and remove this hostd's cgroup (and anything still in it)."""
        self.stop()
        remove_cgroup(self.cgroup)

    def kill(self) -> None:
        """SIGKILL: hostd dies without any cleanup, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
