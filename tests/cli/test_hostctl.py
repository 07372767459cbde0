"""agentic-hostctl against a real hostd: every command as a subprocess, attach on a real PTY."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from ptyprocess import PtyProcess

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.libvirt_service import fake_guest_image
from tests.podman_service import BUSYBOX_IMAGE, PodmanStorage

CTL = [sys.executable, "-m", "agentic_sandbox.cli.hostctl"]
PROMPT = b"PROMPT> "


@dataclass
class Hostd:
    socket: str
    env: dict[str, str]  # for agentic-hostctl: finds the socket through AIWG_HOSTD_SOCKET
    proc: subprocess.Popen[bytes]
    tmp: Path


def make_test_cgroup() -> Path | None:
    """A cgroup of this test's own for hostd's subtree, so teardown can remove all of it."""
    for base in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if (base / "cgroup.subtree_control").exists() and os.access(base, os.W_OK):
            path = base / f"aiwg-test-ctl-{os.getpid()}-{os.urandom(4).hex()}"
            try:
                path.mkdir()
            except OSError:
                continue
            return path
    return None


def remove_test_cgroup(path: Path) -> None:
    """Kill whatever is left in it (nothing, if hostd cleaned up), then remove it bottom-up."""
    (path / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 10
    while "populated 1" in (path / "cgroup.events").read_text():
        assert time.monotonic() < deadline, f"processes left in {path}"
        time.sleep(0.01)  # cgroup.kill is asynchronous; no event to await outside trio
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        sub.rmdir()
    path.rmdir()


@pytest.fixture
def hostd(tmp_path: Path) -> Iterator[Hostd]:
    """A real dev hostd; READY=1 on a notify socket says when it answers."""
    with running_hostd(tmp_path, {}) as h:
        yield h


@pytest.fixture
def vm_hostd(tmp_path: Path) -> Iterator[Hostd]:
    """A dev hostd whose VM runtime is libvirt's test hypervisor (boots nothing)."""
    pytest.importorskip("libvirt")
    extra = {"AIWG_LIBVIRT_URI": "test:///default", "AIWG_VM_IMAGE_DIR": str(fake_guest_image(tmp_path / "image"))}
    with running_hostd(tmp_path, extra) as h:
        yield h


