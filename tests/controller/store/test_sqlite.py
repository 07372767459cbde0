"""The database under every table, on a real file: a private file in WAL mode, the closed state,
the lock's two ways in from trio, transactions, and the schema migrations (steps in order, a failing
step, a database newer than the code)."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest
import trio

from agentic_sandbox.controller.store import SchemaTooNew, Store, StoreClosed
from agentic_sandbox.controller.store.schema import STEPS
from agentic_sandbox.controller.store.sqlite import migrate, schema_version


def test_file_is_private_and_in_wal_mode(sqlite_store: Store) -> None:
    store = sqlite_store
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_closed_store_refuses(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "c.db")
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosed):
        await store.instances.list()
    with pytest.raises(StoreClosed):
        await store.instances.get("id-a")  # the inline way in, too
    with pytest.raises(StoreClosed):
        store.tokens.list()
    assert store.db.total_changes() is None


def test_database_and_its_journal_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = Store.open(tmp_path / "state" / "controller.db")
    finally:
        os.umask(old)
    try:
        names = sorted(p.name for p in (tmp_path / "state").iterdir())
        assert "controller.db-wal" in names, names  # open, after the schema was written
        assert (tmp_path / "state").stat().st_mode & 0o077 == 0
        for name in names:
            assert (tmp_path / "state" / name).stat().st_mode & 0o077 == 0, f"{name} is readable by others"
    finally:
        store.close()


# -- schema versions and migrations ----------------------------------------------------------------


def _version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def test_a_database_from_a_newer_controller_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "controller.db"
    Store.open(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {len(STEPS) + 1}")
    with pytest.raises(SchemaTooNew, match=f"version {len(STEPS) + 1}"):
        Store.open(path)
    assert _version(path) == len(STEPS) + 1  # left as it was


def _conn(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def test_steps_run_in_order_from_the_version_found(tmp_path: Path) -> None:
    db = _conn(tmp_path / "m.db")
    steps = ("CREATE TABLE a (x INTEGER);", "CREATE TABLE b (y INTEGER);\nINSERT INTO b VALUES (1);")
    assert migrate(db, steps[:1]) == 0
    assert schema_version(db) == 1
    db.execute("INSERT INTO a VALUES (7)")
    assert migrate(db, steps) == 1  # only step 2 runs: step 1 would fail on the existing table
    assert schema_version(db) == 2
    assert db.execute("SELECT x FROM a").fetchall() == [(7,)]
    assert db.execute("SELECT y FROM b").fetchall() == [(1,)]
    assert migrate(db, steps) == 2  # nothing left to do
    db.close()


def test_a_failing_step_leaves_the_version_before_it(tmp_path: Path) -> None:
    db = _conn(tmp_path / "m.db")
    steps = ("CREATE TABLE a (x INTEGER);", "CREATE TABLE b (y INTEGER);\nINSERT INTO nowhere VALUES (1);")
    with pytest.raises(sqlite3.OperationalError, match="nowhere"):
        migrate(db, steps)
    assert schema_version(db) == 1
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"a"}  # step 2's table went with its failed transaction
    assert not db.in_transaction
    db.close()


async def test_quick_runs_inline_and_goes_to_a_thread_while_the_lock_is_held(sqlite_store: Store) -> None:
    """Inline when the lock is free (the loop's own thread); when a worker thread holds the lock,
    the call waits in a thread of its own and the event loop goes on meanwhile."""
    import threading

    store = sqlite_store
    loop_thread = threading.get_ident()
    assert await store.db.quick(lambda db: threading.get_ident()) == loop_thread

    holding, release = threading.Event(), threading.Event()

    def hold(db: sqlite3.Connection) -> None:
        holding.set()
        release.wait(10)

    ticks = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.db.run, hold)
        await trio.to_thread.run_sync(holding.wait)

        async def quick() -> None:
            assert await store.db.quick(lambda db: threading.get_ident()) != loop_thread

        nursery.start_soon(quick)
        while ticks < 5:  # the loop is not blocked by the waiting call
            await trio.sleep(0.01)
            ticks += 1
        release.set()
    assert ticks == 5


def test_a_step_with_an_incomplete_statement_is_refused_before_it_runs(tmp_path: Path) -> None:
    db = _conn(tmp_path / "m.db")
    with pytest.raises(ValueError, match="incomplete SQL statement"):
        migrate(db, ("CREATE TABLE a (x INTEGER);\nINSERT INTO a VALUES (1)",))
    assert schema_version(db) == 0 and not db.in_transaction
    assert db.execute("SELECT name FROM sqlite_master").fetchall() == []
    db.close()


def test_a_statement_may_hold_a_semicolon_in_a_string(tmp_path: Path) -> None:
    db = _conn(tmp_path / "m.db")
    migrate(db, ("CREATE TABLE a (x TEXT);\nINSERT INTO a VALUES ('one; two');",))
    assert db.execute("SELECT x FROM a").fetchall() == [("one; two",)]
    db.close()


async def test_a_transaction_that_raises_leaves_nothing(sqlite_store: Store) -> None:
    store = sqlite_store

    def write_then_fail(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO tokens VALUES ('h', 'admin', 'l', 's')")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await store.db.run(store.db.transaction(write_then_fail))
    assert store.tokens.list() == []
    changes = store.db.total_changes()
    await store.db.quick(store.db.transaction(lambda db: db.execute("INSERT INTO tokens VALUES ('h', 'a', 'l', 's')")))
    assert [t.hash for t in store.tokens.list()] == ["h"]
    assert changes is not None and store.db.total_changes() == changes + 1
