"""Frame dispatch in memory: client frames decoded and routed to the socket's parts (a real
Membership, Heartbeat and PostedWrites over a fake hostd link), errors answered, bad frames
counted."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from agentic_sandbox.controller.pty import frames as f
from agentic_sandbox.controller.pty.dispatch import MAX_BAD_FRAMES, FrameDispatch
from agentic_sandbox.controller.pty.heartbeat import Heartbeat
from agentic_sandbox.controller.pty.lanes import Close, Outbox
from agentic_sandbox.controller.pty.membership import Membership
from agentic_sandbox.controller.pty.rooms import Room, Rooms
from agentic_sandbox.controller.pty.scopes import PTY_CONTROL, PTY_OBSERVE
from agentic_sandbox.controller.pty.writes import PostedWrites
from agentic_sandbox.proto import messages as m

from .fakes import SID, FakeLink, FakeSessions, closes, drain, frames, session_info
from .wsclient import cframe

BOTH = frozenset({PTY_OBSERVE, PTY_CONTROL})


@dataclass
class Rig:
    dispatch: FrameDispatch
    box: Outbox
    link: FakeLink
    feeds: list[tuple[Room, int | None]] = field(default_factory=list)

    async def send(self, op: str, payload: dict[str, Any] | None = None, **extra: Any) -> list[dict[str, Any]]:
        """One frame in; the JSON frames it queued."""
        assert await self.dispatch.receive(json.dumps(cframe(op, payload, **extra)))
        return frames(drain(self.box))


@asynccontextmanager
async def rig(scopes: frozenset[str] = BOTH, *, binary: bool = False) -> AsyncIterator[Rig]:
    info = session_info(next_seq=8)
    link, box = FakeLink(info), Outbox()
    rooms = Rooms(link)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        rooms.attach(nursery)
        membership = Membership(info, scopes, box, rooms=rooms, sessions=FakeSessions(), link=link)  # type: ignore[arg-type]
        async with membership:
            feeds: list[tuple[Room, int | None]] = []
            dispatch = FrameDispatch(
                info,
                box,
                binary=binary,
                heartbeat=Heartbeat(box, SID, interval_s=30, timeout_s=90),
                membership=membership,
                writes=PostedWrites(link, SID, box),  # type: ignore[arg-type]
                start_feed=lambda room, replay_from: feeds.append((room, replay_from)),
            )
            yield Rig(dispatch, box, link, feeds)
        nursery.cancel_scope.cancel()


async def test_the_binding_ops_are_served_before_a_join() -> None:
    async with rig() as r:
        (pong,) = await r.send("ping", {"client_ts": "2026-01-01T00:00:00Z"})
        assert pong["op"] == "pong" and pong["payload"]["client_ts"] == "2026-01-01T00:00:00Z"
        assert await r.send("pong", {"client_ts": "x"}) == []
        (hello,) = await r.send("binding_hello", extensions=["urn:other", f.PTY_EXTENSIONS_URI])
        assert hello["payload"]["session"] == {"session_id": SID, "current_sequence": 7}
        assert hello["payload"]["activated_extensions"] == [f.PTY_EXTENSIONS_URI]
        assert await r.dispatch.receive(json.dumps(cframe("binding_goodbye", {"reason": "other"})))
        assert closes(drain(r.box)) == [f.CLOSE_NORMAL]


async def test_session_ops_need_a_join() -> None:
    async with rig() as r:
        frame = cframe("pty.session_resize", {"cols": 100, "rows": 30})
        assert await r.dispatch.receive(json.dumps(frame))
        (error,) = frames(drain(r.box))
        assert error["op"] == "Error" and error["id"] == frame["id"]
        assert error["payload"]["code"] == "INVALID_REQUEST"
        assert error["payload"]["message"] == "pty.session_resize before pty.join_session"
        assert r.link.calls == []


async def test_a_join_takes_its_role_starts_the_feed_and_input_is_posted() -> None:
    async with rig() as r:
        joined = await r.send("pty.join_session", {"role": "controller", "client_label": "me"}, replay_from=5)
        assigned, membership = (frame["payload"] for frame in joined)
        assert assigned["kind"] == "RoleAssigned" and assigned["role"] == "controller"
        assert membership["kind"] == "MembershipChanged" and membership["controllers"][0]["label"] == "me"
        assert [replay_from for _room, replay_from in r.feeds] == [5]
        await r.send("pty.session_input", {"data": base64.b64encode(b"ls\n").decode()})
        assert [post.request for post in r.link.posts] == [m.SessionWriteRequest(session_id=SID, data=b"ls\n")]
        (again,) = await r.send("pty.join_session", {"role": "observer"})
        assert again["payload"]["code"] == "INVALID_REQUEST" and "already joined" in again["payload"]["message"]


async def test_binary_input_on_its_subprotocol_only() -> None:
    async with rig(binary=True) as r:
        await r.send("pty.join_session", {"role": "controller"})
        assert await r.dispatch.receive(f.INPUT_MAGIC + b"keys")
        assert await r.dispatch.receive(b"nope")
        assert [post.request.data for post in r.link.posts] == [b"keys"]
        (error,) = frames(drain(r.box))
        assert error["payload"]["message"] == "a binary frame must start with PW1I"
    async with rig() as r:
        await r.send("pty.join_session", {"role": "controller"})
        assert await r.dispatch.receive(f.INPUT_MAGIC + b"keys")
        (error,) = frames(drain(r.box))
        assert error["payload"]["message"] == "binary frames are for the pty-ws.v1.binary subprotocol"
        assert r.link.posts == []


async def test_an_observer_may_not_type_or_resize() -> None:
    async with rig(frozenset({PTY_OBSERVE})) as r:
        assigned, _membership = await r.send("pty.join_session", {"role": "controller"})
        assert assigned["payload"]["role"] == "observer" and assigned["payload"]["downgraded"]
        (error,) = await r.send("pty.session_input", {"data": "eA=="})
        assert error["payload"] == {
            "code": "PERMISSION_DENIED",
            "message": "input needs pty:control",
            "retryable": False,
        }
        (error,) = await r.send("pty.session_resize", {"cols": 100, "rows": 30})
        assert error["payload"]["message"] == "resize needs pty:control"
        assert r.link.posts == [] and r.link.calls == []


async def test_a_resize_reaches_hostd_and_the_room() -> None:
    async with rig() as r:
        await r.send("pty.join_session", {"role": "controller"})
        (resized,) = await r.send("pty.session_resize", {"cols": 100, "rows": 30})
        assert resized["payload"] == {"kind": "Resize", "cols": 100, "rows": 30}
        assert r.link.calls == [m.SessionResizeRequest(session_id=SID, cols=100, rows=30)]


async def test_leaving_tells_the_room_and_closes() -> None:
    async with rig() as r:
        await r.send("pty.join_session", {"role": "controller"})
        assert await r.dispatch.receive(json.dumps(cframe("pty.leave_session")))
        items = drain(r.box)
        # The broadcast reaches the others (none here); the one that left is told on its own.
        assert [frame["payload"]["controllers"] for frame in frames(items)] == [[]]
        assert closes(items) == [f.CLOSE_NORMAL]


async def test_bad_frames_in_a_row_close_the_socket() -> None:
    async with rig() as r:
        for _ in range(MAX_BAD_FRAMES - 1):
            assert await r.dispatch.receive("not json")
        await r.send("ping")  # a good frame starts the count over
        for _ in range(MAX_BAD_FRAMES - 1):
            assert await r.dispatch.receive("{}")
        assert not await r.dispatch.receive("{}")
        items = drain(r.box)
        assert isinstance(items[-1], Close) and items[-1].code == f.CLOSE_PROTOCOL
        assert len(frames(items)) == MAX_BAD_FRAMES
