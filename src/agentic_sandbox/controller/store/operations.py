"""Operation records (``op_<ULID>``), written whole on every state change; read one by id, or in
pages newest first (:meth:`OperationTable.page`)."""

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

    async def page(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        instance_id: str | None = None,
        completed_since: float | None = None,
        after: tuple[float, str] | None = None,
        limit: int,
    ) -> tuple[list[OperationRecord], bool]:
        """Up to ``limit`` operations after the ``after`` cursor (``(created_at, id)`` of the last
        one of the page before), newest first, matching every filter given; ``completed_since``
        leaves out those that ended before it (past retention). Also whether more match after these."""
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("state", state), ("kind", kind), ("instance_id", instance_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if completed_since is not None:
            where.append("(completed_at IS NULL OR completed_at >= ?)")
            args.append(completed_since)
        if after is not None:
            where.append("(created_at, id) < (?, ?)")
            args += [after[0], after[1]]
        sql = (
            f"SELECT * FROM operations WHERE {' AND '.join(where) or '1 = 1'} ORDER BY created_at DESC, id DESC LIMIT ?"
        )
        rows = await self._db.run(lambda db: db.execute(sql, [*args, limit + 1]).fetchall())
        return [_record(r) for r in rows[:limit]], len(rows) > limit

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
