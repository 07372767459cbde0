"""The controller's durable state in SQLite (WAL): operations, the instance catalog, tokens.

Behind a small interface so a server database can replace it later. One connection, guarded by a
``threading.Lock``; every call from trio goes through ``trio.to_thread.run_sync`` so the event loop
never blocks on disk. The connection is in autocommit mode; each method is one statement or one
explicit transaction. Timestamps are Unix seconds (floats); the HTTP edge formats them.

Resource handling: :meth:`Store.open` creates the schema; :meth:`Store.close` closes the connection,
after which every call raises :class:`StoreClosed` (a background task still finishing during shutdown
gets that error instead of touching a closed handle).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import trio

T = TypeVar("T")

SCHEMA = """
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

TERMINAL_STATES = ("succeeded", "failed", "canceled")


class StoreClosed(RuntimeError):
    """The store was closed (the controller is shutting down)."""


class NameTaken(Exception):
    """An instance with this name is already in the catalog."""


class OperationRecord(msgspec.Struct, kw_only=True):
    id: str
    kind: str
    state: str
    instance_id: str | None = None
    created_at: float
    started_at: float | None = None
    completed_at: float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class InstanceRecord(msgspec.Struct, kw_only=True):
    id: str
    name: str
    runtime: str
    state: str
    provider: str | None = None
    loadout: str | None = None
    working_dir: str | None = None
    labels: dict[str, str] = {}
    source: str | None = None
    note: str | None = None
    created_at: float
    updated_at: float


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    hash: str
    role: str
    label: str
    source: str


def _json(value: Any) -> str | None:
    return None if value is None else msgspec.json.encode(value).decode()


def _unjson(value: str | None) -> Any:
    return None if value is None else msgspec.json.decode(value)


class Store:
    """SQLite-backed state. Made by :meth:`open`."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._closed = False
        self.path = path

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Store:
        path = Path(path)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Made 0600 before SQLite opens it: SQLite gives the -wal and -shm files the database
        # file's mode, so none of the three is ever readable by others, not even for a moment.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(SCHEMA)
        return cls(db, path)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    # -- plumbing -----------------------------------------------------------------------------

    def _locked(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._closed:
                raise StoreClosed("the controller store is closed")
            return fn(self._db)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await trio.to_thread.run_sync(self._locked, fn)

    # -- operations ---------------------------------------------------------------------------

    @staticmethod
    def _op(row: sqlite3.Row) -> OperationRecord:
        return OperationRecord(
            id=row["id"],
            kind=row["kind"],
            state=row["state"],
            instance_id=row["instance_id"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            completed_at=row["completed_at"],
            result=_unjson(row["result"]),
            error=_unjson(row["error"]),
        )

    async def save_operation(self, op: OperationRecord) -> None:
        """Insert or replace the whole record."""
        values = (
            op.id,
            op.kind,
            op.state,
            op.instance_id,
            op.created_at,
            op.started_at,
            op.completed_at,
            _json(op.result),
            _json(op.error),
        )
        await self._run(lambda db: db.execute("INSERT OR REPLACE INTO operations VALUES (?,?,?,?,?,?,?,?,?)", values))

    async def get_operation(self, op_id: str) -> OperationRecord | None:
        row = await self._run(lambda db: db.execute("SELECT * FROM operations WHERE id = ?", (op_id,)).fetchone())
        return None if row is None else self._op(row)

    async def unfinished_operations(self) -> list[OperationRecord]:
        marks = ",".join("?" * len(TERMINAL_STATES))
        rows = await self._run(
            lambda db: db.execute(
                f"SELECT * FROM operations WHERE state NOT IN ({marks}) ORDER BY created_at", TERMINAL_STATES
            ).fetchall()
        )
        return [self._op(r) for r in rows]

    async def purge_operations(self, completed_before: float) -> int:
        """Delete ended operations that completed before the given time; returns how many."""
        cursor = await self._run(
            lambda db: db.execute(
                "DELETE FROM operations WHERE completed_at IS NOT NULL AND completed_at < ?", (completed_before,)
            )
        )
        return cursor.rowcount

    # -- instance catalog ---------------------------------------------------------------------

    @staticmethod
    def _inst(row: sqlite3.Row) -> InstanceRecord:
        return InstanceRecord(
            id=row["id"],
            name=row["name"],
            runtime=row["runtime"],
            provider=row["provider"],
            state=row["state"],
            loadout=row["loadout"],
            working_dir=row["working_dir"],
            labels=_unjson(row["labels"]) or {},
            source=row["source"],
            note=row["note"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    @staticmethod
    def _inst_values(rec: InstanceRecord) -> tuple[Any, ...]:
        return (
            rec.id,
            rec.name,
            rec.runtime,
            rec.provider,
            rec.state,
            rec.loadout,
            rec.working_dir,
            _json(rec.labels),
            rec.source,
            rec.note,
            rec.created_at,
            rec.updated_at,
        )

    async def insert_instance(self, rec: InstanceRecord) -> None:
        """Add a catalog row; :class:`NameTaken` if the name is in use."""
        values = self._inst_values(rec)

        def insert(db: sqlite3.Connection) -> None:
            try:
                db.execute("INSERT INTO instances VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", values)
            except sqlite3.IntegrityError as exc:
                raise NameTaken(rec.name) from exc

        await self._run(insert)

    async def update_instance(self, rec: InstanceRecord) -> None:
        values = self._inst_values(rec)
        await self._run(
            lambda db: db.execute(
                "UPDATE instances SET name=?2, runtime=?3, provider=?4, state=?5, loadout=?6, working_dir=?7,"
                " labels=?8, source=?9, note=?10, created_at=?11, updated_at=?12 WHERE id=?1",
                values,
            )
        )

    async def get_instance(self, instance_id: str) -> InstanceRecord | None:
        row = await self._run(lambda db: db.execute("SELECT * FROM instances WHERE id = ?", (instance_id,)).fetchone())
        return None if row is None else self._inst(row)

    async def get_instance_by_name(self, name: str) -> InstanceRecord | None:
        row = await self._run(lambda db: db.execute("SELECT * FROM instances WHERE name = ?", (name,)).fetchone())
        return None if row is None else self._inst(row)

    async def list_instances(self) -> list[InstanceRecord]:
        rows = await self._run(lambda db: db.execute("SELECT * FROM instances ORDER BY created_at, id").fetchall())
        return [self._inst(r) for r in rows]

    async def delete_instance(self, instance_id: str) -> bool:
        cursor = await self._run(lambda db: db.execute("DELETE FROM instances WHERE id = ?", (instance_id,)))
        return cursor.rowcount > 0

    async def count_instances_by_state(self) -> dict[str, int]:
        rows = await self._run(lambda db: db.execute("SELECT state, COUNT(*) FROM instances GROUP BY state").fetchall())
        return {row[0]: row[1] for row in rows}

    # -- tokens -------------------------------------------------------------------------------

    def replace_tokens(self, source: str, tokens: list[TokenRecord]) -> None:
        """Replace every token row of ``source`` (e.g. "config") in one transaction. Sync: startup only."""

        def replace(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM tokens WHERE source = ?", (source,))
                db.executemany(
                    "INSERT OR REPLACE INTO tokens VALUES (?,?,?,?)",
                    [(t.hash, t.role, t.label, t.source) for t in tokens],
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

        self._locked(replace)

    def list_tokens(self) -> list[TokenRecord]:
        rows = self._locked(lambda db: db.execute("SELECT * FROM tokens ORDER BY source, label").fetchall())
        return [TokenRecord(hash=r["hash"], role=r["role"], label=r["label"], source=r["source"]) for r in rows]
