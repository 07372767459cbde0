"""What every table is written against: a :class:`Database` (SQLite or PostgreSQL), its errors,
and the JSON columns' codec.

A table method hands the database a function of one :class:`Connection` (``execute`` with ``?``
placeholders, rows read by column name or position) and picks how it runs:

* :meth:`Database.run`: in a worker thread. For scans whose cost grows with the data, and for
  every call on PostgreSQL (a round trip over a socket must never block the event loop).
* :meth:`Database.quick`: a keyed read or a short transaction; on SQLite inline when the lock is
  free (see :mod:`controller.store.sqlite`), on PostgreSQL the same as ``run``.
* :meth:`Database.transaction` wraps a function in one transaction (``BEGIN IMMEDIATE`` on SQLite,
  a row lock taken with :attr:`Database.for_update` on PostgreSQL).
* :meth:`Database.locked`: in this thread (startup code only, before serving).

The SQL is the same on both wherever SQL allows (upserts are ``ON CONFLICT``; ``?`` becomes
``%s`` on PostgreSQL); what differs is named here (:attr:`Database.for_update`,
:attr:`Database.integrity_errors`, :meth:`Database.lock_table`). Errors: :class:`StoreClosed`
after :meth:`Database.close`,
:class:`SchemaTooNew` for a database newer than the code, :class:`StoreUnavailable` (the
controller's ``Unavailable``: a 503 on every surface) when the database server cannot be reached.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

import msgspec

from ..errors import Unavailable

T = TypeVar("T")


class StoreClosed(RuntimeError):
    """The store was closed (the controller is shutting down)."""


class SchemaTooNew(RuntimeError):
    """The database was written by a newer controller (its schema version is unknown here)."""


class StoreUnavailable(Unavailable):
    """The database cannot be reached now (down, restarting, every connection busy): the call
    fails closed, and the next one tries again."""

    def __init__(self, message: str) -> None:
        super().__init__("internal.unavailable", f"the controller's database is unavailable: {message}")


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What a table's function is given: sqlite3's connection, or the PostgreSQL adapter."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor: ...


class Database(ABC):
    """The interface the tables use (see the module docstring); :mod:`.sqlite` and
    :mod:`.postgres` implement it."""

    #: Appended to a ``SELECT`` that reads a row the transaction is about to change.
    for_update: str = ""
    #: What a unique or foreign key violation raises.
    integrity_errors: tuple[type[Exception], ...] = ()
    #: Several controllers share this database (PostgreSQL): leases decide who follows what.
    shared: bool = False

    @abstractmethod
    def describe(self) -> str:
        """Where the data is, for logs (never a password)."""

    @abstractmethod
    def close(self) -> None:
        """After this every call raises :class:`StoreClosed`."""

    @abstractmethod
    def locked(self, fn: Callable[[Connection], T]) -> T:
        """``fn`` in this thread (startup code only)."""

    @abstractmethod
    async def run(self, fn: Callable[[Connection], T]) -> T:
        """``fn`` in a worker thread."""

    @abstractmethod
    async def quick(self, fn: Callable[[Connection], T]) -> T:
        """``fn``, a keyed read or a short transaction (inline where that cannot block)."""

    @abstractmethod
    def transaction(self, fn: Callable[[Connection], T]) -> Callable[[Connection], T]:
        """``fn`` wrapped in one transaction."""

    @abstractmethod
    def lock_table(self, conn: Connection, table: str) -> None:
        """In a :meth:`transaction`: hold ``table`` against other writers until it ends (readers
        go on), for a transaction that numbers new rows after ``MAX(id)``."""

    @abstractmethod
    async def ping(self) -> None:
        """Raise :class:`StoreUnavailable` unless the database answers now (readiness)."""


def to_json(value: Any) -> str | None:
    return None if value is None else msgspec.json.encode(value).decode()


def from_json(value: str | None) -> Any:
    return None if value is None else msgspec.json.decode(value)
