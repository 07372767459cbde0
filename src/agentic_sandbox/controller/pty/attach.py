"""The attach socket: one accepted pty-ws/v1 WebSocket on one session (:class:`AttachSocket`).

The upgrade and its checks are :mod:`controller.pty.route`'s; the socket is an
:class:`~controller.pty.asgisocket.AsgiWebSocket`. :class:`AttachSocket` owns it and one nursery of
its two pumps, whichever ends cancelling the rest: the receiver (client frames, handled in order by
the :class:`~controller.pty.dispatch.FrameDispatch`) and the sender (the socket's
:class:`~controller.pty.lanes.Outbox` to the client). Beside them run the
:class:`~controller.pty.heartbeat.Heartbeat` (pings; a socket silent for ``pty_ping_timeout_s`` is
closed and its role freed) and, from the join on, the :class:`~controller.pty.feed.ReplayFeed`
(hostd's output to the client). The socket holds the parts, each with one job: the dispatch, the
heartbeat, the :class:`~controller.pty.membership.Membership` (roles and joins; leaving it leaves
the room and tells the other members), the :class:`~controller.pty.writes.PostedWrites` (input to
hostd, never awaited) and the feed; they get what they use when they are built.

Errors: a bad client frame gets an ``Error`` frame (the binding's codes) and the socket stays;
:data:`MAX_BAD_FRAMES` in a row close it with 4400. PTY failures are ``pty.session_frame`` errors
(``PTY_WRITE_FAILED``, ``PTY_RESIZE_FAILED``, ``PTY_OUTPUT_LAGGED`` followed by a keyframe). hostd
going away closes the socket with 1011 after a ``binding_goodbye``; the client reconnects with
``replay_from``. The session's end is ``Closed``, ``binding_goodbye`` and close 1000.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

import trio

from agentic_sandbox.proto import messages as m

from ..errors import ControllerError
from . import frames as f
from .dispatch import MAX_BAD_FRAMES as MAX_BAD_FRAMES
from .dispatch import FrameDispatch
from .feed import ReplayFeed
from .heartbeat import Heartbeat
from .lanes import Close, Outbox
from .membership import Membership
from .writes import PostedWrites

if TYPE_CHECKING:
    from ..hostlink import HostdLink
    from ..instances.sessions import SessionService
    from .asgisocket import AsgiWebSocket
    from .rooms import Room, Rooms

log = logging.getLogger(__name__)


class AttachSocket:
    """One accepted socket on one session (see the module docstring)."""

    def __init__(
        self,
        ws: AsgiWebSocket,
        info: m.SessionInfo,
        scopes: frozenset[str],
        *,
        binary: bool,
        replay_from: int | None,
        link: HostdLink,
        rooms: Rooms,
        sessions: SessionService,
        ping_interval_s: float,
        ping_timeout_s: float,
    ) -> None:
        sid = info.session_id
        self.ws = ws
        self.info = info
        self.outbox = outbox = Outbox()
        self.heartbeat = Heartbeat(outbox, sid, interval_s=ping_interval_s, timeout_s=ping_timeout_s)
        self.membership = Membership(info, scopes, outbox, rooms=rooms, sessions=sessions, link=link)
        self.feed = ReplayFeed(link, sid, outbox, self._output, binary=binary, replay_from=replay_from)
        self.dispatch = FrameDispatch(
            info,
            outbox,
            binary=binary,
            heartbeat=self.heartbeat,
            membership=self.membership,
            writes=PostedWrites(link, sid, outbox),
            start_feed=self._start_feed,
        )
        self._send_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        self.outbox.put_control(f.hello(self.info.session_id, max(self.info.next_seq - 1, 0), [f.PTY_EXTENSIONS_URI]))
        async with self.membership, trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._ending, self._sender)
            nursery.start_soon(self._ending, self._receiver)
            await nursery.start(self._heartbeat)

    async def _ending(self, pump: Callable[[], Awaitable[None]], *, queues_close: bool = False) -> None:
        """Run one pump; its end ends the socket, unless it ``queues_close`` (the sender closes then)."""
        try:
            await pump()
            if queues_close:
                return
        except ControllerError as exc:
            log.info("attach socket on session %s ended: %s", self.info.session_id, exc)
        self._end()

    def _end(self) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _heartbeat(self, *, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
        await self.heartbeat.run(task_status=task_status)
        self._end()  # silent too long: the role is freed on the way out

    def _start_feed(self, room: Room, replay_from: int | None) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(partial(self._ending, partial(self.feed.run, room, replay_from), queues_close=True))

    # -- the pumps --------------------------------------------------------------------------------

    async def _receiver(self) -> None:
        while True:
            message = await self.ws.receive()
            if message is None:
                return  # the client closed or went away
            self.heartbeat.seen()
            if not await self.dispatch.receive(message):
                await trio.sleep_forever()  # the sender closes the socket once the errors are out

    async def _sender(self) -> None:
        while True:
            item = await self.outbox.get()
            # Taken at once after the item (no checkpoint between): the feed's direct sends see
            # the outbox non-empty or the lock held, never a gap to overtake this item in.
            try:
                self._send_lock.acquire_nowait()
            except trio.WouldBlock:
                await self._send_lock.acquire()
            try:
                if item is None:
                    log.info("attach socket on session %s closed: the client reads nothing", self.info.session_id)
                    await self.ws.close(f.CLOSE_SERVER_ERROR, "client too slow")
                    return
                if isinstance(item, Close):
                    await self.ws.close(item.code, item.reason)
                    return
                await self.ws.send(item)
            finally:
                self._send_lock.release()

    async def _output(self, item: str | bytes) -> None:
        """Send one output frame in order: at once from the feed when nothing is queued or being
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
