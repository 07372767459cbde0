"""The agent outbox: control messages a task's agent has yet to be handed, oldest first.

A row is written in the same transaction as the task event it belongs to (a follow-up message, a
hitl-prompt/v1 answer: :attr:`controller.store.tasks.Append.outbox`), so a message the controller
acknowledged is never lost between the store and hostd: it stays here until hostd has taken it
(or the agent can no longer take it) and is handed over again after a crash or a hostd outage.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .database import Connection, Database, from_json


class OutboxItem(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    #: The sequence of the task event the message belongs to (the order of delivery).
    seq: int
    body: dict[str, Any]


class OutboxTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def pending(self, task_id: str) -> list[OutboxItem]:
        rows = await self._db.run(
            lambda db: db.execute("SELECT * FROM agent_outbox WHERE task_id = ? ORDER BY seq", (task_id,)).fetchall()
        )
        return [OutboxItem(task_id=r["task_id"], seq=r["seq"], body=from_json(r["body"])) for r in rows]

    async def remove(self, task_id: str, seq: int) -> None:
        await self._db.run(
            lambda db: db.execute("DELETE FROM agent_outbox WHERE task_id = ? AND seq = ?", (task_id, seq))
        )

    async def task_ids(self) -> set[str]:
        """Tasks with something waiting (after a restart: who needs a delivery)."""

        def read(db: Connection) -> set[str]:
            return {row[0] for row in db.execute("SELECT DISTINCT task_id FROM agent_outbox")}

        return await self._db.run(read)
