"""The journal on real stores: a bounded queue that drops its oldest, a writer that stores in order,
keeps events through a database outage and makes a last attempt when cancelled, a catch-up that
starts from the newest rows, reads in batches and skips what does not decode, and a pruning timer.
The outage is real: the test's database refuses connections and its sessions are terminated."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import psycopg
import pytest
import trio

from agentic_sandbox.controller.events.journal import READ_BATCH, Journal
from agentic_sandbox.controller.events.ring import Gap, Ring
from agentic_sandbox.controller.store import Store
from tests.postgres_service import PgCluster


def _ring(capacity: int) -> Ring[dict]:
    return Ring(capacity, lambda value: "test")


def _journal(
    store: Store, capacity: int = 16, *, ring: int | None = None, prune_every_s: float = 30.0
) -> Journal[dict]:
    """A journal whose queue and kept rows are ``capacity``, over a ring of ``ring`` (or ``capacity``)."""
    return Journal(
        store.admin_events,
        _ring(ring or capacity),
        msgspec.json.decode,
        max_pending=capacity,
        keep=capacity,
        prune_every_s=prune_every_s,
    )


def _body(n: int) -> bytes:
    return msgspec.json.encode({"n": n})


async def _stored(journal: Journal[dict], count: int) -> None:
    with trio.fail_after(30):
        while journal.stored < count:
            await trio.sleep(0.01)


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "controller.db")
    yield store
    store.close()


@pytest.fixture
async def postgres(pg_url: str) -> AsyncIterator[Store]:
    store = Store.connect(pg_url, timeout_s=1.0)
    yield store
    store.close()


async def test_the_queue_is_bounded_and_the_writer_keeps_order(sqlite: Store) -> None:
    journal = _journal(sqlite, capacity=3)
    for n in range(5):
        journal.put(_body(n))  # before the writer runs: queued, nobody woken
    stats = journal.statistics()
    assert (stats.pending, stats.max_pending, stats.dropped, stats.stored) == (3, 3, 2, 0)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await _stored(journal, 3)

        def publish() -> None:  # from another thread
            for n in range(5, 7):
                journal.put(_body(n))

        await trio.to_thread.run_sync(publish)
        await _stored(journal, 5)
        nursery.cancel_scope.cancel()
    assert [body for _, body in await sqlite.admin_events.after(0, 10)] == [_body(n) for n in (2, 3, 4, 5, 6)]
    assert journal.statistics().pending == 0


async def test_a_cancelled_writer_stores_what_is_queued(sqlite: Store) -> None:
    journal = _journal(sqlite)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.put(_body(1))
        nursery.cancel_scope.cancel()  # before the writer ran again
    assert [body for _, body in await sqlite.admin_events.after(0, 10)] == [_body(1)]


async def test_catch_up_starts_from_the_newest_and_reads_in_batches(sqlite: Store) -> None:
    table = sqlite.admin_events
    await table.append_many([_body(n) for n in range(1, 21)], 1.0)
    small = _journal(sqlite, ring=5)
    await small.catch_up()  # the first catch-up reads the ring's capacity only
    assert [r.seq for r in small.ring.read(0)[1]] == [16, 17, 18, 19, 20]
    assert small.loaded == 5
    await small.catch_up()  # nothing new
    assert small.loaded == 5

    journal = _journal(sqlite, ring=READ_BATCH * 3)
    await journal.catch_up()
    await table.append_many([_body(n) for n in range(21, 21 + READ_BATCH * 2 + 7)], 2.0)
    await journal.catch_up()  # three queries
    ring = journal.ring
    assert [r.seq for r in ring.newest(lambda v: True, READ_BATCH * 3)] == list(range(1, 21 + READ_BATCH * 2 + 7))
    assert ring.read(20)[1][0].value == {"n": 21}
    assert ring.read(20)[1][0].frame == b"id: 21\nevent: test\ndata: " + _body(21) + b"\n\n"


async def test_a_row_that_does_not_decode_is_skipped(sqlite: Store) -> None:
    await sqlite.admin_events.append_many([_body(1), b"not json", _body(3)], 1.0)
    journal = _journal(sqlite)
    await journal.catch_up()
    assert journal.ring.last_seq == 3 and journal.loaded == 2
    gap, records = journal.ring.read(0)
    assert gap is None and [r.seq for r in records] == [1]
    gap, records = journal.ring.read(1)
    assert gap == Gap(reason="dropped", first_missed=2, last_missed=2, missed=1, resumed_at=3)
    assert [r.seq for r in records] == [3]
    await journal.catch_up()  # the bad row is not read again
    assert journal.loaded == 2


async def test_the_timer_prunes_to_the_newest(sqlite: Store) -> None:
    journal = _journal(sqlite, capacity=4, prune_every_s=0.05)
    await sqlite.admin_events.append_many([_body(n) for n in range(10)], 1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        with trio.fail_after(10):
            while len(await sqlite.admin_events.after(0, 100)) > 4:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert [i for i, _ in await sqlite.admin_events.after(0, 100)] == [7, 8, 9, 10]


def _refuse_connections(cluster: PgCluster, url: str, refuse: bool) -> None:
    """The test's database stops (or starts again) taking connections; refusing ends its sessions."""
    dbname = url.rsplit("/", 1)[1]
    with psycopg.connect(cluster.url(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS {"false" if refuse else "true"}'.encode())
        if refuse:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )


async def test_events_wait_out_an_outage_in_a_bounded_queue(
    postgres: Store, pg_cluster: PgCluster, pg_url: str
) -> None:
    journal = _journal(postgres, capacity=8)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.put(_body(0))
        await _stored(journal, 1)
        _refuse_connections(pg_cluster, pg_url, True)
        try:
            for n in range(1, 13):  # 12 while down: the oldest 4 go
                journal.put(_body(n))
            with trio.fail_after(30):
                while journal.available:
                    await trio.sleep(0.01)
            assert journal.statistics().pending == 8 and journal.dropped == 4
            await trio.sleep(0.5)  # retried meanwhile; still nothing lost beyond the bound
            assert journal.statistics().pending == 8 and journal.dropped == 4
        finally:
            _refuse_connections(pg_cluster, pg_url, False)
        await _stored(journal, 9)
        assert journal.available
        nursery.cancel_scope.cancel()
    rows = await postgres.admin_events.after(0, 100)
    assert rows == list(zip(range(1, 10), [_body(n) for n in (0, *range(5, 13))], strict=True))
    await journal.catch_up()  # the ring holds 8: the newest 8
    held = [(r.seq, r.value["n"]) for r in journal.ring.read(0)[1]]
    assert held == list(zip(range(2, 10), range(5, 13), strict=True))
