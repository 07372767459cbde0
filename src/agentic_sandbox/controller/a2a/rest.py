"""The HTTP+JSON binding: the A2A v1.0 paths and the agentic-sandbox ``/v1/`` paths, one handler each.

=====================================  =============================================  ============================
operation                              A2A v1.0 path                                  agentic-sandbox path
=====================================  =============================================  ============================
SendMessage                            ``POST /message:send``                         ``/v1/messages:send``
SendStreamingMessage (SSE)             ``POST /message:stream``                       ``/v1/messages:stream``
GetTask                                ``GET /tasks/{id}``                            ``/v1/tasks/{id}``
ListTasks                              ``GET /tasks``                                 ``/v1/tasks``
CancelTask                             ``POST /tasks/{id}:cancel``                    ``/v1/tasks/{id}/cancel``
SubscribeToTask (SSE)                  ``GET|POST /tasks/{id}:subscribe``             ``/v1/tasks/{id}/subscribe``
push notification configs              ``/tasks/{id}/pushNotificationConfigs[/{c}]``  the same under ``/v1``
GetExtendedAgentCard                   ``GET /extendedAgentCard``                     ``/v1/extendedAgentCard``
=====================================  =============================================  ============================

A2A 0.3's HTTP+JSON paths (a2a-sdk 0.3's) are served beside them: ``POST /v1/message:send``,
``POST /v1/message:stream``, ``GET /v1/tasks/{id}``, ``POST /v1/tasks/{id}:cancel``,
``GET|POST /v1/tasks/{id}:subscribe``, ``/v1/tasks/{id}/pushNotificationConfigs[/{c}]``,
``GET /v1/card``. Every path answers the version the request speaks (:mod:`controller.a2a.edge`;
a missing ``A2A-Version`` is 0.3); a 0.3 answer is translated at the end, in the form the path
calls for (:mod:`controller.a2a.rest03`).

(``{id}:cancel`` and ``{id}:subscribe`` are told apart from ``{id}`` in the handler: a task id
never holds a colon.) Request bodies must be ``application/json`` or ``application/a2a+json``
(else 415 ``CONTENT_TYPE_NOT_SUPPORTED``); answers are in the media type the client used.
SendMessage, SendStreamingMessage, CancelTask and the push operations need runtime/v1 activated
(see :mod:`controller.a2a.edge`); reads do not. The work is in :mod:`controller.a2a.service`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import msgspec
import trio
from quart import Response, request

from ..decoding import decode_json, validation_failure
from ..errors import (
    CONTENT_TYPE_NOT_SUPPORTED,
    METHOD_NOT_FOUND,
    ControllerError,
    NotFound,
    UnsupportedMedia,
    ValidationFailed,
)
from ..http.responses import request_body
from ..push.configs import ConfigRef, ListParams, PushConfigIn
from ..state import app_state
from ..tasks.model import SendMessageRequest
from ..tasks.service import ListQuery
from . import idempotency, rest03, service
from .blueprint import a2a, error_response
from .caller import WIRE_0_3, Caller
from .edge import ACCEPTED_BODY_TYPES, a2a_response, begin, is_legacy_path
from .errors import to_a2a
from .sse import sse_response

P = "/agents/<instance_id>"


async def read_body(type_: type[Any], *, optional: bool = False, body: bytes | None = None) -> Any:
    body = await request_body() if body is None else body
    if optional and not body.strip():
        return None
    check_media_type()
    return decode_json(body, type_)


def query(type_: type[Any], **extra: Any) -> Any:
    """Query parameters (and path values) into ``type_`` (strings converted: numbers, booleans)."""
    args: dict[str, Any] = {key: request.args.get(key) for key in request.args if key != "A2A-Version"}
    args.update(extra)
    try:
        return msgspec.convert(args, type_, strict=False)
    except msgspec.ValidationError as exc:
        raise validation_failure(exc) from None


def split_ref(ref: str) -> tuple[str, str | None]:
    task_id, sep, verb = ref.partition(":")
    return task_id, (verb if sep else None)


def upstream_path() -> bool:
    """An agentic-sandbox ``/agents/{id}/v1/...`` path (where upstream answers its 0.3 shape)."""
    rule = request.url_rule.rule if request.url_rule is not None else request.path
    return rule.startswith(P + "/v1/")


def _scope(caller: Caller, scope: str, form: rest03.Form) -> str:
    """idempotency/v1's scope: each version and form is answered, and stored, in its own shape."""
    return scope if caller.wire != WIRE_0_3 else f"{scope}:0.3:{form}"


