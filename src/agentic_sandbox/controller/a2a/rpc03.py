"""A2A 0.3's JSON-RPC methods, at the same endpoint as 1.0's (:mod:`.jsonrpc` dispatches on the
method name; the request's version must be 0.3: missing, or ``A2A-Version: 0.3``).

=======================================  ==============================================
0.3 method                               the operation (:mod:`.service`)
=======================================  ==============================================
``message/send``                         SendMessage: the Task or, if the agent answered
                                         with one, the Message (0.3's bare result)
``message/stream``                       SendStreamingMessage (SSE)
``tasks/get``, ``tasks/cancel``          GetTask, CancelTask
``tasks/resubscribe``                    SubscribeToTask (SSE)
``tasks/pushNotificationConfig/set``     CreateTaskPushNotificationConfig
``tasks/pushNotificationConfig/get``     GetTaskPushNotificationConfig (without
                                         ``pushNotificationConfigId``: the task's first)
``tasks/pushNotificationConfig/list``    ListTaskPushNotificationConfigs (a bare list)
``tasks/pushNotificationConfig/delete``  DeleteTaskPushNotificationConfig (``null``)
``agent/getAuthenticatedExtendedCard``   GetExtendedAgentCard
=======================================  ==============================================

Params and results are 0.3 JSON (:mod:`.wire03`). Errors are 0.3's JSON-RPC errors: the codes
0.3 defines keep their meaning; 1.0's additions it lacks (-32008 extension required, -32009
version not supported) are -32600 Invalid Request, with the same ``data`` (the ErrorInfo naming
the reason). The extensions' own codes (idempotency/v1, hitl-prompt/v1) are theirs in both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import msgspec
from quart import Response

from ..errors import METHOD_NOT_FOUND, ControllerError, NotFound, ValidationFailed
from ..push.configs import CONFIG_NOT_FOUND, ConfigRef, ListParams, PushConfigIn
from ..state import app_state
from ..tasks.model import Id, Metadata, SendMessageRequest
from . import idempotency, service, wire03
from .caller import Caller
from .errors import A2AError
from .rpcframing import Envelope, JsonId, RpcFraming, params_of, rpc_error, rpc_result
from .sse import sse_response

SEND, STREAM, RESUBSCRIBE = "message/send", "message/stream", "tasks/resubscribe"
PUSH_SET = "tasks/pushNotificationConfig/set"
PUSH_GET = "tasks/pushNotificationConfig/get"
PUSH_LIST = "tasks/pushNotificationConfig/list"
PUSH_DELETE = "tasks/pushNotificationConfig/delete"
METHODS = frozenset(
    {SEND, STREAM, RESUBSCRIBE, PUSH_SET, PUSH_GET, PUSH_LIST, PUSH_DELETE}
    | {"tasks/get", "tasks/cancel", "agent/getAuthenticatedExtendedCard"}
)
#: Methods that need runtime/v1 activated (as their 1.0 twins do).
GATED = frozenset({SEND, STREAM, "tasks/cancel", PUSH_SET, PUSH_GET, PUSH_LIST, PUSH_DELETE})
#: The JSON-RPC codes A2A 0.3 defines (the standard ones and its -32001 ... -32007).
CODES = frozenset({-32700, -32600, -32601, -32602, -32603} | set(range(-32007, -32000)))
#: Codes of the extensions' own specs, the same in both versions.
EXTENSION_CODES = frozenset({-32010, -32011, -32422})
INVALID_REQUEST = -32600


class TaskQuery(msgspec.Struct, rename="camel", kw_only=True):
    id: Id
    history_length: Annotated[int, msgspec.Meta(ge=0, le=10000)] | None = None
    metadata: Metadata | None = None


class ConfigQuery(msgspec.Struct, rename="camel", kw_only=True):
    id: Id
    push_notification_config_id: Id | None = None
    metadata: Metadata | None = None


def code_of(error: A2AError) -> int:
    code = error.kind.jsonrpc
    return code if code in CODES or code in EXTENSION_CODES else INVALID_REQUEST


def error_body(call_id: JsonId, error: A2AError) -> dict[str, Any]:
    return rpc_error(call_id, error, code_of(error))


class Framing03(RpcFraming):
    """A 0.3 stream: each StreamResponse as 0.3's event, errors as 0.3's JSON-RPC errors."""

    form = "0.3"

    def payload(self, obj: dict[str, Any]) -> bytes:
        return super().payload(wire03.stream_out(obj))

    def error(self, error: A2AError) -> bytes:
        return b"event: error\ndata: " + msgspec.json.encode(error_body(self.call_id, error)) + b"\n\n"


def _send_request(envelope: Envelope) -> SendMessageRequest:
    req: SendMessageRequest = params_of(envelope, SendMessageRequest, wire03.send_in(envelope.params))
    return req


async def _push_get(caller: Caller, query: ConfigQuery) -> dict[str, Any]:
    ops = app_state().a2a
    if query.push_notification_config_id is not None:
        return await ops.get_push_config(caller, ConfigRef(task_id=query.id, id=query.push_notification_config_id))
    configs = (await ops.list_push_configs(caller, ListParams(task_id=query.id)))["configs"]
    if not configs:
        raise NotFound(CONFIG_NOT_FOUND, f"task {query.id} has no push notification config")
    first: dict[str, Any] = configs[0]
    return first


async def _push_set(caller: Caller, envelope: Envelope) -> dict[str, Any]:
    cfg: PushConfigIn = params_of(envelope, PushConfigIn, wire03.task_push_config_in(envelope.params))
    if not cfg.task_id:
        raise ValidationFailed([{"field": "taskId", "message": "is required", "code": "required"}])
    return await app_state().a2a.create_push_config(caller, cfg.task_id, cfg)


async def _unary(caller: Caller, envelope: Envelope) -> Any:
    ops = app_state().a2a

    async def get_task() -> dict[str, Any]:
        query: TaskQuery = params_of(envelope, TaskQuery)
        return await ops.get_task(caller, service.GetTaskParams(id=query.id, history_length=query.history_length))

    async def push_list() -> list[dict[str, Any]]:
        query: ConfigQuery = params_of(envelope, ConfigQuery)
        configs: list[dict[str, Any]] = (await ops.list_push_configs(caller, ListParams(task_id=query.id)))["configs"]
        return [wire03.push_config_out(config) for config in configs]

    async def push_delete() -> None:
        query: ConfigQuery = params_of(envelope, ConfigQuery)
        if query.push_notification_config_id is None:
            field = "pushNotificationConfigId"
            raise ValidationFailed([{"field": field, "message": "is required", "code": "required"}])
        await ops.delete_push_config(caller, ConfigRef(task_id=query.id, id=query.push_notification_config_id))

    async def as_task(call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        return wire03.task_out(await call)

    async def as_config(call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        return wire03.push_config_out(await call)

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "tasks/get": lambda: as_task(get_task()),
        "tasks/cancel": lambda: as_task(ops.cancel_task(caller, params_of(envelope, service.TaskIdParams))),
        "agent/getAuthenticatedExtendedCard": lambda: ops.extended_agent_card(caller),
        PUSH_SET: lambda: as_config(_push_set(caller, envelope)),
        PUSH_GET: lambda: as_config(_push_get(caller, params_of(envelope, ConfigQuery))),
        PUSH_LIST: push_list,
        PUSH_DELETE: push_delete,
    }
    call = calls.get(envelope.method)
    if call is None:
        raise NotFound(METHOD_NOT_FOUND, f"no JSON-RPC method {envelope.method[:64]!r}")
    return await call()


async def dispatch(
    caller: Caller, envelope: Envelope, call_id: JsonId, failure: Callable[[ControllerError], Response]
) -> Response:
    """Answer one 0.3 request (``failure`` answers a domain error as this binding does)."""
    ops = app_state().a2a
    if envelope.method == RESUBSCRIBE:
        params = params_of(envelope, service.TaskIdParams)
        return sse_response(caller, await ops.subscribe_to_task(caller, params, Framing03(call_id)))
    if envelope.method == STREAM:

        async def start() -> tuple[dict[str, Any], AsyncIterator[bytes]]:
            stream, body = await ops.send_streaming_message(caller, _send_request(envelope), Framing03(call_id))
            return {**stream, "id": call_id}, body

        def attach(stream: dict[str, Any]) -> AsyncIterator[bytes]:
            return ops.attach_stream(caller, stream, Framing03(stream.get("id")))

        return await idempotency.guarded_stream(caller, "jsonrpc:0.3:stream", envelope.params, start, attach, failure)
    if envelope.method == SEND:

        async def run() -> Response:
            result = await ops.send_message(caller, _send_request(envelope))
            return rpc_result(call_id, wire03.send_out(result), caller)

        return await idempotency.guarded(caller, "jsonrpc:0.3", envelope.params, run, failure)
    return rpc_result(call_id, await _unary(caller, envelope), caller)
