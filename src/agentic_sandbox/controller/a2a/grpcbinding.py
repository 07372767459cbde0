"""The A2A v1.0 gRPC binding: a2a.proto's ``lf.a2a.v1.A2AService``, every method, served by the same
operations as the other two bindings (:mod:`controller.a2a.service`).

One gRPC server (``AIWG_GRPC_LISTEN``) serves every instance. A request names its instance in its
``tenant`` field: the card's GRPC interface carries the instance id as its ``tenant``, and a2a-sdk's
client copies that into every request. Metadata are the other bindings' headers, lowercase:
``authorization`` (the bearer token), ``a2a-version`` (1.x, required), ``a2a-extensions``
(repeatable, comma-separated); the edge (:func:`controller.a2a.edge.open_caller`) checks them in
the same order, and the activated extensions come back in the response's initial metadata
``a2a-extensions``. runtime/v1 is required for the same methods as on JSON-RPC (sends, cancel,
push configs). SendMessage and SendStreamingMessage with idempotency/v1 active go through
:mod:`controller.a2a.idempotency` (scopes ``grpc`` and ``grpc:stream``); a replay says
``idempotent-replayed: true`` in its initial metadata.

Each call has two halves (:mod:`controller.a2a.grpcbridge`). On its gRPC thread, the request is
parsed and its metadata read, and the answer is serialized and written. On the trio loop, in the
app's context, the edge and the operation run, as a task of the bridge's nursery.

Errors: a domain error is translated once (:func:`controller.a2a.errors.to_a2a`) and answered as
``google.rpc.Status`` (:mod:`controller.a2a.grpcwire`). A request that is not the method's message
or names no instance is INVALID_ARGUMENT; an unexpected fault is INTERNAL (and logged); a call the
stopping controller cut short is UNAVAILABLE. grpcio itself answers an unknown method
(UNIMPLEMENTED), a message over ``AIWG_MAX_REQUEST_BYTES`` and a call beyond
``AIWG_GRPC_MAX_CALLS`` (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import grpc
import msgspec
import trio
from a2a.types import a2a_pb2
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from google.protobuf import empty_pb2
from google.protobuf.message import Message
from quart import Response
from quart_trio import QuartTrio

from agentic_sandbox.proto import bind_log_ids

from ..auth.mtls import CLIENT_CERT, ClientCertificate
from ..config import ControllerConfig
from ..decoding import validation_failure
from ..errors import ControllerError, ValidationFailed
from ..push.configs import ConfigRef, ListParams, PushConfigIn
from ..state import app_state, state_of
from ..tasks.model import SendMessageRequest
from ..tasks.service import ListQuery
from . import idempotency, service
from .blueprint import error_response
from .caller import Caller
from .edge import a2a_response, open_caller, principal_of, split_extensions
from .errors import internal_error, to_a2a
from .grpcbridge import Emit, Interrupted, ThreadBridge, serve
from .grpcwire import GrpcFraming, RpcFailed, abort, failure, message_bytes, request_json, stored_failure

log = logging.getLogger(__name__)

SERVICE = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"].full_name
EXTENSIONS_KEY = "a2a-extensions"
REPLAYED_KEY = "idempotent-replayed"
Metadata = tuple[tuple[str, str], ...]


# -- the operations, on the trio loop ------------------------------------------------------------------


def params_of(params: dict[str, Any], type_: type[Any]) -> Any:
    try:
        return msgspec.convert(params, type_)
    except msgspec.ValidationError as exc:
        raise validation_failure(exc) from None


def failure_response(exc: ControllerError) -> Response:
    """A domain error as idempotency/v1 stores it for this binding (the A2A error body)."""
    return error_response(to_a2a(exc))


async def send_message(caller: Caller, params: dict[str, Any]) -> Any:
    req = params_of(params, SendMessageRequest)
    ops = app_state().a2a
    if not idempotency.is_active(caller):
        return await ops.send_message(caller, req)

    async def run() -> Response:
        return a2a_response(await ops.send_message(caller, req), caller)

    return await idempotency.guarded(caller, "grpc", params, run, failure_response)


async def send_streaming_message(caller: Caller, params: dict[str, Any]) -> Any:
    req = params_of(params, SendMessageRequest)
    ops = app_state().a2a
    if not idempotency.is_active(caller):
        _stream, frames = await ops.send_streaming_message(caller, req, GrpcFraming())
        return frames
    return await idempotency.guarded_stream(
        caller,
        "grpc:stream",
        params,
        lambda: ops.send_streaming_message(caller, req, GrpcFraming()),
        lambda stream: ops.attach_stream(caller, stream, GrpcFraming()),
        failure_response,
    )


async def create_push_config(caller: Caller, params: dict[str, Any]) -> Any:
    cfg: PushConfigIn = params_of(params, PushConfigIn)
    if not cfg.task_id:
        raise ValidationFailed([{"field": "taskId", "message": "is required", "code": "required"}])
    return await app_state().a2a.create_push_config(caller, cfg.task_id, cfg)


def _op(name: str, type_: type[Any] | None) -> Callable[[Caller, dict[str, Any]], Awaitable[Any]]:
    """The service's operation ``name``, given the request read as ``type_`` (or nothing)."""

    async def run(caller: Caller, params: dict[str, Any]) -> Any:
        call = getattr(app_state().a2a, name)
        if type_ is None:
            return await call(caller)
        return await call(caller, params_of(params, type_))

    return run


