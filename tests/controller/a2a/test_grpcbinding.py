"""The A2A gRPC binding against a live controller and hostd: a2a-sdk's own gRPC client created from
the card, then raw gRPC calls and raw bytes for what a well-behaved client never sends.

The controller here serves gRPC on an ephemeral port (``AIWG_GRPC_LISTEN=127.0.0.1:0``) with a
1 MiB request limit. a2a-sdk is asyncio-only: its scenarios run in an asyncio loop on a worker
thread (as in test_sdk_client); the raw calls use grpcio's sync client on a worker thread. After
each bad input the server must still answer a good call.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import trio
from a2a.client import create_client
from a2a.types import a2a_pb2, a2a_pb2_grpc
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    ExtensionSupportRequiredError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from a2a.utils.grpc_status import status_from_call
from google.protobuf import json_format
from google.rpc import error_details_pb2

from agentic_sandbox.controller.a2a import grpcbinding
from agentic_sandbox.controller.a2a.card import IDEMPOTENCY_EXTENSION, RUNTIME_EXTENSION
from agentic_sandbox.controller.config import load_config
from tests.controller.a2a.grpcclient import grpc_config, interceptors
from tests.controller.a2a.helpers import Agent, new_agent
from tests.controller.a2a.sdkflows import (
    cancel_a_long_task,
    card_verifier,
    refused_without_runtime,
    run_in_asyncio,
    user_message,
)
from tests.controller.conftest import LiveController, LiveHostd, controller_env, serve_controller
from tests.controller.test_config import _self_signed as self_signed

MAX_REQUEST_BYTES = 1024 * 1024


@pytest.fixture
async def controller(hostd: LiveHostd, tmp_path: Path) -> AsyncIterator[LiveController]:
    """The conftest controller with the gRPC binding on (the conftest's ``admin`` uses this one)."""
    env = controller_env(
        tmp_path / "controller",
        hostd.socket_path,
        AIWG_GRPC_LISTEN="127.0.0.1:0",
        AIWG_MAX_REQUEST_BYTES=str(MAX_REQUEST_BYTES),
    )
    async with serve_controller(load_config(env=env)) as live:
        yield live


def grpc_target(controller: LiveController) -> str:
    port = controller.state.a2a.grpc_port
    assert port is not None
    return f"127.0.0.1:{port}"


# -- pure: the method table is a2a.proto's service -------------------------------------------------


def test_methods_are_the_services() -> None:
    service = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"]
    assert grpcbinding.SERVICE == service.full_name == "lf.a2a.v1.A2AService"
    assert set(grpcbinding.METHODS) == {m.name for m in service.methods}
    for m in service.methods:
        method = grpcbinding.METHODS[m.name]
        assert method.request.DESCRIPTOR is m.input_type
        assert (method.response is None) == m.server_streaming
        if method.response is not None:
            assert method.response.DESCRIPTOR is m.output_type


# -- a2a-sdk's gRPC client, created from the card ----------------------------------------------------


async def grpc_client(agent: Agent, http: httpx.AsyncClient, streaming: bool, *extensions: str) -> Any:
    verifier = await card_verifier(agent, http)
    config = grpc_config(http, streaming=streaming)
    return await create_client(
        agent.base,
        client_config=config,
        interceptors=interceptors(agent.token, *extensions),
        signature_verifier=verifier,
    )


async def sdk_scenario(agent: Agent, streaming: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        client = await grpc_client(agent, http, streaming, RUNTIME_EXTENSION)
        events = [e async for e in client.send_message(SendMessageRequest(message=user_message("echo 'hi grpc'")))]
        out["members"] = [e.WhichOneof("payload") for e in events]
        last = events[-1]
        task_id = events[0].task.id if events[0].HasField("task") else last.status_update.task_id
        if last.HasField("task"):
            out["final_state"] = TaskState.Name(last.task.status.state)
        got = await client.get_task(GetTaskRequest(id=task_id, history_length=1))
        out["state"] = TaskState.Name(got.status.state)
        out["text"] = "".join(p.text for a in got.artifacts for p in a.parts if a.artifact_id == "stdout")
        out["history"] = len(got.history)
        listed = await client.list_tasks(ListTasksRequest(page_size=10))
        out["listed"], out["total"] = [t.id for t in listed.tasks], listed.total_size
        out["task_id"] = task_id
        for name, call in (
            ("cancel_done", lambda: client.cancel_task(CancelTaskRequest(id=task_id))),
            ("get_unknown", lambda: client.get_task(GetTaskRequest(id=str(uuid.uuid4())))),
        ):
            try:
                await call()
            except Exception as exc:
                out[name] = type(exc)
        # Push config CRUD (a public name: judged by its form at creation, resolved at delivery).
        made = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, url="https://hooks.example.com/a2a", token="t-1")
        )
        ref = {"task_id": task_id, "id": made.id}
        fetched = await client.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(**ref))
        configs = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        await client.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(**ref))
        after = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        out["push"] = (fetched.url, fetched.token, [c.id for c in configs.configs] == [made.id], len(after.configs))
        # Over gRPC too the card's signature verifies (it arrives as a2a.proto's AgentCard).
        verifier = await card_verifier(agent, http)
        card = await client.get_extended_agent_card(GetExtendedAgentCardRequest(), signature_verifier=verifier)
        out["card"] = json_format.MessageToDict(card)
        out |= await cancel_a_long_task(client, streaming)  # return-immediately, then canceled
        await client.close()
        # Without runtime/v1 the SDK raises its typed error.
        client = await grpc_client(agent, http, streaming)
        out["no_extension"] = await refused_without_runtime(client)
    return out


