"""The controller's durable state in SQLite (WAL), one module per kind of record.

General layout: ``database`` (the connection, its lock, WAL, the 0600 file, the closed state and the
schema migrations), ``schema`` (the ordered migration steps), then one table module per kind of
record: ``operations``, ``instances``, ``tokens``, ``credentials`` (instance token digests and
signing keys). :class:`Store` holds one table object per kind (``store.operations``,
``store.instances``, ``store.tokens``, ``store.credentials``) over one :class:`Database`; a server
database can replace it behind the same table methods. Timestamps are Unix seconds (floats); the
HTTP edge formats them.

Resource handling: :meth:`Store.open` creates or migrates the schema; :meth:`Store.close` closes the
connection, after which every call raises :class:`StoreClosed`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .controlqueue import OutboxItem, OutboxTable
from .credentials import CredentialTable, SigningKeyRecord
from .database import Database, SchemaTooNew, StoreClosed
from .idempotency import CachedResponse, IdempotencyTable
from .instances import InstanceRecord, InstanceTable, NameTaken
from .operations import TERMINAL_STATES, OperationRecord, OperationTable
from .push import PushConfigRecord, PushTable
from .schema import STEPS
from .tasks import Append, TaskEvent, TaskRecord, TaskSnapshot, TaskTable
from .tokens import TokenRecord, TokenTable

__all__ = [
    "TERMINAL_STATES",
    "Append",
    "CachedResponse",
    "InstanceRecord",
    "NameTaken",
    "OperationRecord",
    "OutboxItem",
    "PushConfigRecord",
    "PushTable",
    "SchemaTooNew",
    "SigningKeyRecord",
    "Store",
    "StoreClosed",
    "TaskEvent",
    "TaskRecord",
    "TaskSnapshot",
    "TokenRecord",
]


class Store:
    """Every table over one database file. Made by :meth:`open`."""

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

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Store:
        return cls(Database.open(path, STEPS))

    @property
    def path(self) -> Path:
        return self.db.path

    def close(self) -> None:
        self.db.close()
