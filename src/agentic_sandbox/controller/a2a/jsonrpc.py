"""The JSON-RPC 2.0 binding at ``POST /agents/{instance_id}`` (the agent's base URL itself).

The binding a2a-sdk clients pick by default. Methods (params are the v1.0 request JSON) are the
same operations as the HTTP+JSON binding (:mod:`controller.a2a.service`): ``SendMessage``,
``SendStreamingMessage`` and ``SubscribeToTask`` (SSE: each event a JSON-RPC response with the
request's id and a StreamResponse result), ``GetTask``, ``ListTasks``, ``CancelTask``, the four
push config methods (:mod:`controller.push`) and ``GetExtendedAgentCard``.

Errors are JSON-RPC errors with the v1.0.1 codes (-32001 ... -32009, -32600 ... -32700) and the
A2A error details (ErrorInfo, BadRequest) as ``error.data``. They are answered with HTTP 200, as
JSON-RPC over HTTP does, except for what HTTP itself says: 401 without a valid token, 404 for an
instance the caller cannot see. A batch (a JSON array) is refused (-32600).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from quart import Response, request

from ..decoding import validation_failure
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
from . import idempotency, service
from .blueprint import a2a
from .caller import Caller
from .edge import A2A_JSON, ACCEPTED_BODY_TYPES, begin
from .errors import A2AError, to_a2a
from .sse import sse_response
from .streams import Framing

JsonId = str | int | None
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
PARSE_ERROR = -32700


class Envelope(msgspec.Struct, kw_only=True):
    jsonrpc: str
    method: str
    id: JsonId = None
    params: dict[str, Any] = {}


def rpc_error(call_id: JsonId, error: A2AError, code: int | None = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": call_id,
        "error": {
            "code": error.kind.jsonrpc if code is None else code,
            "message": error.message,
            "data": error.details(),
        },
    }


def rpc_response(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Response:
    response = Response(msgspec.json.encode(body), status=status, content_type=A2A_JSON)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


class RpcFraming(Framing):
    def __init__(self, call_id: JsonId) -> None:
        self.call_id = call_id

    def data(self, obj: dict[str, Any]) -> bytes:
        return super().data({"jsonrpc": "2.0", "id": self.call_id, "result": obj})

    def error(self, error: A2AError) -> bytes:
        return b"event: error\ndata: " + msgspec.json.encode(rpc_error(self.call_id, error)) + b"\n\n"


def params_of(envelope: Envelope, type_: type[Any]) -> Any:
    try:
        return msgspec.convert(envelope.params, type_)
    except msgspec.ValidationError as exc:
        raise validation_failure(exc) from None


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
        caller = await begin(instance_id, enforce_extensions=envelope.method in GATED)
        if envelope.method == "SubscribeToTask":
            params = params_of(envelope, service.TaskIdParams)
            return sse_response(caller, await app_state().a2a.subscribe_to_task(caller, params, RpcFraming(call_id)))
        if envelope.method == "SendStreamingMessage":
            return await _send_streaming(caller, envelope, call_id)

        async def run() -> Response:
            result = await _unary(caller, envelope)
            response = rpc_response({"jsonrpc": "2.0", "id": call_id, "result": result})
            if caller.extensions:
                response.headers["A2A-Extensions"] = ", ".join(caller.extensions)
            return response

        if envelope.method == "SendMessage":
            return await idempotency.guarded(caller, "jsonrpc", envelope.params, run, lambda e: failure(call_id, e))
        return await run()
    except ControllerError as exc:
        return failure(call_id, exc)


def failure(call_id: JsonId, exc: ControllerError) -> Response:
    """A domain error as this binding answers it: HTTP 200 with the JSON-RPC error, except what HTTP
    itself says (401 without a valid token, 404 for an instance the caller cannot see)."""
    error = to_a2a(exc)
    status = error.http_status if exc.code in ("auth.unauthorized", "instance.not_found") else 200
    return rpc_response(rpc_error(call_id, error), status, error.headers() if status != 200 else None)


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
