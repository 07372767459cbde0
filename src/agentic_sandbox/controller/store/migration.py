"""``agentic-controller migrate-store --from FILE --to URL``: copy an embedded store (the SQLite file
``<state dir>/controller.db``) into an empty PostgreSQL database, to move a controller onto the
shared store (docs/postgresql.md).

What :func:`migrate_store` does, in order:

1. The SQLite file must exist (it is never created here) and nothing may have it open: the check
   asks SQLite for an exclusive lock, which fails while any connection is open on the file, so a
   controller running on it is refused ("stop it first") before anything is touched.
2. Both sides are opened as a controller opens them, and so brought to the newest schema:
   :meth:`Store.open` (the file, migrated in place) and :meth:`Store.connect` (the database, its
   tables made if new). The SQLite connection then keeps the exclusive lock until the end, so a
   controller started meanwhile fails to open the file instead of writing behind the copy.
3. One PostgreSQL transaction, under the schema migrations' advisory lock (a controller starting
   on the target waits for the copy to commit; two copies run one after the other): a target with
   a row in any table is refused, then every table of the file is copied in foreign key order
   (tasks before their events), in batches of ``batch_rows`` (``COPY``), with the columns both
   sides have (read from both, so a schema step added later is copied too; a column the target
   lacks stops the copy). Each table's count is checked, sequences are moved past the copied ids.
   Any failure rolls the whole copy back: the target keeps its (new) schema and no row.

What is not copied as it was: the claims of the stopped controller. Every ``owner`` is cleared and
every ``owner_until`` set to 0, so the first controller on the new store adopts the unfinished
tasks, push configs and idempotency claims at once; the named claims (the ``leases`` table) are
left out. The file itself is left as it was (a backup), except for its schema migration.

Errors: :class:`MigrationError` (one line, for the operator: no row was copied);
:class:`StoreUnavailable`, :class:`SchemaTooNew`, ``psycopg.Error`` and ``sqlite3.Error`` pass
through; :func:`main` turns each into one line and exit status 1 (2 for a usage error).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from . import Store
from .database import Connection, SchemaTooNew, StoreUnavailable
from .postgres import MIGRATION_LOCK, PgConnection, safe_url

PROG = "agentic-controller migrate-store"
BATCH_ROWS = 1000
DEFAULT_TIMEOUT_S = 5.0
#: Tables of the file that are not copied, and why.
SKIPPED: Mapping[str, str] = {
    "leases": "named claims of the stopped controller",
    "host_controllers": "where the stopped controllers listened (each registers again at its start)",
}
#: Tables of the target that are its own bookkeeping: neither data nor copied into.
TARGET_ONLY = frozenset({"schema_version"})
#: A claim's columns and what a copied row gets instead (nobody holds it; it ran out long ago).
CLEARED: Mapping[str, Any] = {"owner": None, "owner_until": 0.0}

Progress = Callable[[str, int], None]


class MigrationError(Exception):
    """The store cannot be migrated as asked; the message says why in one line. No row was copied."""


@dataclass(frozen=True)
class Migrated:
    """What one migration did: rows copied per table (in the order copied), rows left out."""

    source: str
    target: str
    copied: dict[str, int]
    skipped: dict[str, int]
    seconds: float

    @property
    def rows(self) -> int:
        return sum(self.copied.values())


def migrate_store(
    source: str | os.PathLike[str],
    url: str,
    *,
    batch_rows: int = BATCH_ROWS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
) -> Migrated:
    """Copy the SQLite store at ``source`` into the empty PostgreSQL database at ``url`` (see the
    module docstring); ``progress(table, rows)`` is called as each table is copied."""
    started = time.monotonic()
    path = Path(source)
    if not path.is_file():
        raise MigrationError(f"{path}: no such file")
    _lock_exclusively(_open_probe(path), path, close=True)
    _check_reachable(url, timeout_s)
    try:
        src = Store.open(path)
    except sqlite3.DatabaseError as exc:
        raise MigrationError(f"{path}: not a controller store ({_line(exc)})") from exc
    try:
        src.db.locked(lambda conn: _lock_exclusively(_sqlite(conn), path))
        dst = Store.connect(url, min_size=1, max_size=1, timeout_s=timeout_s)
        try:
            copied, skipped = src.db.locked(
                lambda conn: dst.db.locked(
                    dst.db.transaction(lambda target: _copy_all(_sqlite(conn), target, batch_rows, progress))
                )
            )
            # The planner's statistics of tables that were empty a moment ago (outside the copy's transaction).
            analyze = sql.SQL("ANALYZE {}").format(sql.SQL(", ").join(sql.Identifier(t) for t in copied))
            dst.db.locked(lambda target: _raw(target).execute(analyze))
        finally:
            dst.close()
    finally:
        src.close()
    return Migrated(
        source=str(path),
        target=safe_url(url),
        copied=copied,
        skipped=skipped,
        seconds=time.monotonic() - started,
    )


# -- the SQLite side ---------------------------------------------------------------------------


def _open_probe(path: Path) -> sqlite3.Connection:
    try:
        return sqlite3.connect(path, timeout=0, isolation_level=None)
    except sqlite3.Error as exc:
        raise MigrationError(f"{path}: {_line(exc)}") from exc


def _lock_exclusively(conn: sqlite3.Connection, path: Path, *, close: bool = False) -> None:
    """Take SQLite's exclusive lock on ``conn`` and keep it (``locking_mode = EXCLUSIVE``); in WAL
    mode that fails at once while any other connection has the file open."""
    try:
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("COMMIT")  # the lock stays until the connection closes
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise MigrationError(
                f"{path} is in use (a controller running on it?): stop every process using it first"
            ) from exc
        raise MigrationError(f"{path}: {_line(exc)}") from exc
    except sqlite3.DatabaseError as exc:
        raise MigrationError(f"{path}: not a controller store ({_line(exc)})") from exc
    finally:
        if close:
            conn.close()


def _sqlite(conn: Connection) -> sqlite3.Connection:
    assert isinstance(conn, sqlite3.Connection), "the source is the embedded store"
    return conn


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _tables_in_order(src: sqlite3.Connection) -> list[str]:
    """The file's tables, each after the tables its foreign keys name (else in creation order)."""
    names = [
        row[0]
        for row in src.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
            " ORDER BY rowid"
        )
    ]
    parents = {
        name: {row[2] for row in src.execute(f"PRAGMA foreign_key_list({_quoted(name)})")} - {name} for name in names
    }
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = [n for n in names if n not in ordered and parents[n] <= set(ordered)]
        if not ready:
            stuck = sorted(set(names) - set(ordered))
            raise MigrationError(f"the foreign keys of {', '.join(stuck)} form a cycle: no order to copy them in")
        ordered.append(ready[0])
    return ordered