@contextmanager
def running_hostd(tmp_path: Path, extra_env: dict[str, str]) -> Iterator[Hostd]:
    sock_path = str(tmp_path / "h.sock")
    cgroup = make_test_cgroup()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    env = {
        **os.environ,
        "AIWG_STATE_DIR": str(tmp_path / "state"),
        "AIWG_HOSTD_SOCKET": sock_path,
        "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
        "AIWG_STOP_GRACE_S": "1",
        "AIWG_CGROUP_ROOT": str(cgroup) if cgroup else "off",
        **extra_env,
    }
    log = (tmp_path / "hostd.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"], env=env, cwd=tmp_path, stdout=log, stderr=log
    )
    try:
        notify.settimeout(20)
        try:
            while not notify.recv(4096).startswith(b"READY=1"):
                pass
        except TimeoutError:
            pytest.fail(f"hostd did not get ready:\n{(tmp_path / 'hostd.log').read_text()}")
        ctl_env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        ctl_env.update(AIWG_HOSTD_SOCKET=sock_path, XDG_STATE_HOME=str(tmp_path / "xdg"))
        yield Hostd(sock_path, ctl_env, proc, tmp_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        notify.close()
        if cgroup is not None:
            remove_test_cgroup(cgroup)


async def run_ctl(h: Hostd, *args: str, rc: int = 0) -> subprocess.CompletedProcess[bytes]:
    result = await trio.run_process(
        [*CTL, *args], env=h.env, cwd=h.tmp, capture_stdout=True, capture_stderr=True, check=False
    )
    assert result.returncode == rc, (args, result.returncode, result.stdout, result.stderr)
    assert b"Traceback" not in result.stderr
    return result


async def out(h: Hostd, *args: str) -> str:
    return (await run_ctl(h, *args)).stdout.decode()


async def make_dev(h: Hostd) -> str:
    return (await out(h, "instance", "create", "dev", "--workdir", str(h.tmp))).split()[0]


async def session_info(h: Hostd, sid: str) -> m.SessionInfo:
    async with open_hostd(h.socket) as client:
        return (await client.call(m.SessionGetRequest(session_id=sid))).session


# -- plain commands -----------------------------------------------------------------------------


async def test_status_and_instances(hostd: Hostd) -> None:
    status = json.loads(await out(hostd, "--json", "status"))
    assert status["pid"] == hostd.proc.pid
    assert status["instances"] == 0
    assert "hostd_version:" in await out(hostd, "status")

    line = await out(hostd, "instance", "create", "dev", "--workdir", str(hostd.tmp))
    instance_id, state = line.split()
    assert state == "running"
    table = (await out(hostd, "instances")).splitlines()
    assert table[0].split()[:5] == ["INSTANCE", "NAME", "RUNTIME", "STATE", "PID"]
    assert table[1].split()[:4] == [instance_id, "dev", "host/hostd", "running"]
    # --json also works after the command.
    [info] = json.loads(await out(hostd, "instances", "--json"))
    assert info["instance_id"] == instance_id
    assert info["working_dir"] == str(hostd.tmp)
    assert (info["runtime"], info["provider"]) == ("host", "hostd")
    assert info["host"]["pid"] is None  # no main command


async def test_upgrade_in_place_keeps_the_pid_and_the_sessions(hostd: Hostd) -> None:
    await make_dev(hostd)
    sid = (await out(hostd, "session", "new", "--", "cat")).split()[0]
    said = await out(hostd, "upgrade")
    assert f"hostd {hostd.proc.pid} upgraded in place" in said
    assert "1 sessions and 0 execs handed over" in said
    status = json.loads(await out(hostd, "--json", "status"))
    assert (status["pid"], status["upgrades"], status["sessions"]) == (hostd.proc.pid, 1, 1)
    assert (await session_info(hostd, sid)).state == "running"
    again = json.loads(await out(hostd, "--json", "upgrade"))
    assert again["after"]["upgrades"] == 2


async def test_instance_lifecycle(hostd: Hostd) -> None:
    created = json.loads(
        await out(
            hostd, "--json", "instance", "create", "box", "--id", "box-1", "--label", "team=a",
            "--env", "FOO=bar", "--no-start", "--workdir", str(hostd.tmp), "--", "sleep", "60",
        )
    )  # fmt: skip
    assert (created["instance_id"], created["state"], created["labels"]) == ("box-1", "stopped", {"team": "a"})
    assert created["command"] == ["sleep", "60"]

    started = json.loads(await out(hostd, "instance", "start", "box", "--json"))  # by name
    assert started["state"] == "running"
    assert started["host"]["pid"]
    if "instance.sleep.freeze" in started["capabilities"]:  # hostd has cgroups to freeze in
        assert (await out(hostd, "instance", "sleep", "box")).split() == ["box-1", "sleeping/freeze"]
        assert "sleeping/freeze" in (await out(hostd, "instances")).split()
        woke = json.loads(await out(hostd, "instance", "wake", "box-1", "--json"))
        assert (woke["state"], woke["last_wake"]["cause"]) == ("running", "operator")
        refused = await run_ctl(hostd, "instance", "sleep", "box", "--how", "save", rc=1)
        assert b"capability.unsupported" in refused.stderr
    assert (await out(hostd, "instance", "stop", "box-1", "--grace", "1")).split() == ["box-1", "stopped"]
    assert (await out(hostd, "instance", "destroy", "box-1")).split() == ["box-1", "destroyed"]


async def test_vm_instances_by_image_and_what_cannot_be_done_with_them(vm_hostd: Hostd) -> None:
    image = vm_hostd.tmp / "image"
    manifest = json.loads((image / "manifest.json").read_text())
    ref = (
        f"direct://{image / 'vmlinuz'}@sha256:{manifest['kernel_sha256']},"
        f"{image / 'initrd.img'}@sha256:{manifest['initrd_sha256']}"
    )
    created = json.loads(await out(vm_hostd, "--json", "instance", "create", "v1", "--image", ref))
    assert (created["runtime"], created["provider"], created["state"]) == ("vm", "libvirt", "running")
    assert created["vm"]["image_ref"] == ref
    sized = json.loads(
        await out(vm_hostd, "--json", "instance", "create", "v2", "--runtime", "vm", "--memory-mib", "64")
    )
    assert sized["vm"]["memory_mib"] == 64 and sized["vm"]["image_ref"].startswith("direct://")  # the guest image
    rows = (await out(vm_hostd, "instances")).splitlines()[1:]
    assert sorted(r.split()[1:3] for r in rows) == [["v1", "vm/libvirt"], ["v2", "vm/libvirt"]]
    # A host instance has no image; the test driver cannot fork: one line each, no traceback.
    refused = await run_ctl(vm_hostd, "instance", "create", "h", "--runtime", "host", "--image", ref, rc=2)
    assert b"a host instance has none" in refused.stderr
    forked = await run_ctl(vm_hostd, "instance", "fork", "v1", "copy", rc=1)
    assert b"[capability.unsupported]" in forked.stderr and len(forked.stderr.splitlines()) == 1
    assert (await out(vm_hostd, "pools")).split()[:3] == ["POOL", "RUNTIME", "SOURCE"]
    assert json.loads(await out(vm_hostd, "pools", "--json")) == []
    for name in ("v1", "v2"):
        assert (await out(vm_hostd, "instance", "destroy", name)).split()[1] == "destroyed"


@pytest.mark.podman
def test_a_container_instance_by_image(tmp_path: Path, podman_storage: PodmanStorage) -> None:
    with running_hostd(tmp_path, podman_storage.hostd_env(tmp_path / "podman.sock")) as h:

        async def check() -> None:
            created = json.loads(await out(h, "--json", "instance", "create", "c1", "--image", BUSYBOX_IMAGE))
            assert (created["runtime"], created["provider"], created["state"]) == ("container", "podman", "running")
            assert created["container"]["image_ref"].startswith("localhost/busybox@sha256:")
            assert (await out(h, "instance", "destroy", "c1")).split()[1] == "destroyed"

        trio.run(check)


async def test_session_commands(hostd: Hostd) -> None:
    await make_dev(hostd)
    sid = (await out(hostd, "session", "new", "--env", f"PS1={PROMPT.decode()}", "--", "sh")).strip()
    await run_ctl(hostd, "send", sid, "echo $((6*7)); exit 3", "--newline")
    # --follow ends when the session exits, after its last output.
    followed = (await run_ctl(hostd, "logs", sid, "--follow")).stdout
    assert b"\r\n42\r\n" in followed
    assert (await run_ctl(hostd, "logs", sid)).stdout == followed
    later = (await run_ctl(hostd, "logs", sid, "--from", "2")).stdout
    assert followed.endswith(later)
    assert len(later) < len(followed)

    [row] = (await out(hostd, "sessions")).splitlines()[1:]
    assert row.split()[:5] == [sid, row.split()[1], "exited", "with", "code"]
    assert row.split()[5] == "3"
    [info] = json.loads(await out(hostd, "sessions", "--json", "--instance", "dev"))
    assert (info["session_id"], info["exit_code"], info["argv"]) == (sid, 3, ["sh"])

    sleeper = (await out(hostd, "session", "new", "--cols", "100", "--rows", "30", "--", "sleep", "60")).strip()
    assert (await session_info(hostd, sleeper)).cols == 100
    await run_ctl(hostd, "kill", sleeper, "--signal", "TERM")
    await run_ctl(hostd, "logs", sleeper, "--follow")
    assert (await session_info(hostd, sleeper)).signal == signal.SIGTERM

    tree = (await out(hostd, "session", "new", "--", "sh", "-c", "sleep 60; sleep 60")).strip()
    assert (await out(hostd, "kill", tree, "--grace", "1")).split()[1:] == ["killed", "by", "signal", "15"]
    await run_ctl(hostd, "session", "delete", tree)
    assert tree not in await out(hostd, "sessions")


async def test_errors_are_one_line(hostd: Hostd, tmp_path: Path) -> None:
    async def fails(*args: str, rc: int = 1, env: dict[str, str] | None = None) -> str:
        result = await trio.run_process(
            [*CTL, *args], env=env or hostd.env, capture_stdout=True, capture_stderr=True, check=False
        )
        assert result.returncode == rc, result
        lines = result.stderr.decode().splitlines()
        assert len(lines) == 1 or rc == 2, lines  # argparse prints usage above its one line
        assert lines[-1].startswith("agentic-hostctl"), lines
        return lines[-1]

    missing = str(tmp_path / "missing.sock")
    assert await fails("--socket", missing, "status") == (
        f"agentic-hostctl: hostd is not running at {missing} (no such socket)"
    )
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))  # bound, never listening
        assert "nothing listens" in await fails("--socket", str(stale), "instances")
    # The default socket comes from AIWG_HOSTD_SOCKET.
    assert missing in await fails("sessions", env={**hostd.env, "AIWG_HOSTD_SOCKET": missing})
    assert missing in await fails("attach", "nope", env={**hostd.env, "AIWG_HOSTD_SOCKET": missing})

    assert "[session.not_found]" in await fails("logs", "no-such-session")
    assert "[instance.not_found]" in await fails("instance", "stop", "nobody")
    assert "no instance named 'dev'" in await fails("session", "new", "--", "sh", rc=2)
    assert "KEY=VALUE" in await fails("instance", "create", "x", "--label", "novalue", rc=2)
    await fails("kill", rc=2)


