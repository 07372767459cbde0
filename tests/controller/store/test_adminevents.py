"""The admin_events table on both stores: ids consecutive from 1 in append order, bodies kept byte
for byte, reads after an id and of the newest rows, pruning from the old end only; and on
PostgreSQL, with writers in two pools at once, ids in commit order (a reader never finds a smaller
id appear after a larger one)."""

from __future__ import annotations

import trio

from agentic_sandbox.controller.store import Store


async def test_ids_are_consecutive_and_bodies_kept(store: Store) -> None:
    table = store.admin_events
    assert await table.last_id() == 0
    assert await table.append_many([], 1.0) == []
    assert await table.append_many([b'{"n":1}', b'{"n":2}'], 1.0) == [1, 2]
    assert await table.append_many([b'{"n":3}', b"\x00\xff binary"], 2.0) == [3, 4]
    assert await table.last_id() == 4
    assert await table.after(0, 10) == [(1, b'{"n":1}'), (2, b'{"n":2}'), (3, b'{"n":3}'), (4, b"\x00\xff binary")]
    assert await table.after(1, 2) == [(2, b'{"n":2}'), (3, b'{"n":3}')]
    assert await table.after(4, 10) == []
    assert await table.newest(2) == [(3, b'{"n":3}'), (4, b"\x00\xff binary")]
    assert [i for i, _ in await table.newest(100)] == [1, 2, 3, 4]


async def test_prune_keeps_the_newest_and_ids_go_on(store: Store) -> None:
    table = store.admin_events
    assert await table.prune(5) == 0  # an empty table
    await table.append_many([b"%d" % n for n in range(10)], 1.0)
    assert await table.prune(20) == 0  # fewer rows than kept
    assert await table.prune(3) == 7
    assert [i for i, _ in await table.after(0, 100)] == [8, 9, 10]
    assert await table.prune(0) == 2  # at least one row stays: it holds the last id
    assert await table.append_many([b"x"], 2.0) == [11]


async def test_ids_follow_commit_order_across_pools(pg_url: str) -> None:
    """Two stores (two controllers' pools) append batches at once while a reader follows by
    cursor: every id the writers got is read, none twice, none skipped."""
    stores = [Store.connect(pg_url, max_size=4), Store.connect(pg_url, max_size=4)]
    try:
        given: list[int] = []
        seen: list[int] = []
        writers_done = trio.Event()

        async def write(store: Store, tag: int) -> None:
            for batch in range(15):
                given.extend(
                    await store.admin_events.append_many([b"%d-%d-%d" % (tag, batch, i) for i in range(3)], 1.0)
                )

        async def read() -> None:
            cursor = 0
            while True:
                done = writers_done.is_set()  # read once more after the writers ended
                rows = await stores[0].admin_events.after(cursor, 1000)
                seen.extend(i for i, _ in rows)
                cursor = rows[-1][0] if rows else cursor
                if done:
                    return
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            async with trio.open_nursery() as writers:
                for n in range(6):
                    writers.start_soon(write, stores[n % 2], n)
            writers_done.set()
        assert sorted(given) == list(range(1, 6 * 15 * 3 + 1))
        assert seen == sorted(given)
    finally:
        for store in stores:
            store.close()
