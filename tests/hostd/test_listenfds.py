"""take_listen_fds: the variables parsed as sd_listen_fds_with_names(3) does, and fds really passed.

The parsing tests place real fds at a free range of numbers and give its start to the private
helper (this process cannot hand over its own fd 3); the end-to-end tests start a real child
from :class:`tests.service_manager.ServiceManager`, where the fds are at 3, 4, ...
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentic_sandbox.hostd import listenfds, sdnotify
from agentic_sandbox.hostd.listenfds import _take_listen_fds, take_listen_fds
from tests.service_manager import ServiceManager

PID = str(os.getpid())


class Passed:
    """``count`` open, inheritable fds at consecutive numbers from ``start``, as systemd passes them."""

    def __init__(self, count: int) -> None:
        self.start = max(int(fd) for fd in os.listdir("/proc/self/fd")) + 16
        self.fds = list(range(self.start, self.start + count))
        self.peers = []
        for fd in self.fds:
            r, w = os.pipe()
            os.dup2(r, fd)  # inheritable, like an fd systemd passed
            os.close(r)
            self.peers.append(w)

    def close(self) -> None:
        for fd in self.fds + self.peers:
            os.close(fd)


@pytest.fixture
def passed() -> Iterator[Passed]:
    fds = Passed(3)
    yield fds
    fds.close()


def test_names_and_order(passed: Passed) -> None:
    env = {"LISTEN_PID": PID, "LISTEN_FDS": "3", "LISTEN_FDNAMES": "a:b:a", "OTHER": "kept"}
    s = passed.start
    assert _take_listen_fds(env, s) == {"a": [s, s + 2], "b": [s + 1]}
    # Taken: gone from the environment children are built from, and not inherited by them.
    assert env == {"OTHER": "kept"}
    assert not any(os.get_inheritable(fd) for fd in passed.fds)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (None, {"unknown": [0, 1, 2]}),
        ("", {"unknown": [0, 1, 2]}),
        ("a", {"a": [0], "unknown": [1, 2]}),
        ("a:b", {"a": [0], "unknown": [2], "b": [1]}),
        ("a::b", {"a": [0], "": [1], "b": [2]}),
    ],
)
def test_missing_and_short_names(passed: Passed, names: str | None, expected: dict[str, list[int]]) -> None:
    env = {"LISTEN_PID": PID, "LISTEN_FDS": "3"}
    if names is not None:
        env["LISTEN_FDNAMES"] = names
    taken = _take_listen_fds(env, passed.start)
    assert taken == {name: [passed.start + i for i in fds] for name, fds in expected.items()}
    assert env == {}


def test_fewer_fds_than_passed(passed: Passed) -> None:
    env = {"LISTEN_PID": PID, "LISTEN_FDS": "2", "LISTEN_FDNAMES": "x:y"}
    assert _take_listen_fds(env, passed.start) == {"x": [passed.start], "y": [passed.start + 1]}
    # Only the counted fds are ours to mark.
    assert os.get_inheritable(passed.fds[2])


@pytest.mark.parametrize(
    "env",
    [
        {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "3", "LISTEN_FDNAMES": "a:b:c"},  # another's
        {"LISTEN_FDS": "3", "LISTEN_FDNAMES": "a:b:c"},  # no LISTEN_PID
        {"LISTEN_PID": PID},  # no LISTEN_FDS
        {"LISTEN_PID": PID, "LISTEN_FDS": "0"},
        {"LISTEN_PID": "me", "LISTEN_FDS": "3"},
        {"LISTEN_PID": f" {PID}", "LISTEN_FDS": "3"},
        {"LISTEN_PID": PID, "LISTEN_FDS": "three"},
        {"LISTEN_PID": PID, "LISTEN_FDS": "-1"},
        {"LISTEN_PID": PID, "LISTEN_FDS": "+3"},
        {"LISTEN_PID": PID, "LISTEN_FDS": "0_3"},  # int() would read 3
        {"LISTEN_PID": PID, "LISTEN_FDS": ""},
        {"LISTEN_PID": PID, "LISTEN_FDS": "3", "LISTEN_FDNAMES": "a:b:c:d"},  # more names than fds
    ],
)
def test_nothing_for_us(passed: Passed, env: dict[str, str]) -> None:
    ours = env.get("LISTEN_FDNAMES") == "a:b:c:d"  # ours, but refused for the names
    assert _take_listen_fds(env, passed.start) == {}
    assert env == {}  # removed all the same: no child may take them for its own
    # Fds not ours are left as they are; ours are close-on-exec even when refused.
    assert [os.get_inheritable(fd) for fd in passed.fds] == [not ours] * 3


def test_fds_not_open(passed: Passed) -> None:
    env = {"LISTEN_PID": PID, "LISTEN_FDS": "1000000000"}
    assert _take_listen_fds(env, passed.start) == {}
    assert env == {}


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not our pid, so the real fd 3 of this process is left alone.
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_FDNAMES", "x")
    assert take_listen_fds() == {}
    assert not set(listenfds.LISTEN_ENV_VARS) & set(os.environ)


# The service: takes its fds, reads from each (but the "writer" ones), reports what it saw on stdout.
TAKER = textwrap.dedent("""
    import json, os, sys
    from agentic_sandbox.hostd.listenfds import take_listen_fds
    fds = take_listen_fds()
    print(json.dumps({
        "fds": fds,
        "read": {
            name: [os.read(fd, 100).decode() for fd in group] for name, group in fds.items() if name != "writer"
        },
        "cloexec": [not os.get_inheritable(fd) for group in fds.values() for fd in group],
        "env": sorted(k for k in os.environ if k.startswith("LISTEN_")),
    }))