async def test_finds_a_dev_hostd_in_the_working_directory(hostd: Hostd) -> None:
    work = hostd.tmp / "work"
    (work / ".run").mkdir(parents=True)
    (work / ".run" / "hostd.sock").symlink_to(hostd.socket)
    env = {k: v for k, v in hostd.env.items() if k != "AIWG_HOSTD_SOCKET"}
    result = await trio.run_process([*CTL, "--json", "status"], env=env, cwd=work, capture_stdout=True)
    assert json.loads(result.stdout)["pid"] == hostd.proc.pid


# -- attach on a real PTY -----------------------------------------------------------------------


class Terminal:
    """agentic-hostctl attach running on a PTY the test types into and reads from."""

    def __init__(self, h: Hostd, *args: str, rows: int = 24, cols: int = 80) -> None:
        self.proc = PtyProcess.spawn([*CTL, *args], env=h.env, cwd=str(h.tmp), dimensions=(rows, cols))
        self.stream = trio.lowlevel.FdStream(os.dup(self.proc.fd))
        self.seen = b""
        self._pos = 0

    async def _more(self) -> bool:
        try:
            data = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, OSError):  # EIO: the attach process is gone
            data = b""
        self.seen += data
        return bool(data)

    async def expect(self, needle: bytes, timeout: float = 15) -> bytes:
        """Read until ``needle`` appears past what earlier expects consumed; return the text before it."""
        with trio.fail_after(timeout):
            while (index := self.seen.find(needle, self._pos)) < 0:
                assert await self._more(), f"attach ended before {needle!r}; saw {self.seen!r}"
        before = self.seen[self._pos : index]
        self._pos = index + len(needle)
        return before

    async def type(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def exit_status(self, timeout: float = 15) -> int:
        with trio.fail_after(timeout):
            while await self._more():
                pass
            return await trio.to_thread.run_sync(self.proc.wait)

    def close(self) -> None:
        self.stream.close()
        if self.proc.isalive():
            self.proc.terminate(force=True)
        self.proc.close(force=True)


@pytest.fixture
async def terminals() -> AsyncIterator[list[Terminal]]:
    # Async: closing a trio FdStream needs the run's context.
    opened: list[Terminal] = []
    yield opened
    for term in opened:
        term.close()


async def new_shell(h: Hostd) -> str:
    await make_dev(h)
    return (await out(h, "session", "new", "--env", f"PS1={PROMPT.decode()}", "--", "sh")).strip()


async def test_attach_detach_and_resume(hostd: Hostd, terminals: list[Terminal]) -> None:
    sid = await new_shell(hostd)
    term = Terminal(hostd, "attach", sid)
    terminals.append(term)
    await term.expect(PROMPT)  # replayed from the ring: attach is up, the terminal raw
    await term.type(b"echo hel''lo\r")
    await term.expect(b"\r\nhello\r\n")
    await term.expect(PROMPT)
    await term.type(b"\x1d")  # Ctrl-]
    await term.expect(f"[detached from {sid} at seq ".encode())
    seq = int(await term.expect(b"]"))
    assert await term.exit_status() == 0
    assert seq == (await session_info(hostd, sid)).next_seq - 1

    await run_ctl(hostd, "send", sid, "echo wh''ile-detached", "--newline")
    again = Terminal(hostd, "attach", sid)
    terminals.append(again)
    # Resumes after the last sequence seen: what came while detached, nothing seen before.
    before = await again.expect(b"\r\nwhile-detached\r\n")
    assert b"hello" not in before
    await again.expect(PROMPT)
    await again.type(b"exit 7\r")
    await again.expect(f"[session {sid} exited with code 7]".encode())
    assert await again.exit_status() == 7

    # --replay shows everything the ring holds, then the exit.
    replay = Terminal(hostd, "attach", sid, "--replay")
    terminals.append(replay)
    assert b"\r\nhello\r\n" in await replay.expect(b"exited with code 7")
    assert await replay.exit_status() == 7


async def test_attach_resize_and_prefix_detach(hostd: Hostd, terminals: list[Terminal]) -> None:
    sid = await new_shell(hostd)
    term = Terminal(hostd, "attach", sid, rows=33, cols=101)
    terminals.append(term)
    await term.expect(PROMPT)
    await term.type(b"stty size\r")
    await term.expect(b"\r\n33 101\r\n")

    term.proc.setwinsize(40, 120)  # SIGWINCH to attach, which resizes the session's PTY
    with trio.fail_after(10):
        while ((info := await session_info(hostd, sid)).rows, info.cols) != (40, 120):
            await trio.sleep(0.02)
    await term.type(b"stty size\r")
    await term.expect(b"\r\n40 120\r\n")

    await term.type(b"\x02d")  # Ctrl-B d
    await term.expect(b"[detached from")
    assert await term.exit_status() == 0


class Proxy:
    """A Unix socket relay to hostd whose connections the test can cut."""

    def __init__(self, path: str, target: str) -> None:
        self.path, self.target = path, target
        self.scopes: set[trio.CancelScope] = set()
        self.connections = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(self.path)
        sock.listen()
        task_status.started()
        await trio.serve_listeners(self._relay, [trio.SocketListener(sock)])

    async def _relay(self, down: trio.SocketStream) -> None:
        self.connections += 1
        up = await trio.open_unix_socket(self.target)
        with trio.CancelScope() as scope:
            self.scopes.add(scope)

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                try:
                    async for chunk in src:
                        await dst.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, down, up)
                nursery.start_soon(pump, up, down)
        self.scopes.discard(scope)
        await up.aclose()
        await down.aclose()

    def cut(self) -> None:
        for scope in self.scopes:
            scope.cancel()


