"""OutputRing: bounds, gap-free sequences, reads, waiting. Pure logic, in memory."""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.hostd.ring import Lag, OutputRing, SeqOutOfRange, follow, start_seq
from agentic_sandbox.proto import ErrorCode


def test_empty_ring() -> None:
    ring = OutputRing(max_frames=4, max_bytes=100)
    assert (ring.first_seq, ring.next_seq, ring.closed) == (1, 1, False)
    assert ring.read(1) == []
    with pytest.raises(SeqOutOfRange) as info:
        ring.read(2)
    assert (info.value.first_seq, info.value.next_seq) == (1, 1)
    with pytest.raises(SeqOutOfRange):
        ring.read(0)


def test_append_assigns_gap_free_seqs_and_reads_slices() -> None:
    ring = OutputRing(max_frames=10, max_bytes=1000)
    assert [ring.append(bytes([i]) * 3, kind=i % 2) for i in range(5)] == [1, 2, 3, 4, 5]
    assert ring.read(1, max_items=2) == [(1, 0, b"\0\0\0"), (2, 1, b"\1\1\1")]
    assert [seq for seq, _, _ in ring.read(3)] == [3, 4, 5]
    assert ring.read(6) == []
    stats = ring.statistics()
    assert (stats.frames, stats.bytes, stats.first_seq, stats.next_seq) == (5, 15, 1, 6)


def test_evicts_past_max_frames() -> None:
    ring = OutputRing(max_frames=3, max_bytes=1000)
    for i in range(10):
        ring.append(b"x%d" % i)
    assert (ring.first_seq, ring.next_seq, len(ring)) == (8, 11, 3)
    with pytest.raises(SeqOutOfRange) as info:
        ring.read(7)
    assert (info.value.first_seq, info.value.next_seq) == (8, 11)
    assert ring.read(8) == [(8, 0, b"x7"), (9, 0, b"x8"), (10, 0, b"x9")]


def test_evicts_past_max_bytes_but_keeps_the_newest_entry() -> None:
    ring = OutputRing(max_frames=100, max_bytes=10)
    ring.append(b"aaaa")
    ring.append(b"bbbb")
    ring.append(b"cccc")  # 12 bytes: the oldest goes
    assert ring.first_seq == 2
    assert ring.statistics().bytes == 8
    big = b"z" * 50
    seq = ring.append(big)  # alone above the bound: kept, everything older goes
    assert ring.read(ring.first_seq) == [(seq, 0, big)]
    assert ring.statistics().bytes == 50
    ring.append(b"q")
    assert ring.read(ring.first_seq) == [(seq + 1, 0, b"q")]


def test_close_rejects_appends_but_keeps_data() -> None:
    ring = OutputRing(max_frames=4, max_bytes=100)
    ring.append(b"x")
    ring.close()
    ring.close()
    assert ring.closed
    with pytest.raises(trio.ClosedResourceError):
        ring.append(b"y")
    assert ring.read(1) == [(1, 0, b"x")]


def test_invalid_bounds() -> None:
    with pytest.raises(ValueError):
        OutputRing(max_frames=0, max_bytes=10)
    with pytest.raises(ValueError):
        OutputRing(max_frames=1, max_bytes=0)


async def test_wait_beyond_wakes_on_append_and_close() -> None:
    ring = OutputRing(max_frames=4, max_bytes=100)
    woke: list[str] = []

    async def waiter(name: str, seq: int) -> None:
        await ring.wait_beyond(seq)
        woke.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "a", 1)
        nursery.start_soon(waiter, "b", 2)
        await trio.testing.wait_all_tasks_blocked()
        assert ring.statistics().waiters == 2
        ring.append(b"1")
        await trio.testing.wait_all_tasks_blocked()
        assert woke == ["a"]
        assert ring.statistics().waiters == 1
        ring.close()
    assert woke == ["a", "b"]
    assert ring.statistics().waiters == 0


async def test_a_poke_wakes_waiters_without_an_append() -> None:
    ring = OutputRing(max_frames=4, max_bytes=100)
    woke = trio.Event()

    async def waiter() -> None:
        await ring.wait_beyond(1)
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        ring.poke()
        with trio.fail_after(1):
            await woke.wait()
    assert ring.next_seq == 1 and ring.statistics().waiters == 0


