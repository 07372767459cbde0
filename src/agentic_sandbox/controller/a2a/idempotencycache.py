"""idempotency/v1's memory: the stored first outcome of each (instance, scope, messageId), and the
requests with one key being served now. The HTTP side (which requests it guards, what it answers)
is :mod:`agentic_sandbox.controller.a2a.idempotency`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import rfc8785
import trio

from ..errors import IDEMPOTENCY_KEY_REUSED, Conflict
from ..metrics import Metrics
from ..store import CachedResponse, Store
from .card import IDEMPOTENCY_EXTENSION


def request_hash(params: dict[str, Any]) -> str:
    message = {key: value for key, value in params["message"].items() if key != "messageId"}
    digest = hashlib.sha256(rfc8785.dumps({**params, "message": message}))
    return digest.hexdigest()


class IdempotencyCache:
    """Entries live ``ttl_s`` seconds, at most ``max_entries`` are kept (the store evicts the oldest)."""

    def __init__(self, store: Store, metrics: Metrics, *, ttl_s: float, max_entries: int) -> None:
        self._store = store
        self._metrics = metrics
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        #: Keys being served now; a duplicate waits on the first's event.
        self._inflight: dict[tuple[str, str, str], trio.Event] = {}

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
            yield
        finally:
            del running[key]
            done.set()

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
