"""Sessions that outlive a crash of hostd, through the service manager's fd store.

hostd runs under :class:`tests.service_manager.ServiceManager`, a stand-in for systemd that speaks
its protocols (sd_notify with FDSTORE/FDSTOREREMOVE, LISTEN_FDS/LISTEN_FDNAMES on the next start):
hostd's code here is the code that runs under systemd. hostd is killed with SIGKILL and started
again; its sessions go on and replay.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
import trio

from agentic_sandbox.hostd.fdstore import STATE_NAME, StoredSessions
from agentic_sandbox.proto import HostdClient, open_hostd
from agentic_sandbox.proto import messages as m
from tests import hostd_process
from tests.hostd_process import ROOT, remove_cgroup
from tests.service_manager import ServiceManager

HOSTD = [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"]


class Managed:
    """hostd as a service of the stand-in: started, crashed and started again on one state dir."""

    def __init__(self, sm: ServiceManager, base: Path) -> None:
        self.sm = sm
        self.socket = base / "hostd.sock"
        self.cgroup = hostd_process.test_cgroup()
        self.env = {
            **os.environ,
            "AIWG_STATE_DIR": str(base / "state"),
            "AIWG_HOSTD_SOCKET": str(self.socket),
            "AIWG_STOP_GRACE_S": "1",
            "AIWG_LIBVIRT_URI": "",
            "PYTHONPATH": str(ROOT),
        }
        if self.cgroup is not None:
            self.env["AIWG_CGROUP_ROOT"] = str(self.cgroup)

    async def start(self) -> None:
        since = self.sm.mark()
        await self.sm.start(HOSTD, self.env)
        with trio.fail_after(30):
            await self.sm.wait_for("READY=1", since=since)

    async def crash(self) -> None:
        self.sm.kill(signal.SIGKILL)
        with trio.fail_after(10):
            await self.sm.wait_exit()

    @asynccontextmanager
    async def client(self) -> AsyncIterator[HostdClient]:
        async with open_hostd(self.socket) as client:
            yield client


@pytest.fixture
async def managed(tmp_path: Path) -> AsyncIterator[Managed]:
    (tmp_path / "sm").mkdir()
    async with ServiceManager(tmp_path / "sm") as sm:
        hostd = Managed(sm, tmp_path)
        try:
            yield hostd
        finally:
            if sm.process is not None and sm.process.returncode is None:
                sm.kill(signal.SIGTERM)  # a clean stop ends the sessions
                with trio.move_on_after(20):
                    await sm.wait_exit()
            remove_cgroup(hostd.cgroup)


async def _output(client: HostdClient, sid: str, until: bytes, from_seq: int = 1) -> tuple[bytes, list[int]]:
    seen, seqs = b"", []
    with trio.fail_after(15):
        async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=from_seq)) as events:
            async for event in events:
                if isinstance(event, m.SessionOutput):
                    seen += event.data
                    seqs.append(event.seq)
                if until in seen or isinstance(event, m.SessionExited):
                    break
    return seen, seqs


def _stored_state(sm: ServiceManager) -> StoredSessions:
    [fd] = [fd for name, fd in sm._store if name == STATE_NAME]  # what a restarted hostd will read
    return msgspec.msgpack.decode(os.pread(fd, 1 << 20, 0), type=StoredSessions)


async def test_sessions_survive_a_crash_and_replay_their_output(managed: Managed) -> None:
    await managed.start()
    async with managed.client() as client:
        await client.call(m.InstanceProvisionRequest(instance_id="i1", name="i1", command=["sleep", "3600"]))
        cat = (await client.call(m.SessionCreateRequest(instance_id="i1", argv=["cat"]))).session
        ender = (
            await client.call(m.SessionCreateRequest(instance_id="i1", argv=["sh", "-c", "read x; echo bye; exit 3"]))
        ).session
        # Ends while hostd is down: its terminal hangs up, and the store lets it go.
        gone = (
            await client.call(m.SessionCreateRequest(instance_id="i1", argv=["sh", "-c", "echo early; read x; exit 4"]))
        ).session
        await client.call(m.SessionWriteRequest(session_id=cat.session_id, data=b"one\n"))
        before, _ = await _output(client, cat.session_id, b"one\r\none\r\n")
        await _output(client, gone.session_id, b"early\r\n")
    stored = managed.sm.stored()
    assert stored.get(STATE_NAME) == 1
    assert {f"s-{s.session_id}" for s in (cat, ender, gone)} <= set(stored)
    assert {s.id for s in _stored_state(managed.sm).sessions} == {cat.session_id, ender.session_id, gone.session_id}

    await managed.crash()
    os.kill(gone.pid, signal.SIGKILL)  # type: ignore[arg-type]  # dies with no hostd to see it
    with trio.fail_after(10):
        await managed.sm.wait_until(lambda: f"s-{gone.session_id}" not in managed.sm.stored())
    await managed.start()

    async with managed.client() as client:
        info = (await client.call(m.SessionGetRequest(session_id=cat.session_id))).session
        assert (info.state, info.pid) == ("running", cat.pid), "the shell did not outlive the crash"
        # Everything before the crash replays, and the sequence numbers go on where they were.
        replay, seqs = await _output(client, cat.session_id, b"one\r\none\r\n")
        assert replay == before == b"one\r\none\r\n"
        await client.call(m.SessionWriteRequest(session_id=cat.session_id, data=b"two\n"))
        after, more = await _output(client, cat.session_id, b"two\r\ntwo\r\n", from_seq=seqs[-1] + 1)
        assert after == b"two\r\ntwo\r\n" and more[0] == seqs[-1] + 1

        # A session that exits after the crash: its exit is seen, its code was hostd's to keep.
        await client.call(m.SessionWriteRequest(session_id=ender.session_id, data=b"x\n"))
        text, _ = await _output(client, ender.session_id, b"never", from_seq=1)
        assert text == b"x\r\nbye\r\n"
        ended = (await client.call(m.SessionGetRequest(session_id=ender.session_id))).session
        assert (ended.state, ended.exit_code, ended.end_reason) == ("exited", None, "lost")
        with trio.fail_after(10):
            await managed.sm.wait_until(lambda: f"s-{ender.session_id}" not in managed.sm.stored())

        # One that ended while hostd was down is held as ended, with its output up to the crash.
        lost = (await client.call(m.SessionGetRequest(session_id=gone.session_id))).session
        assert (lost.state, lost.end_reason) == ("exited", "lost")
        assert (await _output(client, gone.session_id, b"never"))[0] == b"early\r\n"

        await client.call(m.SessionKillRequest(session_id=cat.session_id, grace_s=0))
        with trio.fail_after(10):
            await managed.sm.wait_until(lambda: set(managed.sm.stored()) == {STATE_NAME})
        assert _stored_state(managed.sm).sessions == []


async def test_without_a_service_manager_nothing_is_stored(tmp_path: Path) -> None:
    """A dev hostd (no NOTIFY_SOCKET): sessions do not write through to disk, and a crash ends them,
    as the documentation says."""
    from tests.hostd_process import HostdProcess

    hostd = HostdProcess(tmp_path / "state").start()
    try:
        async with open_hostd(hostd.socket_path) as client:
            await client.call(m.InstanceProvisionRequest(instance_id="i1", name="i1"))
            cat = (await client.call(m.SessionCreateRequest(instance_id="i1", argv=["cat"]))).session
        hostd.kill()
        with trio.fail_after(10):
            while True:
                try:
                    os.kill(cat.pid, 0)  # type: ignore[arg-type]
                except ProcessLookupError:
                    break  # its terminal hung up with hostd
                await trio.sleep(0.05)
    finally:
        hostd.cleanup()


async def test_an_upgrade_in_place_keeps_the_store_for_a_later_crash(managed: Managed) -> None:
    await managed.start()
    async with managed.client() as client:
        await client.call(m.InstanceProvisionRequest(instance_id="i1", name="i1"))
        cat = (await client.call(m.SessionCreateRequest(instance_id="i1", argv=["cat"]))).session
        await client.call(m.SessionWriteRequest(session_id=cat.session_id, data=b"one\n"))
        await _output(client, cat.session_id, b"one\r\none\r\n")
        since = managed.sm.mark()
        await client.call(m.UpgradeRequest())
    with trio.fail_after(30):
        await managed.sm.wait_for("READY=1", since=since)  # the new image, same pid
    async with managed.client() as client:
        assert (await client.call(m.StatusRequest())).upgrades == 1
        await client.call(m.SessionWriteRequest(session_id=cat.session_id, data=b"two\n"))
        await _output(client, cat.session_id, b"two\r\ntwo\r\n")
    assert [s.id for s in _stored_state(managed.sm).sessions] == [cat.session_id]

    await managed.crash()
    await managed.start()
    async with managed.client() as client:
        assert (await client.call(m.SessionGetRequest(session_id=cat.session_id))).session.state == "running"
        replay, _ = await _output(client, cat.session_id, b"two\r\ntwo\r\n")
        assert replay == b"one\r\none\r\ntwo\r\ntwo\r\n"
