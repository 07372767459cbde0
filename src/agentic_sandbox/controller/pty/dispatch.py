"""Frame dispatch: one attach socket's client frames, decoded and routed, one at a time in order.

:class:`FrameDispatch` takes each message the client sends: a binary frame (the
``pty-ws.v1.binary`` subprotocol's input, ``PW1I`` + the keys) or a JSON text frame (the envelope,
then its op's payload: :func:`controller.pty.frames.decode_client`), and routes it: ``ping`` to the
:class:`~controller.pty.heartbeat.Heartbeat`; joins, roles, resizes, keyframe requests and leaving
to the :class:`~controller.pty.membership.Membership`; input (the controller's only) to the
:class:`~controller.pty.writes.PostedWrites`; ``binding_hello`` and ``binding_goodbye`` answered
here. Every op but the binding's own and the join needs a join first; a join starts the socket's
output feed (``start_feed``).

A bad frame is answered with an ``Error`` frame (the binding's codes) and the socket stays;
:data:`MAX_BAD_FRAMES` in a row queue a close with 4400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agentic_sandbox.proto import bind_log_ids
from agentic_sandbox.proto import messages as m

from . import frames as f
from .lanes import Close

if TYPE_CHECKING:
    from .heartbeat import Heartbeat
    from .lanes import Outbox
    from .membership import Membership
    from .rooms import Room
    from .writes import PostedWrites

MAX_BAD_FRAMES = 32

Handler = Callable[[f.ClientFrame, Any], Awaitable[None]]


class FrameDispatch:
    """One socket's client frames (see the module docstring)."""

    def __init__(
        self,
        info: m.SessionInfo,
        outbox: Outbox,
        *,
        binary: bool,
        heartbeat: Heartbeat,
        membership: Membership,
        writes: PostedWrites,
        start_feed: Callable[[Room, int | None], None],
    ) -> None:
        self._info = info
        self._outbox = outbox
        self._binary = binary
        self._heartbeat = heartbeat
        self._membership = membership
        self._writes = writes
        self._start_feed = start_feed
        self.bad_frames = 0
        #: Ops served before a join, and the ones that need it.
        self._unjoined: dict[str, Handler] = {
            "ping": self._ping,
            "pong": self._pong,
            "binding_hello": self._hello,
            "binding_goodbye": self._goodbye,
            "pty.join_session": self._join,
        }
        self._joined: dict[str, Handler] = {
            "pty.session_input": self._session_input,
            "pty.session_resize": self._resize,
            "pty.request_role": self._request_role,
            "pty.request_keyframe": self._request_keyframe,
            "pty.leave_session": self._leave,
        }

    async def receive(self, message: str | bytes) -> bool:
        """Handle one client message; False once :data:`MAX_BAD_FRAMES` in a row were bad (the
        close is queued behind their errors: read no more)."""
        try:
            await self._dispatch(message)
            self.bad_frames = 0
        except f.FrameError as exc:
            self.bad_frames += 1
            self._outbox.put_control(
                f.error_frame(exc.code, exc.message, exc.request_id, retryable=exc.retryable, a2a_error=exc.a2a_error)
            )
            if self.bad_frames >= MAX_BAD_FRAMES:
                self._outbox.put_control(Close(f.CLOSE_PROTOCOL, "too many bad frames"))
                return False
        return True

    async def _dispatch(self, message: str | bytes) -> None:
        if not isinstance(message, str):
            if not self._binary:
                raise f.FrameError("INVALID_REQUEST", "binary frames are for the pty-ws.v1.binary subprotocol")
            if not message.startswith(f.INPUT_MAGIC):
                raise f.FrameError("INVALID_REQUEST", "a binary frame must start with PW1I")
            if len(message) - len(f.INPUT_MAGIC) > m.MAX_INPUT_BYTES:
                raise f.FrameError("INVALID_REQUEST", f"input frames carry at most {m.MAX_INPUT_BYTES} bytes")
            await self._input(message[len(f.INPUT_MAGIC) :], None)
            return
        if len(message) > f.MAX_CLIENT_FRAME_BYTES:
            raise f.FrameError("INVALID_REQUEST", f"frames are at most {f.MAX_CLIENT_FRAME_BYTES} bytes")
        frame, payload = f.decode_client(message)
        if frame.service_parameters and isinstance(frame.service_parameters.get("trace_id"), str):
            bind_log_ids(request_id=frame.service_parameters["trace_id"][:128])
        handler = self._unjoined.get(frame.op)
        if handler is None:
            if not self._membership.in_room:
                raise f.FrameError("INVALID_REQUEST", f"{frame.op} before pty.join_session", frame.id)
            handler = self._joined.get(frame.op)
            if handler is None:
                return  # decode_client refuses ops the binding does not name
        await handler(frame, payload)

    async def _input(self, data: bytes, request_id: str | None) -> None:
        if self._membership.member is None:
            raise f.FrameError("INVALID_REQUEST", "input before pty.join_session", request_id)
        self._membership.require_control("input", request_id)
        if data:
            await self._writes.post(data)

    # -- the ops ----------------------------------------------------------------------------------

    async def _ping(self, frame: f.ClientFrame, payload: f.Ping) -> None:
        self._heartbeat.pong(payload, frame.id)

    async def _pong(self, frame: f.ClientFrame, payload: Any) -> None:
        pass  # any frame restarts the idle timer; the socket's receiver saw it already

    async def _hello(self, frame: f.ClientFrame, payload: Any) -> None:
        wanted = [ext for ext in frame.extensions or [] if ext == f.PTY_EXTENSIONS_URI] or [f.PTY_EXTENSIONS_URI]
        self._outbox.put_control(f.hello(self._info.session_id, max(self._info.next_seq - 1, 0), wanted))

    async def _goodbye(self, frame: f.ClientFrame, payload: Any) -> None:
        self._outbox.put_control(Close(f.CLOSE_NORMAL))

    async def _join(self, frame: f.ClientFrame, payload: f.JoinSession) -> None:
        room = await self._membership.join(frame, payload)
        self._start_feed(room, frame.replay_from)

    async def _session_input(self, frame: f.ClientFrame, payload: f.SessionInput) -> None:
        await self._input(payload.data, frame.id)

    async def _resize(self, frame: f.ClientFrame, payload: f.SessionResize) -> None:
        await self._membership.resize(payload.cols, payload.rows, frame.id)

    async def _request_role(self, frame: f.ClientFrame, payload: f.RequestRole) -> None:
        await self._membership.request_role(payload.role, frame.id)

    async def _request_keyframe(self, frame: f.ClientFrame, payload: Any) -> None:
        await self._membership.keyframe(frame.id)

    async def _leave(self, frame: f.ClientFrame, payload: Any) -> None:
        self._membership.leave_session()
