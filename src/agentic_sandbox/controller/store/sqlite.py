"""The embedded database: one SQLite file, one connection, one lock, WAL, versioned schema.

One connection, guarded by a ``threading.Lock``, in autocommit mode; each table method is one
statement or one explicit transaction. Two ways in from trio:

* :meth:`Database.run` runs the work in a worker thread (``trio.to_thread.run_sync``): for scans
  whose cost grows with the data (lists, counts, purges).
* :meth:`Database.quick` runs it inline, on the event loop, when the lock is free (else as
  ``run``): for keyed reads and short write transactions, the per-task hot path. In WAL mode with
  ``synchronous=NORMAL`` a commit appends to the WAL file and never waits for the disk (``fsync``
  happens only at checkpoints), so such a call takes tens of microseconds, far less than the two
  thread switches a worker thread costs (each a wait for the scheduler on a busy machine). What
  could block is moved away: checkpoints (which ``fsync``) run in a worker thread on a connection
  of their own (:mod:`controller.store.wal`), and a lock held by a worker thread sends the call to
  a thread too. Durability is the same either way: a committed transaction is in the WAL file, so
  a killed process loses nothing it acknowledged (a power cut may lose the last transactions, as
  ``synchronous=NORMAL`` always allowed).

Resource handling: :meth:`Database.open` creates the file 0600 (before SQLite opens it, so the
``-wal`` and ``-shm`` files SQLite makes with the same mode are never readable by others either),
turns on WAL and brings the schema up to date; :meth:`Database.close` closes the connection, after
which every call raises :class:`StoreClosed` (a background task still finishing during shutdown gets
that error instead of touching a closed handle).

Migrations: the schema's version is ``PRAGMA user_version``; the steps are an ordered list of SQL
scripts (:mod:`controller.store.schema`), step ``n`` taking version ``n - 1`` to ``n``. Each step
runs in one transaction together with its version bump, so a crash leaves the database at the
version before or after the step, never between. A database made before versioning existed has
``user_version`` 0 and holds exactly step 1's tables: it is recognised by its ``operations`` table
and stamped version 1 without running anything. A database newer than this code
(``user_version`` past the last step) is refused with :class:`SchemaTooNew`: an older controller
must not write into a layout it does not know.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import trio

from .database import Connection, Database, SchemaTooNew, StoreClosed

#: The WAL's size past which it is truncated (:mod:`controller.store.wal`); it passes it by at most
#: what is written between two checkpoints.
WAL_LIMIT_BYTES = 64 * 1024 * 1024

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A table every pre-versioning database has (see the module docstring).
_LEGACY_MARKER_TABLE = "operations"


def schema_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def migrate(db: sqlite3.Connection, steps: Sequence[str]) -> int:
    """Bring the schema to ``len(steps)``; returns the version it was at (see the module docstring)."""
    found = version = schema_version(db)
    if version == 0 and _has_table(db, _LEGACY_MARKER_TABLE):
        db.execute("PRAGMA user_version = 1")
        found = version = 1
        log.info("store: database from before schema versioning recognised as version 1")
    if version > len(steps):
        raise SchemaTooNew(
            f"the database has schema version {version}, this controller knows up to {len(steps)}; "
            "run the newer controller or restore a backup"
        )
    for number in range(version + 1, len(steps) + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(steps[number - 1]):
                db.execute(statement)
            # user_version lives in the database header and takes part in the transaction.
            db.execute(f"PRAGMA user_version = {number:d}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        log.info("store: schema migrated to version %d", number)
    return found


def _statements(script: str) -> list[str]:
    """Split a step into statements (``executescript`` would commit the step's transaction)."""
    out: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement in a migration step: {pending.strip()[:80]!r}")
    return out


class SqliteDatabase(Database):
    """One SQLite file, shared by the tables. Made by :meth:`open`."""

    integrity_errors = (sqlite3.IntegrityError,)

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._closed = False
        self.path = path

    @classmethod
    def open(cls, path: str | os.PathLike[str], steps: Sequence[str]) -> SqliteDatabase:
        path = Path(path)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Made 0600 before SQLite opens it: SQLite gives the -wal and -shm files the database
        # file's mode, so none of the three is ever readable by others, not even for a moment.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES:d}")  # see controller.store.wal
            migrate(db, steps)
        except BaseException:
            db.close()
            raise
        return cls(db, path)

    def describe(self) -> str:
        return f"SQLite {self.path}"

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def total_changes(self) -> int | None:
        """Rows written since the connection opened; None while another thread holds the lock."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return None if self._closed else self._db.total_changes
        finally:
            self._lock.release()

    def locked(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` on the connection under the lock, in this thread (startup code only)."""
        with self._lock:
            if self._closed:
                raise StoreClosed("the controller store is closed")
            return fn(self._db)

    async def run(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` on the connection under the lock, in a worker thread."""
        return await trio.to_thread.run_sync(self.locked, fn)

    async def quick(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` (a keyed read or a short transaction) on the connection under the lock, inline
        when the lock is free, else in a worker thread (see the module docstring). Inline, it is
        not a trio checkpoint: the caller's task is not rescheduled."""
        if not self._lock.acquire(blocking=False):
            return await self.run(fn)
        try:
            if self._closed:
                raise StoreClosed("the controller store is closed")
            return fn(self._db)
        finally:
            self._lock.release()

    def lock_table(self, conn: Connection, table: str) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` holds the whole database for the transaction already."""

    async def ping(self) -> None:
        """A file in this process: it answers while it is open."""
        if self._closed:
            raise StoreClosed("the controller store is closed")

    def transaction(self, fn: Callable[[Connection], T]) -> Callable[[Connection], T]:
        """``fn`` wrapped in ``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` if it raises)."""

        def run(db: Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return result

        return run