async def subscribe_to_task(caller: Caller, params: dict[str, Any]) -> Any:
    return await app_state().a2a.subscribe_to_task(caller, params_of(params, service.TaskIdParams), GrpcFraming())


@dataclass(frozen=True)
class Method:
    request: type[Message]
    #: The answer's message; None: a stream of StreamResponse.
    response: type[Message] | None
    #: runtime/v1 must be activated (as on the other bindings).
    gated: bool
    #: The operation: a result's A2A JSON, a stream's frames, or idempotency/v1's Response of either.
    run: Callable[[Caller, dict[str, Any]], Awaitable[Any]]


pb = a2a_pb2
#: Every method of the service (a test holds this to a2a.proto's list).
METHODS: dict[str, Method] = {
    "SendMessage": Method(pb.SendMessageRequest, pb.SendMessageResponse, True, send_message),
    "SendStreamingMessage": Method(pb.SendMessageRequest, None, True, send_streaming_message),
    "GetTask": Method(pb.GetTaskRequest, pb.Task, False, _op("get_task", service.GetTaskParams)),
    "ListTasks": Method(pb.ListTasksRequest, pb.ListTasksResponse, False, _op("list_tasks", ListQuery)),
    "CancelTask": Method(pb.CancelTaskRequest, pb.Task, True, _op("cancel_task", service.TaskIdParams)),
    "SubscribeToTask": Method(pb.SubscribeToTaskRequest, None, False, subscribe_to_task),
    "CreateTaskPushNotificationConfig": Method(
        pb.TaskPushNotificationConfig, pb.TaskPushNotificationConfig, True, create_push_config
    ),
    "GetTaskPushNotificationConfig": Method(
        pb.GetTaskPushNotificationConfigRequest, pb.TaskPushNotificationConfig, True, _op("get_push_config", ConfigRef)
    ),
    "ListTaskPushNotificationConfigs": Method(
        pb.ListTaskPushNotificationConfigsRequest,
        pb.ListTaskPushNotificationConfigsResponse,
        True,
        _op("list_push_configs", ListParams),
    ),
    "DeleteTaskPushNotificationConfig": Method(
        pb.DeleteTaskPushNotificationConfigRequest, empty_pb2.Empty, True, _op("delete_push_config", ConfigRef)
    ),
    "GetExtendedAgentCard": Method(
        pb.GetExtendedAgentCardRequest, pb.AgentCard, False, _op("extended_agent_card", None)
    ),
}


# -- what crosses between the halves ----------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A call's request as its gRPC thread read it."""

    tenant: str
    params: dict[str, Any]
    authorization: str | None
    version: str | None
    extensions: list[str]
    #: The verified client certificate (mTLS with AIWG_TLS_CLIENT_AUTH=required), before the token.
    certificate: ClientCertificate | None = None


@dataclass(frozen=True)
class Answer:
    """A unary call's answer: initial metadata and the result's A2A JSON."""

    metadata: Metadata
    result: dict[str, Any]


