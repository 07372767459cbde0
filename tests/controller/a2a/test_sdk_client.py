"""The official a2a-sdk client against a live controller and hostd, over both bindings.

a2a-sdk is asyncio-only; each scenario runs in its own asyncio loop in a worker thread while the
controller serves on trio in the test's thread. The client gets the agent's token and the
runtime/v1 activation as default headers of its httpx client (it sends ``A2A-Version: 1.0``
itself), and verifies the card's signature with the SDK's verifier before it is used.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    ListTasksRequest,
    SendMessageRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    ExtensionSupportRequiredError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
)

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from tests.controller.a2a.helpers import Agent, new_agent
from tests.controller.a2a.sdkflows import (
    cancel_a_long_task,
    card_verifier,
    refused_without_runtime,
    run_in_asyncio,
    user_message,
)
from tests.controller.conftest import LiveController


async def sdk_client(agent: Agent, http: httpx.AsyncClient, bindings: list[str], streaming: bool) -> Any:
    verifier = await card_verifier(agent, http)
    config = ClientConfig(httpx_client=http, streaming=streaming, supported_protocol_bindings=bindings)
    return await create_client(agent.base, client_config=config, signature_verifier=verifier)


async def scenario(agent: Agent, bindings: list[str], streaming: bool) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {agent.token}", "A2A-Extensions": RUNTIME_EXTENSION}
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        client = await sdk_client(agent, http, bindings, streaming)
        events = [e async for e in client.send_message(SendMessageRequest(message=user_message("echo 'hi sdk'")))]
        out["members"] = [e.WhichOneof("payload") for e in events]
        last = events[-1]
        final = last.task if last.HasField("task") else None
        task_id = events[0].task.id if events[0].HasField("task") else last.status_update.task_id
        got = await client.get_task(GetTaskRequest(id=task_id, history_length=1))
        out["state"] = TaskState.Name(got.status.state)
        out["text"] = "".join(p.text for a in got.artifacts for p in a.parts if a.artifact_id == "stdout")
        out["runtime_kind"] = got.metadata["runtime.kind"]
        out["history"] = len(got.history)
        if final is not None:
            out["final_state"] = TaskState.Name(final.status.state)
        listed = await client.list_tasks(ListTasksRequest(page_size=10))
        out["listed"] = [t.id for t in listed.tasks]
        out["total"] = listed.total_size
        out["task_id"] = task_id
        for name, call in (
            ("cancel_done", lambda: client.cancel_task(CancelTaskRequest(id=task_id))),
            ("get_unknown", lambda: client.get_task(GetTaskRequest(id=str(uuid.uuid4())))),
            (
                "push",
                lambda: client.create_task_push_notification_config(
                    TaskPushNotificationConfig(task_id=task_id, url="http://127.0.0.1:9/hook")
                ),
            ),
        ):
            try:
                await call()
            except Exception as exc:
                out[name] = type(exc)
        card = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
        out["card_name"] = card.name
        out |= await cancel_a_long_task(client, streaming)
        await client.close()
    # Without the runtime/v1 activation the SDK gets its mapped error.
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {agent.token}"}, timeout=30) as http:
        client = await sdk_client(agent, http, bindings, streaming)
        out["no_extension"] = await refused_without_runtime(client)
    return out


@pytest.mark.parametrize("streaming", [False, True], ids=["send", "stream"])
@pytest.mark.parametrize("bindings", [[], ["HTTP+JSON"]], ids=["jsonrpc-default", "http-json"])
async def test_sdk_client_drives_every_operation(
    admin: httpx.AsyncClient, controller: LiveController, bindings: list[str], streaming: bool
) -> None:
    agent = await new_agent(admin, controller, f"sdk-{len(bindings)}-{int(streaming)}", loadout="shell")
    out = await run_in_asyncio(lambda: scenario(agent, bindings, streaming))
    if streaming:
        assert out["members"][0] == "task" and out["members"][-1] == "status_update"
        assert "artifact_update" in out["members"]
        assert out["subscribed"][0] == "task" and out["subscribed"][-1] == "status_update"
    else:
        assert out["members"] == ["task"] and out["final_state"] == "TASK_STATE_COMPLETED"
    assert out["state"] == "TASK_STATE_COMPLETED" and out["text"] == "hi sdk\n"
    assert out["runtime_kind"] == "host" and out["history"] == 1
    assert out["listed"] == [out["task_id"]] and out["total"] == 1
    assert out["cancel_done"] is TaskNotCancelableError
    assert out["get_unknown"] is TaskNotFoundError
    assert out["push"] is InvalidParamsError  # a loopback webhook, refused by default
    assert out["card_name"] == f"sdk-{len(bindings)}-{int(streaming)}"
    assert out["canceled"] == "TASK_STATE_CANCELED"
    assert out["no_extension"] is ExtensionSupportRequiredError
