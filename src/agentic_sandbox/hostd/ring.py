"""The output ring: a bounded, sequence-numbered history of one process's output.

One writer (a PTY or pipe reader task) appends chunks; every chunk gets the next sequence
number, starting at 1, without gaps. The ring holds at most ``max_frames`` chunks and, past
the newest one, at most ``max_bytes`` bytes in memory; older chunks are evicted as new ones
arrive. The writer never waits: appending is O(1) and never blocks.

Two optional partners make a session's history long and its memory bounded. A
:class:`MemoryBudget` bounds the bytes held in memory by every ring that shares it: each ring may
keep its share whatever the others do, and more while the total is under the bound. A
:class:`~hostd.spool.SessionSpool` takes what the ring evicts and keeps it on disk, so
:attr:`OutputRing.first_seq` is the oldest entry held in either place and :meth:`OutputRing.read_any`
reads from either (from disk in a worker thread).

Readers keep their own cursor (there is no per-reader queue) and call :meth:`OutputRing.read`
from it. A reader whose cursor fell below :attr:`OutputRing.first_seq` has lagged: the chunks
it missed are gone, and it resumes from ``first_seq`` (the caller tells its client so).
:meth:`OutputRing.wait_beyond` parks a reader until there is something new, the ring closed or it
was poked.
:func:`follow` is that whole reader loop, shared by session and exec subscribers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import NamedTuple

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode

from .errors import RpcError
from .handover import RingState, SegmentState
from .spool import Entry, SessionSpool, read_spooled


class SeqOutOfRange(Exception):
    """A read asked for a sequence the ring no longer (or does not yet) hold."""

    def __init__(self, first_seq: int, next_seq: int, seq: int | None = None) -> None:
        super().__init__(f"sequence {seq} is outside the ring's [{first_seq}, {next_seq}]")
        self.first_seq = first_seq
        self.next_seq = next_seq
        self.seq = seq


class RingStatistics(msgspec.Struct, frozen=True, kw_only=True):
    frames: int
    bytes: int
    spooled_bytes: int
    first_seq: int
    next_seq: int
    waiters: int
    closed: bool


class MemoryBudget:
    """In-memory bytes of every ring that shares it, under ``limit``; each ring may keep ``share``."""

    def __init__(self, *, limit: int, share: int) -> None:
        self.limit = limit
        self.share = min(share, limit)
        self.bytes = 0
        self._rings: set[OutputRing] = set()

    def join(self, ring: OutputRing) -> None:
        self._rings.add(ring)

    def leave(self, ring: OutputRing) -> None:
        self._rings.discard(ring)

    def reclaim(self) -> None:
        """Over the limit: the rings furthest over their share give back, largest first."""
        while self.bytes > self.limit:
            ring = max(self._rings, key=lambda r: r.memory_bytes, default=None)
            if ring is None or ring.memory_bytes <= self.share or not ring.evict_oldest():
                return


class OutputRing:
    """Bounded history of ``(seq, kind, data)`` chunks. ``kind`` is the caller's tag
    (e.g. stdout/stderr); the ring does not interpret it."""

    def __init__(
        self,
        *,
        max_frames: int,
        max_bytes: int,
        budget: MemoryBudget | None = None,
        spool: SessionSpool | None = None,
        write_through: bool = False,
    ) -> None:
        if max_frames < 1 or max_bytes < 1:
            raise ValueError("ring bounds must be at least 1")
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._entries: deque[tuple[int, int, bytes]] = deque()
        self._bytes = 0
        self.next_seq = 1
        self.closed = False
        self._budget = budget
        self._spool = spool
        #: Every chunk goes to the spool as it is appended, not when memory lets it go: what a crash
        #: of hostd must not lose (:mod:`hostd.fdstore`). Memory then only caches the newest.
        self._write_through = write_through and spool is not None
        if budget is not None:
            budget.join(self)
        # Made only when a reader waits, set and dropped on the next append/close: an append
        # with nobody waiting costs nothing beyond the deque operations.
        self._event: trio.Event | None = None
        self._waiters = 0
        self._pokes = 0

    def append(self, data: bytes, kind: int = 0) -> int:
        """Store ``data`` under the next sequence number and return it; evict past the bounds."""
        if self.closed:
            raise trio.ClosedResourceError("ring is closed")
        seq = self.next_seq
        if self._write_through:
            self._spool.append(((seq, kind, data),))  # type: ignore[union-attr]
        self._entries.append((seq, kind, data))
        self._bytes += len(data)
        self.next_seq = seq + 1
        budget = self._budget
        if budget is not None:
            budget.bytes += len(data)
        entries = self._entries
        # The newest chunk always stays, even alone above max_bytes: a reader must be able to
        # get every chunk it has not lagged past.
        evicted: list[Entry] = []
        while len(entries) > 1 and (
            len(entries) > self.max_frames
            or self._bytes > self.max_bytes
            or (budget is not None and budget.bytes > budget.limit and self._bytes > budget.share)
        ):
            evicted.append(self._pop())
        if evicted and self._spool is not None and not self._write_through:
            self._spool.append(evicted)
        if budget is not None and budget.bytes > budget.limit:
            budget.reclaim()
        self._wake()
        return seq

    def _pop(self) -> Entry:
        entry = self._entries.popleft()
        self._bytes -= len(entry[2])
        if self._budget is not None:
            self._budget.bytes -= len(entry[2])
        return entry

    def evict_oldest(self) -> bool:
        """Give back the oldest entry held in memory (to the spool, if any); False if only the newest
        is left."""
        if len(self._entries) <= 1:
            return False
        entry = self._pop()
        if self._spool is not None and not self._write_through:
            self._spool.append((entry,))
        return True

    @property
    def memory_bytes(self) -> int:
        return self._bytes

    @property
    def memory_first_seq(self) -> int:
        """The oldest sequence held in memory (``next_seq`` while empty)."""
        return self._entries[0][0] if self._entries else self.next_seq

    @property
    def first_seq(self) -> int:
        """The oldest sequence a reader can still get, from disk or memory."""
        spooled = self._spool.first_seq if self._spool is not None else None
        return min(spooled, self.memory_first_seq) if spooled is not None else self.memory_first_seq

    def discard(self) -> None:
        """The session is gone: close, free the memory, remove the spool. Idempotent."""
        self.close()
        while self._entries:
            self._pop()
        if self._budget is not None:
            self._budget.leave(self)
        if self._spool is not None:
            self._spool.remove()
            self._spool = None

    def close(self) -> None:
        """No more appends; wakes every waiter. Idempotent. What the ring holds stays readable."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    def read(self, seq: int, max_items: int = 64, max_bytes: int | None = None) -> list[Entry]:
        """Up to ``max_items`` chunks from ``seq`` on, and no more once ``max_bytes`` are reached
        (the first chunk always comes); ``[]`` if ``seq == next_seq``.

        Memory only: raises :class:`SeqOutOfRange` if ``seq < memory_first_seq`` (evicted or
        spooled) or ``seq > next_seq``.
        """
        first = self.memory_first_seq
        if seq < first or seq > self.next_seq:
            raise SeqOutOfRange(first, self.next_seq, seq)
        entries = self._entries
        start = seq - first
        stop = min(len(entries), start + max_items)
        if max_bytes is None:
            return [entries[i] for i in range(start, stop)]
        batch: list[Entry] = []
        size = 0
        for i in range(start, stop):
            batch.append(entries[i])
            size += len(entries[i][2])
            if size >= max_bytes:
                break
        return batch

    async def read_any(self, seq: int, max_items: int = 64, max_bytes: int | None = None) -> list[Entry]:
        """Like :meth:`read`, from the spool for what memory no longer holds (in a worker thread,
        so the ring's writer and every other reader go on meanwhile). Always checkpoints.

        Raises :class:`SeqOutOfRange` for a ``seq`` held nowhere, also when the spool dropped it
        during the read.
        """
        spool = self._spool
        if seq >= self.memory_first_seq or spool is None or spool.first_seq is None or seq < spool.first_seq:
            batch = self.read(seq, max_items, max_bytes)  # taken before the checkpoint: eviction cannot race it
            await trio.lowlevel.checkpoint()
            return batch
        plan = spool.plan(seq)
        found = await trio.to_thread.run_sync(read_spooled, plan, seq, max_items, max_bytes, abandon_on_cancel=True)
        if not found or found[0][0] != seq:
            raise SeqOutOfRange(self.first_seq, self.next_seq, seq)
        return found

    def poke(self) -> None:
        """Wake every reader parked in :meth:`wait_beyond` without appending: they look again at
        why they follow (a deleted session, say), at no cost to a send they are in."""
        self._pokes += 1
        self._wake()

    async def wait_beyond(self, seq: int) -> None:
        """Return once ``next_seq > seq`` (chunk ``seq`` has been appended: a reader whose
        cursor is ``seq`` has something to read), the ring is closed or :meth:`poke` was called.
        Always checkpoints."""
        if self.next_seq > seq or self.closed:
            await trio.lowlevel.checkpoint()
            return
        pokes = self._pokes
        while self.next_seq <= seq and not self.closed and self._pokes == pokes:
            if self._event is None:
                self._event = trio.Event()
            event = self._event
            self._waiters += 1
            try:
                await event.wait()
            finally:
                self._waiters -= 1

    def snapshot(self) -> RingState:
        """Everything a new image of hostd needs to go on with this ring (:mod:`hostd.handover`)."""
        spool = self._spool
        return RingState(
            next_seq=self.next_seq,
            entries=list(self._entries),
            spool=[SegmentState(*seg) for seg in spool.segments()] if spool is not None else None,
            spool_failed=spool.failed if spool is not None else False,
            closed=self.closed,
        )

    def recover(self) -> None:
        """Go on from what the spool holds on disk (a session taken back after hostd crashed; with
        write-through, every chunk appended before the crash)."""
        if self._spool is None:
            return
        self._spool.recover()
        if self._spool.next_seq is not None:
            self.next_seq = self._spool.next_seq

    def resume(self, state: RingState) -> None:
        """Go on from :meth:`snapshot` of the ring an earlier image of hostd held (this one is new)."""
        if self._spool is not None:
            if state.spool_failed:
                self._spool.failed = True
            self._spool.adopt((s.path, s.first_seq, s.next_seq, s.size) for s in state.spool or ())
        for seq, kind, data in state.entries:
            self._entries.append((seq, kind, data))
            self._bytes += len(data)
            if self._budget is not None:
                self._budget.bytes += len(data)
        self.next_seq = state.next_seq
        self.closed = state.closed

    def statistics(self) -> RingStatistics:
        return RingStatistics(
            frames=len(self._entries),
            bytes=self._bytes,
            spooled_bytes=self._spool.bytes if self._spool is not None else 0,
            first_seq=self.first_seq,
            next_seq=self.next_seq,
            waiters=self._waiters,
            closed=self.closed,
        )

    def __len__(self) -> int:
        return len(self._entries)


