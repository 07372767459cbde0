"""idempotency/v1: a repeated ``SendMessage`` or ``SendStreamingMessage`` with the same ``messageId``
gets the first outcome again.

Active for a request only when the client activates the extension (``A2A-Extensions``); the card
declares it ``required: true`` as upstream's card does, but only runtime/v1 is enforced (upstream's
migration guide: idempotency is opt-in). When active, :func:`guarded` (unary) and
:func:`guarded_stream` wrap the operation:

* ``message.messageId`` must be a UUID in canonical form, version 7 or version 4 (the RFC 9562
  form of a 128-bit random value); anything else is 400 ``IDEMPOTENCY_MESSAGE_ID_MALFORMED``
  before any side effect (low-entropy ids would collide across clients).
* ``request_hash`` is lowercase hex SHA-256 of the JCS (RFC 8785) form of the request params
  without ``message.messageId``.
* A live entry with the same hash: its status and body bytes are sent again as they were, with
  ``Idempotent-Replayed: true`` (never sent on a miss); no task is created. With a different
  hash: 422 ``IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD`` with ``message_id``,
  ``original_request_hash`` and ``submitted_request_hash``; the entry stays.
* A miss runs the operation and stores its outcome in SQLite, so replays survive a restart. Errors
  the operation answers (4xx and 5xx: a refused answer, a task that could not be started) are
  stored too, as the spec says: the outcome of a messageId is fixed, and a client that wants
  another try sends a new messageId. (An unexpected fault of ours, answered 500 by the surface's
  last-resort handler, is not stored.)
* A stream's entry names its task: a repeat attaches to that task's stream, replaying it from the
  task's creation (from the task as it then stands, for a follow-up message) and following it live
  while it runs, framed with the first call's JSON-RPC ``id``.
* Requests with the same key wait for each other (in this process): a retry that arrives while the
  first is still running (a blocking send outlasting a client's timeout) gets the first's outcome
  once it is there, instead of running it a second time.

Entries live ``AIWG_IDEMPOTENCY_TTL`` seconds and at most ``AIWG_IDEMPOTENCY_MAX_ENTRIES`` are kept.
Entries are per instance and per scope: the binding (the JSON-RPC response, with the first call's
``id``, and the HTTP+JSON one differ for the same request) and the operation (a stream is not a
send: the same messageId on both is two requests).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from quart import Response

from ..errors import (
    IDEMPOTENCY_MESSAGE_ID_MALFORMED,
    ControllerError,
    ValidationFailed,
)
from ..state import app_state
from ..store import CachedResponse
from .caller import Caller
from .card import IDEMPOTENCY_EXTENSION
from .edge import JSON, echo_extensions, response_media_type
from .idempotencycache import IdempotencyCache
from .sse import sse_response

OPERATION = "SendMessage"
STREAM_OPERATION = "SendStreamingMessage"
REPLAYED_HEADER = "Idempotent-Replayed"
_MESSAGE_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[47][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$", re.IGNORECASE)


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


def _cache() -> IdempotencyCache:
    return app_state().idempotency


def _replay(caller: Caller, scope: str, cached: CachedResponse) -> Response:
    """The stored answer again, in the binding's media type (JSON-RPC's is application/json)."""
    media_type = JSON if scope.startswith("jsonrpc") else response_media_type()
    response = echo_extensions(Response(cached.body, status=cached.status, content_type=media_type), caller)
    response.headers[REPLAYED_HEADER] = "true"
    return response


async def _outcome(response: Response) -> bytes:
    body = await response.get_data(as_text=False)
    return body if isinstance(body, bytes) else body.encode()


async def guarded(
    caller: Caller,
    scope: str,
    params: Any,
    run: Callable[[], Awaitable[Response]],
    on_error: Callable[[ControllerError], Response],
) -> Response:
    """``run()``'s response, or the first outcome for this messageId (see the module docstring);
    ``on_error`` answers a domain error the way the binding does (what is stored for it)."""
    if not is_active(caller):
        return await run()
    message_id = message_id_of(params)
    cache = _cache()
    async with cache.exclusive((caller.instance.id, scope, message_id)):
        submitted, cached = await cache.lookup(caller.instance.id, scope, params, message_id, OPERATION)
        if cached is not None:
            return _replay(caller, scope, cached)
        try:
            response = await run()
        except ControllerError as exc:
            response = on_error(exc)
        await cache.remember(
            caller.instance.id, scope, message_id, submitted, response.status_code, await _outcome(response)
        )
        return response


#: The status of a stream's entry, whose body names the task a repeat attaches to (``{"taskId",
#: "fromCreation", "id"}``); any other status is an error answer stored as it was sent.
STREAM_ENTRY = 0


async def guarded_stream(
    caller: Caller,
    scope: str,
    params: Any,
    start: Callable[[], Awaitable[tuple[dict[str, Any], AsyncIterator[bytes]]]],
    attach: Callable[[dict[str, Any]], AsyncIterator[bytes]],
    on_error: Callable[[ControllerError], Response],
) -> Response:
    """A stream: ``start()`` sends the message and gives (its entry, its stream); a repeat gets
    ``attach(entry)``, the same task's stream again (see the module docstring)."""
    if not is_active(caller):
        _, body = await start()
        return sse_response(caller, body)
    message_id = message_id_of(params)
    cache = _cache()
    async with cache.exclusive((caller.instance.id, scope, message_id)):
        submitted, cached = await cache.lookup(caller.instance.id, scope, params, message_id, STREAM_OPERATION)
        if cached is not None and cached.status == STREAM_ENTRY:
            response = sse_response(caller, attach(msgspec.json.decode(cached.body)))
            response.headers[REPLAYED_HEADER] = "true"
            return response
        if cached is not None:
            return _replay(caller, scope, cached)
        try:
            entry, body = await start()
        except ControllerError as exc:
            response = on_error(exc)
            await cache.remember(
                caller.instance.id, scope, message_id, submitted, response.status_code, await _outcome(response)
            )
            return response
        await cache.remember(caller.instance.id, scope, message_id, submitted, STREAM_ENTRY, msgspec.json.encode(entry))
        return sse_response(caller, body)