def _sqlite_columns(src: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in src.execute(f"PRAGMA table_info({_quoted(table)})")]


# -- the PostgreSQL side -----------------------------------------------------------------------


def _check_reachable(url: str, timeout_s: float) -> None:
    """One plain connection first: its error says why (a wrong password, no such database), where
    the pool would only say that nothing answered in time."""
    try:
        psycopg.connect(url, connect_timeout=max(1, round(timeout_s))).close()
    except psycopg.Error as exc:
        raise MigrationError(f"cannot connect to {safe_url(url)}: {_line(exc)}") from exc


def _target_tables(raw: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """The target's tables and the columns a row can be written to (not generated ones)."""
    rows = raw.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND is_generated = 'NEVER' ORDER BY table_name, ordinal_position"
    ).fetchall()
    tables: dict[str, list[str]] = {}
    for row in rows:
        tables.setdefault(row[0], []).append(row[1])
    return tables


def _count(raw: psycopg.Connection[Any], table: str) -> int:
    row = raw.execute(sql.SQL("SELECT COUNT(*) FROM {}").format(sql.Identifier(table))).fetchone()
    assert row is not None
    return int(row[0])


def _raw(target: Connection) -> psycopg.Connection[Any]:
    assert isinstance(target, PgConnection), "the target is PostgreSQL"
    return target.raw


def _copy_all(
    src: sqlite3.Connection, target: Connection, batch_rows: int, progress: Progress | None
) -> tuple[dict[str, int], dict[str, int]]:
    raw = _raw(target)
    # The lock every controller's schema migration takes at start: one that starts now waits for this copy.
    raw.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
    tables = _target_tables(raw)
    holding = [t for t in sorted(tables) if t not in TARGET_ONLY and _count(raw, t)]
    if holding:
        named = ", ".join(holding[:3]) + (f" and {len(holding) - 3} more" if len(holding) > 3 else "")
        raise MigrationError(f"the target database is not empty ({named} hold rows): migrate into a new, empty one")
    copied: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for table in _tables_in_order(src):
        if table in SKIPPED:
            skipped[table] = int(src.execute(f"SELECT COUNT(*) FROM {_quoted(table)}").fetchone()[0])
            continue
        columns = _sqlite_columns(src, table)
        missing = [c for c in columns if c not in tables.get(table, [])]
        if missing:
            where = f"column {table}.{missing[0]}" if table in tables else f"table {table}"
            raise MigrationError(f"the target database has no {where}: is the controller older than the file's?")
        copied[table] = _copy_table(src, raw, table, columns, batch_rows)
        if _count(raw, table) != copied[table]:
            raise MigrationError(f"{table}: {copied[table]} rows copied but {_count(raw, table)} stored")
        if progress is not None:
            progress(table, copied[table])
    _advance_sequences(raw)
    return copied, skipped


