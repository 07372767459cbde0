"""The WAL's checkpoints: in a worker thread, on a connection of their own.

At a checkpoint SQLite copies the WAL back into the database file and ``fsync``s both. Left to
SQLite, a checkpoint runs inside whichever commit takes the WAL past ``wal_autocheckpoint`` pages,
which may be one the event loop makes (:meth:`~controller.store.sqlite.SqliteDatabase.quick`), and would
then hold the loop for as long as the disk takes. So while :func:`run_checkpoints` runs, automatic
checkpoints are off on the store's connection and it checkpoints instead: after each
:data:`CHECKPOINT_INTERVAL_S` in which something was written, a ``PASSIVE`` checkpoint (it never
waits for, nor holds up, a reader or a writer) in a worker thread, on its own connection.

Resource handling: the caller's nursery owns it (``nursery.start``); when it is cancelled,
automatic checkpoints are turned back on (a store used without it, by startup code or a test,
checkpoints as SQLite does by default) and its connection is closed. A checkpoint that fails is
logged and tried again at the next interval: the WAL only grows meanwhile, nothing is lost.
"""

from __future__ import annotations

import logging
import sqlite3

import trio

from .database import StoreClosed
from .sqlite import SqliteDatabase

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_S = 0.25
#: SQLite's default, restored when the checkpointer stops.
AUTOCHECKPOINT_PAGES = 1000


def _checkpoint(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()


async def run_checkpoints(
    db: SqliteDatabase,
    *,
    interval_s: float = CHECKPOINT_INTERVAL_S,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Checkpoint ``db``'s WAL whenever something was written, until cancelled (module docstring)."""
    conn = sqlite3.connect(db.path, check_same_thread=False, isolation_level=None)
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
                await trio.to_thread.run_sync(_checkpoint, conn)
            except sqlite3.Error as exc:
                log.warning("store: WAL checkpoint failed (tried again later): %s", exc)
    finally:
        try:
            db.locked(lambda main: main.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES:d}"))
        except StoreClosed:
            pass
        conn.close()
