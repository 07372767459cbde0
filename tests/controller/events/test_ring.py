"""The ring the event bus and the log ring are made of: ids, bounds, gaps, wake-ups from any thread."""

from __future__ import annotations

import msgspec
import pytest
import trio
import trio.testing

from agentic_sandbox.controller.events.ring import READ_BATCH, Gap, Ring, sse_frame


def _ring(capacity: int = 8) -> Ring[dict]:
    return Ring(capacity, lambda value: value.get("kind", "test"))


def test_ids_are_monotonic_and_frames_encoded_once() -> None:
    ring = _ring()
    assert (ring.last_seq, ring.first_seq, len(ring)) == (0, 1, 0)
    ids = [ring.append({"n": n}) for n in range(3)]
    assert ids == [1, 2, 3]
    gap, records = ring.read(0)
    assert gap is None
    assert [r.seq for r in records] == [1, 2, 3]
    assert records[0].frame == b'id: 1\nevent: test\ndata: {"n":0}\n\n'
    assert sse_frame(None, "x", b"{}") == b"event: x\ndata: {}\n\n"


def test_capacity_drops_the_oldest_and_a_reader_behind_is_told() -> None:
    ring = _ring(4)
    for n in range(10):
        ring.append({"n": n})
    assert (ring.first_seq, ring.last_seq, len(ring)) == (7, 10, 4)
    gap, records = ring.read(2)
    assert gap == Gap(reason="dropped", first_missed=3, last_missed=6, missed=4, resumed_at=7)
    assert [r.seq for r in records] == [7, 8, 9, 10]
    # Just at the edge: nothing lost.
    assert ring.read(6) == (None, ring.read(6)[1])
    assert [r.seq for r in ring.read(8)[1]] == [9, 10]
    assert ring.read(10) == (None, [])


def test_an_id_from_an_earlier_process_is_said_to_be_restarted() -> None:
    ring = _ring(4)
    for n in range(6):
        ring.append({"n": n})
    gap, records = ring.read(1000)
    assert gap == Gap(reason="restarted", first_missed=None, last_missed=None, missed=None, resumed_at=3)
    assert [r.seq for r in records] == [3, 4, 5, 6]


def test_reads_are_batched_from_either_end() -> None:
    ring = _ring(READ_BATCH * 3)
    for n in range(READ_BATCH * 3):
        ring.append({"n": n})
    _, first = ring.read(0)
    assert [r.seq for r in first] == list(range(1, READ_BATCH + 1))
    _, tail = ring.read(READ_BATCH * 3 - 5)  # near the tail: read from the right end
    assert [r.seq for r in tail] == list(range(READ_BATCH * 3 - 4, READ_BATCH * 3 + 1))
    _, middle = ring.read(READ_BATCH * 2 - 1, limit=3)
    assert [r.seq for r in middle] == [READ_BATCH * 2, READ_BATCH * 2 + 1, READ_BATCH * 2 + 2]


def test_newest_filters_and_keeps_order() -> None:
    ring = _ring(16)
    for n in range(10):
        ring.append({"kind": "even" if n % 2 == 0 else "odd", "n": n})
    picked = ring.newest(lambda v: v["kind"] == "even", 3)
    assert [r.value["n"] for r in picked] == [4, 6, 8]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        _ring(0)


async def test_an_append_from_another_thread_wakes_a_waiter() -> None:
    ring = _ring()
    ring.attach()
    woke = trio.Event()

    async def wait() -> None:
        await ring.wait_beyond(0)
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert not woke.is_set()
        seqs = await trio.to_thread.run_sync(lambda: [ring.append({"n": n}) for n in range(50)])
        with trio.fail_after(5):
            await woke.wait()
    assert seqs == list(range(1, 51))
    ring.detach()
    ring.append({"n": 50})  # detached: stored, nobody to wake, no error
    assert ring.last_seq == 51


def test_values_must_be_encodable() -> None:
    ring = _ring()
    with pytest.raises(TypeError):
        ring.append({"n": object()})
    assert ring.last_seq == 0  # nothing half-stored
    ring.append({"n": 1})
    assert msgspec.json.decode(ring.read(0)[1][0].frame.split(b"data: ")[1]) == {"n": 1}


def test_given_ids_may_start_late_and_jump() -> None:
    ring = _ring(8)
    ring.append_at(100, {"n": 0})
    assert (ring.first_seq, ring.last_seq) == (100, 100)
    assert ring.read(0)[0] == Gap(reason="dropped", first_missed=1, last_missed=99, missed=99, resumed_at=100)
    assert ring.read(99) == (None, ring.read(99)[1])
    ring.append_at(101, {"n": 1})
    ring.append_at(105, {"n": 2})  # 102..104: never given to this ring
    ring.append_at(106, {"n": 3})
    assert ring.read(100, limit=1)[1][0].seq == 101
    # A reader passing the hole stops before it, then is told about it.
    gap, records = ring.read(99)
    assert gap is None and [r.seq for r in records] == [100, 101]
    gap, records = ring.read(101)
    assert gap == Gap(reason="dropped", first_missed=102, last_missed=104, missed=3, resumed_at=105)
    assert [r.seq for r in records] == [105, 106]
    assert ring.read(105) == (None, ring.read(105)[1]) and [r.seq for r in ring.read(105)[1]] == [106]
    assert records[0].frame == b'id: 105\nevent: test\ndata: {"n":2}\n\n'
    assert ring.read(107)[0] is not None and ring.read(107)[0].reason == "restarted"  # type: ignore[union-attr]
    assert ring.read(106) == (None, [])


def test_given_ids_must_grow() -> None:
    ring = _ring(8)
    ring.append_at(5, {"n": 0}, b'{"n":0}')
    for seq in (5, 3):
        with pytest.raises(ValueError):
            ring.append_at(seq, {"n": 1})
    assert ring.last_seq == 5 and len(ring) == 1
    assert ring.append({"n": 2}) == 6  # numbering goes on after a given id


def test_a_hole_that_leaves_the_ring_makes_it_contiguous_again() -> None:
    ring = _ring(3)
    for seq in (1, 2, 10, 11, 12):
        ring.append_at(seq, {"n": seq})
    assert [r.seq for r in ring.read(9)[1]] == [10, 11, 12]
    assert ring.read(1)[0] == Gap(reason="dropped", first_missed=2, last_missed=9, missed=8, resumed_at=10)


async def test_a_given_id_wakes_a_waiter() -> None:
    ring = _ring()
    ring.attach()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ring.wait_beyond, 0)
        await trio.testing.wait_all_tasks_blocked()
        ring.append_at(42, {"n": 1})
    assert ring.last_seq == 42
    ring.detach()
