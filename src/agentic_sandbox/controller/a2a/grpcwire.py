"""What the gRPC binding puts on the wire: a2a.proto messages for the A2A v1.0 JSON the service
speaks, and errors as ``google.rpc.Status``.

Messages convert by ProtoJSON (``google.protobuf.json_format``), both ways. A request becomes the
JSON a client of the other bindings would send (camelCase, enums by name, unset fields absent), so
the same typed parameters read it, with the same errors. A result becomes the message its JSON
spells; a key the message has no field for is dropped (a2a.proto cannot carry it). The service's
JSON is a2a.proto's, so none is expected but the AgentCard's A2A 0.3 fields, there for 0.3 clients
(its signatures cover the proto's form too); the tests convert the rest strictly.

An error is its A2A error body (:meth:`A2AError.body`) as a ``google.rpc.Status``: the gRPC code of
the v1.0.1 table (``Kind.status``), the message, and the details packed as ``Any``: ErrorInfo,
BadRequest and RetryInfo (a full limit worth retrying) as themselves, any other detail
(hitl-prompt/v1's validation errors) as a ``google.protobuf.Struct`` of its JSON, ``@type``
included. The status travels serialized in the
``grpc-status-details-bin`` trailer, where a2a-sdk's client finds the ErrorInfo reason its typed
errors are chosen by; its code and message are the call's own.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
import msgspec
from a2a.types import a2a_pb2
from google.protobuf import any_pb2, json_format, struct_pb2
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2

from ..errors import MalformedInput
from .errors import BAD_REQUEST, ERROR_INFO, RETRY_INFO, A2AError, internal_error
from .streams import Framing

STATUS_DETAILS_KEY = "grpc-status-details-bin"
#: Details packed as their own message type; any other is packed as a Struct.
DETAIL_TYPES: dict[str, type[Message]] = {
    ERROR_INFO: error_details_pb2.ErrorInfo,
    BAD_REQUEST: error_details_pb2.BadRequest,
    RETRY_INFO: error_details_pb2.RetryInfo,
}


class RpcFailed(Exception):
    """A call that ends with ``status`` (made on the trio side, answered by the gRPC thread)."""

    def __init__(self, status: status_pb2.Status) -> None:
        super().__init__(status.message)
        self.status = status


def request_json(type_: type[Message], raw: bytes) -> dict[str, Any]:
    """The request's A2A JSON; MalformedInput when ``raw`` is not a ``type_`` message."""
    try:
        message = type_.FromString(raw)
    except DecodeError:
        raise MalformedInput(f"the request is not a serialized {type_.DESCRIPTOR.full_name}") from None
    params: dict[str, Any] = json_format.MessageToDict(message)
    return params


def message_bytes(type_: type[Message], obj: dict[str, Any]) -> bytes:
    """``obj`` (A2A JSON) as a serialized ``type_``."""
    message = json_format.ParseDict(obj, type_(), ignore_unknown_fields=True)
    data: bytes = message.SerializeToString()
    return data


def rpc_status(body: dict[str, Any]) -> status_pb2.Status:
    """The ``google.rpc.Status`` of an A2A error body (``{"error": {...}}``, fresh or as stored by
    idempotency/v1 for a replay)."""
    error = body["error"]
    status = status_pb2.Status(code=grpc.StatusCode[error["status"]].value[0], message=error["message"])
    for detail in error.get("details") or []:
        kind = DETAIL_TYPES.get(detail.get("@type"))
        packed = any_pb2.Any()
        if kind is not None:
            fields = {key: value for key, value in detail.items() if key != "@type"}
            packed.Pack(json_format.ParseDict(fields, kind(), ignore_unknown_fields=True))
        else:
            packed.Pack(json_format.ParseDict(detail, struct_pb2.Struct()))
        status.details.append(packed)
    return status


def failure(error: A2AError) -> RpcFailed:
    return RpcFailed(rpc_status(error.body()))


def stored_failure(body: bytes) -> RpcFailed:
    """An error answer idempotency/v1 stored (the HTTP+JSON error body)."""
    try:
        return RpcFailed(rpc_status(msgspec.json.decode(body)))
    except (msgspec.DecodeError, json_format.ParseError, AttributeError, KeyError, TypeError, ValueError):
        return failure(internal_error())  # not an error body (it is ours: this is not expected)


def abort(context: grpc.ServicerContext, status: status_pb2.Status) -> NoReturn:
    """End the call with ``status`` (raises, as ``context.abort`` does)."""
    context.set_trailing_metadata(((STATUS_DETAILS_KEY, status.SerializeToString()),))
    code = next(code for code in grpc.StatusCode if code.value[0] == status.code)
    context.abort(code, status.message)


class GrpcFraming(Framing):
    """A task stream's items as serialized ``StreamResponse`` messages. A failure ends the call
    with its status (raised out of the stream); idle time writes nothing (HTTP/2 keeps the
    connection alive, and a client that leaves cancels its call)."""

    form = "grpc"
    joins = False  # each item is one message

    def payload(self, obj: dict[str, Any]) -> bytes:
        return message_bytes(a2a_pb2.StreamResponse, obj)

    def wrap(self, payload: bytes) -> bytes:
        return payload

    def error(self, error: A2AError) -> bytes:
        raise failure(error)

    def keepalive(self) -> bytes:
        return b""
