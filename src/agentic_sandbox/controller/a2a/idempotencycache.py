"""idempotency/v1's memory: the stored first outcome of each (instance, scope, messageId), and the
requests with one key being served now. The HTTP side (which requests it guards, what it answers)
is :mod:`agentic_sandbox.controller.a2a.idempotency`.

Requests with one key are served one at a time: in this process by an event per key; across the
controllers of a shared store by a claim in the store (:meth:`IdempotencyTable.claim`), so two
sends with one ``messageId`` at two controllers at once make one task and get one answer. A
claim taken over from a controller that died mid-send marks the send as resumed
(:data:`controller.tasks.service.RESUMED_SEND`): a task that send started already is answered
instead of a second one being started.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import rfc8785
import trio

from ..errors import IDEMPOTENCY_KEY_REUSED, Conflict
from ..metrics import Metrics
from ..store import CachedResponse, Store, StoreUnavailable
from ..store.idempotency import Claim
from ..tasks.service import RESUMED_SEND
from .card import IDEMPOTENCY_EXTENSION

log = logging.getLogger(__name__)

#: How long a send waits between two looks at another controller's claim on its key (doubling).
CLAIM_POLL_MIN_S = 0.02
CLAIM_POLL_MAX_S = 0.5


def request_hash(params: dict[str, Any]) -> str:
    message = {key: value for key, value in params["message"].items() if key != "messageId"}
    digest = hashlib.sha256(rfc8785.dumps({**params, "message": message}))
    return digest.hexdigest()


class IdempotencyCache:
    """Entries live ``ttl_s`` seconds, at most ``max_entries`` are kept (the store evicts the oldest)."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        ttl_s: float,
        max_entries: int,
        owner: str = "",
        lease_ttl_s: float = 2.0,
    ) -> None:
        self._store = store
        self._owner = owner
        self._lease_ttl_s = lease_ttl_s
        self._metrics = metrics
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        #: Keys being served now; a duplicate waits on the first's event.
        self._inflight: dict[tuple[str, str, str], trio.Event] = {}
        #: Claims whose release failed (the store was away): released at the next send here (until
        #: then, this controller's renewals keep them, and a retry elsewhere waits).
        self._unreleased: set[tuple[str, str, str]] = set()

    def card_extension(self) -> dict[str, Any]:
        return {
            "uri": IDEMPOTENCY_EXTENSION,
            "description": (
                "Retries of SendMessage (or SendStreamingMessage) with the same messageId get the first outcome "
                "again; activate it with A2A-Extensions (it is not enforced: requests without it are served "
                "without deduplication)."
            ),
            "required": True,
            "params": {
                "ttl_seconds": int(self._ttl_s),
                "canonicalization": "jcs-rfc8785",
                "hash_algorithm": "sha-256",
                "max_cache_entries": self._max_entries,
            },
        }

    @asynccontextmanager
    async def exclusive(self, key: tuple[str, str, str]) -> AsyncIterator[None]:
        """One request per key at a time: a duplicate waits until the first has stored its outcome."""
        running = self._inflight
        while (busy := running.get(key)) is not None:
            await busy.wait()
        done = running[key] = trio.Event()
        try:
            if not self._store.shared:
                yield
                return
            await self._release_unreleased(but=key)
            claim = await self._claim(key)  # one of ours left unreleased is taken over (resumed)
            self._unreleased.discard(key)
            token = RESUMED_SEND.set(claim.taken_over)
            try:
                yield
            finally:
                RESUMED_SEND.reset(token)
                if claim is not Claim.ANSWERED:
                    with trio.CancelScope(shield=True):
                        # Unless an answer replaced it: a send that stored none leaves the key free.
                        try:
                            await self._store.idempotency.unclaim(*key, self._owner)
                        except StoreUnavailable:
                            self._unreleased.add(key)
        finally:
            del running[key]
            done.set()

    async def _release_unreleased(self, *, but: tuple[str, str, str]) -> None:
        for key in list(self._unreleased - {but}):
            await self._store.idempotency.unclaim(*key, self._owner)
            self._unreleased.discard(key)

    async def _claim(self, key: tuple[str, str, str]) -> Claim:
        """The key's claim for this controller, or ANSWERED; waits while another one holds it."""
        pause = CLAIM_POLL_MIN_S
        while True:
            now = time.time()
            claim = await self._store.idempotency.claim(
                *key, owner=self._owner, until=now + self._lease_ttl_s, now=now, ttl_s=self._ttl_s
            )
            if claim is not Claim.BUSY:
                if claim.taken_over:
                    log.warning(
                        "idempotency: messageId %s was being sent by a controller that stopped; resuming", key[2]
                    )
                return claim
            await trio.sleep(pause)
            pause = min(pause * 2, CLAIM_POLL_MAX_S)

    async def lookup(
        self, instance_id: str, scope: str, params: Any, message_id: str, operation: str
    ) -> tuple[str, CachedResponse | None]:
        """(the request's hash, the live entry if any); raises on a collision."""
        submitted = request_hash(params)
        cached = await self._store.idempotency.get(instance_id, scope, message_id, time.time())
        if cached is None:
            self._metrics.idempotency_misses.labels(operation).inc()
        elif cached.request_hash != submitted:
            self._metrics.idempotency_collisions.labels(operation).inc()
            raise Conflict(
                IDEMPOTENCY_KEY_REUSED,
                f"IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD: messageId {message_id} was first sent with a "
                "different request; retry with the original request or use a new messageId",
                details={
                    "message_id": message_id,
                    "original_request_hash": cached.request_hash,
                    "submitted_request_hash": submitted,
                },
            )
        else:
            self._metrics.idempotency_hits.labels(operation).inc()
        return submitted, cached

    async def remember(
        self, instance_id: str, scope: str, message_id: str, submitted: str, status: int, body: bytes
    ) -> None:
        now = time.time()
        entry = CachedResponse(
            request_hash=submitted,
            status=status,
            body=body,
            created_at=now,
            expires_at=now + self._ttl_s,
        )
        await self._store.idempotency.put(instance_id, scope, message_id, entry, max_entries=self._max_entries)
