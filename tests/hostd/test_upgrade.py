"""Upgrades in place of a real hostd: sessions, execs and their output go on, byte for byte; a broken
install or a document the new code cannot read fails the upgrade and the old image serves on."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest
import trio

from agentic_sandbox.proto import HostdClient, HostdConnectionLost, HostdRemoteError
from agentic_sandbox.proto import messages as m
from tests.hostd_process import ROOT, HostdProcess

FLOOD = (
    "import sys, time\n"
    "i = 0\n"
    "while True:\n"
    "    sys.stdout.write(''.join(f'line {n:07d}\\n' for n in range(i, i + 20)))\n"
    "    sys.stdout.flush()\n"
    "    i += 20\n"
    "    time.sleep(0.002)\n"
)


def flood_text(lines: int) -> bytes:
    """What FLOOD writes, as its terminal shows it (the PTY turns each newline into CR LF)."""
    return b"".join(b"line %07d\r\n" % n for n in range(lines))


@pytest.fixture
def hostd(tmp_path: Path) -> Iterator[HostdProcess]:
    proc = HostdProcess(tmp_path / "state").start()
    yield proc
    proc.cleanup()


class Transcripts:
    """What a client following sessions and execs by sequence saw, across reconnects."""

    def __init__(self) -> None:
        self.data: dict[str, bytearray] = defaultdict(bytearray)
        self.next: dict[str, int] = defaultdict(lambda: 1)
        self.exits: dict[str, m.SessionExited | m.ExecExited] = {}

    async def follow(self, client: HostdClient, sessions: list[str], execs: list[str]) -> None:
        """Follow until the connection ends (an upgrade) or everything exited."""
        async with trio.open_nursery() as nursery:
            for sid in sessions:
                if sid not in self.exits:
                    nursery.start_soon(self._follow, client, m.SessionSubscribeRequest(session_id=sid), sid)
            for xid in execs:
                if xid not in self.exits:
                    nursery.start_soon(self._follow, client, m.ExecSubscribeRequest(exec_id=xid), xid)

    async def _follow(self, client: HostdClient, request: m.Request, key: str) -> None:
        request.from_seq = self.next[key]  # type: ignore[attr-defined]
        try:
            async with client.stream(request) as events:
                async for event in events:
                    if isinstance(event, (m.SessionOutput, m.ExecOutput)):
                        assert event.seq == self.next[key], f"{key}: seq {event.seq}, expected {self.next[key]}"
                        self.data[key] += event.data
                        self.next[key] = event.seq + 1
                    elif isinstance(event, (m.SessionLagged, m.ExecLagged)):
                        raise AssertionError(f"{key} lagged: {event}")
                    elif isinstance(event, (m.SessionExited, m.ExecExited)):
                        self.exits[key] = event
        except HostdConnectionLost:
            return  # hostd handed over (HostdRestarting) or went away


async def _provision(client: HostdClient, iid: str = "i1") -> None:
    await client.call(m.InstanceProvisionRequest(instance_id=iid, name=iid, command=["sleep", "3600"]))


async def _upgrade(client: HostdClient, transcripts: Transcripts, sessions: list[str], execs: list[str]) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(transcripts.follow, client, sessions, execs)
        await trio.sleep(0.05)
        await client.call(m.UpgradeRequest())


async def test_sessions_and_execs_go_on_across_upgrades_byte_for_byte(hostd: HostdProcess) -> None:
    transcripts = Transcripts()
    async with hostd.client() as client:
        pid = (await client.call(m.StatusRequest())).pid
        await _provision(client)
        flood = (
            await client.call(m.SessionCreateRequest(instance_id="i1", argv=[sys.executable, "-c", FLOOD]))
        ).session
        cat = (await client.call(m.SessionCreateRequest(instance_id="i1", argv=["cat"]))).session
        pending = (await client.call(m.SessionCreateRequest(instance_id="i1", argv=["cat"], deferred=True))).session
        # An exec whose stdin stays open, one with a control channel that leaves half a line, and one
        # whose timeout falls after the upgrades.
        echo = (
            await client.call(
                m.ExecStartRequest(instance_id="i1", argv=["cat"], stdin=b"first\n", keep_stdin_open=True)
            )
        ).exec
        agent = (
            await client.call(
                m.ExecStartRequest(
                    instance_id="i1",
                    argv=[
                        "bash",
                        "-c",
                        "printf '{\"a\":' >&$AIWG_CONTROL_FD; read x; printf '1}\\n' >&$AIWG_CONTROL_FD; exit 5",
                    ],
                    control=True,
                    keep_stdin_open=True,
                )
            )
        ).exec
        slow = (await client.call(m.ExecStartRequest(instance_id="i1", argv=["sleep", "60"], timeout_s=2.5))).exec
        sessions = [flood.session_id, cat.session_id]
        execs = [echo.exec_id, agent.exec_id, slow.exec_id]
        await client.call(m.SessionWriteRequest(session_id=cat.session_id, data=b"one\n"))
        await _upgrade(client, transcripts, sessions, execs)

    async with hostd.client() as client:
        status = await client.call(m.StatusRequest())
        assert (status.pid, status.upgrades, status.sessions) == (pid, 1, 3)
        assert (await client.call(m.SessionGetRequest(session_id=pending.session_id))).session.pending
        await client.call(m.SessionWriteRequest(session_id=cat.session_id, data=b"two\n"))
        await client.call(m.ExecWriteRequest(exec_id=echo.exec_id, data=b"second\n"))
        os.kill(hostd.proc.pid, signal.SIGHUP)  # systemctl reload
        await transcripts.follow(client, sessions, execs)

    async with hostd.client() as client:
        assert (await client.call(m.StatusRequest())).upgrades == 2
        await client.call(m.ExecWriteRequest(exec_id=echo.exec_id, data=b"third\n", eof=True))
        await client.call(m.ExecWriteRequest(exec_id=agent.exec_id, data=b"go\n", eof=True))
        await client.call(m.SessionWriteRequest(session_id=cat.session_id, data=b"\x04"))  # EOF: cat exits
        await client.call(m.SessionKillRequest(session_id=flood.session_id, grace_s=0))
        with trio.fail_after(20):
            await transcripts.follow(client, sessions, execs)

        assert transcripts.exits[echo.exec_id].exit_code == 0
        assert bytes(transcripts.data[echo.exec_id]) == b"first\nsecond\nthird\n"
        assert transcripts.exits[agent.exec_id].exit_code == 5, "the exit code was not kept"
        control = (await client.call(m.ExecGetRequest(exec_id=agent.exec_id))).exec
        assert control.exit_code == 5
        # The control line the agent wrote half before the upgrades and half after arrived whole.
        async with client.stream(m.ExecSubscribeRequest(exec_id=agent.exec_id, from_seq=1)) as events:
            messages = [e.message async for e in events if isinstance(e, m.ExecControlMessage)]
        assert messages == [{"a": 1}]
        assert transcripts.exits[slow.exec_id].reason == "timeout"
        assert bytes(transcripts.data[cat.session_id]) == b"one\r\none\r\ntwo\r\ntwo\r\n"
        assert transcripts.exits[cat.session_id].exit_code == 0
        text = bytes(transcripts.data[flood.session_id])
        assert len(text) > 100_000
        assert text == flood_text(len(text) // 14 + 1)[: len(text)], "the flood's output has a gap or a repeat"


@pytest.mark.timeout(360)  # about 40 s here; the bar is 50 upgrades, not a time
async def test_fifty_upgrades_with_a_hundred_live_sessions_and_running_tasks(hostd: HostdProcess) -> None:
    """The issue's bar: 50 upgrades in a row, 100 sessions (10 flooding, 90 idle and typed into),
    tasks running through them; every transcript exact, every exit code true, nothing leaked."""
    transcripts = Transcripts()
    typed: dict[str, bytes] = defaultdict(bytes)
    async with hostd.client() as client:
        pid = (await client.call(m.StatusRequest())).pid
        await _provision(client)
        floods = [
            (await client.call(m.SessionCreateRequest(instance_id="i1", argv=[sys.executable, "-c", FLOOD]))).session
            for _ in range(10)
        ]
        cats = [(await client.call(m.SessionCreateRequest(instance_id="i1", argv=["cat"]))).session for _ in range(90)]
        sessions = [s.session_id for s in floods + cats]
        execs: list[str] = []
        codes: dict[str, int] = {}

    for round_ in range(50):
        async with hostd.client() as client:
            if round_ % 5 == 0:
                # A task that outlives a few upgrades and ends with its own exit code.
                code = round_ // 5 + 1
                x = (
                    await client.call(
                        m.ExecStartRequest(
                            instance_id="i1", argv=["sh", "-c", f"echo start; sleep 1.5; echo end {code}; exit {code}"]
                        )
                    )
                ).exec
                execs.append(x.exec_id)
                codes[x.exec_id] = code
            for cat in cats[round_ % 9 :: 9]:
                line = b"r%02d\n" % round_
                typed[cat.session_id] += line
                await client.call(m.SessionWriteRequest(session_id=cat.session_id, data=line))
            await _upgrade(client, transcripts, sessions, execs)

    async with hostd.client() as client:
        status = await client.call(m.StatusRequest())
        assert (status.pid, status.upgrades, status.sessions) == (pid, 50, 100)
        for s in floods:
            await client.call(m.SessionKillRequest(session_id=s.session_id, grace_s=0))
        for cat in cats:
            await client.call(m.SessionWriteRequest(session_id=cat.session_id, data=b"\x04"))
        with trio.fail_after(60):
            await transcripts.follow(client, sessions, execs)
        for cat in cats:
            expected = b"".join(line.replace(b"\n", b"\r\n") * 2 for line in typed[cat.session_id].splitlines(True))
            assert bytes(transcripts.data[cat.session_id]) == expected
        for s in floods:
            text = bytes(transcripts.data[s.session_id])
            assert text == flood_text(len(text) // 14 + 1)[: len(text)], "a flood's output has a gap or a repeat"
        for xid, code in codes.items():
            assert transcripts.exits[xid].exit_code == code
            assert bytes(transcripts.data[xid]) == b"start\nend %d\n" % code
        for sid in sessions:
            await client.call(m.SessionDeleteRequest(session_id=sid))
        for xid in execs:
            await client.call(m.ExecDeleteRequest(exec_id=xid))
        await client.call(m.InstanceDestroyRequest(instance_id="i1", grace_s=0.5))
    # Nothing leaked: hostd has no child left, not even a zombie from before an upgrade.
    assert hostd.proc is not None
    with trio.fail_after(10):
        while psutil.Process(hostd.proc.pid).children():
            await trio.sleep(0.05)


def _install_copy(tmp_path: Path) -> Path:
    """A copy of the package for hostd to run from (first on its PYTHONPATH): the test breaks it."""
    root = tmp_path / "install"
    shutil.copytree(ROOT / "src" / "agentic_sandbox", root / "agentic_sandbox")
    return root


async def _refused_then_serving(hostd: HostdProcess, session_id: str, message: str) -> None:
    async with hostd.client() as client:
        with pytest.raises(HostdRemoteError) as refused:
            await client.call(m.UpgradeRequest())
        assert refused.value.code == "hostd.upgrade_refused"
        assert message in refused.value.message + str(refused.value.details)
        # SIGHUP (systemctl reload) is refused the same way: logged, and hostd serves on.
        os.kill(hostd.proc.pid, signal.SIGHUP)  # type: ignore[union-attr]
        with trio.fail_after(60):
            while "upgrade refused" not in hostd.log():
                await trio.sleep(0.05)
        status = await client.call(m.StatusRequest())
        assert status.upgrades == 0
        await client.call(m.SessionWriteRequest(session_id=session_id, data=b"still\n"))
        async with client.stream(m.SessionSubscribeRequest(session_id=session_id, from_seq=1)) as events:
            seen = b""
            with trio.fail_after(10):
                async for event in events:
                    if isinstance(event, m.SessionOutput):
                        seen += event.data
                    if seen.count(b"still") == 2:
                        break


@asynccontextmanager
async def _from_copy(tmp_path: Path) -> AsyncIterator[tuple[HostdProcess, Path, str]]:
    """hostd running from a copy of the package (the test breaks it), with a ``cat`` session:
    (hostd, the copy's ``agentic_sandbox/hostd``, the session id)."""
    install = _install_copy(tmp_path)
    hostd = HostdProcess(tmp_path / "state", env={"PYTHONPATH": f"{install}:{ROOT}"}).start()
    try:
        async with hostd.client() as client:
            await _provision(client)
            cat = (await client.call(m.SessionCreateRequest(instance_id="i1", argv=["cat"]))).session
        yield hostd, install / "agentic_sandbox" / "hostd", cat.session_id
    finally:
        hostd.cleanup()


async def test_a_broken_install_fails_the_upgrade_and_the_old_image_serves_on(tmp_path: Path) -> None:
    async with _from_copy(tmp_path) as (hostd, code, session_id):
        main = code / "main.py"
        good = main.read_text()
        main.write_text(good + "\ndef broken(:\n")
        await _refused_then_serving(hostd, session_id, "SyntaxError")
        # Fixed: the same hostd upgrades, the session with it.
        main.write_text(good)
        async with hostd.client() as client:
            await client.call(m.UpgradeRequest())
        async with hostd.client() as client:
            assert (await client.call(m.StatusRequest())).upgrades == 1
            assert (await client.call(m.SessionGetRequest(session_id=session_id))).session.state == "running"


async def test_new_code_that_cannot_read_the_document_fails_the_upgrade(tmp_path: Path) -> None:
    """A document version from the future (to the new code): an old release installed over a new one."""
    async with _from_copy(tmp_path) as (hostd, code, session_id):
        module = code / "handover.py"
        module.write_text(module.read_text().replace("\nVERSION = 1\n", "\nVERSION = 0\n"))
        await _refused_then_serving(hostd, session_id, "newer than what this hostd reads")
