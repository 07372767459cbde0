"""Claims a controller holds in the store, renewed together.

Rows held by one controller at a time carry ``owner`` (the controller's id) and ``owner_until``
(when the claim runs out unless renewed): an unfinished task (its exec stream is followed there:
:mod:`controller.store.tasks`), a push config (its events are delivered from there:
:mod:`controller.store.push`), an idempotency/v1 claim (a send with that ``messageId`` runs there
now: :mod:`controller.store.idempotency`), and the named claims of :class:`LeaseTable` (a running
operation, the one controller that reports hostd's sessions). A controller renews all of its claims
in one transaction (:func:`renew_all`, every quarter of ``AIWG_LEASE_TTL_S``), and gives them up at
a clean stop (:func:`release_all`), so another controller takes them at once rather than after the
claims run out.
"""

from __future__ import annotations

from .database import Connection, Database
from .tasks import UNFINISHED

_RENEW = (
    f"UPDATE tasks SET owner_until = ? WHERE owner = ? AND {UNFINISHED}",
    "UPDATE push_configs SET owner_until = ? WHERE owner = ?",
    "UPDATE idempotency_cache SET owner_until = ? WHERE owner = ? AND response_status = -1",
    "UPDATE leases SET owner_until = ? WHERE owner = ?",
)


def renew_all(db: Connection, owner: str, until: float) -> None:
    for statement in _RENEW:
        db.execute(statement, (until, owner))


def release_all(db: Connection, owner: str) -> None:
    for statement in _RENEW:
        db.execute(statement, (0.0, owner))


class LeaseTable:
    """Named claims (``operation:<id>``, ``hostd-watch``)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def acquire(self, name: str, owner: str, until: float, now: float) -> bool:
        """Hold ``name`` until ``until`` if nobody does (or its claim ran out, or it is ours)."""

        def acquire(db: Connection) -> bool:
            cursor = db.execute(
                "INSERT INTO leases VALUES (?,?,?) ON CONFLICT (name) DO UPDATE SET owner = excluded.owner,"
                " owner_until = excluded.owner_until WHERE leases.owner_until < ? OR leases.owner = excluded.owner",
                (name, owner, until, now),
            )
            return bool(cursor.rowcount == 1)

        return await self._db.quick(acquire)

    async def release(self, name: str, owner: str) -> None:
        await self._db.quick(lambda db: db.execute("DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner)))

    async def held(self, names: list[str], now: float) -> set[str]:
        """Which of ``names`` someone holds now."""
        if not names:
            return set()
        marks = ",".join("?" * len(names))
        rows = await self._db.run(
            lambda db: db.execute(
                f"SELECT name FROM leases WHERE name IN ({marks}) AND owner_until >= ?", (*names, now)
            ).fetchall()
        )
        return {row[0] for row in rows}
