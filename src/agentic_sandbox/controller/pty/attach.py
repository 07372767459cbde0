"""The attach socket: one accepted pty-ws/v1 WebSocket on one session (:class:`AttachSocket`).

The upgrade and its checks are :mod:`controller.pty.route`'s; the socket is an
:class:`~controller.pty.asgisocket.AsgiWebSocket`. It is one nursery of pumps; whichever ends cancels the rest: the
receiver (client frames, handled in order; input is posted to hostd from here, its answer never
awaited, at most :data:`MAX_POSTED_WRITES` unanswered, so a flood of input frames is backpressure
on that client's own socket and never a burden on the shared hostd connection), the sender (the
socket's :class:`~controller.pty.outbox.Outbox` to the client), the output feeder (started by the
join: hostd subscription to the outbox) and the heartbeat (an app-level ``ping`` every
``pty_ping_interval_s``; a socket silent for ``pty_ping_timeout_s`` is closed and its role freed).
Leaving the nursery leaves the room and tells the other members.

Errors: a bad client frame gets an ``Error`` frame (the binding's codes) and the socket stays;
:data:`MAX_BAD_FRAMES` in a row close it with 4400. PTY failures are ``pty.session_frame`` errors
(``PTY_WRITE_FAILED``, ``PTY_RESIZE_FAILED``, ``PTY_OUTPUT_LAGGED`` followed by a keyframe). hostd
going away closes the socket with 1011 after a ``binding_goodbye``; the client reconnects with
``replay_from``. The session's end is ``Closed``, ``binding_goodbye`` and close 1000.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack, aclosing
from functools import partial
from typing import Any

import trio

from agentic_sandbox.proto import bind_log_ids, new_id
from agentic_sandbox.proto import messages as m

from ..errors import ControllerError, InvalidState
from ..instances.sessions import Launch
from ..state import AppState
from . import frames as f
from .asgisocket import AsgiWebSocket
from .lanes import Close, Outbox
from .launch import join_launch, start_failure, start_pending
from .rooms import Member, Room, RoomFull
from .scopes import PTY_CONTROL

log = logging.getLogger(__name__)

MAX_BAD_FRAMES = 32
MAX_POSTED_WRITES = 16
KEYFRAME_REQUEST_GAP_S = 1.0


class AttachSocket:
    """One accepted socket on one session (see the module docstring)."""

    def __init__(
        self,
        state: AppState,
        ws: AsgiWebSocket,
        info: m.SessionInfo,
        scopes: frozenset[str],
        *,
        binary: bool,
        replay_from: int | None,
    ) -> None:
        self.state = state
        self.ws = ws
        self.info = info
        self.session_id = info.session_id
        self.scopes = scopes
        self.binary = binary
        self.query_replay_from = replay_from
        self.outbox = Outbox()
        self.member: Member | None = None
        self.room: Room | None = None
        #: A join went through (a failed one, e.g. a pending session that would not start, may be retried).
        self.joined = False
        self.last_seen = trio.current_time()
        self.bad_frames = 0
        self.last_keyframe_request = -KEYFRAME_REQUEST_GAP_S
        self._posted = 0
        self._send_lock = trio.Lock()
        self._write_answered = trio.Event()
        self._stack = AsyncExitStack()
        self._nursery: trio.Nursery | None = None

    # -- the pumps ------------------------------------------------------------------------------

    async def run(self) -> None:
        self.outbox.put_control(f.hello(self.session_id, max(self.info.next_seq - 1, 0), [f.PTY_EXTENSIONS_URI]))
        try:
            async with self._stack, trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._ending, self._sender)
                nursery.start_soon(self._ending, self._receiver)
                nursery.start_soon(self._ending, self._heartbeat)
        finally:
            self._leave()

    async def _ending(self, pump: Any, *, queues_close: bool = False) -> None:
        """Run one pump; its end ends the socket, unless it ``queues_close`` (the sender closes then)."""
        try:
            await pump()
            if queues_close:
                return
        except ControllerError as exc:
            log.info("attach socket on session %s ended: %s", self.session_id, exc)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _sender(self) -> None:
        while True:
            item = await self.outbox.get()
            # Taken at once after the item (no checkpoint between): the feeder's direct sends see
            # the outbox non-empty or the lock held, never a gap to overtake this item in.
            try:
                self._send_lock.acquire_nowait()
            except trio.WouldBlock:
                await self._send_lock.acquire()
            try:
                if item is None:
                    log.info("attach socket on session %s closed: the client reads nothing", self.session_id)
                    await self.ws.close(f.CLOSE_SERVER_ERROR, "client too slow")
                    return
                if isinstance(item, Close):
                    await self.ws.close(item.code, item.reason)
                    return
                await self.ws.send(item)
            finally:
                self._send_lock.release()

    async def _output(self, item: str | bytes) -> None:
        """Send one output frame in order: at once from the feeder when nothing is queued or being
        sent before it (an echo then makes one pass through the scheduler fewer), else behind
        what is queued, through the outbox and the sender."""
        if self.outbox.empty():
            try:
                self._send_lock.acquire_nowait()
            except trio.WouldBlock:
                pass
            else:
                try:
                    await self.ws.send(item)
                finally:
                    self._send_lock.release()
                return
        await self.outbox.put_output(item)

    async def _receiver(self) -> None:
        while True:
            message = await self.ws.receive()
            if message is None:
                return  # the client closed or went away
            self.last_seen = trio.current_time()
            try:
                await self._handle_message(message)
                self.bad_frames = 0
            except f.FrameError as exc:
                self.bad_frames += 1
                self.outbox.put_control(f.error_frame(exc.code, exc.message, exc.request_id, retryable=exc.retryable))
                if self.bad_frames >= MAX_BAD_FRAMES:
                    self.outbox.put_control(Close(f.CLOSE_PROTOCOL, "too many bad frames"))
                    await trio.sleep_forever()  # the sender closes the socket once the errors are out

    async def _heartbeat(self) -> None:
        config = self.state.config
        while True:
            await trio.sleep(config.pty_ping_interval_s)
            if trio.current_time() - self.last_seen > config.pty_ping_timeout_s:
                log.info(
                    "attach socket on session %s reaped: silent for %gs", self.session_id, config.pty_ping_timeout_s
                )
                return  # ends the nursery: the role is freed on the way out
            self.outbox.put_control(f.encode("ping", {"client_ts": f.now_ts()}))

    async def _write(self, data: bytes) -> None:
        """Post one input frame's keys to hostd: the echo never waits for the write's answer, and
        an error answer reaches the client in order. At most :data:`MAX_POSTED_WRITES` writes are
        unanswered at once; past that this waits, so a flood of input frames is backpressure on
        this client's own socket, never a burden on the shared hostd connection."""
        while self._posted >= MAX_POSTED_WRITES:
            self._write_answered = trio.Event()
            await self._write_answered.wait()
        request = m.SessionWriteRequest(session_id=self.session_id, data=data)
        try:
            await self.state.link.post(request, self._write_failed, self._write_done)
        except ControllerError as exc:
            self._pty_error("PTY_WRITE_FAILED", exc.message)
            return
        # Counted after the post: an answer that came while it sent has already taken one off.
        self._posted += 1

    def _write_done(self) -> None:
        self._posted -= 1
        self._write_answered.set()

    def _write_failed(self, failure: ControllerError) -> None:
        self._write_done()
        if isinstance(failure, InvalidState):
            self._pty_error("PTY_WRITE_FAILED", f"the session has exited: {failure.message}")
        else:
            self._pty_error("PTY_WRITE_FAILED", failure.message)

    def _pty_error(self, code: str, message: str) -> None:
        self.outbox.put_control(f.session_frame(f.PtyError(code=code, message=message[:1024])))

    # -- client frames --------------------------------------------------------------------------

    async def _handle_message(self, message: str | bytes | None) -> None:
        if not isinstance(message, str):
            data = message or b""
            if not self.binary:
                raise f.FrameError("INVALID_REQUEST", "binary frames are for the pty-ws.v1.binary subprotocol")
            if not data.startswith(f.INPUT_MAGIC):
                raise f.FrameError("INVALID_REQUEST", "a binary frame must start with PW1I")
            if len(data) - len(f.INPUT_MAGIC) > m.MAX_INPUT_BYTES:
                raise f.FrameError("INVALID_REQUEST", f"input frames carry at most {m.MAX_INPUT_BYTES} bytes")
            await self._input(data[len(f.INPUT_MAGIC) :], None)
            return
        if len(message) > f.MAX_CLIENT_FRAME_BYTES:
            raise f.FrameError("INVALID_REQUEST", f"frames are at most {f.MAX_CLIENT_FRAME_BYTES} bytes")
        frame, payload = f.decode_client(message)
        if frame.service_parameters and isinstance(frame.service_parameters.get("trace_id"), str):
            bind_log_ids(request_id=frame.service_parameters["trace_id"][:128])
        await self._handle(frame, payload)

    async def _handle(self, frame: f.ClientFrame, payload: Any) -> None:
        op = frame.op
        if op == "ping":
            self.outbox.put_control(
                f.encode("pong", {"client_ts": payload.client_ts, "server_ts": f.now_ts()}, request_id=frame.id)
            )
        elif op == "pong":
            pass
        elif op == "binding_hello":
            wanted = [ext for ext in frame.extensions or [] if ext == f.PTY_EXTENSIONS_URI] or [f.PTY_EXTENSIONS_URI]
            self.outbox.put_control(f.hello(self.session_id, max(self.info.next_seq - 1, 0), wanted))
        elif op == "binding_goodbye":
            self.outbox.put_control(Close(f.CLOSE_NORMAL))
        elif op == "pty.join_session":
            await self._join(frame, payload)
        elif self.member is None or self.room is None:
            raise f.FrameError("INVALID_REQUEST", f"{op} before pty.join_session", frame.id)
        elif op == "pty.session_input":
            await self._input(payload.data, frame.id)
        elif op == "pty.session_resize":
            await self._resize(payload.cols, payload.rows, frame.id)
        elif op == "pty.request_role":
            await self._request_role(payload.role, frame.id)
        elif op == "pty.request_keyframe":
            now = trio.current_time()
            if now - self.last_keyframe_request < KEYFRAME_REQUEST_GAP_S:
                raise f.FrameError("RATE_LIMITED", "at most one keyframe request a second", frame.id)
            self.last_keyframe_request = now
            self.outbox.put_control(f.session_frame(await self.room.keyframe()))
        elif op == "pty.leave_session":
            member, room = self.member, self.room
            room.leave(member)
            self.member = None
            room.broadcast(room.membership())
            self.outbox.put_control(room.membership())
            self.outbox.put_control(Close(f.CLOSE_NORMAL, "left the session"))

    async def _join(self, frame: f.ClientFrame, payload: f.JoinSession) -> None:
        if self.joined:
            raise f.FrameError("INVALID_REQUEST", "already joined; leave first or use pty.request_role", frame.id)
        launch = join_launch(payload, frame.id)
        room = self.room
        if room is None:
            room = self.room = await self._stack.enter_async_context(self.state.rooms.enter(self.info))
        member = Member(
            client_id=new_id(),
            label=payload.client_label,
            role="observer",
            may_control=PTY_CONTROL in self.scopes,
            outbox=self.outbox,
        )
        # A pending session is started by its first controller, before it is one: a start that
        # fails leaves the client unjoined, told why, free to join again.
        started = payload.role == "controller" and member.may_control and await self._start(room, launch, frame.id)
        try:
            assigned = room.join(member, payload.role)
        except RoomFull as exc:
            raise f.FrameError("RATE_LIMITED", str(exc), frame.id) from None
        self.member = member
        self.joined = True
        self.outbox.put_control(f.session_frame(assigned))
        room.broadcast(room.membership())
        if member.role == "controller" and not started and launch.cols and launch.rows:
            await self._resize(launch.cols, launch.rows, frame.id)
        replay_from = frame.replay_from if frame.replay_from is not None else self.query_replay_from
        assert self._nursery is not None
        self._nursery.start_soon(partial(self._ending, partial(self._feed, room, replay_from), queues_close=True))

    async def _start(self, room: Room, launch: Launch, request_id: str | None) -> bool:
        try:
            return await start_pending(self.state.sessions, room, self.info, launch)
        except ControllerError as exc:
            raise start_failure(exc, request_id) from None

    def _require_control(self, what: str, request_id: str | None) -> None:
        if PTY_CONTROL not in self.scopes:
            raise f.FrameError("PERMISSION_DENIED", f"{what} needs pty:control", request_id)
        if self.member is None or self.member.role != "controller":
            raise f.FrameError("PERMISSION_DENIED", f"{what} needs the controller role", request_id)

    async def _input(self, data: bytes, request_id: str | None) -> None:
        if self.member is None:
            raise f.FrameError("INVALID_REQUEST", "input before pty.join_session", request_id)
        self._require_control("input", request_id)
        if data:
            await self._write(data)

    async def _resize(self, cols: int, rows: int, request_id: str | None) -> None:
        self._require_control("resize", request_id)
        try:
            await self.state.link.call(m.SessionResizeRequest(session_id=self.session_id, cols=cols, rows=rows))
        except ControllerError as exc:
            self._pty_error("PTY_RESIZE_FAILED", exc.message)
            return
        assert self.room is not None
        self.room.resized(cols, rows)

    async def _request_role(self, role: str, request_id: str) -> None:
        assert self.member is not None and self.room is not None
        if role == "controller" and PTY_CONTROL not in self.scopes:
            raise f.FrameError("PERMISSION_DENIED", "the controller role needs pty:control", request_id)
        if role == "controller" and self.member.role != "controller":
            await self._start(self.room, Launch(), request_id)  # with what it was created with
        assigned = self.room.request_role(self.member, role)
        self.outbox.put_control(f.session_frame(assigned))
        self.room.broadcast(self.room.membership())

    def _leave(self) -> None:
        room, member = self.room, self.member
        if room is not None and member is not None:
            room.leave(member)
            room.broadcast(room.membership())
        self.member = None

    # -- output ---------------------------------------------------------------------------------

    async def _feed(self, room: Room, replay_from: int | None) -> None:
        """Replay (or a keyframe), then live output, into the outbox until the session ends."""
        link = self.state.link
        info = (await link.call(m.SessionGetRequest(session_id=self.session_id))).session
        current = info.next_seq - 1
        keyframe_at: int | None = None
        if replay_from is not None and (replay_from + 1 < info.first_seq or replay_from > current):
            held = f"{info.first_seq - 1}..{current}"
            await self.outbox.put_output(
                f.error_frame("REPLAY_OUT_OF_RANGE", f"replay_from={replay_from} is outside {held}")
            )
            replay_from = None
        if replay_from is None:
            keyframe = await room.keyframe()
            await self.outbox.put_output(f.session_frame(keyframe))
            start = max(keyframe.anchor_sequence + 1, info.first_seq)
        else:
            start = replay_from + 1
            if current < start:
                await self.outbox.put_output(f.session_frame(await room.keyframe()))
            else:
                keyframe_at = current
        encode = f.output_binary if self.binary else f.output_json
        events = link.session_output(self.session_id, start)  # Unavailable: the link is down, the socket ends
        try:
            async with aclosing(events):
                async for event in events:
                    if isinstance(event, m.SessionOutput):
                        room.offer(event.seq, event.data)
                        await self._output(encode(event.seq, event.data))
                        if keyframe_at is not None and event.seq >= keyframe_at:
                            keyframe_at = None
                            await self.outbox.put_output(f.session_frame(await room.keyframe()))
                    elif isinstance(event, m.SessionLagged):
                        lagged = f"output {event.missed_from}..{event.resume_seq - 1} was dropped unsent"
                        await self.outbox.put_output(
                            f.session_frame(f.PtyError(code="PTY_OUTPUT_LAGGED", message=lagged))
                        )
                        await self.outbox.put_output(f.session_frame(await room.keyframe()))
                    elif isinstance(event, m.SessionExited):
                        await self.outbox.put_output(f.session_frame(f.closed(event)))
                        await self.outbox.put_output(f.goodbye("session_closed"))
                        await self.outbox.put_output(Close(f.CLOSE_NORMAL, "session closed"))
                        return
        except ControllerError as exc:
            log.info("attach socket on session %s: hostd stream failed: %s", self.session_id, exc)
            await self.outbox.put_output(f.goodbye("other", "the controller lost hostd; reconnect, replay_from"))
            await self.outbox.put_output(Close(f.CLOSE_SERVER_ERROR, "hostd unavailable"))
            return
        # Ended without an exit: the session was deleted, or hostd is shutting down.
        await self.outbox.put_output(f.session_frame(f.Closed(reason="killed", detail="session deleted")))
        await self.outbox.put_output(f.goodbye("session_closed"))
        await self.outbox.put_output(Close(f.CLOSE_NORMAL, "session closed"))
