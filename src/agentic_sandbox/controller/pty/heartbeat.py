"""The attach socket's heartbeat: app-level pings and pongs, and the idle close.

:class:`Heartbeat` sends a ``ping`` every ``interval_s`` and answers a client's ``ping`` with a
``pong``. The idle close is a restartable timer: every frame from the client starts it over
(:meth:`Heartbeat.seen`), and once ``timeout_s`` pass without one :meth:`Heartbeat.run` returns,
which ends the socket (its role is freed on the way out). A restart only notes the time and the
timer reads it when it falls due, then waits on from there: a keystroke costs a clock read, not a
new deadline. :meth:`Heartbeat.run` is started with ``nursery.start`` and hands back its own cancel
scope, which stops pings and timer both.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from . import frames as f

if TYPE_CHECKING:
    from .lanes import Outbox

log = logging.getLogger(__name__)


class Heartbeat:
    """One socket's pings and idle timer (see the module docstring)."""

    def __init__(self, outbox: Outbox, session_id: str, *, interval_s: float, timeout_s: float) -> None:
        self._outbox = outbox
        self._session_id = session_id
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.last_seen = trio.current_time()

    def seen(self) -> None:
        """A frame came from the client: the idle timer starts over."""
        self.last_seen = trio.current_time()

    def pong(self, payload: f.Ping, request_id: str) -> None:
        """Answer the client's ``ping``."""
        self._outbox.put_control(
            f.encode("pong", {"client_ts": payload.client_ts, "server_ts": f.now_ts()}, request_id=request_id)
        )

    async def run(self, *, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
        """Ping every ``interval_s``; return once the client was silent for ``timeout_s`` (or the
        cancel scope handed back was cancelled)."""
        with trio.CancelScope() as scope:
            task_status.started(scope)
            next_ping = trio.current_time() + self.interval_s
            while True:
                await trio.sleep_until(min(next_ping, self.last_seen + self.timeout_s))
                now = trio.current_time()
                if now >= self.last_seen + self.timeout_s:
                    log.info("attach socket on session %s reaped: silent for %gs", self._session_id, self.timeout_s)
                    return
                if now >= next_ping:
                    self._outbox.put_control(f.encode("ping", {"client_ts": f.now_ts()}))
                    next_ping = now + self.interval_s
