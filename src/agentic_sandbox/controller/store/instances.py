"""The instance catalog: what the admin API made (or adopted from hostd), by id and unique name."""

from __future__ import annotations

from typing import Any

import msgspec

from .database import Connection, Database, from_json, to_json


class NameTaken(Exception):
    """An instance with this name is already in the catalog."""


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
    #: hostd's provider's word on the instance (schema step 7): what it can do, what image it runs.
    capabilities: list[str] = []
    image_ref: str | None = None


def _record(row: Any) -> InstanceRecord:
    return InstanceRecord(
        id=row["id"],
        name=row["name"],
        runtime=row["runtime"],
        provider=row["provider"],
        state=row["state"],
        loadout=row["loadout"],
        working_dir=row["working_dir"],
        labels=from_json(row["labels"]) or {},
        source=row["source"],
        note=row["note"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        capabilities=from_json(row["capabilities"]) or [],
        image_ref=row["image_ref"],
    )


def _values(rec: InstanceRecord) -> tuple[Any, ...]:
    return (
        rec.id,
        rec.name,
        rec.runtime,
        rec.provider,
        rec.state,
        rec.loadout,
        rec.working_dir,
        to_json(rec.labels),
        rec.source,
        rec.note,
        rec.created_at,
        rec.updated_at,
        to_json(rec.capabilities),
        rec.image_ref,
    )


class InstanceTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert(self, rec: InstanceRecord) -> None:
        """Add a catalog row; :class:`NameTaken` if the name is in use."""
        values = _values(rec)

        def insert(db: Connection) -> None:
            try:
                db.execute(
                    "INSERT INTO instances (id, name, runtime, provider, state, loadout, working_dir, labels, source,"
                    " note, created_at, updated_at, capabilities, image_ref) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    values,
                )
            except self._db.integrity_errors as exc:
                raise NameTaken(rec.name) from exc

        await self._db.run(insert)

    async def update(self, rec: InstanceRecord, *, expect_state: str | None = None) -> bool:
        """Write the row; with ``expect_state``, only if the stored state is that (else False)."""
        values: tuple[Any, ...] = (*_values(rec)[1:], rec.id)
        sql = (
            "UPDATE instances SET name=?, runtime=?, provider=?, state=?, loadout=?, working_dir=?,"
            " labels=?, source=?, note=?, created_at=?, updated_at=?, capabilities=?, image_ref=? WHERE id=?"
        )
        if expect_state is not None:
            sql += " AND state=?"
            values = (*values, expect_state)
        cursor = await self._db.run(lambda db: db.execute(sql, values))
        return bool(cursor.rowcount == 1) or expect_state is None

    async def get(self, instance_id: str) -> InstanceRecord | None:
        row = await self._db.quick(
            lambda db: db.execute("SELECT * FROM instances WHERE id = ?", (instance_id,)).fetchone()
        )
        return None if row is None else _record(row)

    async def get_by_name(self, name: str) -> InstanceRecord | None:
        row = await self._db.quick(lambda db: db.execute("SELECT * FROM instances WHERE name = ?", (name,)).fetchone())
        return None if row is None else _record(row)

    async def list(self) -> list[InstanceRecord]:
        rows = await self._db.run(lambda db: db.execute("SELECT * FROM instances ORDER BY created_at, id").fetchall())
        return [_record(r) for r in rows]

    async def delete(self, instance_id: str) -> bool:
        cursor = await self._db.run(lambda db: db.execute("DELETE FROM instances WHERE id = ?", (instance_id,)))
        return cursor.rowcount > 0

    async def count_by_state(self) -> dict[str, int]:
        rows = await self._db.run(
            lambda db: db.execute("SELECT state, COUNT(*) FROM instances GROUP BY state").fetchall()
        )
        return {row[0]: row[1] for row in rows}
