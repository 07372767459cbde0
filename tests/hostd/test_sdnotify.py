"""sd_notify against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import array
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

from agentic_sandbox.hostd import sdnotify
from tests.service_manager import ServiceManager


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
        "AIWG_FD_STORE": "0",  # this listener keeps no fds (tests/hostd/test_fdstore.py does)
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


# The file descriptor store, against the stand-in for systemd (tests/service_manager.py).


class Pipes:
    """Pipes whose read ends go to the store; a write end tells whether anyone still holds its read end."""

    def __init__(self, count: int) -> None:
        self.pairs = [os.pipe() for _ in range(count)]
        for _, w in self.pairs:
            os.set_blocking(w, False)

    @property
    def readers(self) -> list[int]:
        return [r for r, _ in self.pairs]

    def drop_readers(self) -> None:
        """Close this process's read ends: the store's copies are the only ones left."""
        for r, _ in self.pairs:
            os.close(r)
        self.pairs = [(-1, w) for _, w in self.pairs]

    def read_end_open(self, i: int) -> bool:
        try:
            os.write(self.pairs[i][1], b"x")
        except BrokenPipeError:
            return False
        return True

    def close(self) -> None:
        for pair in self.pairs:
            for fd in pair:
                if fd >= 0:
                    os.close(fd)


@pytest.fixture
def pipes() -> Iterator[Pipes]:
    made = Pipes(3)
    yield made
    made.close()


def send_raw(sm: ServiceManager, state: str, fds: list[int]) -> None:
    """A notification sdnotify never sends, straight to the manager."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(sm.notify_socket)
        sock.sendmsg([state.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


async def test_store_and_remove_fds(leak_check: None, tmp_path: Path, pipes: Pipes) -> None:
    async with ServiceManager(tmp_path) as sm:
        assert sdnotify.store_fds("conn", pipes.readers[:2], env=sm.env)
        assert sdnotify.store_fds("other", pipes.readers[2:], env=sm.env)
        with trio.fail_after(5):
            await sm.wait_until(lambda: sm.stored() == {"conn": 2, "other": 1})
        pipes.drop_readers()
        assert [pipes.read_end_open(i) for i in range(3)] == [True, True, True]
        assert sdnotify.remove_fds("conn", env=sm.env)
        with trio.fail_after(5):
            await sm.wait_for("FDSTOREREMOVE=1")
        assert sm.stored() == {"other": 1}
        # Removed means closed: nobody reads those pipes any more.
        assert [pipes.read_end_open(i) for i in range(3)] == [False, False, True]
        assert sm.history == ["FDSTORE=1", "FDNAME=conn", "FDSTORE=1", "FDNAME=other", "FDSTOREREMOVE=1", "FDNAME=conn"]
    assert not pipes.read_end_open(2)  # a manager gone closes what it stored


async def test_store_fds_stores_an_open_file_once(tmp_path: Path, pipes: Pipes) -> None:
    async with ServiceManager(tmp_path) as sm:
        reader = pipes.readers[0]
        assert sdnotify.store_fds("a", [reader, reader], env=sm.env)
        copy = os.dup(reader)
        assert sdnotify.store_fds("b", [copy, pipes.readers[1]], env=sm.env)
        os.close(copy)
        with trio.fail_after(5):
            await sm.wait_for("FDNAME=b")
        assert sm.stored() == {"a": 1, "b": 1}


@pytest.mark.parametrize("name", ["", "x" * 256, "a:b", "tab\there", "new\nline", "é", "\x7f"])
def test_store_fds_refuses_bad_names(name: str) -> None:
    with pytest.raises(ValueError, match="FDNAME"):
        sdnotify.store_fds(name, [0], env={})
    with pytest.raises(ValueError, match="FDNAME"):
        sdnotify.remove_fds(name, env={})


async def test_store_fds_takes_the_names_systemd_takes(tmp_path: Path, pipes: Pipes) -> None:
    names = ["x" * 255, "with space", "~!@#$%^&*()=[]{}"]
    async with ServiceManager(tmp_path) as sm:
        for name, reader in zip(names, pipes.readers, strict=True):
            assert sdnotify.store_fds(name, [reader], env=sm.env)
        with trio.fail_after(5):
            await sm.wait_until(lambda: len(sm.stored()) == 3)
        assert sm.stored() == dict.fromkeys(names, 1)


def test_store_fds_without_a_manager(tmp_path: Path, pipes: Pipes) -> None:
    assert not sdnotify.store_fds("a", pipes.readers, env={})
    assert not sdnotify.remove_fds("a", env={})
    assert not sdnotify.reloading(env={})
    unreachable = {"NOTIFY_SOCKET": str(tmp_path / "nobody.sock")}
    assert not sdnotify.store_fds("a", pipes.readers, env=unreachable)
    assert not sdnotify.remove_fds("a", env=unreachable)
    # An fd that is not open cannot be sent: reported, not raised. (A high one: the lowest free
    # number would be the sending socket's own.)
    closed = max(int(fd) for fd in os.listdir("/proc/self/fd")) + 100
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(tmp_path / "manager.sock"))
        env = {"NOTIFY_SOCKET": str(tmp_path / "manager.sock")}
        assert not sdnotify.store_fds("a", [closed], env=env)
        assert sdnotify.store_fds("a", pipes.readers, env=env)  # the same socket, open fds


def test_store_fds_refuses_more_than_one_message_holds() -> None:
    with pytest.raises(ValueError, match="253"):
        sdnotify.store_fds("a", [0] * 254, env={})


async def test_reloading(tmp_path: Path) -> None:
    async with ServiceManager(tmp_path) as sm:
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert sdnotify.reloading(env=sm.env)
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        with trio.fail_after(5):
            at = await sm.wait_for("RELOADING=1")
        key, value = sm.history[at + 1].split("=")
        assert key == "MONOTONIC_USEC"
        assert before <= int(value) <= after
        # The reload ends with READY=1.
        assert sdnotify.ready(env=sm.env)
        with trio.fail_after(5):
            assert await sm.wait_for("READY=1", since=at) == at + 2


# The stand-in behaves as systemd does where hostd's crash tests could tell the difference.


async def test_manager_enforces_fd_store_max(leak_check: None, tmp_path: Path, pipes: Pipes) -> None:
    async with ServiceManager(tmp_path, fd_store_max=2) as sm:
        assert sdnotify.store_fds("a", pipes.readers, env=sm.env)
        with trio.fail_after(5):
            await sm.wait_for("FDSTORE=1")
        pipes.drop_readers()
        assert sm.stored() == {"a": 2}
        assert sm.refused == 1
        assert [pipes.read_end_open(i) for i in range(3)] == [True, True, False]


async def test_manager_closes_fds_sent_without_fdstore(leak_check: None, tmp_path: Path, pipes: Pipes) -> None:
    async with ServiceManager(tmp_path) as sm:
        send_raw(sm, "STATUS=carrying fds", pipes.readers[:1])
        send_raw(sm, "FDSTORE=1", pipes.readers[1:2])  # no name: systemd's default
        with trio.fail_after(5):
            await sm.wait_for("FDSTORE=1")
        pipes.drop_readers()
        assert sm.stored() == {"stored": 1}
        assert sm.refused == 1
        assert [pipes.read_end_open(i) for i in range(2)] == [False, True]


async def test_manager_drops_fds_that_hang_up(leak_check: None, tmp_path: Path, pipes: Pipes) -> None:
    async with ServiceManager(tmp_path) as sm:
        send_raw(sm, "FDSTORE=1\nFDNAME=unpolled\nFDPOLL=0", pipes.readers[:1])
        assert sdnotify.store_fds("polled", pipes.readers[1:2], env=sm.env)
        with trio.fail_after(5):
            await sm.wait_until(lambda: sm.stored() == {"unpolled": 1, "polled": 1})
        # Closing each write end leaves only the store's read ends: both hang up.
        pipes.drop_readers()
        for _, w in pipes.pairs[:2]:
            os.close(w)
        pipes.pairs = pipes.pairs[2:]
        with trio.fail_after(5):
            await sm.wait_until(lambda: "polled" not in sm.stored())
        assert sm.stored() == {"unpolled": 1}


async def test_manager_takes_notifications_from_the_main_pid_only(
    leak_check: None, tmp_path: Path, pipes: Pipes
) -> None:
    script = "from agentic_sandbox.hostd import sdnotify; import time; sdnotify.ready(); time.sleep(3600)"
    async with ServiceManager(tmp_path, notify_access="main") as sm:
        await sm.start([sys.executable, "-c", script])
        with trio.fail_after(20):
            await sm.wait_for("READY=1")
        assert sdnotify.store_fds("intruder", pipes.readers[:1], env=sm.env)
        with trio.fail_after(5):
            await sm.wait_until(lambda: sm.refused == 1)
        assert sm.history == ["READY=1"]
        sm.kill()
        with trio.fail_after(10):
            assert await sm.wait_exit() == -signal.SIGKILL
        # No main process: anyone may fill the store before the next start.
        assert sdnotify.store_fds("test", pipes.readers[1:2], env=sm.env)
        with trio.fail_after(5):
            await sm.wait_for("FDNAME=test")
        assert sm.stored() == {"test": 1}
