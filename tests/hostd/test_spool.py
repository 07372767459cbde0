"""Rings with a memory budget and a disk spool: byte-exact history past memory, bounded both ways."""

from __future__ import annotations

import os
from contextlib import aclosing
from pathlib import Path

import trio

from agentic_sandbox.hostd.ring import Lag, MemoryBudget, OutputRing, follow
from agentic_sandbox.hostd.spool import Spool

KIB = 1024


def make_spool(tmp_path: Path, *, session: int = 1 << 30, total: int = 1 << 30, segment: int = 64 * KIB) -> Spool:
    spool = Spool(tmp_path / "spool", session_bytes=session, total_bytes=total, segment_bytes=segment)
    spool.clear()
    return spool


def chunk(i: int) -> bytes:
    return f"{i:06d}".encode() * 100  # 600 bytes, each one different


async def drain(ring: OutputRing, seq: int) -> list[tuple[int, int, bytes] | Lag]:
    got: list[tuple[int, int, bytes] | Lag] = []
    async with aclosing(follow(ring, seq, max_items=16, stop=lambda: False)) as entries:
        async for item in entries:
            if isinstance(item, Lag):
                got.append(item)
            else:
                got.extend(item)
    return got


async def test_history_past_memory_is_read_back_byte_exact_from_disk(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    ring = OutputRing(max_frames=1000, max_bytes=8 * KIB, spool=spool.open("s1"))
    for i in range(1, 2001):
        assert ring.append(chunk(i), kind=i % 3) == i
    ring.close()
    assert ring.memory_bytes <= 8 * KIB + 600 and ring.memory_first_seq > 1900
    assert ring.first_seq == 1 and ring.statistics().spooled_bytes > 1_000_000
    got = await drain(ring, 1)
    assert got == [(i, i % 3, chunk(i)) for i in range(1, 2001)]  # gap-free, in order, across the seam
    # From the middle of the spool, and from the seam itself.
    assert (await ring.read_any(1234, 2)) == [(1234, 1234 % 3, chunk(1234)), (1235, 1235 % 3, chunk(1235))]
    seam = ring.memory_first_seq
    assert (await ring.read_any(seam - 1, 1))[0][0] == seam - 1
    ring.discard()
    assert not (tmp_path / "spool" / "s1").exists() and spool.bytes == 0


async def test_bounds_drop_oldest_segments_and_readers_hear_of_it(tmp_path: Path) -> None:
    spool = make_spool(tmp_path, session=200 * KIB, total=300 * KIB, segment=64 * KIB)
    a = OutputRing(max_frames=1000, max_bytes=4 * KIB, spool=spool.open("a"))
    b = OutputRing(max_frames=1000, max_bytes=4 * KIB, spool=spool.open("b"))
    for i in range(1, 1001):
        a.append(chunk(i))
    assert a.first_seq > 1 and a.statistics().spooled_bytes <= 200 * KIB
    for i in range(1, 1001):
        b.append(chunk(i))
    assert spool.bytes <= 300 * KIB  # the total bound took from the session holding most
    assert len(os.listdir(tmp_path / "spool" / "a")) >= 1
    a.close()
    got = await drain(a, 1)
    assert got[0] == Lag(1, a.first_seq)
    assert got[1:] == [(i, 0, chunk(i)) for i in range(a.first_seq, 1001)]


async def test_a_quiet_session_keeps_its_share_of_the_memory_budget(tmp_path: Path) -> None:
    budget = MemoryBudget(limit=64 * KIB, share=16 * KIB)
    spool = make_spool(tmp_path)
    quiet = OutputRing(max_frames=1000, max_bytes=1 << 20, budget=budget, spool=spool.open("quiet"))
    busy = OutputRing(max_frames=1000, max_bytes=1 << 20, budget=budget, spool=spool.open("busy"))
    for i in range(20):
        quiet.append(chunk(i))  # 12 KB: within its share
    for i in range(1, 1001):
        busy.append(chunk(i))
        assert budget.bytes <= budget.limit + 600
    assert quiet.memory_first_seq == 1 and quiet.first_seq == 1  # untouched
    assert busy.memory_bytes <= budget.limit - quiet.memory_bytes + 600
    # The busy one's history is all there, from disk.
    busy.close()
    assert await drain(busy, 1) == [(i, 0, chunk(i)) for i in range(1, 1001)]
    # A session that goes away gives its memory back.
    busy.discard()
    assert budget.bytes == quiet.memory_bytes


async def test_a_disk_that_fails_turns_the_spool_off_not_hostd(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    ring = OutputRing(max_frames=1000, max_bytes=4 * KIB, spool=spool.open("s"))
    for i in range(1, 11):
        ring.append(chunk(i))
    os.rename(tmp_path / "spool", tmp_path / "gone")  # the next segment cannot be created
    for i in range(11, 400):
        ring.append(chunk(i))
    assert ring.first_seq == ring.memory_first_seq > 11  # what memory holds, said as a lag to readers
    ring.close()
    got = await drain(ring, 1)
    assert got[0] == Lag(1, ring.first_seq)


async def test_reading_from_disk_does_not_hold_up_the_writer(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    ring = OutputRing(max_frames=1000, max_bytes=4 * KIB, spool=spool.open("s"))
    for i in range(1, 3001):
        ring.append(chunk(i))
    appended_during_read: list[int] = []

    async def writer() -> None:
        for i in range(3001, 3101):
            appended_during_read.append(ring.append(chunk(i)))
            await trio.sleep(0)
        ring.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        got = await drain(ring, 1)
    assert got == [(i, 0, chunk(i)) for i in range(1, 3101)]
    assert appended_during_read == list(range(3001, 3101))
