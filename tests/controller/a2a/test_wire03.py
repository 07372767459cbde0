"""A2A 0.3 on the wire, in memory: the version a request speaks, the 0.3 JSON translation both
ways (checked against a2a-sdk's own 0.3 models), its protobuf JSON form (parsed as strictly as
a2a-sdk 0.3's HTTP+JSON transport parses it), 0.3's JSON-RPC error codes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb
from a2a.compat.v0_3 import types as t03
from a2a.compat.v0_3.proto_utils import ToProto
from google.protobuf.json_format import MessageToDict, ParseDict

from agentic_sandbox.controller.a2a import proto03, rpc03, wire03
from agentic_sandbox.controller.a2a.caller import WIRE_0_3, WIRE_1_0
from agentic_sandbox.controller.a2a.edge import BOTH_WIRES, check_version
from agentic_sandbox.controller.a2a.errors import to_a2a
from agentic_sandbox.controller.errors import (
    EXTENSION_REQUIRED,
    TASK_NOT_FOUND,
    VERSION_NOT_SUPPORTED,
    ControllerError,
    NotFound,
    ValidationFailed,
)
from agentic_sandbox.controller.tasks.model import SendMessageRequest

TS = "2026-01-02T03:04:05.678901Z"
TASK: dict[str, Any] = {
    "id": "t1",
    "contextId": "c1",
    "status": {
        "state": "TASK_STATE_FAILED",
        "timestamp": TS,
        "message": {"messageId": "m2", "role": "ROLE_AGENT", "parts": [{"text": "exit 3"}]},
    },
    "artifacts": [
        {
            "artifactId": "kinds",
            "name": "kinds",
            "parts": [
                {"text": "hi"},
                {"raw": "aGk=", "mediaType": "application/octet-stream", "filename": "a.bin"},
                {"url": "http://x/agents/i/tasks/t1/files/f", "mediaType": "text/plain", "metadata": {"size": 12}},
                {"data": {"n": 1, "list": [1, 2]}},
                {"data": [1, 2]},
            ],
        }
    ],
    "history": [{"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "exit 3"}], "taskId": "t1"}],
    "metadata": {"fail_kind": "application", "exit_code": 3, "runtime.kind": "host"},
}


def test_check_version_per_request() -> None:
    for raw in (None, "", "  "):
        assert check_version(raw, legacy_path=False, wires=BOTH_WIRES) == WIRE_0_3  # spec §3.6
        assert check_version(raw, legacy_path=True, wires=BOTH_WIRES) == WIRE_1_0  # the deprecated /api/v1/
    for raw in ("0.3", "0.3.0"):
        assert check_version(raw, legacy_path=False, wires=BOTH_WIRES) == WIRE_0_3
    for raw in ("1", "1.0", "1.7"):
        assert check_version(raw, legacy_path=False, wires=BOTH_WIRES) == WIRE_1_0
    for raw in ("0.2", "2.0", "99.0", "one", "1.0.1", "0.3.x"):
        with pytest.raises(ControllerError) as refused:
            check_version(raw, legacy_path=False, wires=BOTH_WIRES)
        assert refused.value.code == VERSION_NOT_SUPPORTED, raw
    # A binding that speaks 1.0 only (gRPC, the default): a missing version (0.3) is refused.
    with pytest.raises(ControllerError) as refused:
        check_version(None, legacy_path=False)
    assert refused.value.code == VERSION_NOT_SUPPORTED and "send A2A-Version: 1.0" in refused.value.message
    assert check_version("1.0", legacy_path=False) == WIRE_1_0


def test_task_in_0_3_json_keeps_every_value_and_fits_the_0_3_model() -> None:
    task = wire03.task_out(TASK)
    assert task["kind"] == "task" and task["status"]["state"] == "failed"
    # upstream's status members, and the metadata as stored (integers stay integers).
    assert task["status"]["fail_kind"] == "application" and task["status"]["terminal_at"] == TS
    assert task["metadata"] == TASK["metadata"] and isinstance(task["metadata"]["exit_code"], int)
    assert task["history"][0] == {
        "kind": "message",
        "messageId": "m1",
        "role": "user",
        "parts": [{"kind": "text", "text": "exit 3"}],
        "taskId": "t1",
    }
    parts = task["artifacts"][0]["parts"]
    assert parts[1] == {
        "kind": "file",
        "file": {"bytes": "aGk=", "mimeType": "application/octet-stream", "name": "a.bin"},
    }
    assert parts[2]["file"] == {"uri": "http://x/agents/i/tasks/t1/files/f", "mimeType": "text/plain"}
    assert parts[3] == {"kind": "data", "data": {"n": 1, "list": [1, 2]}}
    assert parts[4] == {"kind": "data", "data": {"value": [1, 2]}, "metadata": {"data_part_compat": True}}
    model = t03.Task.model_validate(task)
    assert model.status.state == t03.TaskState.failed and model.history and model.history[0].role == t03.Role.user
    working = wire03.task_out({**TASK, "status": {"state": "TASK_STATE_WORKING", "timestamp": TS}, "metadata": {}})
    assert "terminal_at" not in working["status"] and "fail_kind" not in working["status"]


def test_stream_events_say_final_when_the_stream_ends() -> None:
    def update(state: str) -> dict[str, Any]:
        return {"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": state, "timestamp": TS}}}

    for state, final in [
        ("TASK_STATE_WORKING", False),
        ("TASK_STATE_COMPLETED", True),
        ("TASK_STATE_INPUT_REQUIRED", True),
        ("TASK_STATE_AUTH_REQUIRED", True),
        ("TASK_STATE_CANCELED", True),
    ]:
        event = wire03.stream_out(update(state))
        assert event["kind"] == "status-update" and event["final"] is final, state
        t03.TaskStatusUpdateEvent.model_validate(event)
    artifact = {"artifactUpdate": {"taskId": "t", "contextId": "c", "artifact": TASK["artifacts"][0], "append": True}}
    event = wire03.stream_out(artifact)
    assert event["kind"] == "artifact-update" and event["append"] is True
    t03.TaskArtifactUpdateEvent.model_validate(event)
    assert wire03.stream_out({"task": TASK})["kind"] == "task"
    message = {"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "hi"}]}}
    assert wire03.send_out(message) == {
        "kind": "message",
        "messageId": "m",
        "role": "agent",
        "parts": [{"kind": "text", "text": "hi"}],
    }


def test_a_0_3_send_becomes_the_1_0_request() -> None:
    params = {
        "message": {
            "kind": "message",
            "messageId": "m1",
            "role": "user",
            "parts": [
                {"kind": "text", "text": "hi", "metadata": {"k": 1}},
                {"kind": "file", "file": {"bytes": "aGk=", "mimeType": "text/plain", "name": "a.txt"}},
                {"kind": "file", "file": {"uri": "https://example.com/f"}},
                {"kind": "data", "data": {"value": 7}, "metadata": {"data_part_compat": True}},
                {"kind": "data", "data": {"answer": 42}},
            ],
            "taskId": "t1",
        },
        "configuration": {
            "blocking": False,
            "historyLength": 0,
            "acceptedOutputModes": ["text/plain"],
            "pushNotificationConfig": {"url": "https://h.example/x", "authentication": {"schemes": ["Bearer"]}},
        },
        "metadata": {"app": True},
    }
    out = wire03.send_in(params)
    req = msgspec.convert(out, SendMessageRequest)
    assert req.message.role == "ROLE_USER" and req.message.task_id == "t1"
    texts = [msgspec.to_builtins(p) for p in req.message.parts]
    assert texts == [
        {"text": "hi", "metadata": {"k": 1}},
        {"raw": "aGk=", "filename": "a.txt", "mediaType": "text/plain"},
        {"url": "https://example.com/f"},
        {"data": 7},
        {"data": {"answer": 42}},
    ]
    config = req.configuration
    assert config is not None and config.return_immediately is True and config.history_length is None
    assert config.task_push_notification_config == {
        "url": "https://h.example/x",
        "authentication": {"scheme": "Bearer"},
    }
    assert req.metadata == {"app": True}
    blocking = msgspec.convert(wire03.send_in({"message": params["message"]}), SendMessageRequest)
    assert blocking.configuration is None  # 0.3's default is blocking, as 1.0's
    for bad in ({"message": "x"}, {"message": {"parts": [{"kind": "image"}]}}, []):
        with pytest.raises(ValidationFailed):
            wire03.send_in(bad)


def test_push_configs_both_ways() -> None:
    config = {
        "id": "p1",
        "taskId": "t1",
        "url": "https://h.example/x",
        "token": "tok",
        "authentication": {"scheme": "Bearer"},
    }
    out = wire03.push_config_out(config)
    assert out == {
        "taskId": "t1",
        "pushNotificationConfig": {
            "id": "p1",
            "url": "https://h.example/x",
            "token": "tok",
            "authentication": {"schemes": ["Bearer"]},
        },
    }
    t03.TaskPushNotificationConfig.model_validate(out)
    back = wire03.task_push_config_in(out | {"taskId": "ignored"}, "t1")
    assert back == {
        "id": "p1",
        "url": "https://h.example/x",
        "token": "tok",
        "authentication": {"scheme": "Bearer"},
        "taskId": "t1",
    }


def strict(message: Any, obj: dict[str, Any]) -> Any:
    """Parsed as a2a-sdk 0.3's HTTP+JSON transport parses an answer: unknown fields refused."""
    return ParseDict(obj, message)