@pytest.fixture
async def proxy(hostd: Hostd) -> AsyncIterator[Proxy]:
    relay = Proxy(str(hostd.tmp / "proxy.sock"), hostd.socket)
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.serve)
        yield relay
        nursery.cancel_scope.cancel()


async def test_attach_reconnects_without_loss(hostd: Hostd, proxy: Proxy, terminals: list[Terminal]) -> None:
    sid = await new_shell(hostd)
    term = Terminal(hostd, "--socket", proxy.path, "attach", sid)
    terminals.append(term)
    await term.expect(PROMPT)
    await term.type(b"echo fir''st\r")
    await term.expect(b"\r\nfirst\r\n")
    await term.expect(PROMPT)

    proxy.cut()
    await term.expect(b"reconnecting]")
    # Output made while attach was away arrives once it is back, and nothing twice.
    await run_ctl(hostd, "send", sid, "echo sec''ond", "--newline")
    await term.expect(b"\r\nsecond\r\n")
    await term.type(b"echo thi''rd\r")
    await term.expect(b"\r\nthird\r\n")
    assert proxy.connections >= 2
    assert term.seen.count(b"first") == 1
    assert term.seen.count(b"second") == 1
    await term.type(b"\x1d")
    await term.expect(b"[detached from")
    assert await term.exit_status() == 0


