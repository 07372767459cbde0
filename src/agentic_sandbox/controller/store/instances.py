"""The instance catalog: what the admin API made (or adopted from hostd), by id and unique name.

:meth:`InstanceTable.page` reads the catalog in pages, oldest first (``created_at``, then ``id``),
after a cursor, with the admin list's filters. The columns filter in SQL; labels (a JSON column)
filter here, over the rows read in order in batches, so a label that few rows carry costs a longer
read, never a wrong page.

Each row names the host its instance runs on (``host_id``, for good: an instance never moves);
rows from before hosts were recorded have none until a controller claims them
(:meth:`InstanceTable.place_unplaced`, an upgraded single-host deployment), so a host's own list
holds them too.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import msgspec

from .database import Connection, Database, from_json, to_json

#: Rows read at a time while a page looks for rows with the labels asked for.
LABEL_SCAN_BATCH = 200


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
    #: The host it runs on (schema step 10; None: a row from before hosts were recorded, not placed yet).
    host_id: str | None = None
    #: Schema step 11, hostd's word: how it sleeps now (``how``, ``since``, ``cause``; None while
    #: awake), its idle policy, and how many times it slept and woke.
    sleep: dict[str, Any] | None = None
    idle: dict[str, Any] | None = None
    sleeps: int = 0
    wakes: int = 0


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
        host_id=row["host_id"],
        sleep=from_json(row["sleep"]),
        idle=from_json(row["idle"]),
        sleeps=row["sleeps"],
        wakes=row["wakes"],
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
        rec.host_id,
        to_json(rec.sleep) if rec.sleep is not None else None,
        to_json(rec.idle) if rec.idle is not None else None,
        rec.sleeps,
        rec.wakes,
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
                    " note, created_at, updated_at, capabilities, image_ref, host_id, sleep, idle, sleeps, wakes)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    values,
                )
            except self._db.integrity_errors as exc:
                raise NameTaken(rec.name) from exc

        await self._db.run(insert)

    async def update(
        self, rec: InstanceRecord, *, expect_state: str | None = None, expect_counts: tuple[int, int] | None = None
    ) -> bool:
        """Write the row; with ``expect_state`` (and ``expect_counts``: sleeps, wakes), only if the
        stored row holds those (else False: another controller wrote the change first)."""
        values: tuple[Any, ...] = (*_values(rec)[1:], rec.id)
        sql = (
            "UPDATE instances SET name=?, runtime=?, provider=?, state=?, loadout=?, working_dir=?,"
            " labels=?, source=?, note=?, created_at=?, updated_at=?, capabilities=?, image_ref=?, host_id=?,"
            " sleep=?, idle=?, sleeps=?, wakes=?"
            " WHERE id=?"
        )
        if expect_state is not None:
            sql += " AND state=?"
            values = (*values, expect_state)
        if expect_counts is not None:
            sql += " AND sleeps=? AND wakes=?"
            values = (*values, *expect_counts)
        cursor = await self._db.run(lambda db: db.execute(sql, values))
        return bool(cursor.rowcount == 1) or (expect_state is None and expect_counts is None)

    async def get(self, instance_id: str) -> InstanceRecord | None:
        row = await self._db.quick(
            lambda db: db.execute("SELECT * FROM instances WHERE id = ?", (instance_id,)).fetchone()
        )
        return None if row is None else _record(row)

    async def get_by_name(self, name: str) -> InstanceRecord | None:
        row = await self._db.quick(lambda db: db.execute("SELECT * FROM instances WHERE name = ?", (name,)).fetchone())
        return None if row is None else _record(row)

    async def list(self, *, host_id: str | None = None) -> list[InstanceRecord]:
        """Every row; with ``host_id``, that host's rows and the unplaced ones (which may be its)."""
        args: tuple[str, ...] = ()
        if host_id is None:
            sql = "SELECT * FROM instances ORDER BY created_at, id"
        else:
            sql = "SELECT * FROM instances WHERE host_id = ? OR host_id IS NULL ORDER BY created_at, id"
            args = (host_id,)
        rows = await self._db.run(lambda db: db.execute(sql, args).fetchall())
        return [_record(r) for r in rows]

    async def host_of(self, instance_id: str) -> tuple[bool, str | None]:
        """Whether the instance is in the catalog, and its host (None: not placed yet)."""
        row = await self._db.quick(
            lambda db: db.execute("SELECT host_id FROM instances WHERE id = ?", (instance_id,)).fetchone()
        )
        return (False, None) if row is None else (True, row[0])

    async def place_unplaced(self, host_id: str) -> int:
        """Make every row that has no host yet ``host_id``'s; how many there were."""
        cursor = await self._db.run(
            lambda db: db.execute("UPDATE instances SET host_id = ? WHERE host_id IS NULL", (host_id,))
        )
        return int(cursor.rowcount)

    async def page(
        self,
        *,
        state: str | None = None,
        runtime: str | None = None,
        provider: str | None = None,
        instance_id: str | None = None,
        host_id: str | None = None,
        labels: Sequence[tuple[str, str | None]] = (),
        after: tuple[float, str] | None = None,
        limit: int,
    ) -> tuple[builtins.list[InstanceRecord], bool]:
        """Up to ``limit`` rows after the ``after`` cursor (``(created_at, id)`` of the last row of
        the page before), oldest first, matching every filter given: each label pair ``(key, value)``
        holds (value None: the row has the key). Also whether more rows match after these."""
        where: list[str] = []
        args: list[Any] = []
        filters = (
            ("state", state),
            ("runtime", runtime),
            ("provider", provider),
            ("id", instance_id),
            ("host_id", host_id),
        )
        for column, value in filters:
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        wanted = list(labels)
        # Without a label filter every row read is shown: one more than the page tells if more follow.
        batch = limit + 1 if not wanted else max(limit + 1, LABEL_SCAN_BATCH)

        def query(db: Connection) -> tuple[builtins.list[InstanceRecord], bool]:
            found: builtins.list[InstanceRecord] = []
            cursor = after
            while True:
                clauses, params = list(where), list(args)
                if cursor is not None:
                    clauses.append("(created_at, id) > (?, ?)")
                    params += [cursor[0], cursor[1]]
                sql = (
                    f"SELECT * FROM instances WHERE {' AND '.join(clauses) or '1 = 1'} ORDER BY created_at, id LIMIT ?"
                )
                rows = db.execute(sql, [*params, batch]).fetchall()
                for row in rows:
                    rec = _record(row)
                    if all(rec.labels.get(k) == v if v is not None else k in rec.labels for k, v in wanted):
                        found.append(rec)
                        if len(found) > limit:
                            return found[:limit], True
                if len(rows) < batch:
                    return found, False
                cursor = (rows[-1]["created_at"], rows[-1]["id"])

        return await self._db.run(query)

    async def delete(self, instance_id: str) -> bool:
        cursor = await self._db.run(lambda db: db.execute("DELETE FROM instances WHERE id = ?", (instance_id,)))
        return cursor.rowcount > 0

    async def count_by_state(self) -> dict[str, int]:
        rows = await self._db.run(
            lambda db: db.execute("SELECT state, COUNT(*) FROM instances GROUP BY state").fetchall()
        )
        return {row[0]: row[1] for row in rows}
