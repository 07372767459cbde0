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