def test_protobuf_json_form_parses_strictly() -> None:
    task = proto03.task_out(TASK)
    parsed = strict(pb.Task(), task)
    assert parsed.status.state == pb.TASK_STATE_FAILED and parsed.history[0].role == pb.ROLE_USER
    assert parsed.history[0].content[0].text == "exit 3"
    assert parsed.artifacts[0].parts[2].file.file_with_uri.endswith("/files/f")
    assert "fail_kind" not in task["status"] and task["metadata"]["fail_kind"] == "application"
    sent = strict(pb.SendMessageResponse(), proto03.send_out({"task": TASK}))
    assert sent.task.id == "t1"
    answered = strict(pb.SendMessageResponse(), proto03.send_out({"message": TASK["history"][0]}))
    assert answered.msg.message_id == "m1"
    done = {"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED"}}}
    event = strict(pb.StreamResponse(), proto03.stream_out(done))
    assert event.status_update.final is True and event.status_update.status.state == pb.TASK_STATE_INPUT_REQUIRED
    config = {"id": "p1", "taskId": "t1", "url": "https://h.example/x"}
    made = strict(pb.TaskPushNotificationConfig(), proto03.push_config_out(config))
    assert made.name == "tasks/t1/pushNotificationConfigs/p1" and made.push_notification_config.url == config["url"]
    listed = strict(pb.ListTaskPushNotificationConfigResponse(), proto03.push_configs_page_out({"configs": [config]}))
    assert [c.name for c in listed.configs] == ["tasks/t1/pushNotificationConfigs/p1"]


