"""The A2A error body (controller.a2a.errors): a full limit is an answer, not an outage, on every
binding: 429 RESOURCE_EXHAUSTED over HTTP+JSON, a JSON-RPC error naming it in ``data``, gRPC
RESOURCE_EXHAUSTED; the limit's code in the ErrorInfo metadata and, where waiting helps, a
RetryInfo and ``Retry-After``. Live against a real hostd that runs one exec at a time."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import grpc
import trio
from a2a.types import a2a_pb2, a2a_pb2_grpc
from a2a.utils.grpc_status import status_from_call
from google.rpc import error_details_pb2

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from agentic_sandbox.controller.a2a.errors import ERROR_INFO, RETRY_INFO, to_a2a
from agentic_sandbox.controller.errors import LimitReached
from tests.controller.a2a.helpers import new_agent
from tests.controller.test_hostlink import small_limits


def message(text: str) -> dict[str, Any]:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]}


def test_a_limit_worth_waiting_for_says_how_long() -> None:
    error = to_a2a(LimitReached("limit.execs", "full", retry_after_s=5, details={"limit": "1"}))
    assert (error.http_status, error.kind.status, error.kind.reason) == (
        429,
        "RESOURCE_EXHAUSTED",
        "RESOURCE_EXHAUSTED",
    )
    assert error.details()[0]["metadata"] == {"code": "limit.execs", "limit": "1"}
    assert error.details()[1] == {"@type": RETRY_INFO, "retryDelay": "5s"}
    assert error.headers() == {"Retry-After": "5"}
    fixed = to_a2a(LimitReached("limit.checkpoints", "full"))
    assert [d["@type"] for d in fixed.details()] == [ERROR_INFO] and fixed.headers() == {}


def limit_info(details: list[dict[str, Any]]) -> dict[str, str]:
    [info] = [d for d in details if d["@type"] == ERROR_INFO]
    assert info["reason"] == "RESOURCE_EXHAUSTED"
    metadata: dict[str, str] = info["metadata"]
    return metadata


async def test_a_send_when_every_exec_slot_is_taken_is_429_on_every_binding(short_dir: Path, tmp_path: Path) -> None:
    async with (
        small_limits(short_dir, tmp_path / "controller", AIWG_GRPC_LISTEN="127.0.0.1:0") as live,
        live.client() as admin,
    ):
        agent = await new_agent(admin, live, "limits-a2a", loadout="shell")
        async with agent.client(live) as client:
            busy = await client.post(
                "/message:send", json={"message": message("sleep 300"), "configuration": {"returnImmediately": True}}
            )
            assert busy.status_code == 200, busy.text  # the one exec slot is taken

            # HTTP+JSON: 429 with the limit named, the setting in its detail, and when to retry.
            rest = await client.post("/message:send", json={"message": message("echo hi")})
            assert rest.status_code == 429, rest.text
            assert rest.headers["Retry-After"] == "5"
            error = rest.json()["error"]
            assert (error["code"], error["status"]) == (429, "RESOURCE_EXHAUSTED")
            assert "AIWG_MAX_EXECS" in error["message"] and "limit 1" in error["message"]
            metadata = limit_info(error["details"])
            assert (metadata["code"], metadata["limit"], metadata["setting"]) == ("limit.execs", "1", "AIWG_MAX_EXECS")
            assert {"@type": RETRY_INFO, "retryDelay": "5s"} in error["details"]

            # JSON-RPC: an error (HTTP 200, as the binding answers errors) naming the limit in data.
            rpc = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message("echo hi")}}
            answer = await client.post("", json=rpc)
            assert answer.status_code == 200, answer.text
            data = answer.json()["error"]["data"]
            assert limit_info(data)["code"] == "limit.execs"
            assert {"@type": RETRY_INFO, "retryDelay": "5s"} in data

        # gRPC: RESOURCE_EXHAUSTED, with ErrorInfo and RetryInfo in the status details.
        port = live.state.a2a.grpc_port
        assert port is not None

        def grpc_send() -> grpc.RpcError:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                request = a2a_pb2.SendMessageRequest(
                    tenant=agent.instance_id,
                    message=a2a_pb2.Message(
                        message_id=str(uuid.uuid4()), role=a2a_pb2.ROLE_USER, parts=[a2a_pb2.Part(text="echo hi")]
                    ),
                )
                metadata = [
                    ("authorization", f"Bearer {agent.token}"),
                    ("a2a-version", "1.0"),
                    ("a2a-extensions", RUNTIME_EXTENSION),
                ]
                try:
                    stub.SendMessage(request, metadata=metadata, timeout=20)
                except grpc.RpcError as exc:
                    return exc
            raise AssertionError("the send succeeded")

        failed = await trio.to_thread.run_sync(grpc_send)
        assert failed.code() is grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        status = status_from_call(failed)
        assert status is not None
        info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
        assert status.details[0].Unpack(info) and status.details[1].Unpack(retry)
        assert info.metadata["code"] == "limit.execs" and retry.retry_delay.seconds == 5
