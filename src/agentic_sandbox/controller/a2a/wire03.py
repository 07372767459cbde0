"""A2A 0.3 JSON: what a 0.3 caller sends and is answered, translated from and to the 1.0 JSON the
service speaks. Only the edges call this, and only for a 0.3 caller (``Caller.wire``): a 1.0
request never pays for it.

0.3 JSON (the JSON-RPC binding's, upstream's on its ``/v1/`` paths) differs from 1.0 in shape only:

* objects say what they are in ``kind``: ``task``, ``message``, ``status-update``,
  ``artifact-update``; so do parts (``text``, ``file``, ``data``); a send answers the bare Task or
  Message (``kind`` tells which), not ``{"task": ...}``;
* states are lowercase kebab (``input-required``), roles ``user`` and ``agent``;
* a file part is ``{"kind": "file", "file": {"uri" | "bytes", "mimeType", "name"}}``; a data part
  holds an object, anything else is wrapped as ``{"value": ...}`` with ``metadata.data_part_compat``
  (a2a-sdk's compat layer's rule, so either side unwraps it);
* a status update says ``final`` when it ends the stream (a terminal or interrupted state);
* ``configuration.blocking`` (default true) is 1.0's ``returnImmediately`` negated, and
  ``pushNotificationConfig`` its ``taskPushNotificationConfig``, with ``authentication.schemes``
  (a list) for ``scheme``; a push config is ``{"taskId", "pushNotificationConfig": {...}}``;
* upstream's status carries ``fail_kind`` (read from the task's metadata, which keeps it too)
  and ``terminal_at`` (when it became terminal: the terminal status's timestamp).

Written here, not through a2a-sdk's compat layer (``a2a.compat.v0_3.conversions``): that layer
goes through protobuf, whose ``Struct`` holds every number as a double, so metadata and data parts
would lose their integers (``exit_code`` 3 comes out 3.0). The layer's own 0.3 models check this
module's output in the tests, and its protobuf form is what :mod:`.proto03` uses where a client
speaks 0.3's protobuf JSON (a2a-sdk 0.3's HTTP+JSON transport).
"""

from __future__ import annotations

from typing import Any

from ..errors import ValidationFailed

STATES = {
    "TASK_STATE_SUBMITTED": "submitted",
    "TASK_STATE_WORKING": "working",
    "TASK_STATE_COMPLETED": "completed",
    "TASK_STATE_FAILED": "failed",
    "TASK_STATE_CANCELED": "canceled",
    "TASK_STATE_INPUT_REQUIRED": "input-required",
    "TASK_STATE_REJECTED": "rejected",
    "TASK_STATE_AUTH_REQUIRED": "auth-required",
}
TERMINAL = frozenset({"completed", "failed", "canceled", "rejected"})
#: A status update in one of these states is the stream's last (``final``).
FINAL = TERMINAL | {"input-required", "auth-required"}
ROLES = {"ROLE_USER": "user", "ROLE_AGENT": "agent"}
ROLES_IN = {name: role for role, name in ROLES.items()}
#: The metadata key upstream also puts in the status (stored, and shown to a 0.3 caller, as spelled).
FAIL_KIND = "fail_kind"
_DATA_COMPAT = "data_part_compat"
_MESSAGE_KEYS = ("contextId", "taskId", "referenceTaskIds", "metadata", "extensions")


