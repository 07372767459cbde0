"""The HTTP+JSON binding: the A2A v1.0 paths and the agentic-sandbox ``/v1/`` paths, one handler each.

=====================================  ============================================  ==================
operation                              A2A v1.0 path                                 agentic-sandbox
=====================================  ============================================  ==================
SendMessage                            ``POST /message:send``                        ``/v1/messages:send``
SendStreamingMessage (SSE)             ``POST /message:stream``                      ``/v1/messages:stream``
SubscribeToTask (SSE)                  ``GET|POST /tasks/{id}:subscribe``            ``/v1/tasks/{id}/subscribe``
GetTask                                ``GET /tasks/{id}``                           ``/v1/tasks/{id}``
ListTasks                              ``GET /tasks``                                ``/v1/tasks``
CancelTask                             ``POST /tasks/{id}:cancel``                   ``/v1/tasks/{id}/cancel``
push notification configs              ``/tasks/{id}/pushNotificationConfigs[/{c}]``  same under ``/v1``
=====================================  ============================================  ==================

(``{id}:cancel`` and ``{id}:subscribe`` are told apart from ``{id}`` in the handler: a task id
never holds a colon.) Request bodies must be ``application/json`` or ``application/a2a+json``.
SendMessage, CancelTask and the push operations need runtime/v1 activated (see
:mod:`controller.a2a.edge`); reads do not. Push notifications are not offered yet: every push
operation answers ``PUSH_NOTIFICATION_NOT_SUPPORTED``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Response, request

from ..decoding import decode_json, validation_failure
from ..errors import (
    CONTENT_TYPE_NOT_SUPPORTED,
    METHOD_NOT_FOUND,
    PUSH_NOT_SUPPORTED,
    UNSUPPORTED_OPERATION,
    InvalidState,
    NotFound,
    Unimplemented,
    UnsupportedMedia,
    ValidationFailed,
)
from ..http import request_body
from ..state import app_state
from ..tasks.model import CancelRequest, SendMessageRequest
from ..tasks.service import ListQuery
from . import a2a
from .edge import ACCEPTED_BODY_TYPES, Caller, a2a_response, begin, is_legacy_path
from .sse import sse_response, task_events
from .views import task_view

P = "/agents/<instance_id>"


async def read_body(type_: type[Any], *, optional: bool = False) -> Any:
    body = await request_body()
    if optional and not body.strip():
        return type_()
    if request.mimetype not in ACCEPTED_BODY_TYPES:
        raise UnsupportedMedia(
            f"the body must be application/json or application/a2a+json, not {request.mimetype or 'unnamed'!r}",
            code=CONTENT_TYPE_NOT_SUPPORTED,
        )
    return decode_json(body, type_)


def query(type_: type[Any]) -> Any:
    """Query parameters into ``type_`` (strings converted: numbers, booleans)."""
    args = {key: request.args.get(key) for key in request.args if key != "A2A-Version"}
    try:
        return msgspec.convert(args, type_, strict=False)
    except msgspec.ValidationError as exc:
        raise validation_failure(exc) from None


def history_length_arg() -> int | None:
    raw = request.args.get("historyLength")
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) > 10000:
        raise ValidationFailed([{"field": "historyLength", "message": "must be an integer 0..10000", "code": "type"}])
    return int(raw)


async def view(caller: Caller, rec: Any, **kw: Any) -> dict[str, Any]:
    return await task_view(app_state().store, rec, caller.instance, disclose_host=caller.discloses_host, **kw)


# -- SendMessage -----------------------------------------------------------------------------------


@a2a.post(f"{P}/message:send")
@a2a.post(f"{P}/v1/messages:send")
async def send_message(instance_id: str) -> Response:
    caller = await begin(instance_id, legacy_path=is_legacy_path())
    req: SendMessageRequest = await read_body(SendMessageRequest)
    tasks = app_state().tasks
    rec = await tasks.send(caller.instance, req)
    config = req.configuration
    if config is None or not config.return_immediately:
        rec = await tasks.wait_settled(rec.id)
    history = config.history_length if config is not None else None
    return a2a_response({"task": await view(caller, rec, history_length=history)}, caller)


# -- GetTask, CancelTask (and the subscribe verb until streaming exists) ---------------------------


def split_ref(ref: str) -> tuple[str, str | None]:
    task_id, sep, verb = ref.partition(":")
    return task_id, (verb if sep else None)


@a2a.get(f"{P}/tasks/<ref>")
@a2a.get(f"{P}/v1/tasks/<ref>")
async def get_task(instance_id: str, ref: str) -> Response:
    task_id, verb = split_ref(ref)
    if verb == "subscribe":
        return await subscribe(instance_id, task_id)
    if verb is not None:
        raise NotFound(METHOD_NOT_FOUND, f"no A2A operation GET :{verb[:32]}")
    caller = await begin(instance_id, legacy_path=is_legacy_path(), enforce_extensions=False)
    history = history_length_arg()
    rec = await app_state().tasks.get(caller.instance.id, task_id)
    return a2a_response(await view(caller, rec, history_length=history), caller)


@a2a.post(f"{P}/tasks/<ref>")
async def task_verb(instance_id: str, ref: str) -> Response:
    task_id, verb = split_ref(ref)
    if verb == "cancel":
        return await cancel(instance_id, task_id)
    if verb == "subscribe":
        return await subscribe(instance_id, task_id)
    raise NotFound(METHOD_NOT_FOUND, f"no A2A operation POST {request.path[:256]}")


@a2a.post(f"{P}/v1/tasks/<task_id>/cancel")
async def cancel(instance_id: str, task_id: str) -> Response:
    caller = await begin(instance_id, legacy_path=is_legacy_path())
    body: CancelRequest = await read_body(CancelRequest, optional=True)
    if body.id is not None and body.id != task_id:
        raise ValidationFailed([{"field": "id", "message": "differs from the task id in the path", "code": "mismatch"}])
    rec = await app_state().tasks.cancel(caller.instance.id, task_id)
    return a2a_response(await view(caller, rec), caller)


@a2a.get(f"{P}/v1/tasks/<task_id>/subscribe")
@a2a.post(f"{P}/v1/tasks/<task_id>/subscribe")
async def subscribe(instance_id: str, task_id: str) -> Response:
    caller = await begin(instance_id, legacy_path=is_legacy_path(), enforce_extensions=False)
    rec = await app_state().tasks.get(caller.instance.id, task_id)
    if rec.terminal:
        raise InvalidState(UNSUPPORTED_OPERATION, f"task {rec.id} is {rec.state}: there is nothing to subscribe to")
    return sse_response(caller, task_events(caller, rec.id, from_creation=False))


@a2a.post(f"{P}/message:stream")
@a2a.post(f"{P}/v1/messages:stream")
async def send_streaming_message(instance_id: str) -> Response:
    caller = await begin(instance_id, legacy_path=is_legacy_path())
    req: SendMessageRequest = await read_body(SendMessageRequest)
    rec = await app_state().tasks.send(caller.instance, req)
    # A new task streams from its creation; a follow-up from the task as it stands.
    return sse_response(caller, task_events(caller, rec.id, from_creation=req.message.task_id is None))


# -- ListTasks -------------------------------------------------------------------------------------


@a2a.get(f"{P}/tasks")
@a2a.get(f"{P}/v1/tasks")
async def list_tasks(instance_id: str) -> Response:
    caller = await begin(instance_id, legacy_path=is_legacy_path(), enforce_extensions=False)
    q: ListQuery = query(ListQuery)
    page = await app_state().tasks.list(caller.instance.id, q)
    history = 0 if q.history_length is None else q.history_length
    tasks = [
        await view(caller, rec, history_length=history, include_artifacts=q.include_artifacts) for rec in page.tasks
    ]
    body = {
        "tasks": tasks,
        "nextPageToken": page.next_page_token,
        "pageSize": page.page_size,
        "totalSize": page.total_size,
    }
    return a2a_response(body, caller)


# -- push notification configs ---------------------------------------------------------------------


@a2a.route(f"{P}/tasks/<task_id>/pushNotificationConfigs", methods=["GET", "POST"])
@a2a.route(f"{P}/tasks/<task_id>/pushNotificationConfigs/<config_id>", methods=["GET", "DELETE"])
@a2a.route(f"{P}/v1/tasks/<task_id>/pushNotificationConfigs", methods=["GET", "POST"])
@a2a.route(f"{P}/v1/tasks/<task_id>/pushNotificationConfigs/<config_id>", methods=["GET", "DELETE"])
async def push_configs(instance_id: str, task_id: str, config_id: str | None = None) -> Response:
    await begin(instance_id, legacy_path=is_legacy_path())
    raise Unimplemented(PUSH_NOT_SUPPORTED, "this agent does not send push notifications")
