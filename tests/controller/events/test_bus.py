"""The event bus's publish API: what an event looks like, what publish refuses, what it bounds; and
the shared mode on a real PostgreSQL database, two buses on two pools as two controllers: the same
events under the same ids everywhere, in commit order, a cursor that resumes at either, and a new
controller that starts from the newest events."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import trio

from agentic_sandbox.controller.events.bus import MAX_DATA_BYTES, Event, EventBus
from agentic_sandbox.controller.events.ring import Gap, Record
from agentic_sandbox.controller.store import Store
from tests.contracts import component, validate


def _last(bus: EventBus) -> dict:
    return msgspec.to_builtins(bus.ring.read(bus.ring.last_seq - 1)[1][0].value)


def test_published_events_are_upstreams_event() -> None:
    bus = EventBus(16)
    seq = bus.publish("task.status_changed", "task/t-1", {"instance_id": "i", "state": "working"})
    assert seq == 1
    event = _last(bus)
    validate(event, component("Event"))
    assert re.match(r"^ev_[0-9A-HJKMNP-TV-Z]{26}$", event["id"])
    assert event["timestamp"].endswith("Z")
    assert (event["kind"], event["subject"], event["data"]) == (
        "task.status_changed",
        "task/t-1",
        {"instance_id": "i", "state": "working"},
    )
    bus.publish("session.attached")
    assert "subject" not in _last(bus) and "data" not in _last(bus)  # both optional in the contract


def test_helpers_shape_the_kinds_in_use() -> None:
    bus = EventBus(16)
    bus.instance_state_changed("i-1", before=None, after="provisioning", cause="operation", operation_id="op_1")
    assert _last(bus)["data"] == {"from": None, "to": "provisioning", "cause": "operation", "operation_id": "op_1"}
    bus.operation_changed("op_1", kind="instance.start", state="failed", instance_id="i-1", error_code="x.y")
    assert _last(bus)["kind"] == "operation.completed" and _last(bus)["data"]["error_code"] == "x.y"
    bus.operation_changed("op_1", kind="instance.start", state="running", instance_id="i-1")
    assert _last(bus)["kind"] == "operation.started"
    bus.storage_written("inbox", "i-1/a", size_bytes=1, sha256="0" * 64, created=True)
    assert _last(bus)["subject"] == "storage/inbox/i-1/a"
    bus.session_exited("s-1", instance_id="i-1", exit_code=0, signal=None, end_reason="exited")
    assert _last(bus)["kind"] == "session.exited"
    bus.instance_removed("i-1", name="n", operation_id=None, reason="decommissioned")
    assert _last(bus)["kind"] == "instance.removed"


def test_kinds_are_dotted_and_data_is_bounded() -> None:
    bus = EventBus(16)
    for bad in ("", "nodot", "Upper.case", "a..b", "a.b-c"):
        with pytest.raises(ValueError):
            bus.publish(bad)
    assert bus.ring.last_seq == 0
    bus.publish("test.big", None, {"blob": "x" * MAX_DATA_BYTES})
    assert _last(bus)["data"] == {"truncated": True}


# -- shared mode: several controllers on one PostgreSQL database ---------------------------------


@pytest.fixture
async def two_stores(pg_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two controllers' stores on one database (each its own pool)."""
    stores = (Store.connect(pg_url), Store.connect(pg_url))
    yield stores
    for store in stores:
        store.close()


def _held(bus: EventBus) -> list[Record[Event]]:
    return bus.ring.newest(lambda event: True, bus.ring.capacity)


async def _all_stored(*buses: EventBus) -> None:
    with trio.fail_after(30):
        for bus in buses:
            assert bus.journal is not None
            while bus.journal.statistics().pending:
                await trio.sleep(0.01)


async def test_alone_the_ring_numbers_and_run_and_catch_up_do_nothing(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "controller.db")
    try:
        for bus in (EventBus(16), EventBus(16, store=store)):
            assert not bus.shared and bus.journal is None
            async with trio.open_nursery() as nursery:
                await nursery.start(bus.run)  # returns at once
            await bus.catch_up()
            await bus.catch_up_to(100)
            assert bus.publish("test.alone") == 1 and bus.ring.last_seq == 1
        assert await store.admin_events.last_id() == 0
    finally:
        store.close()


