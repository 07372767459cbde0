"""The JSON-RPC 2.0 binding at ``POST /agents/{instance_id}`` (the agent's base URL itself).

The binding a2a-sdk clients pick by default. Methods (params are the v1.0 request JSON) are the
same operations as the HTTP+JSON binding (:mod:`controller.a2a.service`): ``SendMessage``,
``SendStreamingMessage`` and ``SubscribeToTask`` (SSE: each event a JSON-RPC response with the
request's id and a StreamResponse result), ``GetTask``, ``ListTasks``, ``CancelTask``, the four
push config methods (:mod:`controller.push`) and ``GetExtendedAgentCard``.

Errors are JSON-RPC errors with the v1.0.1 codes (-32001 ... -32009, -32600 ... -32700) and the
A2A error details (ErrorInfo, BadRequest) as ``error.data``. They are answered with HTTP 200, as
JSON-RPC over HTTP does, except for what HTTP itself says: 401 without a valid token, 404 for an
instance the caller cannot see. A batch (a JSON array) is refused (-32600). Every answer is
``Content-Type: application/json`` (spec §9); a body in another media type is -32005
(ContentTypeNotSupported).

A2A 0.3's methods (``message/send`` ...) are served at the same endpoint (:mod:`.rpc03`). The
method's version and the request's (``A2A-Version``; missing means 0.3, spec §3.6) must agree:
a 1.0 method without ``A2A-Version: 1.0``, or a 0.3 method with it, is VERSION_NOT_SUPPORTED.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from quart import Response, request

from ..errors import (
    CONTENT_TYPE_NOT_SUPPORTED,
    METHOD_NOT_FOUND,
    ControllerError,
    MalformedInput,
    NotFound,
    UnsupportedMedia,
    ValidationFailed,
)
from ..http.responses import request_body
from ..push.configs import ConfigRef, ListParams, PushConfigIn
from ..state import app_state
from ..tasks.model import SendMessageRequest
from ..tasks.service import ListQuery
from . import idempotency, rpc03, service
from .blueprint import a2a
from .caller import WIRE_0_3, WIRE_1_0, Caller
from .edge import ACCEPTED_BODY_TYPES, BOTH_WIRES, begin
from .errors import to_a2a
from .rpcframing import PARSE_ERROR, Envelope, JsonId, RpcFraming, params_of, rpc_error, rpc_response, rpc_result
from .sse import sse_response

#: Methods that need runtime/v1 activated (as on the HTTP+JSON binding).
GATED = frozenset(
    {
        "SendMessage",
        "SendStreamingMessage",
        "CancelTask",
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
    }
)
#: The 1.0 methods (a request for one must say ``A2A-Version: 1.0``).
METHODS_1_0 = frozenset(
    GATED | {"SendMessage", "SendStreamingMessage", "SubscribeToTask", "GetTask", "ListTasks", "GetExtendedAgentCard"}
)


async def create_push_config(caller: Caller, envelope: Envelope) -> dict[str, Any]:
    cfg: PushConfigIn = params_of(envelope, PushConfigIn)
    if not cfg.task_id:
        raise ValidationFailed([{"field": "taskId", "message": "is required", "code": "required"}])
    return await app_state().a2a.create_push_config(caller, cfg.task_id, cfg)


async def _unary(caller: Caller, envelope: Envelope) -> dict[str, Any]:
    method = envelope.method
    ops = app_state().a2a
    calls: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "SendMessage": lambda: ops.send_message(caller, params_of(envelope, SendMessageRequest)),
        "GetTask": lambda: ops.get_task(caller, params_of(envelope, service.GetTaskParams)),
        "ListTasks": lambda: ops.list_tasks(caller, params_of(envelope, ListQuery)),
        "CancelTask": lambda: ops.cancel_task(caller, params_of(envelope, service.TaskIdParams)),
        "GetExtendedAgentCard": lambda: ops.extended_agent_card(caller),
        "CreateTaskPushNotificationConfig": lambda: create_push_config(caller, envelope),
        "GetTaskPushNotificationConfig": lambda: ops.get_push_config(caller, params_of(envelope, ConfigRef)),
        "ListTaskPushNotificationConfigs": lambda: ops.list_push_configs(caller, params_of(envelope, ListParams)),
        "DeleteTaskPushNotificationConfig": lambda: ops.delete_push_config(caller, params_of(envelope, ConfigRef)),
    }
    call = calls.get(method)
    if call is None:
        raise NotFound(METHOD_NOT_FOUND, f"no JSON-RPC method {method[:64]!r}")
    return await call()


@a2a.post("/agents/<instance_id>")
@a2a.post("/agents/<instance_id>/")  # clients that join paths onto the base URL add the slash
async def jsonrpc(instance_id: str) -> Response:
    call_id: JsonId = None
    legacy = False  # a 0.3 method: its errors are 0.3's
    try:
        body = await request_body()
        if request.mimetype not in ACCEPTED_BODY_TYPES:
            raise UnsupportedMedia("a JSON-RPC request is application/json", code=CONTENT_TYPE_NOT_SUPPORTED)
        try:
            raw = msgspec.json.decode(body)
        except msgspec.DecodeError:
            error = to_a2a(MalformedInput("the body is not JSON"))
            return rpc_response(rpc_error(None, error, PARSE_ERROR))
        if isinstance(raw, dict) and isinstance(raw.get("id"), str | int):
            call_id = raw["id"]
        try:
            envelope = msgspec.convert(raw, Envelope)
        except msgspec.ValidationError as exc:
            raise MalformedInput(f"not a JSON-RPC 2.0 request: {exc}") from None
        if envelope.jsonrpc != "2.0":
            raise MalformedInput('not a JSON-RPC 2.0 request: jsonrpc must be "2.0"')
        legacy = envelope.method in rpc03.METHODS
        gated = envelope.method in (rpc03.GATED if legacy else GATED)
        # The method's version must be the request's: checked before the extensions are.
        wires = (WIRE_0_3,) if legacy else (WIRE_1_0,) if envelope.method in METHODS_1_0 else BOTH_WIRES
        caller = await begin(instance_id, enforce_extensions=gated, wires=wires)
        if legacy:
            return await rpc03.dispatch(caller, envelope, call_id, lambda e: failure(call_id, e, legacy=True))
        if envelope.method == "SubscribeToTask":
            params = params_of(envelope, service.TaskIdParams)
            return sse_response(caller, await app_state().a2a.subscribe_to_task(caller, params, RpcFraming(call_id)))
        if envelope.method == "SendStreamingMessage":
            return await _send_streaming(caller, envelope, call_id)

        async def run() -> Response:
            return rpc_result(call_id, await _unary(caller, envelope), caller)

        if envelope.method == "SendMessage":
            return await idempotency.guarded(caller, "jsonrpc", envelope.params, run, lambda e: failure(call_id, e))
        return await run()
    except ControllerError as exc:
        return failure(call_id, exc, legacy=legacy)


def failure(call_id: JsonId, exc: ControllerError, *, legacy: bool = False) -> Response:
    """A domain error as this binding answers it: HTTP 200 with the JSON-RPC error (0.3's for a 0.3
    method), except what HTTP itself says (401 without a valid token, 404 for an instance the
    caller cannot see)."""
    error = to_a2a(exc)
    status = error.http_status if exc.code in ("auth.unauthorized", "instance.not_found") else 200
    body = rpc03.error_body(call_id, error) if legacy else rpc_error(call_id, error)
    return rpc_response(body, status, error.headers() if status != 200 else None)


async def _send_streaming(caller: Caller, envelope: Envelope, call_id: JsonId) -> Response:
    """SendStreamingMessage; with idempotency/v1, a repeat attaches to the first call's stream,
    framed with that call's id (kept in the entry)."""

    async def start() -> tuple[dict[str, Any], Any]:
        req = params_of(envelope, SendMessageRequest)
        stream, body = await app_state().a2a.send_streaming_message(caller, req, RpcFraming(call_id))
        return {**stream, "id": call_id}, body

    def attach(stream: dict[str, Any]) -> Any:
        return app_state().a2a.attach_stream(caller, stream, RpcFraming(stream.get("id")))

    return await idempotency.guarded_stream(
        caller, "jsonrpc:stream", envelope.params, start, attach, lambda e: failure(call_id, e)
    )
