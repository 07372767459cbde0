"""Live fixtures for controller tests: a real hostd process and a real controller on a loopback port.

* ``hostd``: ``python -m hostd.main --dev`` with its own state dir and a short socket path (Unix
  socket paths are limited to 107 bytes, pytest's tmp paths are long). Teardown destroys every
  instance it holds (main processes are left running by a stopping hostd, by design), stops it,
  and asserts that no process it started is left.
* ``controller``: ``create_app`` served by ``hypercorn.trio.serve`` in the test's trio run on
  ``127.0.0.1:0``; yields a :class:`LiveController` with ``url``; ready (hostd link up) on entry.
* ``admin``, ``operator``, ``anon``: httpx clients with the admin token, the operator token, none.
* :class:`ControllerProcess`: ``python -m controller.main`` as a child process (restart tests, the
  process guard in a real controller).

Nothing here mocks hostd or the controller.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import trio
from hypercorn.trio import serve
from quart_trio import QuartTrio

from agentic_sandbox.controller.app import create_app
from agentic_sandbox.controller.config import ControllerConfig, advertised_url, load_config
from agentic_sandbox.controller.main import hypercorn_config
from agentic_sandbox.controller.state import AppState
from agentic_sandbox.proto import HostdError, open_hostd
from agentic_sandbox.proto import messages as m
from tests.hostd_process import ROOT, HostdProcess
from tests.processes import alive

ADMIN_TOKEN = "admin-token-" + "a" * 24
OPERATOR_TOKEN = "operator-token-" + "o" * 21
START_TIMEOUT_S = 20.0


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory under /tmp for sockets and state."""
    path = Path(tempfile.mkdtemp(prefix="aiwg-c-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- hostd -------------------------------------------------------------------------------------


class LiveHostd:
    """A hostd process the test can kill, stop, freeze and start again on the same state."""

    def __init__(self, base: Path, *, env: dict[str, str] | None = None) -> None:
        self.proc = HostdProcess(base / "hostd", socket_path=base / "hostd.sock", env=env)
        self.socket_path = str(self.proc.socket_path)
        self.seen: set[int] = set()

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    async def start(self) -> None:
        """Start hostd and wait for its ``READY=1`` on a notify socket we own (no probe connection)."""
        notify_path = self.proc.state_dir.parent / "notify.sock"
        notify_path.unlink(missing_ok=True)
        self.proc.state_dir.mkdir(parents=True, exist_ok=True)
        with trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            await notify.bind(str(notify_path))
            log = open(self.proc.log_path, "ab")  # noqa: SIM115 - handed to the child
            self.proc.proc = subprocess.Popen(
                [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"],
                # A readiness probe, not a service manager: it keeps no fds (tests/hostd/test_fdstore.py).
                env={**self.proc.env, "NOTIFY_SOCKET": str(notify_path), "AIWG_FD_STORE": "0"},
                stdout=log,
                stderr=log,
                cwd=ROOT,
            )
            log.close()
            with trio.fail_after(START_TIMEOUT_S):
                while True:
                    with trio.move_on_after(0.2):
                        if b"READY=1" in await notify.recv(4096):
                            return
                    if self.proc.proc.poll() is not None:
                        raise RuntimeError(f"hostd exited with {self.proc.proc.returncode}:\n{self.proc.log()}")

    def kill(self) -> None:
        self.seen |= descendants(self.pid)
        self.proc.kill()

    async def stop(self) -> None:
        self.seen |= descendants(self.pid)
        await trio.to_thread.run_sync(self.proc.stop)

    async def destroy_all(self) -> None:
        """Delete every warm pool and destroy every instance hostd holds (their main processes and
        containers outlive a stopping hostd)."""
        with trio.move_on_after(30):
            async with open_hostd(self.socket_path, client_name="test-cleanup") as client:
                for pool in (await client.call(m.PoolListRequest())).pools:
                    await client.call(m.PoolDeleteRequest(pool=pool.pool))
                while (await client.call(m.InstanceListRequest(pool_slots=True))).instances != (
                    await client.call(m.InstanceListRequest())
                ).instances:
                    await trio.sleep(0.05)  # the pools' slots are destroyed in the background
                for info in (await client.call(m.InstanceListRequest())).instances:
                    await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=0))

    async def instances(self) -> list[m.InstanceInfo]:
        async with open_hostd(self.socket_path, client_name="test") as client:
            return (await client.call(m.InstanceListRequest())).instances

    async def close(self) -> None:
        if self.proc.proc is not None and self.proc.proc.poll() is None:
            try:
                await self.destroy_all()
            except HostdError:
                pass
            await self.stop()
        left = alive(self.seen)
        for pid in left:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        assert not left, f"processes left behind by hostd: {left}\n{self.proc.log()}"


@pytest.fixture
async def hostd(short_dir: Path) -> AsyncIterator[LiveHostd]:
    live = LiveHostd(short_dir)
    await live.start()
    try:
        yield live
    finally:
        await live.close()


# -- the controller in-process -----------------------------------------------------------------


def controller_env(state_dir: Path, hostd_socket: str, **extra: str) -> dict[str, str]:
    env = {
        "AIWG_STATE_DIR": str(state_dir),
        "AIWG_HOSTD_SOCKET": hostd_socket,
        "AIWG_LISTEN": "127.0.0.1:0",
        "AIWG_ADMIN_TOKEN": ADMIN_TOKEN,
        "AIWG_OPERATOR_TOKEN": OPERATOR_TOKEN,
        "AIWG_HOSTD_CALL_TIMEOUT_S": "3",
        "AIWG_HOSTD_CONNECT_TIMEOUT_S": "1",
        "AIWG_HOSTD_PING_INTERVAL_S": "0.2",
        "AIWG_HOSTD_RECONNECT_MAX_S": "0.3",
    }
    env.update(extra)
    return env


@dataclass
class LiveController:
    url: str
    app: QuartTrio
    config: ControllerConfig

    @property
    def state(self) -> AppState:
        return self.app.extensions["aiwg"]

    def client(self, token: str | None = ADMIN_TOKEN, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=15, **kwargs)


@asynccontextmanager
async def serve_controller(config: ControllerConfig, *, wait_ready: bool = True) -> AsyncIterator[LiveController]:
    app = create_app(config)
    hc = hypercorn_config(config, graceful_timeout_s=1)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, hc, shutdown_trigger=stop.wait))
        live = LiveController(url=binds[0], app=app, config=config)
        live.state.hosts.listening_at(advertised_url(config, binds[0]))  # as main does once it bound its port
        try:
            if wait_ready:
                with trio.fail_after(START_TIMEOUT_S):
                    await live.state.link.wait_ready()
            yield live
        finally:
            stop.set()


