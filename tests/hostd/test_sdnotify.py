"""sd_notify against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

from agentic_sandbox.hostd import sdnotify


class Listener:
    """The manager's end: a bound SOCK_DGRAM socket and the env that points at it."""

    def __init__(self, sock: socket.socket, env_value: str) -> None:
        self.sock = sock
        self.env = {"NOTIFY_SOCKET": env_value}

    def receive(self, timeout: float = 5.0) -> str:
        self.sock.settimeout(timeout)
        return self.sock.recv(4096).decode()

    def pending(self) -> list[str]:
        """Every datagram already queued, without waiting."""
        out = []
        self.sock.setblocking(False)
        while True:
            try:
                out.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return out


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        yield Listener(sock, str(path))


@pytest.fixture
def abstract_listener() -> Iterator[Listener]:
    name = f"aiwg-test-notify-{os.getpid()}-{os.urandom(4).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        yield Listener(sock, "@" + name)


def test_ready_stopping_watchdog_status(listener: Listener) -> None:
    assert sdnotify.ready(env=listener.env)
    assert listener.receive() == "READY=1"
    assert sdnotify.ready("listening on x", env=listener.env)
    assert listener.receive() == "READY=1\nSTATUS=listening on x"
    assert sdnotify.stopping(env=listener.env)
    assert listener.receive() == "STOPPING=1"
    assert sdnotify.watchdog(env=listener.env)
    assert listener.receive() == "WATCHDOG=1"
    # A newline in a status must not smuggle in a second assignment.
    assert sdnotify.status("two\nREADY=1", env=listener.env)
    assert listener.receive() == "STATUS=two READY=1"


def test_reads_os_environ_by_default(listener: Listener, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", listener.env["NOTIFY_SOCKET"])
    assert sdnotify.ready()
    assert listener.receive() == "READY=1"


def test_abstract_socket(abstract_listener: Listener) -> None:
    assert sdnotify.socket_address(abstract_listener.env) == "\0" + abstract_listener.env["NOTIFY_SOCKET"][1:]
    assert sdnotify.notify("READY=1\nSTATUS=abstract", env=abstract_listener.env)
    assert abstract_listener.receive() == "READY=1\nSTATUS=abstract"


def test_no_socket_is_a_noop() -> None:
    assert sdnotify.socket_address({}) is None
    assert not sdnotify.ready(env={})
    assert not sdnotify.stopping(env={})
    assert not sdnotify.watchdog(env={})
    assert not sdnotify.status("x", env={})
    # A relative path is not an address systemd would hand out.
    assert not sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": "relative.sock"})


def test_unreachable_socket_reports_false(tmp_path: Path) -> None:
    assert not sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "nobody.sock")})


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "500000"}, 0.25),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "me"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert sdnotify.watchdog_interval_s(env) == expected


async def test_run_watchdog_pings_every_half_period(listener: Listener, autojump_clock: trio.testing.MockClock) -> None:
    env = {**listener.env, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    async with trio.open_nursery() as nursery:
        interval = await nursery.start(partial(sdnotify.run_watchdog, env=env))
        assert interval == 15.0
        start = trio.current_time()
        # The first ping goes out at once, then one per interval: 0, 15, 30, 45 s.
        await trio.sleep(50)
        nursery.cancel_scope.cancel()
    assert trio.current_time() - start == pytest.approx(50)
    assert listener.pending() == ["WATCHDOG=1"] * 4


async def test_run_watchdog_returns_without_watchdog(listener: Listener) -> None:
    async with trio.open_nursery() as nursery:
        assert await nursery.start(partial(sdnotify.run_watchdog, env=listener.env)) is None
    # A watchdog without a socket has nobody to ping either.
    async with trio.open_nursery() as nursery:
        env = {"WATCHDOG_USEC": "1000000"}
        assert await nursery.start(partial(sdnotify.run_watchdog, env=env)) is None
    assert listener.pending() == []


def test_hostd_reports_ready_watchdog_stopping(listener: Listener, tmp_path: Path) -> None:
    """The real daemon, as systemd would run it: READY=1 once listening, pings, STOPPING=1."""
    env = {
        **os.environ,
        **listener.env,
        "WATCHDOG_USEC": "200000",  # a ping every 0.1 s
        "AIWG_STATE_DIR": str(tmp_path / "state"),
        "AIWG_HOSTD_SOCKET": str(tmp_path / "h.sock"),
        "AIWG_CGROUP_ROOT": "off",
    }
    with (tmp_path / "hostd.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"], env=env, stdout=log, stderr=log
        )
    try:
        # Pings may come before READY=1 (the watchdog task starts with the server).
        while not (message := listener.receive(timeout=20)).startswith("READY=1"):
            assert message == "WATCHDOG=1"
        assert message.startswith("READY=1\nSTATUS=listening on "), message
        assert (tmp_path / "h.sock").exists()  # READY only once the socket is there
        assert [listener.receive(), listener.receive()] == ["WATCHDOG=1", "WATCHDOG=1"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "STOPPING=1" in listener.pending()
