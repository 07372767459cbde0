"""Session output spilled to disk: older ring entries in per-session segment files.

General layout: one :class:`Spool` per hostd owns a directory under the state dir and the two disk
bounds (per session and in total); one :class:`SessionSpool` per session owns
``<spool dir>/<session id>/`` and its segments, oldest first. A ring hands its spool the entries it
evicts from memory, in sequence order, so a session's history is the spool's entries followed by the
ring's: gap-free, byte-exact, and a reader can resume from any sequence either holds.

Segment files are a run of records, each a 13-byte header (sequence u64, kind u8, length u32, big
endian) and the data. A segment is closed for appends once it reaches ``segment_bytes``. When a bound
is passed, whole segments go, oldest first: the session's own when it passes its bound, the most
spooled session's when the total passes. What goes is said to readers as a lag, never skipped silently.

Appends run on hostd's trio thread (a few writes into the page cache per evicted megabyte); reads of
old output run in a worker thread (:meth:`SessionSpool.read`) so that a reattach from hours back never
stalls the live output of that session or any other. Sessions do not outlive hostd, so a new hostd
clears what an old one left.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from collections import deque
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">QBI")
Entry = tuple[int, int, bytes]


class _Segment:
    __slots__ = ("first_seq", "next_seq", "path", "size")

    def __init__(self, path: Path, first_seq: int) -> None:
        self.path = path
        self.first_seq = first_seq
        self.next_seq = first_seq
        self.size = 0


class Spool:
    """Every session's spilled output, under ``root``, within the two bounds."""

    def __init__(self, root: Path, *, session_bytes: int, total_bytes: int, segment_bytes: int) -> None:
        self.root = root
        self.session_bytes = session_bytes
        self.total_bytes = total_bytes
        self.segment_bytes = segment_bytes
        self.bytes = 0
        self._sessions: dict[str, SessionSpool] = {}

    def clear(self) -> None:
        """Remove what a previous hostd left (its sessions ended with it) and make the root, 0700."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def open(self, session_id: str) -> SessionSpool:
        spool = SessionSpool(self, session_id)
        self._sessions[session_id] = spool
        return spool

    def make_root(self) -> None:
        """Make the root (0700) without clearing it: an upgrade in place hands its sessions over."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def remove_unclaimed(self) -> None:
        """Remove every session directory no session of this hostd holds (after a handover: what
        sessions that ended meanwhile, or a failed spool, left)."""
        if not self.root.is_dir():
            return
        for child in self.root.iterdir():
            if child.name not in self._sessions:
                shutil.rmtree(child, ignore_errors=True)

    def _forget(self, spool: SessionSpool) -> None:
        self._sessions.pop(spool.session_id, None)

    def _enforce_total(self) -> None:
        while self.bytes > self.total_bytes:
            biggest = max(self._sessions.values(), key=lambda s: s.bytes, default=None)
            if biggest is None or not biggest.drop_oldest():
                return


