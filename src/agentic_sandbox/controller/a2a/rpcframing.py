"""JSON-RPC 2.0 as both A2A versions frame it: the request envelope, responses (always
``Content-Type: application/json``, spec §9), errors, and the SSE items of a stream (each a
JSON-RPC response with the request's id)."""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Response

from ..decoding import validation_failure
from .caller import Caller
from .edge import JSON, echo_extensions
from .errors import A2AError
from .streams import Framing

JsonId = str | int | None
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


def rpc_response(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None, caller: Caller | None = None
) -> Response:
    response = Response(msgspec.json.encode(body), status=status, content_type=JSON)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    if caller is not None:
        echo_extensions(response, caller)
    return response


def rpc_result(call_id: JsonId, result: Any, caller: Caller) -> Response:
    return rpc_response({"jsonrpc": "2.0", "id": call_id, "result": result}, caller=caller)


class RpcFraming(Framing):
    """Each item a JSON-RPC response of the request's id around the shared payload: the same
    bytes as encoding ``{"jsonrpc": "2.0", "id": <id>, "result": <obj>}``, made by concatenation
    (no JSON work per stream)."""

    def __init__(self, call_id: JsonId) -> None:
        self.call_id = call_id
        self._head = b'data: {"jsonrpc":"2.0","id":' + msgspec.json.encode(call_id) + b',"result":'

    def wrap(self, payload: bytes) -> bytes:
        return self._head + payload + b"}\n\n"

    def error(self, error: A2AError) -> bytes:
        return b"event: error\ndata: " + msgspec.json.encode(rpc_error(self.call_id, error)) + b"\n\n"


def params_of(envelope: Envelope, type_: type[Any], params: Any = None) -> Any:
    """The request's params (or ``params``, translated from them) as ``type_``."""
    try:
        return msgspec.convert(envelope.params if params is None else params, type_)
    except msgspec.ValidationError as exc:
        raise validation_failure(exc) from None
