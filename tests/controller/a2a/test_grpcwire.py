"""What the gRPC binding puts on the wire, in memory: requests read as the A2A JSON the other
bindings take, results written as a2a.proto messages (keys it has no field for dropped), error bodies
as ``google.rpc.Status`` (ErrorInfo and BadRequest as themselves, any other detail as a Struct), a
stored error body read back, and a status sent by a real grpcio server where a2a-sdk finds it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import msgspec
import pytest
from a2a.types import a2a_pb2
from a2a.utils.grpc_status import status_from_call
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2, status_pb2

from agentic_sandbox.controller.a2a.errors import (
    ERROR_INFO,
    HITL_VALIDATION_ERRORS,
    A2AError,
    internal_error,
    to_a2a,
)
from agentic_sandbox.controller.a2a.grpcwire import (
    STATUS_DETAILS_KEY,
    GrpcFraming,
    RpcFailed,
    abort,
    failure,
    message_bytes,
    request_json,
    rpc_status,
    stored_failure,
)
from agentic_sandbox.controller.errors import (
    HITL_RESPONSE_INVALID,
    TASK_NOT_FOUND,
    LimitReached,
    MalformedInput,
    NotFound,
    ValidationFailed,
)

SEND: dict[str, Any] = {
    "tenant": "i-1",
    "message": {
        "messageId": "m-1",
        "contextId": "c-1",
        "role": "ROLE_USER",
        "parts": [{"text": "echo hi"}, {"data": {"k": [1, "two"]}, "mediaType": "application/json"}],
        "metadata": {"n": 1.5},
    },
    "configuration": {"acceptedOutputModes": ["text/plain"], "returnImmediately": True},
}
STATUS_UPDATE: dict[str, Any] = {
    "statusUpdate": {
        "taskId": "t-1",
        "contextId": "c-1",
        "status": {"state": "TASK_STATE_WORKING", "timestamp": "2026-01-02T03:04:05.678901Z"},
    }
}


def unpacked(status: status_pb2.Status) -> list[Any]:
    """The status's details as their own messages (Struct for any other)."""
    out: list[Any] = []
    for packed in status.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, struct_pb2.Struct):
            message = kind()
            if packed.Is(message.DESCRIPTOR):
                assert packed.Unpack(message)
                out.append(message)
                break
        else:
            raise AssertionError(f"unexpected detail {packed.type_url}")
    return out


# -- requests and results -------------------------------------------------------------------------


def test_a_request_reads_as_the_other_bindings_json() -> None:
    raw = json_format.ParseDict(SEND, a2a_pb2.SendMessageRequest()).SerializeToString()
    params = request_json(a2a_pb2.SendMessageRequest, raw)
    assert params == SEND  # camelCase, enums by name, unset fields absent
    assert request_json(a2a_pb2.GetTaskRequest, b"") == {}  # an empty message is all defaults


@pytest.mark.parametrize("raw", [b"\xff\xff\xff\xff", b"\x0a\x05ab", b"\x08"], ids=["garbage", "short", "truncated"])
def test_bytes_that_are_not_the_message_are_malformed_input(raw: bytes) -> None:
    with pytest.raises(MalformedInput) as caught:
        request_json(a2a_pb2.SendMessageRequest, raw)
    assert caught.value.message == "the request is not a serialized lf.a2a.v1.SendMessageRequest"
    assert to_a2a(caught.value).kind.status == "INVALID_ARGUMENT"


def test_results_round_trip_through_their_messages() -> None:
    data = message_bytes(a2a_pb2.SendMessageRequest, SEND)
    assert a2a_pb2.SendMessageRequest.FromString(data).message.role == a2a_pb2.Role.ROLE_USER
    assert request_json(a2a_pb2.SendMessageRequest, data) == SEND
    frame = message_bytes(a2a_pb2.StreamResponse, STATUS_UPDATE)
    parsed = a2a_pb2.StreamResponse.FromString(frame)
    assert parsed.WhichOneof("payload") == "status_update"
    assert parsed.status_update.status.state == a2a_pb2.TaskState.TASK_STATE_WORKING
    assert request_json(a2a_pb2.StreamResponse, frame) == STATUS_UPDATE
    assert GrpcFraming().data(STATUS_UPDATE) == frame