@dataclass(frozen=True)
class Head:
    """A stream's first item: its initial metadata (the frames follow)."""

    metadata: Metadata


def echoed(caller: Caller, response: Response | None = None) -> Metadata:
    out: list[tuple[str, str]] = []
    if caller.extensions:
        out.append((EXTENSIONS_KEY, ", ".join(caller.extensions)))
    if response is not None and response.headers.get(idempotency.REPLAYED_HEADER) == "true":
        out.append((REPLAYED_KEY, "true"))
    return tuple(out)


@contextlib.contextmanager
def as_status(method: Method) -> Iterator[None]:
    """Any failure of the block as the ``RpcFailed`` its call ends with: a domain error translated
    once, an unexpected one logged and answered INTERNAL."""
    try:
        yield
    except ControllerError as exc:
        raise failure(to_a2a(exc)) from None
    except RpcFailed:
        raise
    except Exception:
        log.exception("gRPC %s failed", method.request.DESCRIPTOR.name)
        raise failure(internal_error()) from None


# -- the binding ------------------------------------------------------------------------------------


class GrpcBinding:
    """The handlers of every method, calling the operations of ``app`` through ``bridge``.

    ``base_url`` is the HTTP origin a gRPC caller is shown (what URLs in its answers name: the
    extended card's interfaces, artifact files): gRPC requests carry no HTTP host.
    """

    def __init__(self, app: QuartTrio, bridge: ThreadBridge, *, base_url: str) -> None:
        self._app = app
        self._bridge = bridge
        self._base_url = base_url

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        table: dict[str, grpc.RpcMethodHandler] = {}
        for name, method in METHODS.items():
            # No (de)serializers: requests are parsed where a bad one can be answered, and stream
            # frames arrive serialized (GrpcFraming).
            if method.response is None:
                table[name] = grpc.unary_stream_rpc_method_handler(partial(self._serve_stream, method))
            else:
                table[name] = grpc.unary_unary_rpc_method_handler(partial(self._serve_unary, method))
        return [grpc.method_handlers_generic_handler(SERVICE, table)]

    # -- on the call's gRPC thread ---------------------------------------------------------------

    def _read(self, method: Method, raw: bytes, context: grpc.ServicerContext) -> Request:
        try:
            params = request_json(method.request, raw)
        except ControllerError as exc:
            abort(context, failure(to_a2a(exc)).status)
        tenant = params.pop("tenant", "")
        values: dict[str, list[str]] = {}
        for key, value in context.invocation_metadata() or ():
            if isinstance(value, str):
                values.setdefault(key.lower(), []).append(value)
        return Request(
            tenant=tenant,
            params=params,
            authorization=next(iter(values.get("authorization", [])), None),
            version=next(iter(values.get("a2a-version", [])), None),
            extensions=split_extensions(values.get(EXTENSIONS_KEY, [])),
            certificate=_peer_certificate(context),
        )

    def _serve_unary(self, method: Method, raw: bytes, context: grpc.ServicerContext) -> bytes:
        assert method.response is not None
        request = self._read(method, raw, context)
        pipe = self._bridge.open(partial(self._unary, method, request), context)
        try:
            answer: Answer = pipe.first()
            data = message_bytes(method.response, answer.result)
        except RpcFailed as exc:
            abort(context, exc.status)
        except Interrupted as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception:
            log.exception("gRPC %s failed", method.request.DESCRIPTOR.name)
            abort(context, failure(internal_error()).status)
        if answer.metadata:
            context.send_initial_metadata(answer.metadata)
        return data

    def _serve_stream(self, method: Method, raw: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        request = self._read(method, raw, context)
        pipe = self._bridge.open(partial(self._stream, method, request), context)
        try:
            for item in pipe:
                if isinstance(item, Head):
                    if item.metadata:
                        context.send_initial_metadata(item.metadata)
                else:
                    yield item
        except RpcFailed as exc:
            abort(context, exc.status)
        except Interrupted as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        finally:
            pipe.cancel()  # a client gone mid-stream closes this generator: its trio side ends too

    # -- on the trio loop ------------------------------------------------------------------------

    async def _caller(self, method: Method, request: Request) -> Caller:
        CLIENT_CERT.set(request.certificate)  # this call's task only: the token's precedence as on HTTP
        if not request.tenant:
            principal_of(request.authorization)  # an unauthenticated call learns nothing more
            message = "names the instance (the tenant of the card's GRPC interface)"
            raise ValidationFailed([{"field": "tenant", "message": message, "code": "required"}])
        return await open_caller(
            authorization=request.authorization,
            instance_id=request.tenant,
            version=request.version,
            extensions=request.extensions,
            base_url=self._base_url,
            enforce_extensions=method.gated,
        )

    async def _unary(self, method: Method, request: Request, emit: Emit[Answer]) -> None:
        bind_log_ids(instance_id=request.tenant or None)
        async with self._app.app_context():
            with as_status(method):
                caller = await self._caller(method, request)
                result = await method.run(caller, request.params)
                if isinstance(result, Response):  # idempotency/v1's: fresh, or a replay
                    body = await result.get_data(as_text=False)
                    if result.status_code != 200:
                        raise stored_failure(body)
                    answer = Answer(echoed(caller, result), msgspec.json.decode(body))
                else:
                    answer = Answer(echoed(caller), result)
        await emit(answer)

    async def _stream(self, method: Method, request: Request, emit: Emit[Head | bytes]) -> None:
        bind_log_ids(instance_id=request.tenant or None)
        frames: Any  # a Response's body, or the stream itself: closed on leaving, either way
        async with self._app.app_context():
            with as_status(method):
                caller = await self._caller(method, request)
                result = await method.run(caller, request.params)
                if isinstance(result, Response):  # idempotency/v1's: a stream, or a stored error
                    if result.status_code != 200:
                        raise stored_failure(await result.get_data(as_text=False))
                    head, frames = Head(echoed(caller, result)), result.response
                else:
                    head, frames = Head(echoed(caller)), contextlib.aclosing(result)
            await emit(head)
            # The stream reports its own failures as RpcFailed (GrpcFraming); closed however it ends.
            async with frames as body:
                iterator: AsyncIterator[bytes] = aiter(body)
                async for frame in iterator:
                    if frame:  # empty: an idle stream's keep-alive, which gRPC does not need
                        await emit(frame)


def http_origin(config: ControllerConfig) -> str:
    """The HTTP origin gRPC callers are shown: ``AIWG_PUBLIC_URL``, else the HTTP listen address
    (a wildcard host named ``localhost``)."""
    if config.public_url:
        return config.public_url
    host, port = config.listen_host_port
    host = "localhost" if host in ("", "0.0.0.0", "::") else host
    host = f"[{host}]" if ":" in host else host
    return f"{config.scheme}://{host}:{port}"


def _peer_certificate(context: grpc.ServicerContext) -> ClientCertificate | None:
    """The client certificate grpcio verified for this call, if it asked for one."""
    # grpcio answers each property as a list of values (its stubs say otherwise).
    values = cast(dict[str, list[bytes]], context.auth_context() or {}).get("x509_pem_cert") or []
    pem = values[0] if values else None
    if not pem:
        return None
    return ClientCertificate.from_der(x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER))


async def serve_grpc(app: QuartTrio, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the gRPC binding on ``AIWG_GRPC_LISTEN`` for ``app`` until cancelled (reports the port);
    TLS with the HTTP certificate when one is configured."""
    config = state_of(app).config
    assert config.grpc_listen
    credentials = None
    if config.tls_cert and config.tls_key:
        pair = (Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())
        if config.tls_client_auth == "required" and config.tls_client_ca:
            # grpcio either demands and verifies a client certificate or asks for none: with
            # ``optional``, gRPC callers present bearer tokens only.
            ca = Path(config.tls_client_ca).read_bytes()
            credentials = grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=True)
        else:
            credentials = grpc.ssl_server_credentials([pair])
    base_url = http_origin(config)
    await serve(
        lambda bridge: GrpcBinding(app, bridge, base_url=base_url).handlers(),
        listen=config.grpc_listen,
        credentials=credentials,
        max_calls=config.grpc_max_calls,
        max_message_bytes=config.max_request_bytes,
        keepalive_s=config.sse_keepalive_s,
        task_status=task_status,
    )