def _copy_table(
    src: sqlite3.Connection, raw: psycopg.Connection[Any], table: str, columns: list[str], batch_rows: int
) -> int:
    cleared = [(i, CLEARED[c]) for i, c in enumerate(columns) if c in CLEARED]
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )
    rows = src.execute(f"SELECT {', '.join(_quoted(c) for c in columns)} FROM {_quoted(table)}")
    count = 0
    with raw.cursor() as cursor, cursor.copy(statement) as copy:
        while batch := rows.fetchmany(batch_rows):
            for row in batch:
                values = list(row)
                for index, value in cleared:
                    values[index] = value
                copy.write_row(values)
            count += len(batch)
    return count


def _advance_sequences(raw: psycopg.Connection[Any]) -> None:
    """Past the copied ids, every sequence that feeds a column (serial and identity columns)."""
    rows = raw.execute(
        "SELECT table_name, column_name, pg_get_serial_sequence(quote_ident(table_name), column_name)"
        " FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND pg_get_serial_sequence(quote_ident(table_name), column_name) IS NOT NULL"
    ).fetchall()
    for table, column, sequence in rows:
        raw.execute(
            sql.SQL("SELECT setval(%s, COALESCE((SELECT MAX({}) FROM {}), 0) + 1, false)").format(
                sql.Identifier(column), sql.Identifier(table)
            ),
            (sequence,),
        )


# -- the command -------------------------------------------------------------------------------


def arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Copy a controller's SQLite store into an empty PostgreSQL database (docs/postgresql.md). "
        "No controller may run on the file meanwhile.",
    )
    parser.add_argument(
        "--from", dest="source", metavar="FILE", required=True, help="the SQLite store (<state dir>/controller.db)"
    )
    parser.add_argument(
        "--to",
        dest="url",
        metavar="URL",
        default=os.environ.get("AIWG_DATABASE_URL"),
        help="postgresql://user:password@host:port/db of an empty database (default: $AIWG_DATABASE_URL, "
        "which keeps a password off the command line)",
    )
    parser.add_argument("--batch-rows", type=int, default=BATCH_ROWS, help=f"rows per batch (default {BATCH_ROWS})")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long to wait for the database server (default {DEFAULT_TIMEOUT_S:g})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 copied, 1 failed (one line on stderr, nothing written), 2 usage error."""
    parser = arg_parser()
    args = parser.parse_args(argv)
    if not args.url:
        parser.error("--to URL (or AIWG_DATABASE_URL) is required")
    if not re.match(r"^postgres(ql)?://", args.url):
        parser.error("--to must be a postgresql:// URL")
    if args.batch_rows < 1 or args.timeout <= 0:
        parser.error("--batch-rows and --timeout must be positive")
    print(f"{PROG}: {args.source} -> {safe_url(args.url)}", flush=True)
    try:
        with _quiet("psycopg", "psycopg.pool"):
            done = migrate_store(
                args.source,
                args.url,
                batch_rows=args.batch_rows,
                timeout_s=args.timeout,
                progress=lambda table, rows: print(f"  {table:<20} {_rows(rows)}", flush=True),
            )
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was written", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"{PROG}: {_failure(exc)}", file=sys.stderr)
        return 1
    for table, rows in done.skipped.items():
        print(f"  {table:<20} {_rows(rows)} not copied ({SKIPPED[table]})")
    print(f"{PROG}: {_rows(done.rows).strip()} of {len(done.copied)} tables copied in {done.seconds:.1f} s")
    print("  claims were cleared: the first controller on the database adopts every unfinished task")
    print("  next: start the controllers with AIWG_DATABASE_URL set and the same AIWG_STATE_DIR;")
    print(f"  {done.source} is left as it was (keep it as a backup)", flush=True)
    return 0


@contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """No log line from these loggers meanwhile: the pool's warnings while it retries would say
    again, in many lines, what the one error line says."""
    loggers = [logging.getLogger(name) for name in names]
    were = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, was in zip(loggers, were, strict=True):
            logger.disabled = was


def _rows(count: int) -> str:
    return f"{count:>10} row" + ("" if count == 1 else "s")


#: What each kind of failure says (the first matching class wins).
_FAILURES: tuple[tuple[type[BaseException], Callable[[Any], str]], ...] = (
    (MigrationError, str),
    (StoreUnavailable, lambda exc: exc.message),
    (SchemaTooNew, str),
    (psycopg.Error, lambda exc: f"the copy failed, nothing was written: {_line(exc)}"),
    (sqlite3.Error, lambda exc: f"the SQLite file: {_line(exc)}"),
    (OSError, lambda exc: f"{exc.filename or ''}: {exc.strerror or exc}"),
)


def _failure(exc: Exception) -> str:
    for kind, say in _FAILURES:
        if isinstance(exc, kind):
            return say(exc)
    return f"{type(exc).__name__}: {_line(exc)}"


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