async def test_two_controllers_see_the_same_events_under_the_same_ids(two_stores: tuple[Store, Store]) -> None:
    buses = [EventBus(1000, store=store) for store in two_stores]
    assert all(bus.shared for bus in buses)
    assert buses[0].publish("test.early") == 0  # shared: numbered once stored
    assert buses[0].ring.last_seq == 0  # in the ring only once read back from the store

    def publish_from_a_thread(bus: EventBus, who: str) -> None:
        for n in range(50):
            bus.publish("test.threaded", f"who/{who}", {"n": n})

    async with trio.open_nursery() as nursery:
        for bus in buses:
            await nursery.start(bus.run)
        async with trio.open_nursery() as publishers:
            for i, bus in enumerate(buses):
                publishers.start_soon(trio.to_thread.run_sync, publish_from_a_thread, bus, f"t{i}")
                for n in range(50):
                    bus.publish("test.looped", f"who/l{i}", {"n": n})
                    if n % 7 == 0:
                        await trio.sleep(0)
        await _all_stored(*buses)
        nursery.cancel_scope.cancel()
    for bus in buses:
        await bus.catch_up()
    held = [_held(bus) for bus in buses]
    assert [r.seq for r in held[0]] == list(range(1, 1 + 1 + 4 * 50))  # every event once, no hole
    for a, b in zip(*held, strict=True):
        assert (a.seq, a.value, a.frame) == (b.seq, b.value, b.frame)
    early = [r for r in held[0] if r.value.kind == "test.early"]  # published before the writers ran
    assert len(early) == 1 and early[0].frame.startswith(f"id: {early[0].seq}\nevent: test.early\ndata: ".encode())
    # Each publisher's events in its own order (a batch is stored in the order it was queued).
    for who in ("t0", "t1", "l0", "l1"):
        assert [r.value.data["n"] for r in held[0] if r.value.subject == f"who/{who}"] == list(range(50))


async def test_a_cursor_from_one_controller_resumes_at_the_other(two_stores: tuple[Store, Store]) -> None:
    first, second = (EventBus(64, store=store) for store in two_stores)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        await nursery.start(second.run)
        for n in range(10):
            first.publish("test.marker", None, {"n": n})
        await _all_stored(first)
        await first.catch_up()
        _, seen = first.ring.read(0, limit=4)  # a follower at the first read four
        cursor = seen[-1].seq
        second.publish("test.marker", None, {"n": 10})
        await _all_stored(second)
        await second.catch_up()
        gap, rest = second.ring.read(cursor)
        assert gap is None
        assert [r.value.data["n"] for r in rest] == list(range(4, 11))
        assert [r.seq for r in rest] == list(range(cursor + 1, 12))
        nursery.cancel_scope.cancel()
    # A controller that has read nothing yet: the follower's id makes it catch up.
    third = EventBus(64, store=two_stores[1])
    await third.catch_up_to(0)
    assert third.ring.last_seq == 0
    await third.catch_up_to(cursor)
    assert [r.seq for r in third.ring.read(cursor)[1]] == list(range(cursor + 1, 12))


async def test_an_id_is_given_in_commit_order(two_stores: tuple[Store, Store]) -> None:
    """A follower at one controller that reads while both write never finds an event appear
    below one it has read: it sees every id, in order, with no gap."""
    buses = [EventBus(5000, store=store) for store in two_stores]
    reader = buses[0]
    got: list[int] = []
    async with trio.open_nursery() as nursery:
        for bus in buses:
            await nursery.start(bus.run)

        async def follow() -> None:
            cursor = 0
            while True:
                await reader.catch_up()
                gap, records = reader.ring.read(cursor)
                assert gap is None
                got.extend(r.seq for r in records)
                cursor = records[-1].seq if records else cursor
                await trio.sleep(0.001)

        nursery.start_soon(follow)
        for n in range(300):
            buses[n % 2].publish("test.marker", None, {"n": n})
            if n % 10 == 0:
                await trio.sleep(0.002)
        await _all_stored(*buses)
        with trio.fail_after(10):
            while len(got) < 300:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert got == list(range(1, 301))


async def test_a_new_controller_starts_from_the_newest_events(two_stores: tuple[Store, Store]) -> None:
    old = EventBus(64, store=two_stores[0])
    async with trio.open_nursery() as nursery:
        await nursery.start(old.run)
        for n in range(40):
            old.publish("test.marker", None, {"n": n})
        await _all_stored(old)
        nursery.cancel_scope.cancel()
    new = EventBus(8, store=two_stores[1])
    await new.catch_up()
    assert [r.seq for r in _held(new)] == list(range(33, 41))
    assert new.ring.read(0)[0] == Gap(reason="dropped", first_missed=1, last_missed=32, missed=32, resumed_at=33)
