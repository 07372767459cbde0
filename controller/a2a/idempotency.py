"""idempotency/v1: a repeated ``SendMessage`` with the same ``messageId`` replays the first response.

Active for a request only when the client activates the extension (``A2A-Extensions``); the card
declares it ``required: true`` as upstream's card does, but only runtime/v1 is enforced (upstream's
migration guide: idempotency is opt-in). When active, :func:`guarded` wraps the operation:

* ``message.messageId`` must be a UUID in canonical form, version 7 or version 4 (the RFC 9562
  form of a 128-bit random value); anything else is 400 ``IDEMPOTENCY_MESSAGE_ID_MALFORMED``
  before any side effect (low-entropy ids would collide across clients).
* ``request_hash`` is lowercase hex SHA-256 of the JCS (RFC 8785) form of the request params
  without ``message.messageId``.
* A live entry with the same hash: its status and body bytes are sent again as they were, with
  ``Idempotent-Replayed: true`` (never sent on a miss); no task is created. With a different
  hash: 422 ``IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD`` with ``message_id``,
  ``original_request_hash`` and ``submitted_request_hash``; the entry stays.
* A miss runs the operation and stores its response (successes only: an error is not a result a
  retry should be pinned to) in SQLite, so replays survive a restart.

Entries live ``AIWG_IDEMPOTENCY_TTL`` seconds and at most ``AIWG_IDEMPOTENCY_MAX_ENTRIES`` are kept.
Entries are per instance and per binding (``scope``): the JSON-RPC response (with the first
call's ``id``) and the HTTP+JSON one differ for the same request.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import rfc8785
from quart import Response

from ..errors import IDEMPOTENCY_KEY_REUSED, IDEMPOTENCY_MESSAGE_ID_MALFORMED, Conflict, ValidationFailed
from ..state import app_state
from ..store import CachedResponse
from .card import IDEMPOTENCY_EXTENSION
from .edge import A2A_JSON, Caller

OPERATION = "SendMessage"
REPLAYED_HEADER = "Idempotent-Replayed"
_MESSAGE_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[47][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$", re.IGNORECASE)


def card_extension() -> dict[str, Any]:
    config = app_state().config
    return {
        "uri": IDEMPOTENCY_EXTENSION,
        "description": (
            "Retries of SendMessage with the same messageId replay the first response; activate it with "
            "A2A-Extensions (it is not enforced: requests without it are served without deduplication)."
        ),
        "required": True,
        "params": {
            "ttl_seconds": int(config.idempotency_ttl_s),
            "canonicalization": "jcs-rfc8785",
            "hash_algorithm": "sha-256",
            "max_cache_entries": config.idempotency_max_entries,
        },
    }


def is_active(caller: Caller) -> bool:
    return any(uri.lower() == IDEMPOTENCY_EXTENSION.lower() for uri in caller.extensions)


def message_id_of(params: Any) -> str:
    message = params.get("message") if isinstance(params, dict) else None
    value = message.get("messageId") if isinstance(message, dict) else None
    if not isinstance(value, str) or _MESSAGE_ID_RE.match(value) is None:
        shown = value[:64] if isinstance(value, str) else None
        raise ValidationFailed(
            [{"field": "message.messageId", "message": "must be a canonical UUIDv7 or UUIDv4", "code": "malformed"}],
            "IDEMPOTENCY_MESSAGE_ID_MALFORMED: message.messageId must be a canonical UUIDv7 or UUIDv4 "
            "(lower-entropy ids are refused)",
            code=IDEMPOTENCY_MESSAGE_ID_MALFORMED,
            details={"message_id": str(shown)},
        )
    return value


def request_hash(params: dict[str, Any]) -> str:
    message = {key: value for key, value in params["message"].items() if key != "messageId"}
    digest = hashlib.sha256(rfc8785.dumps({**params, "message": message}))
    return digest.hexdigest()


def _replay(caller: Caller, cached: CachedResponse) -> Response:
    response = Response(cached.body, status=cached.status, content_type=A2A_JSON)
    response.headers["A2A-Extensions"] = ", ".join(caller.extensions)
    response.headers[REPLAYED_HEADER] = "true"
    return response


async def guarded(caller: Caller, scope: str, params: Any, run: Callable[[], Awaitable[Response]]) -> Response:
    """``run()``'s response, or the cached first response to this messageId (see the module docstring)."""
    if not is_active(caller):
        return await run()
    state = app_state()
    message_id = message_id_of(params)
    submitted = request_hash(params)
    now = time.time()
    cached = await state.store.idempotency.get(caller.instance.id, scope, message_id, now)
    if cached is not None:
        if cached.request_hash != submitted:
            state.metrics.idempotency_collisions.labels(OPERATION).inc()
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
        state.metrics.idempotency_hits.labels(OPERATION).inc()
        return _replay(caller, cached)
    state.metrics.idempotency_misses.labels(OPERATION).inc()
    response = await run()
    body = await response.get_data(as_text=False)
    entry = CachedResponse(
        request_hash=submitted,
        status=response.status_code,
        body=body if isinstance(body, bytes) else body.encode(),
        created_at=now,
        expires_at=now + state.config.idempotency_ttl_s,
    )
    await state.store.idempotency.put(
        caller.instance.id, scope, message_id, entry, max_entries=state.config.idempotency_max_entries
    )
    return response
