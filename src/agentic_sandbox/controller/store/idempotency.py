"""The idempotency/v1 cache: the first response to each ``messageId``, kept until it expires.

Rows are keyed by instance, scope (the binding: a JSON-RPC response differs from the HTTP+JSON
one for the same request) and message id. :meth:`IdempotencyTable.put` keeps the first response
(``INSERT OR IGNORE``: a concurrent duplicate never overwrites it) and holds the table to its
bounds in the same transaction: expired rows go, then the oldest ``created_at`` beyond
``max_entries``.
"""

from __future__ import annotations

import sqlite3

import msgspec

from .database import Database


class CachedResponse(msgspec.Struct, frozen=True, kw_only=True):
    request_hash: str
    status: int
    body: bytes
    created_at: float
    expires_at: float


class IdempotencyTable:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, instance_id: str, scope: str, message_id: str, now: float) -> CachedResponse | None:
        """The live entry for the key, or None (an expired entry is a miss)."""
        row = await self._db.run(
            lambda db: db.execute(
                "SELECT request_hash, response_status, response_body, created_at, expires_at FROM idempotency_cache"
                " WHERE instance_id = ? AND scope = ? AND message_id = ? AND expires_at > ?",
                (instance_id, scope, message_id, now),
            ).fetchone()
        )
        if row is None:
            return None
        return CachedResponse(
            request_hash=row["request_hash"],
            status=row["response_status"],
            body=bytes(row["response_body"]),
            created_at=row["created_at"],
            expires_at=row["expires_at"],
        )

    async def put(
        self, instance_id: str, scope: str, message_id: str, entry: CachedResponse, *, max_entries: int
    ) -> None:
        def put(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM idempotency_cache WHERE expires_at <= ?", (entry.created_at,))
            # An expired row under the same key was just removed, so this inserts unless a live
            # first response exists (which stays).
            db.execute(
                "INSERT OR IGNORE INTO idempotency_cache VALUES (?,?,?,?,?,?,?,?)",
                (
                    instance_id,
                    scope,
                    message_id,
                    entry.request_hash,
                    entry.status,
                    entry.body,
                    entry.created_at,
                    entry.expires_at,
                ),
            )
            (count,) = db.execute("SELECT COUNT(*) FROM idempotency_cache").fetchone()
            if count > max_entries:
                db.execute(
                    "DELETE FROM idempotency_cache WHERE rowid IN"
                    " (SELECT rowid FROM idempotency_cache ORDER BY created_at, rowid LIMIT ?)",
                    (count - max_entries,),
                )

        await self._db.run(self._db.transaction(put))

    async def count(self) -> int:
        row = await self._db.run(lambda db: db.execute("SELECT COUNT(*) FROM idempotency_cache").fetchone())
        return int(row[0])