@a2a.post(f"{P}/message:send")
@a2a.post(f"{P}/v1/messages:send")
@a2a.post(f"{P}/v1/message:send")
async def send_message(instance_id: str) -> Response:
    form = rest03.form_of(sdk=request.path.endswith("/v1/message:send"))
    caller = await begin(instance_id, legacy_path=is_legacy_path())
    raw = rest03.send_request(caller, await read_raw(), form)
    req: SendMessageRequest = await read_body(SendMessageRequest, body=raw)

    async def run() -> Response:
        result = await app_state().a2a.send_message(caller, req)
        return a2a_response(rest03.answer(caller, "send", result, form), caller)

    return await idempotency.guarded(caller, _scope(caller, "http+json", form), msgspec.json.decode(raw), run, failure)


@a2a.post(f"{P}/message:stream")
@a2a.post(f"{P}/v1/messages:stream")
@a2a.post(f"{P}/v1/message:stream")
async def send_streaming_message(instance_id: str) -> Response:
    form = rest03.form_of(sdk=request.path.endswith("/v1/message:stream"))
    caller = await begin(instance_id, legacy_path=is_legacy_path())
    raw = rest03.send_request(caller, await read_raw(), form)
    req: SendMessageRequest = await read_body(SendMessageRequest, body=raw)
    return await idempotency.guarded_stream(
        caller,
        _scope(caller, "http+json:stream", form),
        msgspec.json.decode(raw),
        lambda: app_state().a2a.send_streaming_message(caller, req, rest03.framing(caller, form)),
        lambda stream: app_state().a2a.attach_stream(caller, stream, rest03.framing(caller, form)),
        failure,
    )


async def read_raw() -> bytes:
    """A request's body, checked to be in a media type this binding takes (415 otherwise)."""
    body = await request_body()
    check_media_type()
    return body


def check_media_type() -> None:
    if request.mimetype not in ACCEPTED_BODY_TYPES:
        raise UnsupportedMedia(
            f"the body must be application/json or application/a2a+json, not {request.mimetype or 'unnamed'!r}",
            code=CONTENT_TYPE_NOT_SUPPORTED,
        )


def failure(exc: ControllerError) -> Response:
    """A domain error as this binding answers it (what idempotency/v1 stores for a request)."""
    return error_response(to_a2a(exc))


@a2a.get(f"{P}/tasks/<ref>")
@a2a.get(f"{P}/v1/tasks/<ref>")
async def get_task(instance_id: str, ref: str) -> Response:
    task_id, verb = split_ref(ref)
    if verb == "subscribe":
        return await subscribe(instance_id, task_id)
    if verb is not None:
        raise NotFound(METHOD_NOT_FOUND, f"no A2A operation GET :{verb[:32]}")
    form = rest03.form_of(shared=upstream_path())
    caller = await begin(instance_id, legacy_path=is_legacy_path(), enforce_extensions=False)
    params = query(service.GetTaskParams, id=task_id)
    return a2a_response(rest03.answer(caller, "task", await app_state().a2a.get_task(caller, params), form), caller)


@a2a.post(f"{P}/tasks/<ref>")
@a2a.post(f"{P}/v1/tasks/<ref>")
async def task_verb(instance_id: str, ref: str) -> Response:
    task_id, verb = split_ref(ref)
    if verb == "cancel":
        return await cancel(instance_id, task_id)
    if verb == "subscribe":
        return await subscribe(instance_id, task_id)
    raise NotFound(METHOD_NOT_FOUND, f"no A2A operation POST {request.path[:256]}")


def _sdk_verb() -> bool:
    """``/v1/tasks/{id}:cancel`` or ``:subscribe``: a2a-sdk 0.3's paths (upstream's say ``/cancel``)."""
    return upstream_path() and ":" in request.path.rsplit("/", 1)[-1]


@a2a.post(f"{P}/v1/tasks/<task_id>/cancel")
async def cancel(instance_id: str, task_id: str) -> Response:
    form = rest03.form_of(sdk=_sdk_verb())
    caller = await begin(instance_id, legacy_path=is_legacy_path())
    body: service.TaskIdParams | None = None
    if form == "json":  # a2a-sdk 0.3 sends {"name": "tasks/{id}"}: the path says which task
        body = await read_body(service.TaskIdParams, optional=True)
    if body is not None and body.id != task_id:
        raise ValidationFailed([{"field": "id", "message": "differs from the task id in the path", "code": "mismatch"}])
    params = body or service.TaskIdParams(id=task_id)
    return a2a_response(rest03.answer(caller, "task", await app_state().a2a.cancel_task(caller, params), form), caller)


