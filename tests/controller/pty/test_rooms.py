"""A session's room: its screen is fed by the members' own subscriptions, read back by the room
only where they could not feed it, and keyframes fall due by the cadence."""

from __future__ import annotations

import base64

import trio

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.hostd_process import HostdProcess

from .conftest import Instance
from .wsclient import cframe

CAT = ["/bin/sh", "-c", "stty raw -echo; exec cat"]


async def _hostd_subscribers(hostd_socket: str, sid: str) -> int:
    async with open_hostd(hostd_socket) as client:
        return int((await client.call(m.SessionGetRequest(session_id=sid))).session.subscribers)


async def test_the_screen_takes_live_output_from_the_members(instance: Instance) -> None:
    sid = await instance.session(CAT)
    ws = await instance.attach(sid)
    await ws.join(role="controller")
    await ws.kind("Keyframe")
    await ws.type(b"hello")
    await ws.output_until(b"hello")
    # One subscription in hostd: the socket's. The room read the session back once, when it
    # opened, and stopped once it had what the member had seen.
    socket_path = str(instance.controller.config.hostd_socket)
    with trio.fail_after(10):
        while await _hostd_subscribers(socket_path, sid) != 1:
            await trio.sleep(0.05)
    await ws.type(b" world")
    await ws.output_until(b"world")
    await ws.send(cframe("pty.request_keyframe"))
    keyframe = (await ws.kind("Keyframe"))["payload"]
    assert b"hello world" in base64.b64decode(keyframe["snapshot"]), keyframe
    assert await _hostd_subscribers(socket_path, sid) == 1
    await ws.close()


async def test_a_keyframe_falls_due_after_a_hundred_frames(instance: Instance) -> None:
    sid = await instance.session(CAT)
    ws = await instance.attach(sid)
    await ws.join(role="controller")
    joined = (await ws.kind("Keyframe"))["payload"]["anchor_sequence"]
    for i in range(105):  # one output frame per key: each is echoed before the next is typed
        await ws.type(b"%d," % i)
        await ws.output_until(b"%d," % i)
    with trio.fail_after(10):  # at most one per 2 s: it comes once that much passed since the join
        keyframe = (await ws.kind("Keyframe"))["payload"]
    assert keyframe["anchor_sequence"] >= joined + 100
    assert b"104," in base64.b64decode(keyframe["snapshot"])
    await ws.close()


async def test_output_no_member_fed_is_read_back(hostd: HostdProcess) -> None:
    """A member whose feed skips ahead (it lagged, or every member was behind): the room reads the
    session back from where its screen stopped, so keyframes miss nothing hostd still holds."""
    from agentic_sandbox.controller.pty.rooms import Room

    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id="room", name="room"))
        argv = ["/bin/sh", "-c", "for i in $(seq 1 30); do echo line-$i; sleep 0.005; done; exec cat"]
        info = (await client.call(m.SessionCreateRequest(instance_id="room", argv=argv, cols=40, rows=40))).session
        async with client.stream(m.SessionSubscribeRequest(session_id=info.session_id, from_seq=1)) as events:
            seen = b""
            with trio.fail_after(10):
                while b"line-30" not in seen:
                    event = await anext(events)
                    if isinstance(event, m.SessionOutput):
                        seen += event.data
        info = (await client.call(m.SessionGetRequest(session_id=info.session_id))).session
        assert info.next_seq > 3  # several frames: the room has something to read back
        room = Room(info.session_id, 40, 40)
        async with trio.open_nursery() as nursery:
            room._start_catch_up = lambda start: nursery.start_soon(room.catch_up, client, start, 0)
            room.offer(1, b"")  # the screen's first frame, from a member
            assert room.screen.anchor == 1 and room.caught_up.is_set()
            latest = info.next_seq - 1
            room.offer(latest, b"")  # far ahead: everything between is read back from hostd
            assert not room.caught_up.is_set()
            with trio.fail_after(10):
                await room.caught_up.wait()
        assert room.screen.anchor == latest
        snapshot = (await room.keyframe()).snapshot
        assert b"line-29" in snapshot and b"line-30" in snapshot
        room.offer(latest + 1, b"more")  # members feed it again
        assert room.screen.anchor == latest + 1
        await client.call(m.InstanceDestroyRequest(instance_id="room", grace_s=0.5))
