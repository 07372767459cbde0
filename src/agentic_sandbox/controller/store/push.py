"""Push notification configs of A2A tasks, each with its delivery cursor.

``delivered_seq`` is the sequence of the last task event the config is done with (delivered, or
given up on after its retry budget); delivery resumes after it, so an event stored before a
controller crash is delivered after the restart (at least once: a crash between a receiver's 2xx
and the cursor's write sends that one event again). A config's credentials are stored as given
(the database file is 0600) and never shown back.
"""

from __future__ import annotations

import builtins
import sqlite3

import msgspec

from .database import Database, from_json, to_json


class PushConfigRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    task_id: str
    instance_id: str
    url: str
    token: str | None = None
    auth_scheme: str | None = None
    auth_credentials: str | None = None
    delivered_seq: int = 0
    created_at: float
    #: The extensions the request that made it activated (hitl-prompt/v1: its deliveries carry prompts).
    extensions: list[str] = []


def _record(row: sqlite3.Row) -> PushConfigRecord:
    fields = {key: row[key] for key in row.keys()}  # noqa: SIM118 (a Row iterates values)
    fields["extensions"] = from_json(fields["extensions"])
    return PushConfigRecord(**fields)


class PushTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, rec: PushConfigRecord, *, limit: int) -> bool:
        """Store ``rec`` (replacing a config of the same id); False if the task has ``limit`` already."""

        def create(db: sqlite3.Connection) -> bool:
            count = db.execute(
                "SELECT COUNT(*) FROM push_configs WHERE task_id = ? AND id != ?", (rec.task_id, rec.id)
            ).fetchone()[0]
            if count >= limit:
                return False
            db.execute(
                "INSERT OR REPLACE INTO push_configs VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    rec.task_id,
                    rec.id,
                    rec.instance_id,
                    rec.url,
                    rec.token,
                    rec.auth_scheme,
                    rec.auth_credentials,
                    rec.delivered_seq,
                    rec.created_at,
                    to_json(rec.extensions),
                ),
            )
            return True

        return await self._db.run(self._db.transaction(create))

    async def get(self, task_id: str, config_id: str) -> PushConfigRecord | None:
        row = await self._db.run(
            lambda db: db.execute(
                "SELECT * FROM push_configs WHERE task_id = ? AND id = ?", (task_id, config_id)
            ).fetchone()
        )
        return None if row is None else _record(row)

    async def list(self, task_id: str, *, after: str = "", limit: int = 100) -> list[PushConfigRecord]:
        rows = await self._db.run(
            lambda db: db.execute(
                "SELECT * FROM push_configs WHERE task_id = ? AND id > ? ORDER BY id LIMIT ?", (task_id, after, limit)
            ).fetchall()
        )
        return [_record(r) for r in rows]

    async def delete(self, task_id: str, config_id: str) -> None:
        await self._db.run(
            lambda db: db.execute("DELETE FROM push_configs WHERE task_id = ? AND id = ?", (task_id, config_id))
        )

    async def advance(self, task_id: str, config_id: str, seq: int) -> None:
        """The config is done with every event up to ``seq``."""
        await self._db.run(
            lambda db: db.execute(
                "UPDATE push_configs SET delivered_seq = MAX(delivered_seq, ?) WHERE task_id = ? AND id = ?",
                (seq, task_id, config_id),
            )
        )

    async def pending(self) -> builtins.list[PushConfigRecord]:
        """Configs with events to deliver, or whose task may still have some (not ended)."""
        rows = await self._db.run(
            lambda db: db.execute(
                "SELECT p.* FROM push_configs p JOIN tasks t ON t.id = p.task_id"
                " WHERE p.delivered_seq < t.last_seq OR t.state NOT IN"
                " ('TASK_STATE_COMPLETED','TASK_STATE_FAILED','TASK_STATE_CANCELED','TASK_STATE_REJECTED')"
            ).fetchall()
        )
        return [_record(r) for r in rows]
