"""The output ring: a bounded, sequence-numbered history of one process's output.

One writer (a PTY or pipe reader task) appends chunks; every chunk gets the next sequence
number, starting at 1, without gaps. The ring holds at most ``max_frames`` chunks and, past
the newest one, at most ``max_bytes`` bytes; older chunks are evicted as new ones arrive. The
writer never waits: appending is O(1) and never blocks.

Readers keep their own cursor (there is no per-reader queue) and call :meth:`OutputRing.read`
from it. A reader whose cursor fell below :attr:`OutputRing.first_seq` has lagged: the chunks
it missed are gone, and it resumes from ``first_seq`` (the caller tells its client so).
:meth:`OutputRing.wait_beyond` parks a reader until there is something new or the ring closed.
:func:`follow` is that whole reader loop, shared by session and exec subscribers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import NamedTuple

import msgspec
import trio

from proto import ErrorCode

from .errors import RpcError


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
    first_seq: int
    next_seq: int
    waiters: int
    closed: bool


class OutputRing:
    """Bounded history of ``(seq, kind, data)`` chunks. ``kind`` is the caller's tag
    (e.g. stdout/stderr); the ring does not interpret it."""

    def __init__(self, *, max_frames: int, max_bytes: int) -> None:
        if max_frames < 1 or max_bytes < 1:
            raise ValueError("ring bounds must be at least 1")
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._entries: deque[tuple[int, int, bytes]] = deque()
        self._bytes = 0
        self.first_seq = 1
        self.next_seq = 1
        self.closed = False
        # Made only when a reader waits, set and dropped on the next append/close: an append
        # with nobody waiting costs nothing beyond the deque operations.
        self._event: trio.Event | None = None
        self._waiters = 0

    def append(self, data: bytes, kind: int = 0) -> int:
        """Store ``data`` under the next sequence number and return it; evict past the bounds."""
        if self.closed:
            raise trio.ClosedResourceError("ring is closed")
        seq = self.next_seq
        self._entries.append((seq, kind, data))
        self._bytes += len(data)
        self.next_seq = seq + 1
        entries = self._entries
        # The newest chunk always stays, even alone above max_bytes: a reader must be able to
        # get every chunk it has not lagged past.
        while len(entries) > self.max_frames or (self._bytes > self.max_bytes and len(entries) > 1):
            _, _, old = entries.popleft()
            self._bytes -= len(old)
        self.first_seq = entries[0][0]
        self._wake()
        return seq

    def close(self) -> None:
        """No more appends; wakes every waiter. Idempotent. What the ring holds stays readable."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    def read(self, seq: int, max_items: int = 64) -> list[tuple[int, int, bytes]]:
        """Up to ``max_items`` chunks from ``seq`` on; ``[]`` if ``seq == next_seq``.

        Raises :class:`SeqOutOfRange` if ``seq < first_seq`` (evicted) or ``seq > next_seq``.
        """
        if seq < self.first_seq or seq > self.next_seq:
            raise SeqOutOfRange(self.first_seq, self.next_seq, seq)
        entries = self._entries
        start = seq - self.first_seq
        stop = min(len(entries), start + max_items)
        return [entries[i] for i in range(start, stop)]

    async def wait_beyond(self, seq: int) -> None:
        """Return once ``next_seq > seq`` (chunk ``seq`` has been appended: a reader whose
        cursor is ``seq`` has something to read) or the ring is closed. Always checkpoints."""
        if self.next_seq > seq or self.closed:
            await trio.lowlevel.checkpoint()
            return
        while self.next_seq <= seq and not self.closed:
            if self._event is None:
                self._event = trio.Event()
            event = self._event
            self._waiters += 1
            try:
                await event.wait()
            finally:
                self._waiters -= 1

    def statistics(self) -> RingStatistics:
        return RingStatistics(
            frames=len(self._entries),
            bytes=self._bytes,
            first_seq=self.first_seq,
            next_seq=self.next_seq,
            waiters=self._waiters,
            closed=self.closed,
        )

    def __len__(self) -> int:
        return len(self._entries)


# ---------------------------------------------------------------------------------------------
# Following a ring: what every subscriber does, whatever it turns the entries into.


class Lag(NamedTuple):
    """The follower fell out of the ring: ``[missed_from, resume_seq)`` is gone."""

    missed_from: int
    resume_seq: int


Entry = tuple[int, int, bytes]


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
    stop: Callable[[], bool],
    wait: Callable[[int], Awaitable[None]] | None = None,
) -> AsyncGenerator[list[Entry] | Lag, None]:
    """Replay from ``seq``, then live: yield batches of entries and a :class:`Lag` whenever the
    follower fell behind the oldest entry held, gap-free otherwise.

    Ends once the ring is closed and everything in it was yielded, or as soon as ``stop()`` is
    true. Waits for new entries with ``wait(seq)`` (default :meth:`OutputRing.wait_beyond`).
    A batch is taken from the ring before it is yielded, so eviction while the caller sends it
    cannot tear it.
    """
    wait = wait or ring.wait_beyond
    while not stop():
        if seq < ring.first_seq:
            yield Lag(seq, ring.first_seq)
            seq = ring.first_seq
            continue
        batch = ring.read(seq, max_items)
        if batch:
            yield batch
            seq = batch[-1][0] + 1
            continue
        if ring.closed:
            return
        await wait(seq)