def test_keys_the_message_has_no_field_for_are_dropped() -> None:
    task = {
        "id": "t-1",
        "contextId": "c-1",
        "status": {"state": "TASK_STATE_COMPLETED", "notInProto": 1},
        "kind": "task",  # A2A 0.3's discriminator
        "extra": {"deep": [1, 2]},
    }
    data = message_bytes(a2a_pb2.SendMessageResponse, {"task": task})
    back = request_json(a2a_pb2.SendMessageResponse, data)
    assert back == {"task": {"id": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_COMPLETED"}}}
    # A value of the wrong type is no unknown key: it is refused, not dropped.
    with pytest.raises(json_format.ParseError):
        message_bytes(a2a_pb2.Task, {"id": 5, "status": {"state": "NOT_A_STATE"}})


# -- errors as google.rpc.Status ------------------------------------------------------------------


def test_status_carries_error_info_and_bad_request() -> None:
    body = {
        "error": {
            "code": 400,
            "status": "INVALID_ARGUMENT",
            "message": "bad",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "INVALID_PARAMS", "domain": "d"},
                {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [{"field": "a"}]},
                {"@type": "https://example.org/Other", "n": [1]},
            ],
        }
    }
    status = rpc_status(body)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and status.message == "bad"
    info, bad, other = status.details
    unpacked_info = error_details_pb2.ErrorInfo()
    assert info.Unpack(unpacked_info) and unpacked_info.reason == "INVALID_PARAMS"
    violations = error_details_pb2.BadRequest()
    assert bad.Unpack(violations) and violations.field_violations[0].field == "a"
    assert other.type_url.endswith("google.protobuf.Struct")


def test_a_limit_worth_waiting_for_carries_retry_info() -> None:
    status = rpc_status(to_a2a(LimitReached("limit.execs", "full", retry_after_s=5)).body())
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info) and info.metadata["code"] == "limit.execs"
    assert status.details[1].Unpack(retry) and retry.retry_delay.seconds == 5


def test_any_other_detail_is_a_struct_with_its_type() -> None:
    fields = [{"field": "answers.name", "message": "is required", "code": "required"}]
    error = to_a2a(ValidationFailed(fields, code=HITL_RESPONSE_INVALID, details={"prompt_id": "p-1"}))
    status = rpc_status(error.body())
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    info, bad, other = unpacked(status)
    assert info.reason == "HITL_RESPONSE_INVALID" and info.domain == "a2a-protocol.org"
    assert dict(info.metadata) == {"code": HITL_RESPONSE_INVALID, "prompt_id": "p-1"}
    assert [(v.field, v.description) for v in bad.field_violations] == [("answers.name", "is required")]
    assert isinstance(other, struct_pb2.Struct)
    assert json_format.MessageToDict(other) == {
        "@type": HITL_VALIDATION_ERRORS,
        "prompt_id": "p-1",
        "validation_errors": [{"path": "answers.name", "keyword": "required", "message": "is required"}],
    }


def test_every_status_name_maps_to_its_code() -> None:
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        status = rpc_status({"error": {"status": code.name, "message": code.name.lower()}})
        assert (status.code, status.message, list(status.details)) == (code.value[0], code.name.lower(), [])


