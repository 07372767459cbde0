"""Roles and joins: one attach socket's place in its session's room.

:class:`Membership` joins the room (entering it through :class:`~controller.pty.rooms.Rooms` at
the first join, and leaving it when the socket ends) with the role asked for: a controller
request without ``pty:control``, or past the room's controllers, is downgraded to observer. The
first controller of a pending session starts it first (:mod:`controller.pty.launch`); a start that
fails leaves the client unjoined, told why, free to join again. It changes roles, resizes the
session (the controller only), answers keyframe requests (at most one per
:data:`KEYFRAME_REQUEST_GAP_S`) and leaves the session; every change of members is broadcast to
the room. Refusals are :class:`~controller.pty.frames.FrameError`; a resize hostd refuses is a
``PTY_RESIZE_FAILED`` session frame.

Use it as an async context manager around the socket's pumps: leaving it leaves the room.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import trio

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import new_id

from ..errors import ControllerError
from ..instances.sessions import Launch
from . import frames as f
from .lanes import Close
from .launch import join_launch, start_failure, start_pending
from .rooms import Member, RoomFull
from .scopes import PTY_CONTROL

if TYPE_CHECKING:
    from ..hostlink import HostdLink
    from ..instances.sessions import SessionService
    from .lanes import Outbox
    from .rooms import Room, Rooms

KEYFRAME_REQUEST_GAP_S = 1.0


class Membership:
    """One socket's member in one session's room (see the module docstring)."""

    def __init__(
        self,
        info: m.SessionInfo,
        scopes: frozenset[str],
        outbox: Outbox,
        *,
        rooms: Rooms,
        sessions: SessionService,
        link: HostdLink,
    ) -> None:
        self._info = info
        self._scopes = scopes
        self._outbox = outbox
        self._rooms = rooms
        self._sessions = sessions
        self._link = link
        self._stack = AsyncExitStack()
        self.member: Member | None = None
        self.room: Room | None = None
        #: A join went through (a failed one, e.g. a pending session that would not start, may be retried).
        self.joined = False
        self._last_keyframe_request = -KEYFRAME_REQUEST_GAP_S

    async def __aenter__(self) -> Membership:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self._stack.aclose()
        finally:
            self.leave()

    @property
    def in_room(self) -> bool:
        return self.member is not None and self.room is not None

    async def join(self, frame: f.ClientFrame, payload: f.JoinSession) -> Room:
        """``pty.join_session``: the room joined (the caller starts the output feed)."""
        if self.joined:
            raise f.FrameError("INVALID_REQUEST", "already joined; leave first or use pty.request_role", frame.id)
        launch = join_launch(payload, frame.id)
        room = self.room
        if room is None:
            room = self.room = await self._stack.enter_async_context(self._rooms.enter(self._info))
        member = Member(
            client_id=new_id(),
            label=payload.client_label,
            role="observer",
            may_control=PTY_CONTROL in self._scopes,
            outbox=self._outbox,
        )
        # A pending session is started by its first controller, before it is one.
        started = payload.role == "controller" and member.may_control and await self._start(room, launch, frame.id)
        try:
            assigned = room.join(member, payload.role)
        except RoomFull as exc:
            raise f.FrameError("RATE_LIMITED", str(exc), frame.id) from None
        self.member = member
        self.joined = True
        self._outbox.put_control(f.session_frame(assigned))
        room.broadcast(room.membership())
        if member.role == "controller" and not started and launch.cols and launch.rows:
            await self.resize(launch.cols, launch.rows, frame.id)
        return room

    async def _start(self, room: Room, launch: Launch, request_id: str | None) -> bool:
        try:
            return await start_pending(self._sessions, room, self._info, launch)
        except ControllerError as exc:
            raise start_failure(exc, request_id) from None

    def require_control(self, what: str, request_id: str | None) -> None:
        if PTY_CONTROL not in self._scopes:
            raise f.FrameError("PERMISSION_DENIED", f"{what} needs pty:control", request_id)
        if self.member is None or self.member.role != "controller":
            raise f.FrameError("PERMISSION_DENIED", f"{what} needs the controller role", request_id)

    async def resize(self, cols: int, rows: int, request_id: str | None) -> None:
        self.require_control("resize", request_id)
        try:
            await self._link.call(m.SessionResizeRequest(session_id=self._info.session_id, cols=cols, rows=rows))
        except ControllerError as exc:
            self._outbox.put_control(f.pty_error("PTY_RESIZE_FAILED", exc.message))
            return
        assert self.room is not None
        self.room.resized(cols, rows)

    async def request_role(self, role: str, request_id: str) -> None:
        assert self.member is not None and self.room is not None
        if role == "controller" and PTY_CONTROL not in self._scopes:
            raise f.FrameError("PERMISSION_DENIED", "the controller role needs pty:control", request_id)
        if role == "controller" and self.member.role != "controller":
            await self._start(self.room, Launch(), request_id)  # with what it was created with
        assigned = self.room.request_role(self.member, role)
        self._outbox.put_control(f.session_frame(assigned))
        self.room.broadcast(self.room.membership())

    async def keyframe(self, request_id: str) -> None:
        """``pty.request_keyframe``: the room's keyframe to this client alone."""
        assert self.room is not None
        now = trio.current_time()
        if now - self._last_keyframe_request < KEYFRAME_REQUEST_GAP_S:
            raise f.FrameError("RATE_LIMITED", "at most one keyframe request a second", request_id)
        self._last_keyframe_request = now
        self._outbox.put_control(f.session_frame(await self.room.keyframe()))

    def leave_session(self) -> None:
        """``pty.leave_session``: leave the room, tell everyone, and close the socket normally."""
        assert self.member is not None and self.room is not None
        room = self.room
        room.leave(self.member)
        self.member = None
        room.broadcast(room.membership())
        self._outbox.put_control(room.membership())
        self._outbox.put_control(Close(f.CLOSE_NORMAL, "left the session"))

    def leave(self) -> None:
        """The socket ends: its member leaves the room, and the others are told."""
        room, member = self.room, self.member
        if room is not None and member is not None:
            room.leave(member)
            room.broadcast(room.membership())
        self.member = None
