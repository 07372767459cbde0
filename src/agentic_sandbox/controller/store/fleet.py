"""fleet-workload/v1 records (:mod:`controller.fleet`): one row per admitted workload.

A row keeps the whole workload document (``record``, JSON, as the contract shapes it) and, beside
it, what the rules need to be atomic in the database: its ``revision`` (the compare-and-set of
every change), the admission's idempotency key with the hash of its payload (a replay is found by
the key and told apart by the hash), and the ``child_id``. One more row, ``fleet_inventory``,
counts changes: every admission and every record that moves to a new revision bumps it in the same
transaction, so an inventory read in one transaction has the revision its records belong to, and
it never goes back (no row yet: revision 0). Several controllers on one PostgreSQL database see one counter.

Why the compare-and-set is an ``UPDATE ... WHERE revision = ?`` and no lock held from read to
write: the record's new content is computed from the one read, and a writer that read an older
revision matches no row (``READ COMMITTED`` checks the ``WHERE`` again on the row another
transaction committed), so of concurrent writers exactly one moves a record to a revision.
"""

from __future__ import annotations

import builtins
import time
from enum import Enum
from typing import Any

import msgspec

from .database import Connection, Database, from_json, to_json


class FleetRow(msgspec.Struct, frozen=True, kw_only=True):
    child_id: str
    orchestrator_id: str
    idempotency_key: str
    payload_hash: str
    record: dict[str, Any]
    revision: int
    admitted_at: float
    updated_at: float


class Admission(Enum):
    CREATED = "created"
    #: The same key with the same payload: the stored row is the answer.
    REPLAYED = "replayed"
    #: The same key with another payload.
    KEY_CONFLICT = "key_conflict"
    #: Another key for a child that exists.
    CHILD_EXISTS = "child_exists"


def _row(r: Any) -> FleetRow:
    return FleetRow(
        child_id=r["child_id"],
        orchestrator_id=r["orchestrator_id"],
        idempotency_key=r["idempotency_key"],
        payload_hash=r["payload_hash"],
        record=from_json(r["record"]),
        revision=r["revision"],
        admitted_at=r["admitted_at"],
        updated_at=r["updated_at"],
    )


def _bump(db: Connection) -> None:
    db.execute(
        "INSERT INTO fleet_inventory (id, revision) VALUES (1, 1)"
        " ON CONFLICT (id) DO UPDATE SET revision = fleet_inventory.revision + 1"
    )


def _revision(db: Connection) -> int:
    found = db.execute("SELECT revision FROM fleet_inventory WHERE id = 1").fetchone()
    return 0 if found is None else int(found["revision"])


class FleetTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def admit(self, row: FleetRow) -> tuple[Admission, FleetRow]:
        """Store a new workload, unless its key or its child is known: then what is stored."""

        def admit(db: Connection) -> tuple[Admission, FleetRow]:
            # Two admissions of one key (or one child) go one after the other.
            self._db.lock_table(db, "fleet_workloads")
            known = db.execute(
                "SELECT * FROM fleet_workloads WHERE orchestrator_id = ? AND idempotency_key = ?",
                (row.orchestrator_id, row.idempotency_key),
            ).fetchone()
            if known is not None:
                stored = _row(known)
                same = stored.payload_hash == row.payload_hash
                return (Admission.REPLAYED if same else Admission.KEY_CONFLICT), stored
            other = db.execute("SELECT * FROM fleet_workloads WHERE child_id = ?", (row.child_id,)).fetchone()
            if other is not None:
                return Admission.CHILD_EXISTS, _row(other)
            db.execute(
                "INSERT INTO fleet_workloads (child_id, orchestrator_id, idempotency_key, payload_hash, record,"
                " revision, admitted_at, updated_at) VALUES (?,?,?,?,?,?,?,?)",
                (
                    row.child_id,
                    row.orchestrator_id,
                    row.idempotency_key,
                    row.payload_hash,
                    to_json(row.record),
                    row.revision,
                    row.admitted_at,
                    row.updated_at,
                ),
            )
            _bump(db)
            return Admission.CREATED, row

        return await self._db.run(self._db.transaction(admit))

    async def get(self, child_id: str) -> FleetRow | None:
        found = await self._db.quick(
            lambda db: db.execute("SELECT * FROM fleet_workloads WHERE child_id = ?", (child_id,)).fetchone()
        )
        return None if found is None else _row(found)

    async def inventory(self) -> tuple[int, builtins.list[FleetRow]]:
        """The counter and every record, read in one transaction (admission order)."""

        def read(db: Connection) -> tuple[int, builtins.list[FleetRow]]:
            revision = _revision(db)
            rows = db.execute("SELECT * FROM fleet_workloads ORDER BY admitted_at, child_id").fetchall()
            return revision, [_row(r) for r in rows]

        return await self._db.run(self._db.transaction(read))

    async def revision(self) -> int:
        return await self._db.quick(_revision)

    async def advance(self, child_id: str, expected: int, record: dict[str, Any]) -> bool:
        """Replace the record of ``child_id`` by ``record`` (whose revision is ``expected + 1``) if it
        is still at ``expected``; False (nothing written) if not, or if there is no such child."""
        revision = int(record["status"]["revision"])

        def advance(db: Connection) -> bool:
            cursor = db.execute(
                "UPDATE fleet_workloads SET record = ?, revision = ?, updated_at = ?"
                " WHERE child_id = ? AND revision = ?",
                (to_json(record), revision, time.time(), child_id, expected),
            )
            if cursor.rowcount != 1:
                return False
            _bump(db)
            return True

        return await self._db.run(self._db.transaction(advance))
