"""Operation records (``op_<ULID>``), written whole on every state change."""

from __future__ import annotations

from typing import Any

import msgspec

from .database import Database, from_json, to_json

TERMINAL_STATES = ("succeeded", "failed", "canceled")
_SAVE = (
    "INSERT INTO operations VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT (id) DO UPDATE SET kind = excluded.kind,"
    " state = excluded.state, instance_id = excluded.instance_id, created_at = excluded.created_at,"
    " started_at = excluded.started_at, completed_at = excluded.completed_at, result = excluded.result,"
    " error = excluded.error"
)


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


def _record(row: Any) -> OperationRecord:
    return OperationRecord(
        id=row["id"],
        kind=row["kind"],
        state=row["state"],
        instance_id=row["instance_id"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        completed_at=row["completed_at"],
        result=from_json(row["result"]),
        error=from_json(row["error"]),
    )


class OperationTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def save(self, op: OperationRecord) -> None:
        """Insert or replace the whole record."""
        values = (
            op.id,
            op.kind,
            op.state,
            op.instance_id,
            op.created_at,
            op.started_at,
            op.completed_at,
            to_json(op.result),
            to_json(op.error),
        )
        await self._db.run(lambda db: db.execute(_SAVE, values))

    async def get(self, op_id: str) -> OperationRecord | None:
        row = await self._db.run(lambda db: db.execute("SELECT * FROM operations WHERE id = ?", (op_id,)).fetchone())
        return None if row is None else _record(row)

    async def unfinished(self) -> list[OperationRecord]:
        marks = ",".join("?" * len(TERMINAL_STATES))
        rows = await self._db.run(
            lambda db: db.execute(
                f"SELECT * FROM operations WHERE state NOT IN ({marks}) ORDER BY created_at", TERMINAL_STATES
            ).fetchall()
        )
        return [_record(r) for r in rows]

    async def purge(self, completed_before: float) -> int:
        """Delete ended operations that completed before the given time; returns how many."""
        cursor = await self._db.run(
            lambda db: db.execute(
                "DELETE FROM operations WHERE completed_at IS NOT NULL AND completed_at < ?", (completed_before,)
            )
        )
        return cursor.rowcount
