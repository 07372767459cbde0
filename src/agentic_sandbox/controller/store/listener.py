"""What other controllers wrote, as it is committed: PostgreSQL ``LISTEN`` on one connection of
its own, with polling as the fallback.

The schema's triggers (:data:`controller.store.schema.POSTGRES_STEP_8`) ``NOTIFY`` at commit:
``aiwg_tasks`` (``"<task id> <last seq>"``: a task has new events), ``aiwg_events`` (an admin
event's id) and ``aiwg_tokens`` (an instance whose token changed). :class:`Listener` hands each to
its ``on_news(channel, payload)`` on the event loop; a controller's own writes come back too, and
the handlers know what they have seen already.

No notification is lost while the connection is up (PostgreSQL queues them for the session); one
sent while it is down is. So after every (re)connect, before the first notification is read,
``on_resync()`` runs: each handler catches up from the store as if everything had changed. And
every ``poll_s`` ``on_poll()`` runs as well, a cheap check of the store that keeps a reader correct
even when the connection is up but silent (a half-open TCP connection that keepalives have not yet
declared dead).

The connection is waited on with ``trio.lowlevel.wait_readable`` on its socket and read without
blocking (``consume_input``), so a quiet listener costs nothing and wakes within the loop's next
turn. A connection that breaks is reopened with backoff (capped at :data:`RECONNECT_MAX_S`).

Resource handling: :meth:`Listener.run` in the caller's nursery (``nursery.start``: started once
listening, or once the first attempt failed, so a database that is down at start does not hold
the start up); cancelling it closes the connection.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
import trio

from .postgres import safe_url

log = logging.getLogger(__name__)

RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 2.0

News = Callable[[str, str], None]
Resync = Callable[[], Awaitable[None]]


class Listener:
    def __init__(
        self,
        url: str,
        channels: Sequence[str],
        *,
        on_news: News,
        on_resync: Resync,
        on_poll: Resync,
        poll_s: float = 1.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.url = url
        self.channels = tuple(channels)
        self.on_news = on_news
        self.on_resync = on_resync
        self.on_poll = on_poll
        self.poll_s = poll_s
        self.connect_timeout_s = connect_timeout_s
        #: True while the connection listens (what a readiness check may show).
        self.listening = False
        self.received = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._poll)
            await self._listen(task_status)

    async def _poll(self) -> None:
        while True:
            await trio.sleep(self.poll_s)
            try:
                await self.on_poll()
            except Exception as exc:  # a store outage: polled again next time
                log.debug("store poll failed: %s", exc)

    async def _listen(self, task_status: trio.TaskStatus[None]) -> None:
        pause = RECONNECT_MIN_S
        started = False
        while True:
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = await trio.to_thread.run_sync(self._connect)
                self.listening = True
                pause = RECONNECT_MIN_S
                await self.on_resync()  # what was sent while nobody listened
                if not started:
                    started = True
                    task_status.started()
                await self._read(conn)
            except (psycopg.Error, OSError) as exc:
                if self.listening:
                    log.warning("store: stopped listening to %s (%s); reconnecting", safe_url(self.url), _line(exc))
                else:
                    log.debug("store: cannot listen to %s yet: %s", safe_url(self.url), _line(exc))
            except Exception as exc:  # a handler's resync failed (the store is down): try again
                log.warning("store: catching up after a reconnect failed (%s); retrying", _line(exc))
            finally:
                self.listening = False
                if conn is not None:
                    if not conn.closed:
                        trio.lowlevel.notify_closing(conn.fileno())
                    conn.close()
            if not started:
                started = True
                task_status.started()
            await trio.sleep(pause)
            pause = min(pause * 2, RECONNECT_MAX_S)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=max(1, round(self.connect_timeout_s)),
            # TCP keepalives: a server that vanished (no RST) is noticed within about 11 s.
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
        )
        try:
            for channel in self.channels:
                conn.execute(f"LISTEN {channel}")
        except BaseException:
            conn.close()
            raise
        return conn

    async def _read(self, conn: psycopg.Connection[Any]) -> None:
        pgconn = conn.pgconn
        fd = conn.fileno()
        while True:
            await trio.lowlevel.wait_readable(fd)
            pgconn.consume_input()  # raises once the connection is gone
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listening connection was closed by the server")
            while (note := pgconn.notifies()) is not None:
                self.received += 1
                try:
                    self.on_news(note.relname.decode(), note.extra.decode())
                except Exception:  # a handler's bug must not stop the others' news
                    log.exception("store: a notification handler failed")


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
