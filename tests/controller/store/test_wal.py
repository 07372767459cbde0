"""The WAL checkpointer on a real file: it turns SQLite's own checkpoints off while it runs, gets
the WAL into the database file itself, and gives SQLite's back when it stops."""

from __future__ import annotations

import sqlite3
from functools import partial
from pathlib import Path

import trio

from agentic_sandbox.controller.store import Store
from agentic_sandbox.controller.store.wal import AUTOCHECKPOINT_PAGES, run_checkpoints
from tests.controller.store.records import instance


def _autocheckpoint(store: Store) -> int:
    return int(store.db.locked(lambda db: db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]))


async def test_checkpoints_run_off_the_loop_and_give_back_sqlites_own_when_stopped(tmp_path: Path) -> None:
    """While run_checkpoints runs, the connection's automatic checkpoints are off and the WAL
    still reaches the database file (a copy of the main file alone holds what was written)."""
    store = Store.open(tmp_path / "c.db")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(run_checkpoints, store.db, interval_s=0.02))
            assert _autocheckpoint(store) == 0
            await store.instances.insert(instance("id-1", "checkpointed"))
            copy = tmp_path / "main-only.db"
            with trio.fail_after(10):
                while True:
                    await trio.sleep(0.02)
                    copy.write_bytes(store.path.read_bytes())  # the main file, without its WAL
                    with sqlite3.connect(copy) as db:
                        try:
                            if db.execute("SELECT name FROM instances").fetchall() == [("checkpointed",)]:
                                break
                        except sqlite3.DatabaseError:
                            pass  # not checkpointed yet (the schema itself may still be in the WAL)
            nursery.cancel_scope.cancel()
        assert _autocheckpoint(store) == AUTOCHECKPOINT_PAGES
    finally:
        store.close()


async def test_a_store_closed_under_it_stops_it_cleanly(tmp_path: Path) -> None:
    """The store closes first at shutdown: the checkpointer's cancellation must not fail on it."""
    store = Store.open(tmp_path / "c.db")
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(run_checkpoints, store.db, interval_s=0.01))
        store.close()
        await trio.sleep(0.05)  # a few intervals with the store closed
        nursery.cancel_scope.cancel()


async def test_a_wal_grown_past_its_limit_is_truncated_once_readers_let_go(tmp_path: Path) -> None:
    """A reader holding an old snapshot keeps every checkpoint from finishing, so the WAL grows;
    once it lets go, the next checkpoint brings the file back under the limit."""
    store = Store.open(tmp_path / "c.db")
    wal = Path(f"{store.path}-wal")
    limit = 256 * 1024
    reader = sqlite3.connect(store.path, isolation_level=None)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(run_checkpoints, store.db, interval_s=0.02, wal_limit_bytes=limit))
            reader.execute("BEGIN")
            reader.execute("SELECT COUNT(*) FROM instances").fetchone()  # the snapshot is held from here
            for i in range(300):
                await store.instances.insert(instance(f"id-{i}", f"n{i}", note="x" * 4000))
            await trio.sleep(0.1)
            assert wal.stat().st_size > limit  # nothing could be checkpointed past the reader
            reader.execute("COMMIT")
            with trio.fail_after(10):
                while wal.stat().st_size > limit:
                    await store.instances.insert(instance(f"late-{trio.current_time()}", f"late-{trio.current_time()}"))
                    await trio.sleep(0.02)
            assert len(await store.instances.list()) > 300  # every row is still there
            nursery.cancel_scope.cancel()
    finally:
        reader.close()
        store.close()
