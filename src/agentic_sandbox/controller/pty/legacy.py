"""The legacy v1 PTY WebSocket (``ws://HOST:8121/sessions/{id}``) over the same hostd sessions.

Served only on its own listener (``AIWG_LEGACY_PTY_LISTEN``, e.g. ``0.0.0.0:8121``): that server
runs the app through :class:`LegacyPort`, which marks each connection's scope, so the route below
answers 404 on the main port and the two surfaces never mix. Same bearer tokens and scopes as the
pty-ws/v1 socket.

Protocol (upstream ``docs/ws-protocol.md``), JSON text frames discriminated by ``type``:

* client: ``join_session{session_id, role, replay_from?}``, ``session_input{session_id, data}``
  (base64), ``session_resize{session_id, cols, rows}``, ``leave_session``;
* server: ``session_joined{session_id, role, current_seq}``, ``session_left``, ``error{message}``
  and ``session_frame{session_id, seq, ts, kind, ...}`` with kind ``Output{stream, data}``,
  ``Resize{cols, rows}``, ``Keyframe{data}`` (the vt100 screen state) and ``Closed{exit_code}``.

Roles share the session's controller lease with pty-ws/v1 clients (the same room): a controller
request beyond it is downgraded to observer. A controller join on a pending session starts it with
what it was created with (the v1 join has no launch fields; :mod:`controller.pty.launch`).
Replay: ``replay_from=N`` sends the output after N, else a keyframe then live output. One nursery
of two pumps (client frames; hostd output), sends serialized by a lock.
"""

from __future__ import annotations

import base64
import binascii
import logging
from contextlib import AsyncExitStack, aclosing
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from quart import Response, websocket

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import new_id

from ..errors import ControllerError, NotFound
from ..instances.sessions import Launch
from ..state import app_state
from . import frames as f
from .blueprint import pty
from .launch import start_pending
from .rooms import Member, Room, RoomFull
from .scopes import PTY_CONTROL, PTY_OBSERVE, pty_scopes

if TYPE_CHECKING:
    from ..hostlink import HostdLink
    from ..instances.sessions import SessionService
    from .rooms import Rooms

log = logging.getLogger(__name__)

SCOPE_KEY = "aiwg.legacy_pty"