async def test_attach_gives_up_when_hostd_is_gone(hostd: Hostd, proxy: Proxy, terminals: list[Terminal]) -> None:
    sid = await new_shell(hostd)
    term = Terminal(hostd, "--socket", proxy.path, "attach", "--retries", "2", sid)
    terminals.append(term)
    await term.expect(PROMPT)
    proxy.cut()
    os.unlink(proxy.path)  # nobody to reconnect to
    await term.expect(b"reconnecting]")
    line = await term.expect(b"attempts to reconnect")
    assert re.search(rb"\r\nagentic-hostctl: lost the connection to hostd at .*: gave up after 2 $", line), line
    assert await term.exit_status() == 1


async def test_attach_detaches_while_reconnecting(hostd: Hostd, proxy: Proxy, terminals: list[Terminal]) -> None:
    sid = await new_shell(hostd)
    term = Terminal(hostd, "--socket", proxy.path, "attach", sid)
    terminals.append(term)
    await term.expect(PROMPT)
    proxy.cut()
    os.unlink(proxy.path)
    await term.expect(b"reconnecting]")
    await term.type(b"\x1d")  # honoured during the backoff, not only once connected again
    await term.expect(f"[detached from {sid} at seq ".encode(), timeout=3)
    assert await term.exit_status() == 0
