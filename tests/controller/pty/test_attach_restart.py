"""Surviving controller restarts: clients attached to busy shells, the controller killed with SIGKILL
and started again, each client reconnecting with ``replay_from`` its last sequence. The transcript
each assembles is byte-identical to what its shell wrote (hostd's own record, read over the proto
socket), with no gap and no duplicate, and the shells never noticed (same pid, still running)."""

from __future__ import annotations

import base64
import re
import signal
from pathlib import Path

import httpx
import pytest
import trio

from agentic_sandbox.proto import HostdStreamOverflow, open_hostd
from agentic_sandbox.proto import messages as m

from ..conftest import ADMIN_TOKEN, ControllerProcess, LiveHostd, controller_env, provision
from .wsclient import WS, ConnectionClosed, attach_url, cframe

CYCLES = 20
SESSIONS = 3
#: Output frames each client must see between two kills (so every cycle replays and goes live).
FRAMES_PER_CYCLE = 5
COUNTER = 'i=0; while :; do i=$((i+1)); echo "count $i"; sleep 0.01; done'


class Transcript:
    """One client's view of one session, across connections."""

    def __init__(self, sid: str, binary: bool) -> None:
        self.sid = sid
        self.binary = binary
        self.last = 0
        self.data = bytearray()
        self.seqs: list[int] = []
        self.progress = trio.Event()
        self.frames_this_cycle = 0

    def add(self, seq: int, data: bytes) -> None:
        assert seq == self.last + 1, f"{self.sid}: got seq {seq} after {self.last}"  # no gap, no duplicate
        self.last = seq
        self.data += data
        self.frames_this_cycle += 1
        if self.frames_this_cycle >= FRAMES_PER_CYCLE:
            self.progress.set()

    async def follow(self, url: str) -> None:
        """One connection: replay after ``last``, then live, until the controller goes away."""
        protocols = ("pty-ws.v1.binary",) if self.binary else ("pty-ws.v1",)
        ws = await WS.connect(f"{url}?replay_from={self.last}", subprotocols=protocols)
        try:
            await ws.send(cframe("pty.join_session", {"role": "observer"}))
            while True:
                frame = await ws.frame(timeout=30)
                if isinstance(frame, tuple):
                    self.add(*frame)
                elif frame["op"] == "pty.session_frame" and frame["payload"]["kind"] == "Output":
                    self.add(frame["sequence"], base64.b64decode(frame["payload"]["data"]))
        except (ConnectionClosed, OSError):
            return  # the controller was killed
        finally:
            await ws.close()


async def _ready(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        with trio.fail_after(20):
            while (await client.get("/readyz")).status_code != 200:
                await trio.sleep(0.05)


async def _hostd_record(socket_path: str, sid: str, upto: int) -> bytes:
    """What the shell wrote, seqs 1..upto, as hostd recorded it."""
    data = bytearray()
    seq = 0
    async with open_hostd(socket_path, client_name="test-record") as client:
        while seq < upto:
            # A replay of thousands of small frames can arrive in one read, ahead of this reader:
            # an overflowed stream resumes where it stopped, as the controller's rooms do.
            request = m.SessionSubscribeRequest(session_id=sid, from_seq=seq + 1)
            try:
                async with client.stream(request) as events:
                    async for event in events:
                        assert not isinstance(event, m.SessionLagged), event
                        if isinstance(event, m.SessionOutput):
                            assert event.seq == seq + 1, (event.seq, seq)
                            data += event.data
                            seq = event.seq
                            if seq >= upto:
                                break
            except HostdStreamOverflow:
                continue
    return bytes(data)


@pytest.mark.slow
async def test_transcripts_survive_sigkill_restarts(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "c", hostd.socket_path)
    async with trio.open_nursery() as nursery:
        proc = ControllerProcess(env)
        url = await proc.start(nursery)
        await _ready(url)
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=15
        ) as admin:
            iid = (await provision(admin, "busy", start=True))["result"]["instance_id"]
            sessions = []
            for _ in range(SESSIONS):
                response = await admin.post(
                    f"/api/v2/admin/instances/{iid}/sessions", json={"argv": ["/bin/sh", "-c", COUNTER]}
                )
                assert response.status_code == 201, response.text
                sessions.append(response.json())
        pids = {s["id"]: s["pid"] for s in sessions}
        transcripts = [Transcript(s["id"], binary=i == 0) for i, s in enumerate(sessions)]

        for _cycle in range(CYCLES):
            async with trio.open_nursery() as clients:
                for t in transcripts:
                    t.frames_this_cycle = 0
                    t.progress = trio.Event()
                    clients.start_soon(t.follow, attach_url(url, iid, t.sid))
                with trio.move_on_after(30) as waited:
                    for t in transcripts:
                        await t.progress.wait()
                assert not waited.cancelled_caught, (_cycle, [t.last for t in transcripts], proc.output()[-3000:])
                assert await proc.stop(signal.SIGKILL) == -signal.SIGKILL
            proc = ControllerProcess(env)
            url = await proc.start(nursery)
            await _ready(url)

        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=15
        ) as admin:
            for t in transcripts:
                info = (await admin.get(f"/api/v2/admin/instances/{iid}/sessions/{t.sid}")).json()
                assert info["state"] == "running" and info["pid"] == pids[t.sid]  # the shell never noticed
        for t in transcripts:
            assert t.last >= CYCLES * FRAMES_PER_CYCLE
            assert bytes(t.data) == await _hostd_record(hostd.socket_path, t.sid, t.last)
            counts = [int(n) for n in re.findall(rb"count (\d+)\r\n", bytes(t.data))]
            assert counts == list(range(1, len(counts) + 1))  # the shell's own numbering: none lost, none twice
        await proc.stop()
        nursery.cancel_scope.cancel()