class SessionSpool:
    """One session's segments, used from the trio thread only (readers in worker threads get a
    :meth:`plan` made here and read with :func:`read_spooled`)."""

    def __init__(self, owner: Spool, session_id: str) -> None:
        self.owner = owner
        self.session_id = session_id
        self.dir = owner.root / session_id
        self.bytes = 0
        self._segments: deque[_Segment] = deque()
        self._fd: int | None = None
        self.failed = False

    @property
    def first_seq(self) -> int | None:
        """The oldest sequence held on disk, or None when nothing is."""
        return self._segments[0].first_seq if self._segments else None

    @property
    def next_seq(self) -> int | None:
        return self._segments[-1].next_seq if self._segments else None

    def append(self, entries: Iterable[Entry]) -> None:
        """Write ``entries`` (contiguous, after everything held) and apply the bounds.

        A disk that refuses a write (full, read-only) turns the spool off for this session with one
        log line: the ring goes on in memory, and readers see the lost span as a lag.
        """
        if self.failed:
            return
        try:
            for seq, kind, data in entries:
                segment = self._writable(seq)
                fd = self._fd_for(segment)
                header = _HEADER.pack(seq, kind, len(data))
                size = len(header) + len(data)
                written = os.writev(fd, (header, data))
                if written < size:  # short write: finish it (and hear about a full disk)
                    rest = memoryview(header + data)[written:]
                    while rest:
                        rest = rest[os.write(fd, rest) :]
                segment.size += size
                segment.next_seq = seq + 1
                self.bytes += size
                self.owner.bytes += size
        except OSError as exc:
            log.error(
                "session %s: cannot spool output to %s (%s); older output is kept in memory only",
                self.session_id,
                self.dir,
                exc,
            )
            self.remove()
            self.failed = True
            return
        while self.bytes > self.owner.session_bytes and self.drop_oldest():
            pass
        self.owner._enforce_total()

    def segments(self) -> list[tuple[str, int, int, int]]:
        """(path, first_seq, next_seq, size) of each segment, oldest first: what a handover carries."""
        return [(str(s.path), s.first_seq, s.next_seq, s.size) for s in self._segments]

    def adopt(self, segments: Iterable[tuple[str, int, int, int]]) -> None:
        """Take over the segments an earlier image of hostd wrote (:meth:`segments`). A segment whose
        file is gone is left out with every older one, so what is held stays gap-free."""
        kept: list[_Segment] = []
        for path, first_seq, next_seq, size in segments:
            if not os.path.exists(path):
                kept.clear()
                continue
            segment = _Segment(Path(path), first_seq)
            segment.next_seq, segment.size = next_seq, size
            kept.append(segment)
        for segment in kept:
            self._segments.append(segment)
            self.bytes += segment.size
            self.owner.bytes += segment.size

    def recover(self) -> None:
        """Take back the segments on disk (hostd crashed; their index was only in its memory): each
        file is read record by record, a torn last record cut off, and the run kept gap-free from
        the newest back."""
        if not self.dir.is_dir():
            return
        found: list[_Segment] = []
        for path in sorted(self.dir.glob("*.seg")):
            segment = _scan(path)
            if segment is None:
                continue
            if found and found[-1].next_seq != segment.first_seq:
                found.clear()  # a gap: only what follows it is one run
            found.append(segment)
        self.adopt((str(s.path), s.first_seq, s.next_seq, s.size) for s in found)

    def _writable(self, seq: int) -> _Segment:
        last = self._segments[-1] if self._segments else None
        if last is not None and last.size < self.owner.segment_bytes and last.next_seq == seq:
            return last
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if last is None:
            self.dir.mkdir(mode=0o700, exist_ok=True)
        segment = _Segment(self.dir / f"{seq:020d}.seg", seq)
        self._segments.append(segment)
        return segment

    def _fd_for(self, segment: _Segment) -> int:
        if self._fd is None:
            self._fd = os.open(segment.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        return self._fd

    def drop_oldest(self) -> bool:
        """Remove the oldest segment (never the one being written while another exists)."""
        if not self._segments:
            return False
        segment = self._segments.popleft()
        if not self._segments and self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.bytes -= segment.size
        self.owner.bytes -= segment.size
        try:
            segment.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("session %s: cannot remove spool segment %s: %s", self.session_id, segment.path, exc)
        return True

    def remove(self) -> None:
        """Drop every segment and the directory (the session was deleted, or the disk failed)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.owner.bytes -= self.bytes
        self.bytes = 0
        self._segments.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.owner._forget(self)

    # -- reading ------------------------------------------------------------------------------

    def plan(self, seq: int) -> list[tuple[Path, int]]:
        """On the trio thread: the segments (path, complete size) that hold ``seq`` and later."""
        return [(s.path, s.size) for s in self._segments if s.next_seq > seq]


def _scan(path: Path) -> _Segment | None:
    """A segment file's records (a torn last one cut off), or None if it holds none."""
    try:
        with open(path, "r+b") as f:
            data = f.read()
            pos = 0
            first = next_seq = None
            while pos + _HEADER.size <= len(data):
                seq, _kind, length = _HEADER.unpack_from(data, pos)
                if pos + _HEADER.size + length > len(data) or (next_seq is not None and seq != next_seq):
                    break
                first = seq if first is None else first
                next_seq = seq + 1
                pos += _HEADER.size + length
            if pos < len(data):
                f.truncate(pos)
    except OSError as exc:
        log.warning("cannot read spool segment %s: %s", path, exc)
        return None
    if first is None or next_seq is None:
        return None
    segment = _Segment(path, first)
    segment.next_seq, segment.size = next_seq, pos
    return segment


def read_spooled(plan: list[tuple[Path, int]], seq: int, max_items: int, max_bytes: int | None = None) -> list[Entry]:
    """In a worker thread: up to ``max_items`` entries (and ``max_bytes``, the first entry always) from
    ``seq`` on, reading only the bytes each
    segment of ``plan`` (:meth:`SessionSpool.plan`) had; shorter or ``[]`` when a segment went
    meanwhile (the caller re-checks what the ring holds)."""
    found: list[Entry] = []
    size = 0
    for path, limit in plan:
        try:
            with open(path, "rb") as f:
                data = f.read(limit)
        except FileNotFoundError:
            return found
        view = memoryview(data)
        pos = 0
        while pos + _HEADER.size <= len(view) and len(found) < max_items:
            entry_seq, kind, length = _HEADER.unpack_from(view, pos)
            start = pos + _HEADER.size
            pos = start + length
            if entry_seq >= seq and pos <= len(view):
                found.append((entry_seq, kind, bytes(view[start:pos])))
                seq = entry_seq + 1
                size += length
                if max_bytes is not None and size >= max_bytes:
                    return found
        if len(found) >= max_items:
            return found
    return found