@a2a.get(f"{P}/v1/tasks/<task_id>/subscribe")
@a2a.post(f"{P}/v1/tasks/<task_id>/subscribe")
async def subscribe(instance_id: str, task_id: str) -> Response:
    form = rest03.form_of(sdk=_sdk_verb())
    caller = await begin(instance_id, legacy_path=is_legacy_path(), enforce_extensions=False)
    params = service.TaskIdParams(id=task_id)
    return sse_response(caller, await app_state().a2a.subscribe_to_task(caller, params, rest03.framing(caller, form)))


@a2a.get(f"{P}/tasks/<task_id>/files/<file_id>")
async def task_file(instance_id: str, task_id: str, file_id: str) -> Response:
    """A file an agent returned (an artifact's ``url`` part points here), streamed from disk."""
    # A plain resource, fetched as any URL is: no A2A-Version needed (one that is sent is checked).
    caller = await begin(instance_id, legacy_path=True, enforce_extensions=False)
    found = await app_state().a2a.task_file(caller, task_id, file_id)

    async def body() -> AsyncIterator[bytes]:
        chunks = found.chunks
        while chunk := await trio.to_thread.run_sync(next, chunks, b""):
            yield chunk

    headers = {"Content-Length": str(found.size), "X-Content-Type-Options": "nosniff"}
    if found.filename:
        headers["Content-Disposition"] = content_disposition(found.filename)
    media_type = found.media_type if found.media_type and "/" in found.media_type else "application/octet-stream"
    return Response(body(), status=200, headers=headers, content_type=media_type)


def content_disposition(filename: str) -> str:
    """``attachment`` with the name as RFC 6266 spells it (ASCII fallback, UTF-8 form)."""
    fallback = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


@a2a.get(f"{P}/tasks")
@a2a.get(f"{P}/v1/tasks")
async def list_tasks(instance_id: str) -> Response:
    caller = await begin(instance_id, legacy_path=is_legacy_path(), enforce_extensions=False)
    page = await app_state().a2a.list_tasks(caller, query(ListQuery))
    return a2a_response(rest03.answer(caller, "tasks", page), caller)


@a2a.route(f"{P}/tasks/<task_id>/pushNotificationConfigs", methods=["GET", "POST"])
@a2a.route(f"{P}/tasks/<task_id>/pushNotificationConfigs/<config_id>", methods=["GET", "DELETE"])
@a2a.route(f"{P}/v1/tasks/<task_id>/pushNotificationConfigs", methods=["GET", "POST"])
@a2a.route(f"{P}/v1/tasks/<task_id>/pushNotificationConfigs/<config_id>", methods=["GET", "DELETE"])
async def push_configs(instance_id: str, task_id: str, config_id: str | None = None) -> Response:
    form = rest03.form_of(shared=upstream_path())
    caller = await begin(instance_id, legacy_path=is_legacy_path())
    ops = app_state().a2a
    if config_id is not None:
        ref = ConfigRef(task_id=task_id, id=config_id)
        if request.method == "DELETE":
            return a2a_response(await ops.delete_push_config(caller, ref), caller)
        return a2a_response(rest03.answer(caller, "push", await ops.get_push_config(caller, ref), form), caller)
    if request.method == "GET":
        params = query(ListParams, taskId=task_id)
        return a2a_response(rest03.answer(caller, "pushes", await ops.list_push_configs(caller, params), form), caller)
    # The task is the path's: a body need not name it (one that names another is refused).
    raw = rest03.push_config_request(caller, await read_raw(), task_id, form)
    cfg: PushConfigIn = await read_body(PushConfigIn, body=raw)
    return a2a_response(rest03.answer(caller, "push", await ops.create_push_config(caller, task_id, cfg), form), caller)


@a2a.get(f"{P}/extendedAgentCard")
@a2a.get(f"{P}/v1/extendedAgentCard")
@a2a.get(f"{P}/v1/card")
async def extended_agent_card(instance_id: str) -> Response:
    # One card for both versions: it carries 0.3's connection fields beside 1.0's (card03).
    caller = await begin(instance_id, legacy_path=is_legacy_path(), enforce_extensions=False)
    return a2a_response(await app_state().a2a.extended_agent_card(caller), caller)
