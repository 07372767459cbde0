"""A ring kept by a shared store: how the admin event stream works across controllers.

With PostgreSQL several controllers serve one host, and a follower may resume with
``Last-Event-ID`` at any of them, so an event's id must be the same everywhere. The
:class:`Journal` makes it so: the events every controller publishes are stored in one table
(:mod:`controller.store.adminevents`), which gives the ids, in commit order; each controller's
:class:`~controller.events.ring.Ring` is filled only from that table, each record under its
table id (:meth:`Ring.append_at`). So the rings of all controllers hold the same events under
the same ids, in the same order, and an id read at one resumes at another.

Three parts, one object:

* :meth:`Journal.put` (the bus's ``publish``, from any thread): never blocks and never awaits. The
  encoded event goes on a bounded queue (``max_pending``; when full the oldest is dropped,
  counted in :attr:`Journal.dropped` and logged once per outage) and the writer is woken, from
  another thread with the run's ``TrioToken`` (``run_sync_soon``), coalesced. The batch the writer
  is storing is off the queue (it still counts as pending in :meth:`Journal.statistics`); if it
  comes back unstored, the oldest past the bound are dropped then. The writer waits
  :data:`WRITE_DELAY_S` after a wake-up before it takes a batch: the events of one task's life (or
  of a burst) go in one transaction, and a busy controller writes a few times a second, not once
  per event.
* :meth:`Journal.run` (the app's nursery, ``nursery.start``): the writer. It stores what is queued,
  in order, in batches of up to :data:`WRITE_BATCH` rows per transaction. While the store is
  unavailable (:class:`StoreUnavailable`) the batch goes back on the queue and is retried with
  backoff (:data:`RETRY_MIN_S` doubling to :data:`RETRY_MAX_S`); a batch that fails otherwise (a
  bug) is dropped and logged, so it cannot stop the stream. Beside it a timer prunes the table to
  the newest ``keep`` rows every ``prune_every_s`` (never on a request's path; with several
  controllers the smallest ``AIWG_EVENT_RING_SIZE`` decides). When the writer is cancelled it
  makes one last shielded attempt to store a batch still queued (bounded by the store's own
  timeout), unless the store was just found down.
  A batch whose commit broke the connection may have been stored after all: retried, its events
  appear twice (same ``ev_`` id, two stream ids); never lost silently. After each stored batch
  the writer puts it in the ring itself when it follows what the ring holds (no other
  controller's events came in between: no read), else catches up; so this controller's followers
  see its own events without waiting for the notification (or the poll, while the listener is
  not connected).
* :meth:`Journal.catch_up` (the cluster's news handler, its resync and its poll timer, see
  :mod:`controller.cluster`): reads the rows past the last one seen and appends them to the ring
  (nothing when a notification names an id the ring holds already, its own writes coming back,
  or while the writer stores a batch: the writer catches up after it).
  The first call reads only the newest ``capacity`` rows (a ring holds no more), later ones
  everything new, :data:`READ_BATCH` rows per query. Calls are serialised. A row that does not
  decode is logged and skipped (readers are told of the hole as lost records). Ids only grow
  (pruning keeps the newest row); a table emptied by hand starts again at 1, which a running
  controller does not follow until it restarts.

An event is in this controller's ring only once it is committed and read back, even the ones it
published itself: a publisher's own followers see it after the round trip, in the same order as
everybody else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import msgspec
import trio

from ..store.adminevents import AdminEventTable
from ..store.database import StoreClosed, StoreUnavailable
from .ring import Ring

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Rows stored in one transaction at most.
WRITE_BATCH = 500
#: Rows read by one catch-up query at most.
READ_BATCH = 500
#: How long the writer lets events gather after a wake-up (see the module docstring).
WRITE_DELAY_S = 0.05
RETRY_MIN_S = 0.1
RETRY_MAX_S = 5.0
PRUNE_EVERY_S = 30.0


class JournalStatistics(msgspec.Struct, kw_only=True, frozen=True):
    """The journal's fill and history (for metrics and tests)."""

    pending: int
    max_pending: int
    stored: int
    dropped: int
    loaded: int
    available: bool