def test_a_stored_error_body_reads_back_as_its_status() -> None:
    error = to_a2a(NotFound(TASK_NOT_FOUND, "task t-1 not found"))
    got = stored_failure(msgspec.json.encode(error.body()))
    assert isinstance(got, RpcFailed) and str(got) == "task t-1 not found"
    assert got.status == rpc_status(error.body()) == failure(error).status
    assert got.status.code == grpc.StatusCode.NOT_FOUND.value[0]
    [info] = unpacked(got.status)
    assert info.reason == "TASK_NOT_FOUND"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"detail": "a problem+json body"}',
        b'{"error": {}}',
        b'{"error": {"status": "NO_SUCH_STATUS", "message": "x"}}',
        b'{"error": "text"}',
        b'{"error": {"status": "NOT_FOUND", "message": 5}}',
        b'{"error": {"status": "NOT_FOUND", "message": "x", "details": [5]}}',
        msgspec.json.encode(
            {"error": {"status": "NOT_FOUND", "message": "x", "details": [{"@type": ERROR_INFO, "reason": 5}]}}
        ),
    ],
    ids=["not-json", "list", "problem", "empty", "unknown-status", "string", "bad-message", "bad-detail", "bad-info"],
)
def test_a_stored_body_that_is_no_error_body_is_internal(body: bytes) -> None:
    got = stored_failure(body)
    assert got.status == failure(internal_error()).status
    assert got.status.code == grpc.StatusCode.INTERNAL.value[0]
    assert "Traceback" not in got.status.message


def test_the_framing_raises_a_streams_failure() -> None:
    framing = GrpcFraming()
    error = to_a2a(NotFound(TASK_NOT_FOUND, "gone"))
    with pytest.raises(RpcFailed) as caught:
        framing.error(error)
    assert caught.value.status == rpc_status(error.body())
    assert framing.keepalive() == b""  # nothing is written for an idle stream


# -- abort, through a real grpcio server ------------------------------------------------------------


@pytest.fixture
def aborting_server() -> Iterator[str]:
    """A grpcio server whose ``/t.T/Fail`` aborts with the status the request names (an error of
    grpcwire's own making), and whose ``/t.T/Ok`` answers; its target."""

    errors: dict[bytes, A2AError] = {
        b"not-found": to_a2a(NotFound(TASK_NOT_FOUND, "task x not found")),
        b"invalid": to_a2a(ValidationFailed([{"field": "message", "message": "is required", "code": "required"}])),
        b"internal": internal_error(),
    }

    def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
        abort(context, failure(errors[request]).status)

    handler = grpc.method_handlers_generic_handler(
        "t.T",
        {
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
            "Ok": grpc.unary_unary_rpc_method_handler(lambda request, _context: request),
        },
    )
    with ThreadPoolExecutor(max_workers=2) as executor:
        server = grpc.server(executor, handlers=[handler])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield f"127.0.0.1:{port}"
        finally:
            server.stop(None).wait()


def test_abort_sends_the_status_where_a2a_sdk_finds_it(aborting_server: str) -> None:
    with grpc.insecure_channel(aborting_server) as channel:
        call = channel.unary_unary("/t.T/Fail")
        seen: dict[bytes, tuple[grpc.StatusCode, str, status_pb2.Status | None, bytes | None]] = {}
        for name in (b"not-found", b"invalid", b"internal"):
            with pytest.raises(grpc.RpcError) as caught:
                call(name, timeout=10)
            exc: Any = caught.value
            trailer = dict(exc.trailing_metadata() or ()).get(STATUS_DETAILS_KEY)
            seen[name] = (exc.code(), exc.details(), status_from_call(exc), trailer)
        assert channel.unary_unary("/t.T/Ok")(b"still serving", timeout=10) == b"still serving"
    for name, code, reason in (
        (b"not-found", grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND"),
        (b"invalid", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMS"),
        (b"internal", grpc.StatusCode.INTERNAL, "INTERNAL_ERROR"),
    ):
        got_code, details, status, trailer = seen[name]
        assert got_code == code
        # a2a-sdk's parser checks the trailer's code and message against the call's own.
        assert status is not None and status.code == code.value[0] and status.message == details
        assert trailer is not None and status_pb2.Status.FromString(trailer) == status
        assert unpacked(status)[0].reason == reason
    _code, message, invalid, _trailer = seen[b"invalid"]
    assert message == "message: is required" and invalid is not None
    assert [v.field for v in unpacked(invalid)[1].field_violations] == ["message"]
