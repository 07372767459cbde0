"""The schema steps on a real file: a new database is at the last step, and a database made before
versioning (user_version 0) is read as version 1 and brought up to date, its rows intact."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from agentic_sandbox.controller.store import OperationRecord, Store, TokenRecord
from agentic_sandbox.controller.store.postgres import PostgresDatabase
from agentic_sandbox.controller.store.schema import STEPS, postgres_steps
from tests.controller.store.records import instance

#: The schema exactly as controllers created it before versioning (user_version stayed 0): the
#: fixture of the upgrade test, copied here on purpose so a change to step 1 cannot hide from it.
PRE_VERSIONING_SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    instance_id TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    completed_at REAL,
    result TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS operations_completed ON operations (completed_at);
CREATE TABLE IF NOT EXISTS instances (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    runtime TEXT NOT NULL,
    provider TEXT,
    state TEXT NOT NULL,
    loadout TEXT,
    working_dir TEXT,
    labels TEXT NOT NULL DEFAULT '{}',
    source TEXT,
    note TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    label TEXT NOT NULL,
    source TEXT NOT NULL
);
"""


def _version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def test_a_new_database_is_at_the_latest_version(sqlite_store: Store) -> None:
    assert _version(sqlite_store.path) == len(STEPS) >= 1


def test_each_step_runs_on_the_database_the_steps_before_it_made(tmp_path: Path) -> None:
    """Every prefix of the steps makes a database that the full list brings up to date."""
    for n in range(len(STEPS)):
        path = tmp_path / f"v{n}.db"
        with sqlite3.connect(path, isolation_level=None) as db:
            for script in STEPS[:n]:
                db.executescript(script)
            db.execute(f"PRAGMA user_version = {n}")
        Store.open(path).close()
        assert _version(path) == len(STEPS), n


async def test_a_database_from_before_versioning_is_read_as_version_1(tmp_path: Path) -> None:
    path = tmp_path / "controller.db"
    with sqlite3.connect(path) as db:
        db.executescript(PRE_VERSIONING_SCHEMA)
        db.execute(
            "INSERT INTO operations VALUES (?,?,?,?,?,?,?,?,?)",
            ("op_OLD", "instance.stop", "failed", "id-a", 1.0, 2.0, 3.0, None, '{"code": "x.y", "status": 503}'),
        )
        db.execute(
            "INSERT INTO instances VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            ("id-a", "alpha", "host", None, "running", "echo", "/w", '{"team": "x"}', "admin-v2", None, 1.0, 2.0),
        )
        db.execute("INSERT INTO tokens VALUES (?,?,?,?)", ("aa", "admin", "admin", "config"))
    assert _version(path) == 0

    store = Store.open(path)
    try:
        assert _version(path) == len(STEPS)
        op = await store.operations.get("op_OLD")
        assert op == OperationRecord(
            id="op_OLD",
            kind="instance.stop",
            state="failed",
            instance_id="id-a",
            created_at=1.0,
            started_at=2.0,
            completed_at=3.0,
            error={"code": "x.y", "status": 503},
        )
        rec = await store.instances.get_by_name("alpha")
        assert rec is not None
        assert (rec.id, rec.loadout, rec.working_dir, rec.labels, rec.source) == (
            "id-a",
            "echo",
            "/w",
            {"team": "x"},
            "admin-v2",
        )
        assert store.tokens.list() == [TokenRecord(hash="aa", role="admin", label="admin", source="config")]
        # ... and writable as before.
        await store.instances.insert(instance("id-b", "beta"))
        assert [r.name for r in await store.instances.list()] == ["alpha", "beta"]
    finally:
        store.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # made private on open, like a new one


async def test_step_9_counts_the_tasks_a_database_already_holds(tmp_path: Path) -> None:
    path = tmp_path / "v8.db"
    with sqlite3.connect(path, isolation_level=None) as db:
        for script in STEPS[:8]:
            db.executescript(script)
        db.execute("PRAGMA user_version = 8")
        for i, (instance_id, state) in enumerate(
            [
                ("i1", "TASK_STATE_COMPLETED"),
                ("i1", "TASK_STATE_COMPLETED"),
                ("i1", "TASK_STATE_WORKING"),
                ("i2", "TASK_STATE_FAILED"),
            ]
        ):
            db.execute(
                "INSERT INTO tasks (id, instance_id, context_id, state, status, last_at, created_at, status_at)"
                " VALUES (?,?,?,?,?,?,?,?)",
                (f"t{i}", instance_id, "c", state, f'{{"state": "{state}"}}', 1.0, 1.0, 1.0 + i),
            )
    store = Store.open(path)
    try:

        async def total(instance_id: str | None, state: str | None = None) -> int:
            page = await store.tasks.page(
                instance_id, context_id=None, state=state, status_after=None, after=None, limit=1
            )
            return page[1]

        assert (await total("i1"), await total("i1", "TASK_STATE_COMPLETED"), await total("i2")) == (3, 2, 1)
        assert (await total(None), await total(None, "TASK_STATE_WORKING")) == (4, 1)
    finally:
        store.close()


_V9_INSTANCE = (
    "INSERT INTO instances (id, name, runtime, state, created_at, updated_at) VALUES (?,?,?,?,?,?)",
    ("id-a", "alpha", "host", "running", 1.0, 2.0),
)


async def _step_10_left_the_rows_unplaced(store: Store) -> None:
    rec = await store.instances.get("id-a")
    assert rec is not None and (rec.name, rec.host_id) == ("alpha", None)
    assert await store.instances.host_of("id-a") == (True, None)
    assert await store.hosts.list() == [] and await store.hosts.instance_counts() == {"": {"running": 1}}


async def test_step_10_leaves_the_instances_of_a_version_9_file_unplaced(tmp_path: Path) -> None:
    path = tmp_path / "v9.db"
    with sqlite3.connect(path, isolation_level=None) as db:
        for script in STEPS[:9]:
            db.executescript(script)
        db.execute("PRAGMA user_version = 9")
        db.execute(*_V9_INSTANCE)
    store = Store.open(path)
    try:
        assert _version(path) == len(STEPS) == 12
        await _step_10_left_the_rows_unplaced(store)
    finally:
        store.close()


async def test_step_10_leaves_the_instances_of_a_version_9_server_database_unplaced(pg_url: str) -> None:
    old = PostgresDatabase.connect(pg_url, postgres_steps()[:9])
    try:
        old.locked(lambda db: db.execute(*_V9_INSTANCE))
    finally:
        old.close()
    store = Store.connect(pg_url)
    try:
        version = await store.db.run(lambda db: db.execute("SELECT version FROM schema_version").fetchone()[0])
        assert version == 12
        await _step_10_left_the_rows_unplaced(store)
    finally:
        store.close()