class _Wakeup:
    """A ``trio.Event`` any thread may set without blocking; sets are coalesced."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: int | None = None
        self._pending = False

    def attach(self) -> None:
        """From the waiter's trio run: sets from now on wake it."""
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.get_ident()
        self._event = trio.Event()

    def set(self) -> None:
        with self._lock:
            if self._pending:
                return
            self._pending = True
        if threading.get_ident() == self._thread:
            self._fire()
            return
        token = self._token
        try:
            if token is None:
                raise trio.RunFinishedError
            token.run_sync_soon(self._fire)
        except trio.RunFinishedError:  # nobody waits (yet): the waiter looks when it starts
            with self._lock:
                self._pending = False

    def _fire(self) -> None:
        with self._lock:
            self._pending = False
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


class Journal(Generic[T]):
    """See the module docstring. ``decode(body)`` makes a ring value of a stored body."""

    def __init__(
        self,
        table: AdminEventTable,
        ring: Ring[T],
        decode: Callable[[bytes], T],
        *,
        max_pending: int,
        keep: int,
        prune_every_s: float = PRUNE_EVERY_S,
    ) -> None:
        if max_pending < 1:
            raise ValueError("the journal's queue holds at least one event")
        self.table = table
        self.ring = ring
        self.decode = decode
        self.max_pending = max_pending
        self.keep = keep
        self.prune_every_s = prune_every_s
        self.stored = 0
        self.dropped = 0
        self.loaded = 0
        #: False from a failed write to the next one that succeeds.
        self.available = True
        self._lock = threading.Lock()
        self._pending: deque[bytes] = deque()
        self._in_flight = 0  # taken by the writer, not stored yet (still pending)
        self._dropping = False  # one warning per stretch of drops
        self._wakeup = _Wakeup()
        self._reading = trio.Lock()
        self._read_to = 0  # the newest row id read (or skipped): catch-up goes on after it

    def statistics(self) -> JournalStatistics:
        with self._lock:
            pending = len(self._pending) + self._in_flight
        return JournalStatistics(
            pending=pending,
            max_pending=self.max_pending,
            stored=self.stored,
            dropped=self.dropped,
            loaded=self.loaded,
            available=self.available,
        )

    # -- writing --------------------------------------------------------------------------------

    def put(self, body: bytes) -> None:
        """Queue one encoded event for the writer (any thread; never blocks)."""
        with self._lock:
            dropped = len(self._pending) >= self.max_pending
            if dropped:
                self._pending.popleft()
                self.dropped += 1
            warn = dropped and not self._dropping
            self._dropping = self._dropping or dropped
            self._pending.append(body)
        if warn:
            log.warning(
                "events: %d events wait to be stored; dropping the oldest (the store is slow or down)",
                self.max_pending,
            )
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer and the pruning timer, until cancelled or the store is closed."""
        self._wakeup.attach()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._prune)
                task_status.started()
                await self._write()
                nursery.cancel_scope.cancel()
        finally:
            await self._last_flush()

    async def _write(self) -> None:
        while True:
            pause = RETRY_MIN_S
            await trio.sleep(WRITE_DELAY_S)
            while (batch := self._take()) is not None:
                try:
                    ids = await self.table.append_many(batch, time.time())
                except StoreUnavailable as exc:
                    self._give_back(batch)
                    if self.available:
                        log.warning("events: cannot store events (%s); keeping them queued and retrying", exc)
                    self.available = False
                    await trio.sleep(pause)
                    pause = min(pause * 2, RETRY_MAX_S)
                    continue
                except StoreClosed:  # shutting down: what is left is counted by _last_flush
                    self._give_back(batch)
                    self.available = False
                    return
                except Exception:  # a bug (not a bad day): one batch lost, the stream goes on
                    with self._lock:
                        self._in_flight = 0
                        self.dropped += len(batch)
                    log.exception("events: storing %d events failed; dropped them", len(batch))
                    continue
                except BaseException:  # cancelled: _last_flush may still store it
                    self._give_back(batch)
                    raise
                self._done(batch)
                pause = RETRY_MIN_S
                if not self.available:
                    log.info("events: storing events again (%d dropped so far)", self.dropped)
                    self.available = True
                await self._read_own(ids, batch)
            await self._wakeup.wait()

    def _take(self) -> list[bytes] | None:
        with self._lock:
            count = min(WRITE_BATCH, len(self._pending))
            if count == 0:
                self._dropping = False
                return None
            self._in_flight = count
            return [self._pending.popleft() for _ in range(count)]

    def _done(self, batch: list[bytes]) -> None:
        with self._lock:
            self._in_flight = 0
            self.stored += len(batch)

    def _give_back(self, batch: list[bytes]) -> None:
        """Put a batch that was not stored back in front (the queue's bound still holds: what
        was published meanwhile is newer, so the batch's oldest go first)."""
        with self._lock:
            self._in_flight = 0
            self._pending.extendleft(reversed(batch))
            while len(self._pending) > self.max_pending:
                self._pending.popleft()
                self.dropped += 1

    async def _read_own(self, ids: list[int], batch: list[bytes]) -> None:
        """Put a stored batch in the ring at once, so this controller's followers get its own
        events without waiting for the notification's round trip (or for the poll, while it is not
        listening): as it is when it follows the ring, else by a catch-up; a failure here is the
        next catch-up's to fix."""
        if ids and ids[-1] <= self._read_to:
            return  # a catch-up (its notification came first) has taken it in
        if ids and ids[0] == self._read_to + 1 and not self._reading.locked():
            self._load(list(zip(ids, batch, strict=True)))
            return
        try:
            await self.catch_up()
        except (StoreUnavailable, StoreClosed) as exc:
            log.debug("events: reading back what was stored failed: %s", exc)
        except Exception:  # a bug here must not stop the writer: the cluster's catch-up goes on
            log.exception("events: reading back what was stored failed")

    async def _last_flush(self) -> None:
        """One shielded attempt to store a batch still queued (skipped when the store was just
        found down or closed: shutdown must not wait for it); says what is left unstored."""
        batch = self._take() if self.available else None
        if batch is not None:
            with trio.CancelScope(shield=True):
                try:
                    await self.table.append_many(batch, time.time())
                    self._done(batch)
                except Exception as exc:
                    self._give_back(batch)
                    log.debug("events: storing at shutdown failed: %s", exc)
        left = self.statistics().pending
        if left:
            log.warning("events: the writer stopped with %d events not stored", left)

    async def _prune(self) -> None:
        while True:
            await trio.sleep(self.prune_every_s)
            try:
                pruned = await self.table.prune(self.keep)
            except StoreClosed:
                return
            except Exception as exc:  # a store outage: pruned next time
                log.debug("events: pruning failed: %s", exc)
                continue
            if pruned:
                log.debug("events: pruned %d stored events", pruned)

    # -- reading --------------------------------------------------------------------------------

    async def catch_up(self, upto: int | None = None) -> None:
        """Append the rows stored since the last call to the ring (see the module docstring);
        nothing when ``upto`` (a notification's id) is held already. Raises what the store raises
        (the caller retries on its next news or poll)."""
        if upto is not None and (0 < upto <= self._read_to or self._in_flight):
            # Held already, or the writer is storing a batch: it takes in what was stored before
            # its batch when that commits (its own notification comes back meanwhile).
            return
        async with self._reading:
            if self._read_to == 0:
                self._load(await self.table.newest(self.ring.capacity))
            while True:
                rows = await self.table.after(self._read_to, READ_BATCH)
                self._load(rows)
                if len(rows) < READ_BATCH:
                    return

    def _load(self, rows: list[tuple[int, bytes]]) -> None:
        for event_id, body in rows:
            self._read_to = event_id
            try:
                value = self.decode(body)
            except msgspec.DecodeError as exc:  # ValidationError too
                log.warning("events: stored event %d does not decode (%s); skipped", event_id, exc)
                continue
            self.ring.append_at(event_id, value, body)
            self.loaded += 1
