"""A bounded ring of published records with monotonic ids, read by any number of cursors.

This is what the event bus (:mod:`controller.events.bus`) and the log ring (:mod:`controller.events.logs`)
are made of. A record gets the next id (1, 2, 3, ...) when it is appended, and its SSE frame is
encoded once then, so serving it to N followers costs N writes and no per-follower encoding.

Resource handling: nothing here owns a task. :meth:`Ring.append` never blocks and never awaits:
it takes a short lock (records may come from worker threads: log records do), stores the record,
drops the oldest past ``capacity`` and wakes the waiters. From the trio thread the wake is a
``trio.Event``; from any other thread it is scheduled with the run's ``TrioToken``
(``run_sync_soon``, which does not block either), coalesced so a flood of records schedules one
wake. Before :meth:`attach` (outside the app's trio run) records are stored and nobody is woken.

Readers hold a cursor (the last id they saw), never a queue: :meth:`Ring.read` returns what came
after the cursor, and a :class:`Gap` when some of it is no longer held (a follower that fell
behind, a ``Last-Event-ID`` older than the ring, or one from an earlier controller process, whose
ids the new ring does not know). So a slow reader costs the others nothing and is told what it
lost instead of being buffered for.

Ids given from outside: where the ids are a shared store's (the admin event stream on
PostgreSQL, :mod:`controller.events.journal`), records are stored with :meth:`Ring.append_at`
under the id they were given, which only has to be above the last one. Ids it skips (events this
process never loaded, or the history before it started) are a hole: a reader whose next record
lies past one is told so with a ``dropped`` :class:`Gap`, as if the ring had dropped them.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

import msgspec
import trio

T = TypeVar("T")

#: What one read hands back at most, so a follower far behind writes in bounded steps.
READ_BATCH = 256


class Gap(msgspec.Struct, kw_only=True, frozen=True):
    """Records a reader will never get, said before what it gets next.

    ``reason``: ``dropped`` (the ring no longer holds them: the reader fell behind or resumed from
    an id the ring has since dropped, or never loaded them: a hole in given ids) or ``restarted``
    (the reader's id is above every id the ring knows: from an earlier controller process, or from
    another database; what it missed cannot be counted). ``first_missed``..``last_missed`` is the
    inclusive range of lost ids, when known; the next record delivered has id ``resumed_at``.
    """

    reason: Literal["dropped", "restarted"]
    first_missed: int | None
    last_missed: int | None
    missed: int | None
    resumed_at: int


class Record(Generic[T]):
    """One published record: its id, the value and its SSE frame (``id:``, ``event:``, ``data:``)."""

    __slots__ = ("frame", "seq", "value")

    def __init__(self, seq: int, value: T, frame: bytes) -> None:
        self.seq = seq
        self.value = value
        self.frame = frame


def sse_frame(seq: int | None, event: str, data: bytes) -> bytes:
    """One SSE event. ``data`` is one JSON object (msgspec escapes newlines, so one line)."""
    head = f"event: {event}\ndata: " if seq is None else f"id: {seq}\nevent: {event}\ndata: "
    return head.encode() + data + b"\n\n"


def _dropped(after: int, resumed_at: int) -> Gap:
    return Gap(
        reason="dropped",
        first_missed=after + 1,
        last_missed=resumed_at - 1,
        missed=resumed_at - 1 - after,
        resumed_at=resumed_at,
    )


def _seq_of(record: Record[Any]) -> int:
    return record.seq


class Ring(Generic[T]):
    """See the module docstring. ``event_name(value)`` is the SSE ``event:`` of a record."""

    def __init__(self, capacity: int, event_name: Callable[[T], str]) -> None:
        if capacity < 1:
            raise ValueError("a ring holds at least one record")
        self.capacity = capacity
        self._event_name = event_name
        self._records: deque[Record[T]] = deque(maxlen=capacity)
        self._next = 1
        self._lock = threading.Lock()
        self._changed = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._trio_thread: int | None = None
        self._wake_pending = False

    # -- publishing -----------------------------------------------------------------------------

    def attach(self) -> None:
        """Call from the app's trio run: from now on appends wake the readers waiting in it."""
        self._token = trio.lowlevel.current_trio_token()
        self._trio_thread = threading.get_ident()
        self._changed = trio.Event()

    def detach(self) -> None:
        self._token = None
        self._trio_thread = None

    def append(self, value: T, encoded: bytes | None = None) -> int:
        """Store ``value`` under the next id and return the id. Never blocks (see the module docstring).
        ``encoded`` is its JSON when the caller has it already."""
        data = msgspec.json.encode(value) if encoded is None else encoded
        event = self._event_name(value)
        with self._lock:
            seq = self._next
            schedule = self._store(seq, value, sse_frame(seq, event, data))
        if schedule:
            self._wake_from(threading.get_ident())
        return seq

    def append_at(self, seq: int, value: T, encoded: bytes | None = None) -> None:
        """Store ``value`` under the id ``seq`` it was given elsewhere (a shared store's), which must
        be above :attr:`last_seq` (ValueError otherwise); the ids between are a hole (see the
        module docstring). Never blocks, like :meth:`append`."""
        data = msgspec.json.encode(value) if encoded is None else encoded
        frame = sse_frame(seq, self._event_name(value), data)
        with self._lock:
            if seq < self._next:
                raise ValueError(f"record id {seq} is not above the ring's last id {self._next - 1}")
            schedule = self._store(seq, value, frame)
        if schedule:
            self._wake_from(threading.get_ident())

    def _store(self, seq: int, value: T, frame: bytes) -> bool:
        """Under the lock: keep the record; True when a wake must be scheduled (none is pending)."""
        self._next = seq + 1
        self._records.append(Record(seq, value, frame))
        schedule = not self._wake_pending
        self._wake_pending = True
        return schedule

    def _wake_from(self, thread: int) -> None:
        if thread == self._trio_thread:
            self._wake()
            return
        token = self._token
        if token is None:
            self._wake_pending = False  # nobody waits outside a run
            return
        try:
            token.run_sync_soon(self._wake)
        except trio.RunFinishedError:
            self._wake_pending = False

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        self._changed.set()
        self._changed = trio.Event()

    # -- reading --------------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The id of the newest record (0 before the first)."""
        return self._next - 1

    @property
    def first_seq(self) -> int:
        """The id of the oldest record held (``last_seq + 1`` while empty)."""
        with self._lock:
            return self._records[0].seq if self._records else self._next

    def __len__(self) -> int:
        return len(self._records)

    def read(self, after: int, limit: int = READ_BATCH) -> tuple[Gap | None, list[Record[T]]]:
        """Records with ids above ``after`` (at most ``limit``, oldest first), and the gap before
        them if the ring no longer holds some. ``after`` above :attr:`last_seq` is an id from an
        earlier controller process: the gap says ``restarted`` and reading starts at the oldest held."""
        with self._lock:
            held = self._records
            newest = self._next - 1
            first = held[0].seq if held else self._next
            gap = None
            if after > newest:
                gap = Gap(reason="restarted", first_missed=None, last_missed=None, missed=None, resumed_at=first)
                after = first - 1
            elif after < first - 1:
                gap = _dropped(after, first)
                after = first - 1
            if not held or held[-1].seq - first + 1 == len(held):  # no hole: the index is the id's offset
                start = after + 1 - first  # index of the first record to hand back
                count = len(held) - start
                if start > count:  # near the tail, where live followers read: walk from the right end
                    records = list(itertools.islice(reversed(held), count))
                    records.reverse()
                    del records[limit:]
                else:
                    records = list(itertools.islice(held, start, start + limit))
                return gap, records
            start = bisect.bisect_right(held, after, key=_seq_of)
            records = list(itertools.islice(held, start, start + limit))
        if records and records[0].seq > after + 1:  # the cursor sits in a hole (``gap`` is None here)
            gap = _dropped(after, records[0].seq)
        for i in range(1, len(records)):  # stop before the next hole: the next read says it
            if records[i].seq != records[i - 1].seq + 1:
                del records[i:]
                break
        return gap, records

    def newest(self, keep: Callable[[T], bool], limit: int) -> list[Record[T]]:
        """Up to ``limit`` of the newest records whose value passes ``keep``, oldest first."""
        with self._lock:
            held = list(self._records)
        out: list[Record[T]] = []
        for record in reversed(held):
            if keep(record.value):
                out.append(record)
                if len(out) >= limit:
                    break
        out.reverse()
        return out

    async def wait_beyond(self, seq: int) -> None:
        """Return once a record with an id above ``seq`` exists (callers bound the wait)."""
        while self._next - 1 <= seq:
            await self._changed.wait()