@pytest.mark.parametrize("streaming", [False, True], ids=["send", "stream"])
async def test_sdk_grpc_client_drives_every_operation(
    admin: httpx.AsyncClient, controller: LiveController, streaming: bool
) -> None:
    agent = await new_agent(admin, controller, f"grpc-{int(streaming)}", loadout="shell")
    out = await run_in_asyncio(lambda: sdk_scenario(agent, streaming))
    if streaming:
        assert out["members"][0] == "task" and out["members"][-1] == "status_update"
        assert "artifact_update" in out["members"]
        assert out["subscribed"][0] == "task" and out["subscribed"][-1] == "status_update"
    else:
        assert out["members"] == ["task"] and out["final_state"] == "TASK_STATE_COMPLETED"
        assert out["quick_state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
    assert out["state"] == "TASK_STATE_COMPLETED" and out["text"] == "hi grpc\n" and out["history"] == 1
    assert out["listed"] == [out["task_id"]] and out["total"] == 1
    assert out["cancel_done"] is TaskNotCancelableError
    assert out["get_unknown"] is TaskNotFoundError
    assert out["push"] == ("https://hooks.example.com/a2a", "t-1", True, 0)
    assert out["card"]["name"] == f"grpc-{int(streaming)}"
    grpc_interfaces = [i for i in out["card"]["supportedInterfaces"] if i["protocolBinding"] == "GRPC"]
    assert grpc_interfaces == [
        {
            "url": grpc_target(controller),
            "protocolBinding": "GRPC",
            "protocolVersion": "1.0",
            "tenant": agent.instance_id,
        }
    ]
    assert out["canceled"] == "TASK_STATE_CANCELED"
    assert out["no_extension"] is ExtensionSupportRequiredError


# -- raw gRPC: metadata, errors and bad input ---------------------------------------------------------


def md(agent: Agent, *, token: str | None = None, extensions: bool = True, version: str | None = "1.0") -> list[Any]:
    out: list[tuple[str, str]] = [("authorization", f"Bearer {token or agent.token}")]
    if version is not None:
        out.append(("a2a-version", version))
    if extensions:
        out.append(("a2a-extensions", RUNTIME_EXTENSION))
    return out


def call_error(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str | None]:
    """The status a failing call ends with, and the ErrorInfo reason a2a-sdk's parser finds in it."""
    try:
        fn()
    except grpc.RpcError as exc:
        status = status_from_call(exc)  # also checks that the details' code and message match the call's
        reason = None
        if status is not None:
            info = error_details_pb2.ErrorInfo()
            assert status.details[0].Unpack(info)
            reason = info.reason
        return exc.code(), reason
    raise AssertionError("the call succeeded")


class Raw:
    """A sync gRPC stub on a worker thread's channel (closed by the test's end)."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = a2a_pb2_grpc.A2AServiceStub(self.channel)

    def healthy(self, agent: Agent) -> bool:
        card = self.stub.GetExtendedAgentCard(
            a2a_pb2.GetExtendedAgentCardRequest(tenant=agent.instance_id), metadata=md(agent), timeout=10
        )
        return bool(card.name)


@pytest.fixture
async def raw(controller: LiveController) -> AsyncIterator[Raw]:
    client = Raw(grpc_target(controller))
    try:
        yield client
    finally:
        client.channel.close()


async def test_metadata_auth_and_errors(admin: httpx.AsyncClient, controller: LiveController, raw: Raw) -> None:
    agent = await new_agent(admin, controller, "grpc-raw", loadout="shell")
    other = await new_agent(admin, controller, "grpc-other", loadout="shell")
    stub, tenant = raw.stub, agent.instance_id

    def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        send = a2a_pb2.SendMessageRequest(tenant=tenant, message=user_message("echo ok"))
        reply, call = stub.SendMessage.with_call(send, metadata=md(agent), timeout=20)
        out["echo"] = [v for k, v in call.initial_metadata() if k == "a2a-extensions"]
        out["state"] = TaskState.Name(reply.task.status.state)
        task_id = reply.task.id
        get = a2a_pb2.GetTaskRequest(tenant=tenant, id=task_id)
        _, call = stub.GetTask.with_call(get, metadata=md(agent, extensions=False), timeout=10)
        out["echo_none"] = [v for k, v in call.initial_metadata() if k == "a2a-extensions"]
        out["no_auth"] = call_error(lambda: stub.GetTask(get, metadata=[("a2a-version", "1.0")], timeout=10))
        out["bad_token"] = call_error(lambda: stub.GetTask(get, metadata=md(agent, token="x" * 32), timeout=10))
        out["no_version"] = call_error(lambda: stub.GetTask(get, metadata=md(agent, version=None), timeout=10))
        out["no_tenant"] = call_error(lambda: stub.GetTask(a2a_pb2.GetTaskRequest(id=task_id), metadata=md(agent)))
        out["no_tenant_no_auth"] = call_error(lambda: stub.GetTask(a2a_pb2.GetTaskRequest(id=task_id)))
        # Another instance's token sees neither the instance nor its task.
        out["other_token"] = call_error(lambda: stub.GetTask(get, metadata=md(agent, token=other.token)))
        unknown = a2a_pb2.GetTaskRequest(tenant=tenant, id=str(uuid.uuid4()))
        out["unknown_task"] = call_error(lambda: stub.GetTask(unknown, metadata=md(agent)))
        out["no_extension"] = call_error(lambda: stub.SendMessage(send, metadata=md(agent, extensions=False)))
        bad_message = a2a_pb2.SendMessageRequest(tenant=tenant, message=a2a_pb2.Message(message_id="m"))
        out["invalid"] = call_error(lambda: stub.SendMessage(bad_message, metadata=md(agent)))
        cancel = a2a_pb2.CancelTaskRequest(tenant=tenant, id=task_id)
        out["not_cancelable"] = call_error(lambda: stub.CancelTask(cancel, metadata=md(agent)))
        return out

    out = await trio.to_thread.run_sync(run)
    assert out["echo"] == [RUNTIME_EXTENSION] and out["echo_none"] == []
    assert out["state"] == "TASK_STATE_COMPLETED"
    assert out["no_auth"] == out["bad_token"] == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    assert out["no_version"] == (grpc.StatusCode.FAILED_PRECONDITION, "VERSION_NOT_SUPPORTED")
    assert out["no_tenant"] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMS")
    assert out["no_tenant_no_auth"] == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    assert out["other_token"] == (grpc.StatusCode.NOT_FOUND, "INSTANCE_NOT_FOUND")
    assert out["unknown_task"] == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")
    assert out["no_extension"] == (grpc.StatusCode.FAILED_PRECONDITION, "EXTENSION_SUPPORT_REQUIRED")
    assert out["invalid"] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMS")
    assert out["not_cancelable"] == (grpc.StatusCode.FAILED_PRECONDITION, "TASK_NOT_CANCELABLE")


async def test_bad_input_gets_clean_statuses(admin: httpx.AsyncClient, controller: LiveController, raw: Raw) -> None:
    agent = await new_agent(admin, controller, "grpc-bad", loadout="shell")
    target = grpc_target(controller)

    def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        channel = raw.channel
        garbage = channel.unary_unary(f"/{grpcbinding.SERVICE}/GetTask")
        out["garbage_message"] = call_error(lambda: garbage(b"\xff\xff\xff\xff", metadata=md(agent), timeout=10))
        out["healthy_1"] = raw.healthy(agent)
        nope = channel.unary_unary(f"/{grpcbinding.SERVICE}/Nope")
        out["unknown_method"] = call_error(lambda: nope(b"", metadata=md(agent), timeout=10))
        other = channel.unary_unary("/lf.a2a.v1.Other/GetTask")
        out["unknown_service"] = call_error(lambda: other(b"", metadata=md(agent), timeout=10))
        out["healthy_2"] = raw.healthy(agent)
        huge = a2a_pb2.SendMessageRequest(tenant=agent.instance_id, message=user_message("x" * MAX_REQUEST_BYTES))
        out["huge"] = call_error(lambda: raw.stub.SendMessage(huge, metadata=md(agent), timeout=10))
        out["healthy_3"] = raw.healthy(agent)
        # Not gRPC at all: HTTP/1.1 and random bytes on the port; the server closes the connection.
        host, port = target.rsplit(":", 1)
        for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", bytes(range(256)) * 64):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(junk)
                received = b""
                while chunk := sock.recv(65536):
                    received += chunk
                out.setdefault("junk_closed", []).append(True)
        out["healthy_4"] = raw.healthy(agent)
        return out

    out = await trio.to_thread.run_sync(run)
    assert out["garbage_message"] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert out["unknown_method"] == (grpc.StatusCode.UNIMPLEMENTED, None)
    assert out["unknown_service"] == (grpc.StatusCode.UNIMPLEMENTED, None)
    assert out["huge"] == (grpc.StatusCode.RESOURCE_EXHAUSTED, None)
    assert out["junk_closed"] == [True, True]
    assert all(out[f"healthy_{n}"] for n in range(1, 5))


async def test_a_canceled_stream_frees_the_server_side(
    admin: httpx.AsyncClient, controller: LiveController, raw: Raw
) -> None:
    agent = await new_agent(admin, controller, "grpc-cancel", loadout="shell")
    hub = controller.state.tasks.hub
    tenant = agent.instance_id
    quick = SendMessageConfiguration(return_immediately=True)
    send = a2a_pb2.SendMessageRequest(tenant=tenant, message=user_message("sleep 30"), configuration=quick)
    reply = await trio.to_thread.run_sync(lambda: raw.stub.SendMessage(send, metadata=md(agent), timeout=10))
    task_id = reply.task.id
    assert hub.watchers(task_id) == 0
    for _ in range(3):  # the server side of each canceled stream ends; the next one gets a thread
        stream = raw.stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(tenant=tenant, id=task_id), metadata=md(agent), timeout=30
        )
        first = await trio.to_thread.run_sync(lambda: next(stream))  # noqa: B023 - used at once
        assert first.HasField("task") and first.task.id == task_id
        assert [v for k, v in stream.initial_metadata() if k == "a2a-extensions"] == [RUNTIME_EXTENSION]
        assert hub.watchers(task_id) == 1
        stream.cancel()
        with trio.fail_after(5):
            while hub.watchers(task_id):
                await trio.sleep(0.02)
    # A deadline ends it the same way.
    stream = raw.stub.SubscribeToTask(
        a2a_pb2.SubscribeToTaskRequest(tenant=tenant, id=task_id), metadata=md(agent), timeout=0.5
    )
    code = await trio.to_thread.run_sync(lambda: call_error(lambda: list(stream))[0])
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    with trio.fail_after(5):
        while hub.watchers(task_id):
            await trio.sleep(0.02)
    cancel = a2a_pb2.CancelTaskRequest(tenant=tenant, id=task_id)
    canceled = await trio.to_thread.run_sync(lambda: raw.stub.CancelTask(cancel, metadata=md(agent), timeout=10))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED


async def test_idempotent_sends_replay(admin: httpx.AsyncClient, controller: LiveController, raw: Raw) -> None:
    agent = await new_agent(admin, controller, "grpc-idem", loadout="shell")
    metadata = [*md(agent), ("a2a-extensions", IDEMPOTENCY_EXTENSION)]
    message_id = str(uuid.uuid4())

    def send(text: str, stream: bool = False) -> tuple[Any, dict[str, str]]:
        message = Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(text=text)])
        request = a2a_pb2.SendMessageRequest(tenant=agent.instance_id, message=message)
        if stream:
            call = raw.stub.SendStreamingMessage(request, metadata=metadata, timeout=20)
            return [e.WhichOneof("payload") for e in call], dict(call.initial_metadata())
        reply, call = raw.stub.SendMessage.with_call(request, metadata=metadata, timeout=20)
        return reply, dict(call.initial_metadata())

    def run() -> dict[str, Any]:
        first, head1 = send("echo once")
        again, head2 = send("echo once")
        reused = call_error(lambda: send("echo other"))
        return {"same": first.task.id == again.task.id, "heads": (head1, head2), "reused": reused}

    out = await trio.to_thread.run_sync(run)
    assert out["same"]
    head1, head2 = out["heads"]
    assert "idempotent-replayed" not in head1 and head2["idempotent-replayed"] == "true"
    assert IDEMPOTENCY_EXTENSION in head2["a2a-extensions"]
    assert out["reused"] == (grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD")
    # A stream with the same messageId is another request; repeated, it attaches to the same task's stream.
    message_id = str(uuid.uuid4())
    first, head1 = await trio.to_thread.run_sync(lambda: send("echo streamed", True))
    again, head2 = await trio.to_thread.run_sync(lambda: send("echo streamed", True))
    assert first == again and first[0] == "task" and first[-1] == "status_update"
    assert "idempotent-replayed" not in head1 and head2["idempotent-replayed"] == "true"


async def test_tls_with_the_http_certificate(hostd: LiveHostd, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    env = controller_env(
        tmp_path / "c",
        hostd.socket_path,
        AIWG_GRPC_LISTEN="127.0.0.1:0",
        AIWG_TLS_CERT=str(cert),
        AIWG_TLS_KEY=str(key),
    )
    async with serve_controller(load_config(env=env)) as live:
        port = live.state.a2a.grpc_port
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())

        def run() -> tuple[grpc.StatusCode, str | None]:
            with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                request = a2a_pb2.GetTaskRequest(tenant="x", id="y")
                return call_error(lambda: stub.GetTask(request, metadata=[("a2a-version", "1.0")], timeout=10))

        assert await trio.to_thread.run_sync(run) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")


async def test_stopping_ends_open_streams_and_threads(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "c", hostd.socket_path, AIWG_GRPC_LISTEN="127.0.0.1:0")
    async with serve_controller(load_config(env=env)) as live:
        async with live.client() as admin:
            agent = await new_agent(admin, live, "grpc-stop", loadout="shell")
        client = Raw(grpc_target(live))
        quick = SendMessageConfiguration(return_immediately=True)
        send = a2a_pb2.SendMessageRequest(
            tenant=agent.instance_id, message=user_message("sleep 30"), configuration=quick
        )
        reply = await trio.to_thread.run_sync(lambda: client.stub.SendMessage(send, metadata=md(agent), timeout=10))
        request = a2a_pb2.SubscribeToTaskRequest(tenant=agent.instance_id, id=reply.task.id)
        stream = client.stub.SubscribeToTask(request, metadata=md(agent), timeout=30)
        assert (await trio.to_thread.run_sync(lambda: next(stream))).HasField("task")
    with trio.fail_after(10):
        code, _reason = await trio.to_thread.run_sync(lambda: call_error(lambda: list(stream)))
    assert code == grpc.StatusCode.UNAVAILABLE  # "the controller is stopping": a client may retry
    client.channel.close()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("grpc-call")]


async def test_the_services_json_is_a2a_protos(admin: httpx.AsyncClient, controller: LiveController) -> None:
    """What the service answers converts to a2a.proto with no key dropped (the binding converts
    tolerantly; this holds the JSON to the proto strictly). The card is not held to it: it carries
    A2A 0.3's fields beside 1.0's for 0.3 clients, which a2a.proto drops; its signatures cover the
    proto's form too (verified over gRPC in test_sdk_grpc_client_drives_every_operation)."""
    agent = await new_agent(admin, controller, "grpc-strict", loadout="shell")
    script = "echo out; echo err >&2; printf 'x%.0s' $(seq 100)"
    body = {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": script}]}}
    async with agent.client(controller) as client:
        sent = (await client.post("/message:send", json=body)).json()
        task_id = sent["task"]["id"]
        push = {"url": "https://hooks.example.com/a2a", "token": "t", "authentication": {"scheme": "Bearer"}}
        made = (await client.post(f"/tasks/{task_id}/pushNotificationConfigs", json=push)).json()
        answers = {
            a2a_pb2.SendMessageResponse: sent,
            a2a_pb2.Task: (await client.get(f"/tasks/{task_id}", params={"historyLength": 5})).json(),
            a2a_pb2.ListTasksResponse: (await client.get("/tasks", params={"includeArtifacts": "true"})).json(),
            a2a_pb2.TaskPushNotificationConfig: made,
            a2a_pb2.ListTaskPushNotificationConfigsResponse: (
                await client.get(f"/tasks/{task_id}/pushNotificationConfigs")
            ).json(),
        }
        async with client.stream(
            "POST", "/message:stream", json={**body, "message": {**body["message"], "messageId": str(uuid.uuid4())}}
        ) as s:
            frames = [line[6:] async for line in s.aiter_lines() if line.startswith("data: ")]
    for type_, answer in answers.items():
        json_format.ParseDict(answer, type_())  # raises on a key the proto has no field for
    for frame in frames:
        json_format.Parse(frame, a2a_pb2.StreamResponse())
    assert len(frames) >= 3