@pytest.fixture
async def controller(hostd: LiveHostd, tmp_path: Path) -> AsyncIterator[LiveController]:
    config = load_config(env=controller_env(tmp_path / "controller", hostd.socket_path))
    async with serve_controller(config) as live:
        yield live


@pytest.fixture
async def admin(controller: LiveController) -> AsyncIterator[httpx.AsyncClient]:
    async with controller.client(ADMIN_TOKEN) as client:
        yield client


@pytest.fixture
async def operator(controller: LiveController) -> AsyncIterator[httpx.AsyncClient]:
    async with controller.client(OPERATOR_TOKEN) as client:
        yield client


@pytest.fixture
async def anon(controller: LiveController) -> AsyncIterator[httpx.AsyncClient]:
    async with controller.client(None) as client:
        yield client


# -- helpers the tests share --------------------------------------------------------------------


async def wait_operation(client: httpx.AsyncClient, op_id: str, timeout: float = 15.0) -> dict[str, Any]:
    """Poll ``GET /operations/{id}`` until it ends (bounded)."""
    with trio.fail_after(timeout):
        while True:
            response = await client.get(f"/api/v2/admin/operations/{op_id}")
            assert response.status_code == 200, response.text
            body = response.json()
            if body["state"] in ("succeeded", "failed", "canceled"):
                return body
            await trio.sleep(0.02)


async def provision(client: httpx.AsyncClient, name: str, **fields: Any) -> dict[str, Any]:
    """Provision a host instance, wait for the operation, return it (asserting success)."""
    response = await client.post("/api/v2/admin/instances", json={"name": name, "runtime": "host", **fields})
    assert response.status_code == 202, response.text
    op = await wait_operation(client, response.json()["id"])
    assert op["state"] == "succeeded", op
    return op


# -- the controller as a child process ------------------------------------------------------------


class ControllerProcess:
    """``python -m controller.main`` in a child process, stdout read for its URL."""

    def __init__(self, env: dict[str, str], *, dev: bool = False) -> None:
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        self.dev = dev
        self.proc: trio.Process | None = None
        self.url: str | None = None
        self.lines: list[str] = []
        self._line_seen = trio.Event()

    async def start(self, nursery: trio.Nursery) -> str:
        argv = [sys.executable, "-m", "agentic_sandbox.controller.main", *(["--dev"] if self.dev else [])]
        self.proc = await trio.lowlevel.open_process(
            argv, env=self.env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        nursery.start_soon(self._drain, self.proc)
        with trio.fail_after(START_TIMEOUT_S):
            # The URL ends at a space or, in a JSON log line (AIWG_LOG_FORMAT=json), at its quote.
            self.url = await self.wait_line(r"listening on (https?://[^\s\"]+)")
        return self.url

    async def _drain(self, proc: trio.Process) -> None:
        """Collect output lines; if the test ends early (cancelled), kill the child first."""
        assert proc.stdout is not None
        pending = b""
        try:
            async for chunk in proc.stdout:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                if complete:
                    self.lines.extend(line.decode(errors="replace") for line in complete)
                    self._line_seen.set()
                    self._line_seen = trio.Event()
        finally:
            if proc.returncode is None and proc.poll() is None:
                proc.kill()
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await proc.wait()

    async def wait_line(self, pattern: str) -> str:
        """First capture group of the first output line matching ``pattern`` (waits for it)."""
        regex = re.compile(pattern)
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if match := regex.search(line):
                    return match.group(1)
            seen = len(self.lines)
            if self.proc is not None and self.proc.poll() is not None and seen == len(self.lines):
                raise RuntimeError("controller exited:\n" + "\n".join(self.lines[-40:]))
            with trio.move_on_after(0.5):
                await self._line_seen.wait()

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        with trio.move_on_after(timeout):
            return await self.proc.wait()
        self.proc.kill()
        return await self.proc.wait()

    def output(self) -> str:
        return "\n".join(self.lines)
