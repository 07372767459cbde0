"""The admin event stream's shared copy (``admin_events``): what makes an event id mean the same
at every controller of one PostgreSQL database (:mod:`controller.events.journal`).

A row is one event: ``id`` (its SSE ``id:``), ``at`` (when it was stored, Unix seconds) and
``body`` (the ``Event``'s JSON exactly as published, so every controller serves the same bytes).

Ids are given in commit order: :meth:`AdminEventTable.append_many` numbers its rows from
``MAX(id) + 1`` inside a transaction that first holds the table against other writers
(:meth:`Database.lock_table`; readers go on). The next writer waits for that commit and numbers
after it, so a reader that has seen id N never later finds a smaller id appear, and ids have no
holes (a rolled-back batch used none). Pruning (:meth:`AdminEventTable.prune`) deletes from the
old end only, so ``MAX(id)`` never goes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .database import Connection, Database

_NEWEST = "SELECT id, body FROM admin_events ORDER BY id DESC LIMIT ?"
_AFTER = "SELECT id, body FROM admin_events WHERE id > ? ORDER BY id LIMIT ?"
#: Everything at or below the ``keep + 1``-th newest id (nothing while there are fewer rows).
_PRUNE = "DELETE FROM admin_events WHERE id <= (SELECT id FROM admin_events ORDER BY id DESC LIMIT 1 OFFSET ?)"


def _rows(rows: list[Any]) -> list[tuple[int, bytes]]:
    return [(int(row[0]), bytes(row[1])) for row in rows]


class AdminEventTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def append_many(self, bodies: Sequence[bytes], at: float) -> list[int]:
        """Store ``bodies`` in this order, in one transaction; returns their ids (consecutive,
        above every id committed before; see the module docstring)."""
        if not bodies:
            return []

        def append(db: Connection) -> list[int]:
            self._db.lock_table(db, "admin_events")
            last = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM admin_events").fetchone()[0])
            ids = list(range(last + 1, last + 1 + len(bodies)))
            db.executemany(
                "INSERT INTO admin_events (id, at, body) VALUES (?,?,?)",
                [(i, at, b) for i, b in zip(ids, bodies, strict=True)],
            )
            return ids

        return await self._db.run(self._db.transaction(append))

    async def after(self, event_id: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` rows with ids above ``event_id``, oldest first: ``(id, body)``."""
        return _rows(await self._db.run(lambda db: db.execute(_AFTER, (event_id, limit)).fetchall()))

    async def newest(self, limit: int) -> list[tuple[int, bytes]]:
        """The newest ``limit`` rows, oldest first: ``(id, body)``."""
        rows = _rows(await self._db.run(lambda db: db.execute(_NEWEST, (limit,)).fetchall()))
        rows.reverse()
        return rows

    async def last_id(self) -> int:
        """The newest id (0 while the table is empty)."""
        row = await self._db.run(lambda db: db.execute("SELECT COALESCE(MAX(id), 0) FROM admin_events").fetchone())
        return int(row[0])

    async def prune(self, keep: int) -> int:
        """Delete all but the newest ``keep`` rows (at least one is kept); returns how many went."""
        cursor = await self._db.run(lambda db: db.execute(_PRUNE, (max(keep, 1),)))
        return cursor.rowcount