def _copy(src: dict[str, Any], out: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    for key in keys:
        if key in src:
            out[key] = src[key]
    return out


# -- 1.0 → 0.3 (answers) -------------------------------------------------------------------------


def part_out(part: dict[str, Any]) -> dict[str, Any]:
    metadata = part.get("metadata")
    out: dict[str, Any]
    if "text" in part:
        out = {"kind": "text", "text": part["text"]}
    elif "data" in part:
        data = part["data"]
        if not isinstance(data, dict):
            data, metadata = {"value": data}, {**(metadata or {}), _DATA_COMPAT: True}
        out = {"kind": "data", "data": data}
    else:
        file: dict[str, Any] = {"bytes": part["raw"]} if "raw" in part else {"uri": part.get("url", "")}
        if part.get("mediaType"):
            file["mimeType"] = part["mediaType"]
        if part.get("filename"):
            file["name"] = part["filename"]
        out = {"kind": "file", "file": file}
    if metadata is not None:
        out["metadata"] = metadata
    return out


def message_out(message: dict[str, Any]) -> dict[str, Any]:
    out = {
        "kind": "message",
        "messageId": message.get("messageId", ""),
        "role": ROLES.get(message.get("role", ""), "agent"),
        "parts": [part_out(part) for part in message.get("parts") or []],
    }
    return _copy(message, out, _MESSAGE_KEYS)


def status_out(status: dict[str, Any], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A TaskStatus, with upstream's ``fail_kind`` and ``terminal_at`` (module docstring)."""
    out: dict[str, Any] = {"state": STATES.get(status.get("state", ""), "unknown")}
    if "message" in status:
        out["message"] = message_out(status["message"])
    if "timestamp" in status:
        out["timestamp"] = status["timestamp"]
    if metadata and FAIL_KIND in metadata:
        out[FAIL_KIND] = metadata[FAIL_KIND]
    if out["state"] in TERMINAL and "timestamp" in status:
        out["terminal_at"] = status["timestamp"]
    return out


def artifact_out(artifact: dict[str, Any]) -> dict[str, Any]:
    out = {"artifactId": artifact.get("artifactId", ""), "parts": [part_out(p) for p in artifact.get("parts") or []]}
    return _copy(artifact, out, ("name", "description", "metadata", "extensions"))


def task_out(task: dict[str, Any]) -> dict[str, Any]:
    metadata = task.get("metadata")
    out: dict[str, Any] = {
        "kind": "task",
        "id": task["id"],
        "contextId": task.get("contextId", ""),
        "status": status_out(task.get("status") or {}, metadata),
    }
    if task.get("artifacts"):
        out["artifacts"] = [artifact_out(a) for a in task["artifacts"]]
    if task.get("history"):
        out["history"] = [message_out(m) for m in task["history"]]
    if metadata is not None:
        out["metadata"] = metadata
    return out


def send_out(result: dict[str, Any]) -> dict[str, Any]:
    """A SendMessageResponse (``{"task"}`` or ``{"message"}``) as 0.3's bare Task or Message."""
    return message_out(result["message"]) if "message" in result else task_out(result["task"])


def stream_out(item: dict[str, Any]) -> dict[str, Any]:
    """One StreamResponse as 0.3's stream event."""
    if "statusUpdate" in item:
        event = item["statusUpdate"]
        status = status_out(event.get("status") or {}, event.get("metadata"))
        out = {
            "kind": "status-update",
            "taskId": event.get("taskId", ""),
            "contextId": event.get("contextId", ""),
            "status": status,
            "final": status["state"] in FINAL,
        }
        return _copy(event, out, ("metadata",))
    if "artifactUpdate" in item:
        event = item["artifactUpdate"]
        out = {
            "kind": "artifact-update",
            "taskId": event.get("taskId", ""),
            "contextId": event.get("contextId", ""),
            "artifact": artifact_out(event.get("artifact") or {}),
        }
        return _copy(event, out, ("append", "lastChunk", "metadata"))
    return send_out(item)


def push_config_out(config: dict[str, Any]) -> dict[str, Any]:
    """A TaskPushNotificationConfig (1.0: flat, ``authentication.scheme``) in 0.3's form."""
    inner: dict[str, Any] = _copy(config, {}, ("id", "url", "token"))
    auth = config.get("authentication")
    if isinstance(auth, dict):
        schemes = [auth["scheme"]] if auth.get("scheme") else []
        inner["authentication"] = _copy(auth, {"schemes": schemes}, ("credentials",))
    return {"taskId": config.get("taskId", ""), "pushNotificationConfig": inner}


def tasks_page_out(page: dict[str, Any]) -> dict[str, Any]:
    """ListTasks' answer (upstream's ``/v1/tasks``): its tasks in 0.3's shape, the paging as is."""
    return {**page, "tasks": [task_out(task) for task in page["tasks"]]}


def push_configs_page_out(page: dict[str, Any]) -> dict[str, Any]:
    return {**page, "configs": [push_config_out(config) for config in page["configs"]]}


# -- 0.3 → 1.0 (requests) ------------------------------------------------------------------------


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationFailed([{"field": field, "message": "must be an object", "code": "type"}])
    return value


def part_in(part: Any, field: str) -> dict[str, Any]:
    part = _object(part, field)
    kind = part.get("kind") or next((k for k in ("text", "file", "data") if k in part), None)
    metadata = part.get("metadata")
    out: dict[str, Any]
    if kind == "text":
        out = {"text": part.get("text")}
    elif kind == "data":
        data = part.get("data")
        if isinstance(metadata, dict) and metadata.get(_DATA_COMPAT) and isinstance(data, dict) and "value" in data:
            data = data["value"]
            metadata = {k: v for k, v in metadata.items() if k != _DATA_COMPAT} or None
        out = {"data": data}
    elif kind == "file":
        file = _object(part.get("file"), f"{field}.file")
        out = {"raw": file["bytes"]} if "bytes" in file else {"url": file.get("uri")}
        if file.get("mimeType") is not None:
            out["mediaType"] = file["mimeType"]
        if file.get("name") is not None:
            out["filename"] = file["name"]
    else:
        raise ValidationFailed([{"field": f"{field}.kind", "message": "must be text, file or data", "code": "type"}])
    if metadata is not None:
        out["metadata"] = metadata
    return out


def message_in(message: Any, field: str = "message") -> dict[str, Any]:
    message = _object(message, field)
    parts = message.get("parts")
    role = message.get("role")
    out: dict[str, Any] = {
        "messageId": message.get("messageId"),
        "role": ROLES_IN.get(role, role) if isinstance(role, str) else role,
        "parts": [part_in(p, f"{field}.parts[{i}]") for i, p in enumerate(parts)] if isinstance(parts, list) else parts,
    }
    return _copy(message, out, _MESSAGE_KEYS)


def push_auth_in(auth: Any, field: str) -> dict[str, Any]:
    auth = _object(auth, field)
    schemes = auth.get("schemes")
    out: dict[str, Any] = {"scheme": schemes[0] if isinstance(schemes, list) and schemes else auth.get("scheme")}
    return _copy(auth, out, ("credentials",))


def push_config_in(config: Any, field: str = "pushNotificationConfig") -> dict[str, Any]:
    """0.3's PushNotificationConfig (``{id, url, token, authentication: {schemes}}``) as 1.0's."""
    config = _object(config, field)
    out = _copy(config, {}, ("id", "url", "token"))
    if config.get("authentication") is not None:
        out["authentication"] = push_auth_in(config["authentication"], f"{field}.authentication")
    return out


def task_push_config_in(params: Any, task_id: str | None = None) -> dict[str, Any]:
    """0.3's TaskPushNotificationConfig (``{taskId, pushNotificationConfig}``) as 1.0's flat one;
    ``task_id`` (from a path) wins over the body's."""
    params = _object(params, "$")
    out = push_config_in(params.get("pushNotificationConfig"))
    task = task_id or params.get("taskId")
    if task:
        out["taskId"] = task
    return out


def send_in(params: Any) -> dict[str, Any]:
    """0.3's MessageSendParams as 1.0's SendMessageRequest."""
    params = _object(params, "$")
    out: dict[str, Any] = {"message": message_in(params.get("message"))}
    config = params.get("configuration")
    if config is not None:
        config = _object(config, "configuration")
        conf: dict[str, Any] = _copy(config, {}, ("acceptedOutputModes",))
        if config.get("blocking") is False:
            conf["returnImmediately"] = True
        if config.get("historyLength"):  # 0.3 reads 0 as "no limit": left unset
            conf["historyLength"] = config["historyLength"]
        if config.get("pushNotificationConfig") is not None:
            push = config["pushNotificationConfig"]
            conf["taskPushNotificationConfig"] = push_config_in(push, "configuration.pushNotificationConfig")
        out["configuration"] = conf
    return _copy(params, out, ("metadata",))