async def test_wait_beyond_returns_at_once_when_data_is_there() -> None:
    ring = OutputRing(max_frames=4, max_bytes=100)
    ring.append(b"1")
    with trio.fail_after(1):
        await ring.wait_beyond(1)


async def test_wait_beyond_is_cancellable() -> None:
    ring = OutputRing(max_frames=4, max_bytes=100)
    with trio.move_on_after(0.01) as scope:
        await ring.wait_beyond(1)
    assert scope.cancelled_caught
    assert ring.statistics().waiters == 0
    ring.append(b"x")  # an abandoned event does no harm


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.binary(max_size=40)),
        st.tuples(st.just("read"), st.integers(min_value=-2, max_value=60), st.integers(min_value=1, max_value=8)),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(max_frames=st.integers(min_value=1, max_value=12), max_bytes=st.integers(min_value=1, max_value=120), ops=ops)
def test_ring_matches_a_simple_model(max_frames: int, max_bytes: int, ops: list[tuple]) -> None:
    ring = OutputRing(max_frames=max_frames, max_bytes=max_bytes)
    history: list[bytes] = []  # every chunk ever appended; seq n is history[n - 1]
    for op in ops:
        if op[0] == "append":
            assert ring.append(op[1]) == len(history) + 1
            history.append(op[1])
        else:
            _, seq, count = op
            if ring.first_seq <= seq <= ring.next_seq:
                got = ring.read(seq, count)
                want = history[seq - 1 : min(seq - 1 + count, len(history))]
                assert [d for _, _, d in got] == want
                assert [s for s, _, _ in got] == list(range(seq, seq + len(got)))
            else:
                with pytest.raises(SeqOutOfRange):
                    ring.read(seq, count)
        held = history[ring.first_seq - 1 :]
        assert ring.next_seq == len(history) + 1
        assert len(held) == len(ring) <= max_frames
        stats = ring.statistics()
        assert stats.bytes == sum(map(len, held))
        # Within the byte bound, unless the newest entry alone exceeds it.
        assert stats.bytes <= max_bytes or len(held) == 1
        # Eviction takes only what it must: one more old entry would break a bound.
        if ring.first_seq > 1:
            previous = history[ring.first_seq - 2]
            assert len(held) + 1 > max_frames or stats.bytes + len(previous) > max_bytes


async def test_follow_replays_lags_and_ends_when_closed_and_drained() -> None:
    ring = OutputRing(max_frames=4, max_bytes=1 << 20)
    for i in range(6):  # 1..6 appended, 3..6 held
        ring.append(b"%d" % i)
    seen: list[object] = []
    gen = follow(ring, 1, max_items=2, stop=lambda: False)
    async with aclosing(gen):
        async for item in gen:
            seen.append(item if isinstance(item, Lag) else [seq for seq, _, _ in item])
            if len(seen) == 3:
                ring.append(b"late")  # live: 7
                ring.close()
    assert seen == [Lag(1, 3), [3, 4], [5, 6], [7]]


async def test_follow_stops_when_asked_and_start_seq_refuses_what_is_gone() -> None:
    ring = OutputRing(max_frames=2, max_bytes=1 << 20)
    for _ in range(3):
        ring.append(b"x")
    assert start_seq(ring, None) == 4 and start_seq(ring, 2) == 2
    for bad in (1, 5):
        with pytest.raises(RpcError) as info:
            start_seq(ring, bad)
        assert info.value.code is ErrorCode.SEQ_OUT_OF_RANGE
        assert info.value.details == {"first_seq": 2, "next_seq": 4}
    stopped = [item async for item in follow(ring, 4, max_items=8, stop=lambda: True)]
    assert stopped == []


def test_read_stops_at_max_bytes_but_always_gives_one_entry() -> None:
    ring = OutputRing(max_frames=100, max_bytes=1 << 20)
    for size in (10, 20, 30, 5000, 1):
        ring.append(b"x" * size)
    assert [seq for seq, _, _ in ring.read(1, max_bytes=30)] == [1, 2]  # 10 + 20 reaches 30
    assert [seq for seq, _, _ in ring.read(4, max_bytes=100)] == [4]  # one entry even when bigger
    assert [seq for seq, _, _ in ring.read(1, max_bytes=1 << 20)] == [1, 2, 3, 4, 5]