# ---------------------------------------------------------------------------------------------
# Following a ring: what every subscriber does, whatever it turns the entries into.


#: Batches a follower may take from memory in a row without passing through the scheduler.
_YIELD_EVERY = 16


class Lag(NamedTuple):
    """The follower fell out of the ring: ``[missed_from, resume_seq)`` is gone."""

    missed_from: int
    resume_seq: int


def start_seq(ring: OutputRing, from_seq: int | None) -> int:
    """Where a follower starts: ``from_seq``, or only new output for None.

    Sequences start at 1, so asking from 0 (or from 1 on a ring that never dropped anything) asks
    for everything, and gets it. Out of range, answered ``stream.seq_out_of_range`` with what the
    ring holds, is only a request for output that is gone (below ``first_seq`` once the ring
    dropped entries) or that does not exist yet (beyond ``next_seq``).
    """
    seq = ring.next_seq if from_seq is None else max(from_seq, 1)
    if not ring.first_seq <= seq <= ring.next_seq:
        raise RpcError(
            ErrorCode.SEQ_OUT_OF_RANGE,
            f"sequence {seq} is not in [{ring.first_seq}, {ring.next_seq}]",
            first_seq=ring.first_seq,
            next_seq=ring.next_seq,
        )
    return seq


async def follow(
    ring: OutputRing,
    seq: int,
    *,
    max_items: int,
    max_bytes: int | None = None,
    stop: Callable[[], bool],
) -> AsyncGenerator[list[Entry] | Lag, None]:
    """Replay from ``seq``, then live: yield batches of entries and a :class:`Lag` whenever the
    follower fell behind the oldest entry held, gap-free otherwise.

    Ends once the ring is closed and everything in it was yielded, or as soon as ``stop()`` is
    true (a caller that sets what ``stop`` reads pokes the ring). Waits with :meth:`OutputRing.wait_beyond`.
    A batch is taken from the ring before it is yielded, so eviction while the caller sends it
    cannot tear it.
    """
    unyielded = 0
    while not stop():
        if seq < ring.first_seq:
            yield Lag(seq, ring.first_seq)
            seq = ring.first_seq
            continue
        try:
            if seq >= ring.memory_first_seq:
                # No pass through the scheduler for what memory holds: a live follower has just
                # been woken for it, and its caller's send yields whenever the client is slow.
                batch = ring.read(seq, max_items, max_bytes)
            else:
                batch = await ring.read_any(seq, max_items, max_bytes)
        except SeqOutOfRange:
            # Gone during the read (the spool dropped it, or the disk failed): resume where the
            # ring can still answer, and say what was missed.
            resume = ring.first_seq if ring.first_seq > seq else ring.memory_first_seq
            yield Lag(seq, resume)
            seq = resume
            continue
        if batch:
            yield batch
            seq = batch[-1][0] + 1
            unyielded += 1
            if unyielded >= _YIELD_EVERY:
                # A replay whose client keeps up never waits: let every other task in.
                unyielded = 0
                await trio.lowlevel.checkpoint()
            continue
        if ring.closed:
            return
        unyielded = 0
        await ring.wait_beyond(seq)