""")


async def run_taker(sm: ServiceManager, tmp_path: Path) -> dict[str, object]:
    mark = sm.log_path.stat().st_size if sm.log_path.exists() else 0
    await sm.start([sys.executable, "-c", TAKER])
    with trio.fail_after(20):
        code = await sm.wait_exit()
    output = sm.log_path.read_bytes()[mark:].decode()
    assert code == 0, output
    result: dict[str, object] = json.loads(output)
    return result


async def test_stored_fds_come_back_at_start(leak_check: None, tmp_path: Path) -> None:
    pipes = [os.pipe() for _ in range(3)]
    try:
        async with ServiceManager(tmp_path) as sm:
            assert sdnotify.store_fds("first", [pipes[0][0]], env=sm.env)
            assert sdnotify.store_fds("second", [pipes[1][0], pipes[2][0]], env=sm.env)
            with trio.fail_after(5):
                await sm.wait_until(lambda: sm.stored() == {"first": 1, "second": 2})
            for r, _ in pipes:
                os.close(r)  # the store holds the only read ends now
            for i, (_, w) in enumerate(pipes):
                os.write(w, f"pipe {i}".encode())
            result = await run_taker(sm, tmp_path)
    finally:
        for _, w in pipes:
            os.close(w)
    assert result == {
        "fds": {"first": [3], "second": [4, 5]},
        "read": {"first": ["pipe 0"], "second": ["pipe 1", "pipe 2"]},
        "cloexec": [True, True, True],
        "env": [],
    }


async def test_no_fds_no_variables(tmp_path: Path) -> None:
    async with ServiceManager(tmp_path) as sm:
        assert await run_taker(sm, tmp_path) == {"fds": {}, "read": {}, "cloexec": [], "env": []}


# The crash path: a service keeps a pipe in the store, is killed, and its successor reads on.
KEEPER = textwrap.dedent("""
    import os, time
    from agentic_sandbox.hostd import sdnotify
    r, w = os.pipe()
    os.write(w, b"written before the crash")
    assert sdnotify.store_fds("pipe", [r])
    # The write end too: with no writer left the read end would hang up, and be dropped.
    assert sdnotify.store_fds("writer", [w])
    sdnotify.ready()
    time.sleep(3600)
""")


async def test_fds_survive_a_crash(leak_check: None, tmp_path: Path) -> None:
    async with ServiceManager(tmp_path, notify_access="main") as sm:
        await sm.start([sys.executable, "-c", KEEPER])
        with trio.fail_after(20):
            await sm.wait_for("READY=1")
        assert sm.stored() == {"pipe": 1, "writer": 1}
        sm.kill(signal.SIGKILL)
        with trio.fail_after(10):
            assert await sm.wait_exit() == -signal.SIGKILL
        result = await run_taker(sm, tmp_path)
    assert result == {
        "fds": {"pipe": [3], "writer": [4]},
        "read": {"pipe": ["written before the crash"]},
        "cloexec": [True, True],
        "env": [],
    }
