"""The idempotency/v1 cache: the first response to each ``messageId``, kept until it expires.

Rows are keyed by instance, scope (the binding: a JSON-RPC response differs from the HTTP+JSON
one for the same request) and message id. :meth:`IdempotencyTable.put` keeps the first response
(a concurrent duplicate never overwrites it) and holds the table to its bounds in the same
transaction: expired rows go (from their index), and the oldest ``created_at`` beyond
``max_entries`` at every hundredth of ``max_entries`` puts of this controller (at most every
:data:`TRIM_EVERY`): counting the rows at every put would cost each send a scan of the whole
cache, and between two counts it passes its bound by 1 % at most.

Several controllers (a shared store): before a send runs, its controller claims the key
(:meth:`IdempotencyTable.claim`): a row with status :data:`CLAIMED` owned by the controller until
``owner_until`` (renewed with its other claims, :mod:`controller.store.leases`). A second send with
the key at another controller finds the claim and waits for the answer that replaces it; if the
claim runs out first (its controller died mid-send), the waiter takes it over and is told so
(:attr:`Claim.taken_over`): what the dead controller may have started is found by the message id.
A claim is never shown as an answer (:meth:`IdempotencyTable.get` skips it).
"""

from __future__ import annotations

from enum import Enum

import msgspec

from .database import Connection, Database

#: The status of a claim: a send with this key is running at ``owner`` (no answer yet).
CLAIMED = -1
#: Puts between two counts of the cache against its bound, at most (see the module docstring).
TRIM_EVERY = 1000

_COLUMNS = "instance_id, scope, message_id, request_hash, response_status, response_body, created_at, expires_at"


class CachedResponse(msgspec.Struct, frozen=True, kw_only=True):
    request_hash: str
    status: int
    body: bytes
    created_at: float
    expires_at: float


class Claim(Enum):
    """What :meth:`IdempotencyTable.claim` found."""

    #: The key is this controller's now: run the send.
    MINE = "mine"
    #: ... taken over from a controller whose claim ran out (it died mid-send).
    TAKEN_OVER = "taken_over"
    #: Another controller runs a send with this key now: wait and ask again.
    BUSY = "busy"
    #: The key has its answer: read it.
    ANSWERED = "answered"

    @property
    def taken_over(self) -> bool:
        return self is Claim.TAKEN_OVER


class IdempotencyTable:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._puts = 0

    async def get(self, instance_id: str, scope: str, message_id: str, now: float) -> CachedResponse | None:
        """The live answer for the key, or None (an expired entry and a claim are misses)."""
        row = await self._db.run(
            lambda db: db.execute(
                "SELECT request_hash, response_status, response_body, created_at, expires_at FROM idempotency_cache"
                " WHERE instance_id = ? AND scope = ? AND message_id = ? AND expires_at > ? AND response_status <> ?",
                (instance_id, scope, message_id, now, CLAIMED),
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

    async def claim(
        self, instance_id: str, scope: str, message_id: str, *, owner: str, until: float, now: float, ttl_s: float
    ) -> Claim:
        """Claim the key for a send at ``owner`` (see the module docstring)."""
        key = (instance_id, scope, message_id)

        def claim(db: Connection) -> Claim:
            db.execute(
                "DELETE FROM idempotency_cache WHERE instance_id = ? AND scope = ? AND message_id = ?"
                " AND expires_at <= ?",
                (*key, now),
            )
            inserted = db.execute(
                f"INSERT INTO idempotency_cache ({_COLUMNS}, owner, owner_until) VALUES (?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT DO NOTHING",
                (*key, "", CLAIMED, b"", now, now + ttl_s, owner, until),
            )
            if inserted.rowcount == 1:
                return Claim.MINE
            taken = db.execute(
                "UPDATE idempotency_cache SET owner = ?, owner_until = ? WHERE instance_id = ? AND scope = ?"
                " AND message_id = ? AND response_status = ? AND (owner_until < ? OR owner = ?)",
                (owner, until, *key, CLAIMED, now, owner),
            )
            if taken.rowcount == 1:
                return Claim.TAKEN_OVER
            row = db.execute(
                "SELECT response_status FROM idempotency_cache WHERE instance_id = ? AND scope = ? AND message_id = ?",
                key,
            ).fetchone()
            if row is None:
                return Claim.BUSY  # answered and expired in between: ask again
            return Claim.BUSY if row[0] == CLAIMED else Claim.ANSWERED

        return await self._db.run(self._db.transaction(claim))

    async def unclaim(self, instance_id: str, scope: str, message_id: str, owner: str) -> None:
        """Drop ``owner``'s claim on the key (the send stored no answer: the next one runs anew)."""
        await self._db.run(
            lambda db: db.execute(
                "DELETE FROM idempotency_cache WHERE instance_id = ? AND scope = ? AND message_id = ?"
                " AND response_status = ? AND owner = ?",
                (instance_id, scope, message_id, CLAIMED, owner),
            )
        )

    async def put(
        self, instance_id: str, scope: str, message_id: str, entry: CachedResponse, *, max_entries: int
    ) -> None:
        # The first put after a start, then every hundredth of the bound.
        trim = self._puts % min(TRIM_EVERY, max(1, max_entries // 100)) == 0
        self._puts += 1

        def put(db: Connection) -> None:
            db.execute("DELETE FROM idempotency_cache WHERE expires_at <= ?", (entry.created_at,))
            # An expired row under the same key was just removed, so this inserts, or replaces a
            # claim, unless a live first response exists (which stays).
            db.execute(
                f"INSERT INTO idempotency_cache ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)"
                " ON CONFLICT (instance_id, scope, message_id) DO UPDATE SET request_hash = excluded.request_hash,"
                " response_status = excluded.response_status, response_body = excluded.response_body,"
                " created_at = excluded.created_at, expires_at = excluded.expires_at, owner = NULL, owner_until = 0"
                " WHERE idempotency_cache.response_status = ?",
                (
                    instance_id,
                    scope,
                    message_id,
                    entry.request_hash,
                    entry.status,
                    entry.body,
                    entry.created_at,
                    entry.expires_at,
                    CLAIMED,
                ),
            )
            if not trim:
                return
            (count,) = db.execute("SELECT COUNT(*) FROM idempotency_cache").fetchone()
            if count > max_entries:
                db.execute(
                    "DELETE FROM idempotency_cache WHERE (instance_id, scope, message_id) IN"
                    " (SELECT instance_id, scope, message_id FROM idempotency_cache"
                    " ORDER BY created_at, instance_id, scope, message_id LIMIT ?)",
                    (count - max_entries,),
                )

        await self._db.run(self._db.transaction(put))

    async def count(self) -> int:
        row = await self._db.run(
            lambda db: db.execute(
                "SELECT COUNT(*) FROM idempotency_cache WHERE response_status <> ?", (CLAIMED,)
            ).fetchone()
        )
        return int(row[0])
