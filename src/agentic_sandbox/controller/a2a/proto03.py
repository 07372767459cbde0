"""A2A 0.3's protobuf JSON: what a2a-sdk 0.3's HTTP+JSON transport sends and reads (its
``/v1/message:send``, ``/v1/tasks/{id}:cancel`` ... paths; a2a-sdk 1.3's own 0.3 server answers
the same). It parses every answer into the 0.3 protobuf messages, strictly, so an answer must be
exactly that form: ``TASK_STATE_WORKING``, ``ROLE_AGENT``, a message's ``content``, a part's
``{"file": {"fileWithUri"}}``, no ``kind``, nothing protobuf does not know (no ``fail_kind`` in a
status: the task's metadata has it).

Built on :mod:`.wire03` (1.0 JSON ↔ 0.3 JSON) and a2a-sdk's compat layer for the rest
(``a2a.compat.v0_3``: its 0.3 models, and ``proto_utils`` between them and the 0.3 protobuf).
"""

from __future__ import annotations

from typing import Any

import pydantic
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb
from a2a.compat.v0_3 import types as t03
from a2a.compat.v0_3.proto_utils import FromProto, ToProto
from google.protobuf.json_format import MessageToDict, Parse, ParseError

from ..errors import InternalError, MalformedInput, ValidationFailed
from . import wire03

_STREAM_ITEM: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(
    t03.Task | t03.Message | t03.TaskStatusUpdateEvent | t03.TaskArtifactUpdateEvent
)


def _model(type_: Any, obj: dict[str, Any]) -> Any:
    """Our own 0.3 JSON as a2a-sdk's 0.3 model (failing is our bug, not the caller's)."""
    try:
        return type_.model_validate(obj) if hasattr(type_, "model_validate") else type_.validate_python(obj)
    except pydantic.ValidationError as exc:
        raise InternalError("internal.error", f"a 0.3 answer does not fit its model: {exc}") from None


def _dict(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = MessageToDict(message)
    return out


def task_out(task: dict[str, Any]) -> dict[str, Any]:
    return _dict(ToProto.task(_model(t03.Task, wire03.task_out(task))))


def send_out(result: dict[str, Any]) -> dict[str, Any]:
    """``{"task": ...}`` or ``{"message": ...}``, as SendMessageResponse."""
    return _dict(ToProto.task_or_message(_model(_STREAM_ITEM, wire03.send_out(result))))


def stream_out(item: dict[str, Any]) -> dict[str, Any]:
    event = _model(_STREAM_ITEM, wire03.stream_out(item))
    return _dict(ToProto.stream_response(event))


def push_config_out(config: dict[str, Any]) -> dict[str, Any]:
    model = _model(t03.TaskPushNotificationConfig, wire03.push_config_out(config))
    return _dict(ToProto.task_push_notification_config(model))


def push_configs_page_out(page: dict[str, Any]) -> dict[str, Any]:
    configs = [_model(t03.TaskPushNotificationConfig, wire03.push_config_out(c)) for c in page["configs"]]
    listed = pb.ListTaskPushNotificationConfigResponse(
        configs=[ToProto.task_push_notification_config(c) for c in configs],
        next_page_token=page.get("nextPageToken") or "",
    )
    return _dict(listed)


def _parse(body: bytes, message: Any) -> Any:
    try:
        return Parse(body or b"{}", message, ignore_unknown_fields=True)
    except ParseError as exc:
        raise MalformedInput(f"not 0.3 protobuf JSON: {str(exc)[:512]}") from None


def _json(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


def _unset_empty(obj: dict[str, Any]) -> dict[str, Any]:
    """Protobuf's empty strings (its "unset") left out, nested objects too."""
    return {k: _unset_empty(v) if isinstance(v, dict) else v for k, v in obj.items() if v != ""}


def send_in(body: bytes) -> dict[str, Any]:
    """A2A 0.3's protobuf SendMessageRequest as 1.0's SendMessageRequest JSON."""
    request = _parse(body, pb.SendMessageRequest())
    if not request.HasField("request"):
        raise ValidationFailed([{"field": "message", "message": "is required", "code": "required"}])
    return wire03.send_in(_json(FromProto.message_send_params(request)))


def push_config_in(body: bytes, task_id: str) -> dict[str, Any]:
    """CreateTaskPushNotificationConfigRequest (``{parent, configId, config}``) as 1.0's config
    for the task the path names."""
    request = _parse(body, pb.CreateTaskPushNotificationConfigRequest())
    config = _json(FromProto.push_notification_config(request.config.push_notification_config))
    out = wire03.push_config_in(_unset_empty(config))
    if request.config_id and not out.get("id"):
        out["id"] = request.config_id
    out["taskId"] = task_id
    return out