async def answer_lifespan(receive: Any, send: Any) -> None:
    """An ASGI app's lifespan when it has nothing to start or stop: say yes to both (hypercorn waits
    for the startup answer before it serves)."""
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class LegacyPort:
    """The app as the legacy listener serves it: WebSocket connections marked, lifespan answered
    here (the main server runs the app's startup and shutdown once), nothing else served."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            await self.app({**scope, SCOPE_KEY: True}, receive, send)
            return
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"legacy PTY port: WebSocket only\n"})


class _Join(msgspec.Struct, kw_only=True):
    session_id: str = ""
    role: str = "observer"
    replay_from: int | None = None


def _refuse(status: int, message: str) -> Response:
    return Response(msgspec.json.encode({"error": message}), status=status, content_type="application/json")


@pty.websocket("/sessions/<session_id>")
async def legacy_attach(session_id: str) -> Response | None:
    if not websocket.scope.get(SCOPE_KEY):
        return _refuse(404, "not found")
    state = app_state()
    principal = state.auth.authenticate(websocket.headers.get("Authorization"))
    if principal is None:
        return _refuse(401, "a valid bearer token is required")
    try:
        info = (await state.link.call(m.SessionGetRequest(session_id=session_id))).session
        await state.instances.record(info.instance_id)
    except NotFound:
        return _refuse(404, f"no session {session_id!r}")
    except ControllerError as exc:
        return _refuse(503, exc.message)
    scopes = pty_scopes(principal, info.instance_id)
    if PTY_OBSERVE not in scopes:
        return _refuse(403, "the token lacks pty:observe")
    await websocket.accept()
    await LegacySocket(info, scopes, link=state.link, rooms=state.rooms, sessions=state.sessions).run()
    return None


class LegacySocket:
    """One accepted legacy socket on one session; what it uses is handed in when it is built."""

    def __init__(
        self, info: m.SessionInfo, scopes: frozenset[str], *, link: HostdLink, rooms: Rooms, sessions: SessionService
    ) -> None:
        self.info, self.scopes = info, scopes
        self.link, self.rooms, self.sessions = link, rooms, sessions
        self.sid = info.session_id
        self.lock = trio.Lock()
        self.member: Member | None = None
        self.room: Room | None = None

    async def send(self, obj: dict[str, Any]) -> None:
        async with self.lock:
            await websocket.send(msgspec.json.encode(obj).decode())

    async def frame(self, kind: str, seq: int | None = None, **fields: Any) -> None:
        await self.send(
            {"type": "session_frame", "session_id": self.sid, "seq": seq, "ts": f.now_ts(), "kind": kind, **fields}
        )

    async def run(self) -> None:
        stack = AsyncExitStack()
        try:
            async with stack, trio.open_nursery() as nursery:
                while True:
                    raw = await websocket.receive()
                    try:
                        message = msgspec.json.decode(raw) if isinstance(raw, str) else None
                    except msgspec.DecodeError:
                        message = None
                    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
                        await self.send({"type": "error", "message": "frames are JSON objects with a type"})
                        continue
                    if not await self.handle(message, stack, nursery):
                        nursery.cancel_scope.cancel()
                        return
        finally:
            if self.room is not None and self.member is not None:
                self.room.leave(self.member)
                self.room.broadcast(self.room.membership())

    async def handle(self, message: dict[str, Any], stack: AsyncExitStack, nursery: trio.Nursery) -> bool:
        kind = message["type"]
        if message.get("session_id", self.sid) != self.sid:
            await self.send({"type": "error", "message": "this socket is for session " + self.sid})
        elif kind == "join_session" and self.member is None:
            try:
                join = msgspec.convert(message, _Join, strict=False)
            except msgspec.ValidationError as exc:
                await self.send({"type": "error", "message": f"join_session: {exc}"})
                return True
            room = await stack.enter_async_context(self.rooms.enter(self.info))
            member = Member(client_id=new_id(), label="v1", role="observer", may_control=PTY_CONTROL in self.scopes)
            if join.role == "controller" and member.may_control:
                try:
                    await start_pending(self.sessions, room, self.info, Launch())
                except ControllerError as exc:
                    await self.send({"type": "error", "message": f"cannot start the session: {exc.message}"})
                    return True
            try:
                assigned = room.join(member, "controller" if join.role == "controller" else "observer")
            except RoomFull as exc:
                await self.send({"type": "error", "message": str(exc)})
                return True
            self.room, self.member = room, member
            room.broadcast(room.membership())
            current = (await self.link.call(m.SessionGetRequest(session_id=self.sid))).session.next_seq - 1
            await self.send(
                {"type": "session_joined", "session_id": self.sid, "role": assigned.role, "current_seq": current}
            )
            nursery.start_soon(self.output, room, join.replay_from)
        elif kind == "leave_session":
            await self.send({"type": "session_left", "session_id": self.sid})
            await websocket.close(f.CLOSE_NORMAL)
            return False
        elif kind in ("session_input", "session_resize"):
            if self.member is None or self.member.role != "controller":
                await self.send({"type": "error", "message": f"{kind} needs the controller role"})
            elif kind == "session_input":
                try:
                    data = base64.b64decode(str(message.get("data", "")), validate=True)
                except (binascii.Error, ValueError):
                    await self.send({"type": "error", "message": "data must be base64"})
                    return True
                await self._call(m.SessionWriteRequest(session_id=self.sid, data=data[: m.MAX_INPUT_BYTES]))
            else:
                cols, rows = message.get("cols"), message.get("rows")
                if not (isinstance(cols, int) and isinstance(rows, int)) or not all(
                    1 <= v <= m.MAX_TERMINAL_DIM for v in (cols, rows)
                ):
                    await self.send({"type": "error", "message": f"cols and rows must be 1..{m.MAX_TERMINAL_DIM}"})
                elif await self._call(m.SessionResizeRequest(session_id=self.sid, cols=cols, rows=rows)):
                    assert self.room is not None
                    self.room.resized(cols, rows)
                    await self.frame("Resize", cols=cols, rows=rows)
        else:
            await self.send({"type": "error", "message": f"unexpected {kind}"})
        return True

    async def _call(self, request: m.Request) -> bool:
        try:
            await self.link.call(request)
            return True
        except ControllerError as exc:
            await self.send({"type": "error", "message": exc.message})
            return False

    async def output(self, room: Room, replay_from: int | None) -> None:
        if replay_from is None:
            keyframe = await room.keyframe()
            await self.frame(
                "Keyframe", seq=keyframe.anchor_sequence, data=base64.b64encode(keyframe.snapshot).decode()
            )
            start = keyframe.anchor_sequence + 1
        else:
            start = replay_from + 1
        try:
            async with aclosing(self.link.session_output(self.sid, start)) as events:
                async for event in events:
                    if isinstance(event, m.SessionOutput):
                        room.offer(event.seq, event.data)
                        data = base64.b64encode(event.data).decode()
                        await self.frame("Output", seq=event.seq, stream="stdout", data=data)
                    elif isinstance(event, m.SessionExited):
                        await self.frame("Closed", exit_code=event.exit_code)
        except ControllerError as exc:
            await self.send({"type": "error", "message": f"hostd: {exc}"})
            await websocket.close(f.CLOSE_SERVER_ERROR)
