"""The two servers bench_growth.py measures as their stores grow, each on a store of its own:
the controller (``python -m agentic_sandbox.controller.main`` on its default SQLite store) and
a2a-sdk's own server (``peer_a2a_server.py`` on the SDK's ``DatabaseTaskStore`` in SQLite).

Each is started, timed from the spawn to ready, and stopped (:meth:`Server.stop` also when the
bench ends early: the bench registers it), and filled while stopped by ``growth_fill.py`` in a
child process. Child processes get the bench's ``PYTHONPATH`` in front of the repository
(:func:`child_env`), so the bench can measure another tree's code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
import trio
from bench_a2a import RUNTIME_EXTENSION, admin_provision_loadout, free_port
from bench_admin import Controller, admin_client
from common import MIB, ROOT

BENCH = Path(__file__).resolve().parent
START_TIMEOUT_S = 120.0
OURS, PEER = "controller", "a2a-sdk (SQLite)"


#: The filled tasks all belong to one instance: the retention's default count per instance would
#: prune them in the background while the sizes are measured.
RETENTION_OFF = {"AIWG_TASK_RETENTION_PER_INSTANCE": "0"}


def child_env() -> dict[str, str]:
    """The bench's PYTHONPATH in front of the repository's (see the module docstring)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)}


def fill(args: list[str]) -> dict[str, Any]:
    """``growth_fill.py`` in a child process; its JSON answer."""
    env = {**os.environ, **child_env()}
    out = subprocess.run(
        [sys.executable, str(BENCH / "growth_fill.py"), *args], env=env, cwd=ROOT, capture_output=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"growth_fill.py {' '.join(args)}: {out.stderr.decode(errors='replace')[-3000:]}")
    return dict(json.loads(out.stdout))


def rss_mib(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_info().rss / MIB
    except psutil.Error:
        return float("nan")


class Server(ABC):
    """One side of the task cases: a controller, or the a2a-sdk peer, on a store of its own."""

    name: str
    db_file: Path
    pid: int
    agent_url: str
    headers: dict[str, str]

    @abstractmethod
    async def start(self) -> int:
        """Start it; ns from the spawn to ready."""

    @abstractmethod
    def stop(self) -> None:
        """Stop it."""

    @abstractmethod
    def fill(self, count: int) -> dict[str, Any]:
        """Add ``count`` tasks to its store, through the store's own write path (it is stopped)."""


class Ours(Server):
    name = OURS

    def __init__(self, state_dir: Path, hostd_socket: Path, token: str) -> None:
        self.state_dir, self.hostd_socket, self.token = state_dir, hostd_socket, token
        self.db_file = state_dir / "controller.db"
        self.ctl: Controller | None = None
        self.instance_id = ""
        self.headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0", "A2A-Extensions": RUNTIME_EXTENSION}

    async def start(self) -> int:
        t0 = time.perf_counter_ns()
        log = self.state_dir.parent / "controller.log"
        self.ctl = ctl = await trio.to_thread.run_sync(
            partial(
                Controller,
                self.state_dir,
                self.hostd_socket,
                {**child_env(), **RETENTION_OFF},
                token=self.token,
                log_path=log,
            )
        )
        async with httpx.AsyncClient(base_url=ctl.url) as probe:
            with trio.fail_after(START_TIMEOUT_S):
                while (await probe.get("/readyz")).status_code != 200:
                    await trio.sleep(0.005)
        elapsed = time.perf_counter_ns() - t0
        self.pid = ctl.proc.pid
        self.agent_url = f"{ctl.url}/agents/{self.instance_id}"
        return elapsed

    async def provision(self) -> None:
        """The echo instance every task of this side runs on (before the first fill)."""
        await self.start()
        assert self.ctl is not None
        async with admin_client(self.ctl.url, self.token) as admin:
            self.instance_id = await admin_provision_loadout(admin, "bench-growth-echo", "echo")
        self.stop()

    def stop(self) -> None:
        if self.ctl is not None:
            self.ctl.stop()
            self.ctl = None

    def fill(self, count: int) -> dict[str, Any]:
        return fill(["controller", str(self.db_file), self.instance_id, str(count)])


class Peer(Server):
    name = PEER

    def __init__(self, db_file: Path, via: str) -> None:
        self.db_file, self.via = db_file, via
        self.proc: subprocess.Popen[bytes] | None = None
        self.headers = {"A2A-Version": "1.0"}

    async def start(self) -> int:
        port = free_port()
        argv = [sys.executable, str(BENCH / "peer_a2a_server.py"), str(port), str(self.db_file)]
        t0 = time.perf_counter_ns()
        self.proc = proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, env={**os.environ, **child_env()}
        )
        assert proc.stdout is not None
        if (await trio.to_thread.run_sync(proc.stdout.readline)).strip() != b"ready":
            raise RuntimeError("the a2a-sdk peer did not start")
        self.pid = proc.pid
        self.agent_url = f"http://127.0.0.1:{port}/agents/peer"
        async with httpx.AsyncClient(base_url=self.agent_url, headers=self.headers) as probe:
            await probe.get(f"/tasks/{uuid.uuid4()}")  # its first answer (a 404): the store opened
        return time.perf_counter_ns() - t0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def fill(self, count: int) -> dict[str, Any]:
        return fill(["peer", str(self.db_file), str(count), "--via", self.via])
