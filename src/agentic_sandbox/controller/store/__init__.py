"""The controller's durable state, one module per kind of record, in SQLite (WAL, the embedded
default) or PostgreSQL (``AIWG_DATABASE_URL``: one database for several controllers).

General layout: ``database`` (what the tables are written against: the two ways in from trio,
transactions, the errors), ``sqlite`` (the file, its lock, WAL, the 0600 mode, migrations by
``user_version``), ``postgres`` (the pool, the placeholder and type mapping, migrations under an
advisory lock), ``schema`` (the ordered migration steps, one set for both), then one table module per kind of
record: ``operations``, ``instances``, ``tokens``, ``credentials`` (instance token digests and
signing keys), ``hosts`` (the hosts sharing the store, their controllers, the cluster secret).
:class:`Store` holds one table object per kind (``store.operations``, ``store.instances``,
``store.tokens``, ``store.credentials``, ``store.hosts``, ``store.fleet``) over one :class:`Database`; a server
database replaces it behind the same table methods. Timestamps are Unix seconds (floats); the
HTTP edge formats them.

Resource handling: :meth:`Store.open` (a SQLite file) and :meth:`Store.connect` (a PostgreSQL URL)
create or migrate the schema; :meth:`Store.close` closes the connection (or the pool), after which
every call raises :class:`StoreClosed`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .adminevents import AdminEventTable
from .controlqueue import OutboxItem, OutboxTable
from .credentials import CredentialTable, SigningKeyRecord
from .database import Database, SchemaTooNew, StoreClosed, StoreUnavailable
from .fleet import Admission, FleetRow, FleetTable
from .hosts import ControllerRecord, HostCapacity, HostFacts, HostRecord, HostTable
from .idempotency import CachedResponse, IdempotencyTable
from .instances import InstanceRecord, InstanceTable, NameTaken
from .leases import LeaseTable, release_all, renew_all
from .operations import TERMINAL_STATES, OperationRecord, OperationTable
from .postgres import PostgresDatabase
from .push import PushConfigRecord, PushTable
from .schema import STEPS, postgres_steps
from .sqlite import SqliteDatabase
from .tasks import Append, TaskEvent, TaskRecord, TaskSnapshot, TaskTable
from .tokens import TokenRecord, TokenTable

__all__ = [
    "TERMINAL_STATES",
    "AdminEventTable",
    "Admission",
    "Append",
    "CachedResponse",
    "ControllerRecord",
    "FleetRow",
    "HostCapacity",
    "HostFacts",
    "HostRecord",
    "InstanceRecord",
    "NameTaken",
    "OperationRecord",
    "OutboxItem",
    "PushConfigRecord",
    "PushTable",
    "SchemaTooNew",
    "SigningKeyRecord",
    "SqliteDatabase",
    "Store",
    "StoreClosed",
    "StoreUnavailable",
    "TaskEvent",
    "TaskRecord",
    "TaskSnapshot",
    "TokenRecord",
]


class Store:
    """Every table over one database. Made by :meth:`open` or :meth:`connect`."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.operations = OperationTable(db)
        self.instances = InstanceTable(db)
        self.tokens = TokenTable(db)
        self.credentials = CredentialTable(db)
        self.tasks = TaskTable(db)
        self.idempotency = IdempotencyTable(db)
        self.push = PushTable(db)
        self.outbox = OutboxTable(db)
        self.leases = LeaseTable(db)
        self.admin_events = AdminEventTable(db)
        self.hosts = HostTable(db)
        self.fleet = FleetTable(db)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Store:
        """The SQLite file at ``path`` (made 0600 if new)."""
        return cls(SqliteDatabase.open(path, STEPS))

    @classmethod
    def connect(cls, url: str, *, min_size: int = 1, max_size: int = 10, timeout_s: float = 5.0) -> Store:
        """The PostgreSQL database at ``url``; :class:`StoreUnavailable` if it does not answer."""
        return cls(
            PostgresDatabase.connect(url, postgres_steps(), min_size=min_size, max_size=max_size, timeout_s=timeout_s)
        )

    @property
    def shared(self) -> bool:
        """Several controllers may use this store at once (PostgreSQL)."""
        return self.db.shared

    @property
    def path(self) -> Path:
        """The SQLite file (the embedded store only)."""
        assert isinstance(self.db, SqliteDatabase), "only the embedded store has a file"
        return self.db.path

    async def renew(self, owner: str, until: float) -> None:
        """Extend every claim ``owner`` holds to ``until``, in one transaction (:mod:`.leases`)."""
        await self.db.run(self.db.transaction(lambda db: renew_all(db, owner, until)))

    async def release(self, owner: str) -> None:
        """Give up every claim ``owner`` holds (a clean stop): others take them at once."""
        await self.db.run(self.db.transaction(lambda db: release_all(db, owner)))

    def close(self) -> None:
        self.db.close()
