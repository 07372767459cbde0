"""The WAL's checkpoints: in a worker thread, on a connection of their own.

At a checkpoint SQLite copies the WAL back into the database file and ``fsync``s both. Left to
SQLite, a checkpoint runs inside whichever commit takes the WAL past ``wal_autocheckpoint`` pages,
which may be one the event loop makes (:meth:`~controller.store.sqlite.SqliteDatabase.quick`), and would
then hold the loop for as long as the disk takes. So while :func:`run_checkpoints` runs, automatic
checkpoints are off on the store's connection and it checkpoints instead: after each
:data:`CHECKPOINT_INTERVAL_S` in which something was written, a ``PASSIVE`` checkpoint (it never
waits for, nor holds up, a reader or a writer) in a worker thread, on its own connection.

The WAL stays bounded: SQLite only starts the file over when a writer finds every frame of it
checkpointed, which a busy store may rarely offer, and never shrinks it by itself. So a WAL past
:data:`WAL_LIMIT_BYTES` after a passive checkpoint is checkpointed again with ``TRUNCATE`` (it
waits for the writer of the moment, then has little left to copy: the passive one just did it),
and ``journal_size_limit`` truncates the file to that size whenever SQLite starts it over.

Resource handling: the caller's nursery owns it (``nursery.start``); when it is cancelled,
automatic checkpoints are turned back on (a store used without it, by startup code or a test,
checkpoints as SQLite does by default) and its connection is closed. A checkpoint that fails is
logged and tried again at the next interval: the WAL only grows meanwhile, nothing is lost.
"""

from __future__ import annotations

import logging
import os
import sqlite3

import trio

from .database import StoreClosed
from .sqlite import WAL_LIMIT_BYTES, SqliteDatabase

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_S = 0.25
#: SQLite's default, restored when the checkpointer stops.
AUTOCHECKPOINT_PAGES = 1000
#: How long a truncating checkpoint waits for the writer of the moment (its own connection's wait).
TRUNCATE_WAIT_MS = 2000


def _checkpoint(conn: sqlite3.Connection, wal: str, limit: int) -> None:
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    try:
        size = os.path.getsize(wal)
    except OSError:
        return
    if size > limit:
        busy, _frames, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            log.info("store: the WAL is %d MiB; truncating it waits for a reader (tried again)", size >> 20)


async def run_checkpoints(
    db: SqliteDatabase,
    *,
    interval_s: float = CHECKPOINT_INTERVAL_S,
    wal_limit_bytes: int = WAL_LIMIT_BYTES,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Checkpoint ``db``'s WAL whenever something was written, until cancelled (module docstring)."""
    conn = sqlite3.connect(db.path, check_same_thread=False, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout={TRUNCATE_WAIT_MS:d}")
    wal = f"{db.path}-wal"
    try:
        db.locked(lambda main: main.execute("PRAGMA wal_autocheckpoint=0"))
        task_status.started()
        seen = db.total_changes()
        while True:
            await trio.sleep(interval_s)
            changes = db.total_changes()
            if changes is None or changes == seen:
                continue  # nothing written (or a write under way: its turn comes next time)
            seen = changes
            try:
                await trio.to_thread.run_sync(_checkpoint, conn, wal, wal_limit_bytes)
            except sqlite3.Error as exc:
                log.warning("store: WAL checkpoint failed (tried again later): %s", exc)
    finally:
        try:
            db.locked(lambda main: main.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES:d}"))
        except StoreClosed:
            pass
        conn.close()
