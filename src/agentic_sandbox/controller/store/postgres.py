"""The shared database: PostgreSQL through psycopg 3 and its connection pool.

Selected by ``AIWG_DATABASE_URL=postgresql://...``; several controllers use one database at once
(:attr:`PostgresDatabase.shared`). The tables' SQL is the SQLite SQL (see
:mod:`controller.store.database`): :class:`PgConnection` turns ``?`` into ``%s`` (once per
statement text) and gives rows that read by column name or position, as ``sqlite3.Row`` does.

Every call goes through a worker thread (``trio.to_thread.run_sync``) holding one pooled
connection for the call: psycopg's blocking API on a thread per call is what trio does for SQLite
too, and a round trip over a socket must never hold the event loop. Connections are in autocommit
mode; :meth:`PostgresDatabase.transaction` is psycopg's ``transaction()`` block (``READ
COMMITTED``: a method that reads a row to change it takes it ``FOR UPDATE``).

Bad days: a server that cannot be reached, that restarts or closes connections, or a pool with no
free connection within ``timeout_s`` makes the call raise :class:`StoreUnavailable` (503 on every
surface). After such an error the pool checks its idle connections at once, so the calls after a
restart get fresh ones instead of failing one by one. A transaction whose commit was not
acknowledged was not acknowledged to the client either (the error reaches it), so nothing
acknowledged is lost.

Migrations: the steps of :mod:`controller.store.schema`, their column types mapped
(``REAL`` -> ``DOUBLE PRECISION``, ``INTEGER`` -> ``BIGINT``, ``BLOB`` -> ``BYTEA``), each in one
transaction with its version bump in ``schema_version``, under an advisory lock: controllers that
start together migrate once, one after the other.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg_pool
import trio
from psycopg.conninfo import conninfo_to_dict

from .database import Connection, Database, SchemaTooNew, StoreClosed, StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long the server lets one of our transactions sit idle before it ends it (see ``connect``).
IDLE_IN_TRANSACTION_MS = 5000
#: ``pg_advisory_xact_lock`` key that serialises migrations ("aiwg" in ASCII).
MIGRATION_LOCK = 0x61697767
_TYPES = ((re.compile(r"\bREAL\b"), "DOUBLE PRECISION"), (re.compile(r"\bINTEGER\b"), "BIGINT"))
_BLOB = re.compile(r"\bBLOB\b")


class PgRow:
    """One result row: ``row["name"]`` or ``row[0]``, iterable, like ``sqlite3.Row``."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: dict[str, int]) -> None:
        self._values = values
        self._index = index

    def __getitem__(self, key: str | int) -> Any:
        return self._values[self._index[key]] if isinstance(key, str) else self._values[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_maker(cursor: Any) -> Callable[[Sequence[Any]], Any]:
    description = cursor.description
    if description is None:
        return tuple
    index = {column.name: i for i, column in enumerate(description)}
    return lambda values: PgRow(values, index)


_translated: dict[str, str] = {}


def translate(sql: str) -> str:
    """The statement with psycopg's placeholders (``?`` -> ``%s``; a literal ``%`` doubled)."""
    out = _translated.get(sql)
    if out is None:
        out = _translated[sql] = sql.replace("%", "%%").replace("?", "%s")
    return out


def ddl(script: str) -> str:
    """A migration step's SQL with PostgreSQL's column types (see the module docstring)."""
    for pattern, name in _TYPES:
        script = pattern.sub(name, script)
    return _BLOB.sub("BYTEA", script)


class PgConnection:
    """A pooled psycopg connection as the tables see it (:class:`~.database.Connection`)."""

    __slots__ = ("raw",)

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        return self.raw.execute(translate(sql), parameters)

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any:
        cursor = self.raw.cursor()
        cursor.executemany(translate(sql), parameters)
        return cursor


def split_statements(script: str) -> list[str]:
    """A step's statements (they hold no ``;`` inside a literal, except in a ``$$`` body)."""
    out, pending, in_body = [], "", False
    for line in script.splitlines(keepends=True):
        pending += line
        if line.count("$$") % 2:
            in_body = not in_body
        if not in_body and line.rstrip().endswith(";"):
            out.append(pending.strip())
            pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def safe_url(url: str) -> str:
    """The URL's host, port and database, for logs (never its password)."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "PostgreSQL (an unreadable URL)"
    host = parts.get("host") or "localhost"
    return f"PostgreSQL {parts.get('user') or ''}@{host}:{parts.get('port') or 5432}/{parts.get('dbname') or ''}"


class PostgresDatabase(Database):
    """A pool of connections to one PostgreSQL database. Made by :meth:`connect`."""

    for_update = " FOR UPDATE"
    integrity_errors = (psycopg.IntegrityError,)
    shared = True

    def __init__(self, pool: psycopg_pool.ConnectionPool[Any], url: str) -> None:
        self._pool = pool
        self._closed = False
        self.url = url

    @classmethod
    def connect(
        cls, url: str, steps: Sequence[str], *, min_size: int = 1, max_size: int = 10, timeout_s: float = 5.0
    ) -> PostgresDatabase:
        """Open the pool (waiting up to ``timeout_s`` for the server) and migrate the schema;
        :class:`StoreUnavailable` if the server cannot be reached."""
        pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout_s,
            kwargs={
                "autocommit": True,
                "row_factory": _row_maker,
                "connect_timeout": max(1, round(timeout_s)),
                # A transaction here never waits on anything but the server; one left open is a
                # controller that froze (SIGSTOP, a stalled VM) with rows locked: the server ends it.
                "options": f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
            },
            open=False,
            name="aiwg-store",
            reconnect_timeout=24 * 3600.0,  # keep trying: the database comes back, the controller waits for it
        )
        try:
            pool.open(wait=True, timeout=timeout_s)
        except psycopg_pool.PoolTimeout as exc:
            pool.close()
            raise StoreUnavailable(f"{safe_url(url)} did not answer within {timeout_s:g} s") from exc
        db = cls(pool, url)
        try:
            db.locked(lambda conn: migrate(conn, steps))
        except BaseException:
            db.close()
            raise
        return db

    def describe(self) -> str:
        return safe_url(self.url)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.close()

    def locked(self, fn: Callable[[Connection], T]) -> T:
        """``fn`` on one pooled connection, in this thread (a worker thread, or startup code)."""
        if self._closed:
            raise StoreClosed("the controller store is closed")
        try:
            with self._pool.connection() as raw:
                return fn(PgConnection(raw))
        except psycopg_pool.PoolTimeout as exc:
            raise StoreUnavailable(f"no connection within {self._pool.timeout:g} s ({exc})") from exc
        except psycopg_pool.PoolClosed as exc:
            raise StoreClosed("the controller store is closed") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if self._closed:
                raise StoreClosed("the controller store is closed") from exc
            self._pool.check()  # drop every idle connection that broke with this one (a restart)
            raise StoreUnavailable(_first_line(exc)) from exc

    async def run(self, fn: Callable[[Connection], T]) -> T:
        return await trio.to_thread.run_sync(self.locked, fn)

    async def quick(self, fn: Callable[[Connection], T]) -> T:
        return await trio.to_thread.run_sync(self.locked, fn)

    def transaction(self, fn: Callable[[Connection], T]) -> Callable[[Connection], T]:
        def run(conn: Connection) -> T:
            assert isinstance(conn, PgConnection)
            with conn.raw.transaction():
                return fn(conn)

        return run

    def lock_table(self, conn: Connection, table: str) -> None:
        # EXCLUSIVE conflicts with every writer (and itself), not with plain SELECTs.
        conn.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")

    async def ping(self) -> None:
        await self.run(lambda conn: conn.execute("SELECT 1").fetchone())

    def pool_stats(self) -> dict[str, int]:
        return self._pool.get_stats()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def migrate(conn: Connection, steps: Sequence[str]) -> int:
    """Bring the schema to ``len(steps)``; returns the version it was at (see the module docstring)."""
    assert isinstance(conn, PgConnection)
    raw = conn.raw
    found: int | None = None
    while True:
        with raw.transaction():
            raw.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            raw.execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
            row = raw.execute("SELECT version FROM schema_version").fetchone()
            version = 0 if row is None else int(row[0])
            if found is None:
                found = version
            if version > len(steps):
                raise SchemaTooNew(
                    f"the database has schema version {version}, this controller knows up to {len(steps)}; "
                    "run the newer controller or restore a backup"
                )
            if version == len(steps):
                return found
            for statement in split_statements(ddl(steps[version])):
                raw.execute(statement.encode())  # no parameters: a literal % stays as written
            if row is None:
                raw.execute("INSERT INTO schema_version VALUES (%s)", (version + 1,))
            else:
                raw.execute("UPDATE schema_version SET version = %s", (version + 1,))
        log.info("store: schema migrated to version %d", version + 1)