def test_protobuf_json_requests_as_a2a_sdk_0_3_sends_them() -> None:
    message = t03.Message(
        message_id="m1", role=t03.Role.user, parts=[t03.Part(root=t03.TextPart(text="hi"))], context_id="c1"
    )
    params = t03.MessageSendParams(message=message, configuration=t03.MessageSendConfiguration(blocking=True))
    body = MessageToDict(
        pb.SendMessageRequest(
            request=ToProto.message(params.message),
            configuration=ToProto.message_send_configuration(params.configuration),
        )
    )
    req = msgspec.convert(proto03.send_in(msgspec.json.encode(body)), SendMessageRequest)
    assert req.message.context_id == "c1" and req.message.role == "ROLE_USER" and req.message.task_id is None
    assert req.configuration is not None and req.configuration.return_immediately is False
    config = t03.PushNotificationConfig(id="p1", url="https://h.example/x")
    create = pb.CreateTaskPushNotificationConfigRequest(
        parent="tasks/t1",
        config_id="p1",
        config=ToProto.task_push_notification_config(
            t03.TaskPushNotificationConfig(task_id="t1", push_notification_config=config)
        ),
    )
    pushed = proto03.push_config_in(msgspec.json.encode(MessageToDict(create)), "t1")
    assert pushed == {"id": "p1", "url": "https://h.example/x", "taskId": "t1"}


def test_0_3_json_rpc_error_codes() -> None:
    missing = to_a2a(NotFound(TASK_NOT_FOUND, "no task"))
    assert rpc03.code_of(missing) == -32001
    required = to_a2a(ValidationFailed([], "runtime/v1 is required", code=EXTENSION_REQUIRED))
    assert required.kind.jsonrpc == -32008 and rpc03.code_of(required) == -32600  # not 0.3's
    body = rpc03.error_body(7, required)
    assert body["id"] == 7 and body["error"]["data"][0]["reason"] == "EXTENSION_SUPPORT_REQUIRED"
    assert rpc03.code_of(to_a2a(ValidationFailed([], "v", code=VERSION_NOT_SUPPORTED))) == -32600
    t03.JSONRPCErrorResponse.model_validate(body)
