"""The replay feed: one attach socket's output, replayed from a sequence (or a keyframe), then live.

:class:`ReplayFeed` runs from the socket's join until the session's output ends. It asks hostd
where the session's output stands: a ``replay_from`` outside what hostd holds is a
``REPLAY_OUT_OF_RANGE`` error, and the feed goes on as if none was given. Without one it sends the
room's keyframe and goes on after it; with one it replays from ``replay_from + 1`` and sends a
keyframe once the replay reaches what was current at the start (at once when there is nothing to
replay). Then live output, each frame offered to the room's screen on its way
(:meth:`~controller.pty.rooms.Room.offer`). Output frames go through ``send`` (the socket's send,
direct when nothing waits before them); what must stay in order with them (a lag error and its
keyframe, ``Closed``, the goodbye and the close) through the outbox's output lane.

It ends with the session: ``Closed``, ``binding_goodbye`` and close 1000 (the session exited, or
was deleted); or with hostd failing: ``binding_goodbye`` and close 1011, and the client
reconnects with ``replay_from``. A link already down when it subscribes raises ``Unavailable``.
hostd upgrading in place is not a failure: the feed waits for the link to come back (up to
:data:`~controller.hostlink.RESUME_WITHIN_S`) and goes on from the next sequence, so the client
sees no gap and no repeat.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING

from agentic_sandbox.proto import messages as m

from ..errors import ControllerError
from ..hostlink import RESTARTING
from . import frames as f
from .lanes import Close

if TYPE_CHECKING:
    from ..hostlink import HostdLink
    from .lanes import Outbox
    from .rooms import Room

log = logging.getLogger(__name__)


class ReplayFeed:
    """One socket's output from one session (see the module docstring). ``replay_from``: the
    upgrade's ``?replay_from=N``, used when the join gives none."""

    def __init__(
        self,
        link: HostdLink,
        session_id: str,
        outbox: Outbox,
        send: Callable[[str | bytes], Awaitable[None]],
        *,
        binary: bool,
        replay_from: int | None = None,
    ) -> None:
        self._link = link
        self._session_id = session_id
        self._outbox = outbox
        self._send = send
        self._encode = f.output_binary if binary else f.output_json
        self._replay_from = replay_from

    async def run(self, room: Room, replay_from: int | None) -> None:
        """Replay (or a keyframe), then live output, until the session's output ends."""
        outbox = self._outbox
        if replay_from is None:
            replay_from = self._replay_from
        info = (await self._link.call(m.SessionGetRequest(session_id=self._session_id))).session
        current = info.next_seq - 1
        keyframe_at: int | None = None
        if replay_from is not None and (replay_from + 1 < info.first_seq or replay_from > current):
            held = f"{info.first_seq - 1}..{current}"
            await outbox.put_output(
                f.error_frame("REPLAY_OUT_OF_RANGE", f"replay_from={replay_from} is outside {held}")
            )
            replay_from = None
        if replay_from is None:
            keyframe = await room.keyframe()
            await outbox.put_output(f.session_frame(keyframe))
            start = max(keyframe.anchor_sequence + 1, info.first_seq)
        else:
            start = replay_from + 1
            if current < start:
                await outbox.put_output(f.session_frame(await room.keyframe()))
            else:
                keyframe_at = current
        encode, send = self._encode, self._send
        while True:
            try:
                # Unavailable at once when the link is down.
                async with aclosing(self._link.session_output(self._session_id, start)) as events:
                    async for event in events:
                        if isinstance(event, m.SessionOutput):
                            room.offer(event.seq, event.data)
                            await send(encode(event.seq, event.data))
                            start = event.seq + 1
                            if keyframe_at is not None and event.seq >= keyframe_at:
                                keyframe_at = None
                                await outbox.put_output(f.session_frame(await room.keyframe()))
                        elif isinstance(event, m.SessionLagged):
                            lagged = f"output {event.missed_from}..{event.resume_seq - 1} was dropped unsent"
                            await outbox.put_output(f.pty_error("PTY_OUTPUT_LAGGED", lagged))
                            await outbox.put_output(f.session_frame(await room.keyframe()))
                            start = event.resume_seq
                        elif isinstance(event, m.SessionExited):
                            await self._closed(f.closed(event))
                            return
            except ControllerError as exc:
                if exc.code == RESTARTING and await self._link.wait_back():
                    # hostd upgraded in place: the session and its output are where they were.
                    log.info(
                        "attach socket on session %s: hostd restarted in place; resuming at %d", self._session_id, start
                    )
                    continue
                log.info("attach socket on session %s: hostd stream failed: %s", self._session_id, exc)
                await outbox.put_output(f.goodbye("other", "the controller lost hostd; reconnect, replay_from"))
                await outbox.put_output(Close(f.CLOSE_SERVER_ERROR, "hostd unavailable"))
                return
            # Ended without an exit: the session was deleted, or hostd is shutting down.
            await self._closed(f.Closed(reason="killed", detail="session deleted"))
            return

    async def _closed(self, closed: f.Closed) -> None:
        await self._outbox.put_output(f.session_frame(closed))
        await self._outbox.put_output(f.goodbye("session_closed"))
        await self._outbox.put_output(Close(f.CLOSE_NORMAL, "session closed"))
