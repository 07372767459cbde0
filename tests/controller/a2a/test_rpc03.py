"""A2A 0.3's JSON-RPC methods with a raw client (what a2a-sdk 0.3 itself does is in
tests/scenarios/test_v03_clients.py): the methods its client has no call for (push config list
and delete), 0.3's results and errors, the version a method needs."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from a2a.compat.v0_3 import types as t03

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from tests.controller.a2a.helpers import new_agent
from tests.controller.a2a.test_jsonrpc import reason, rpc
from tests.controller.conftest import LiveController


def message(text: str, **fields: Any) -> dict[str, Any]:
    return {
        "kind": "message",
        "messageId": str(uuid.uuid4()),
        "role": "user",
        "parts": [{"kind": "text", "text": text}],
    } | fields


def client_for(agent: Any, **headers: str) -> httpx.AsyncClient:
    """No A2A-Version (a 0.3 client sends none), 0.3's extensions header."""
    auth = {"Authorization": f"Bearer {agent.token}", "X-A2A-Extensions": RUNTIME_EXTENSION}
    return httpx.AsyncClient(base_url=agent.base, headers=auth | headers, timeout=15)


async def test_0_3_methods_results_and_push_configs(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rpc03-a", loadout="shell")
    async with client_for(agent) as client:
        response = await client.post("", json=rpc("message/send", {"message": message("exit 3")}, "s-1"))
        assert response.headers["content-type"] == "application/json"
        assert response.headers["x-a2a-extensions"] == response.headers["a2a-extensions"] == RUNTIME_EXTENSION
        sent = response.json()
        assert sent["id"] == "s-1"
        task = t03.SendMessageSuccessResponse.model_validate(sent).result
        assert isinstance(task, t03.Task) and task.status.state == t03.TaskState.failed
        status = sent["result"]["status"]
        assert status["fail_kind"] == "application" and status["terminal_at"] == status["timestamp"]
        assert sent["result"]["metadata"]["exit_code"] == 3 and sent["result"]["metadata"]["fail_kind"] == "application"
        task_id = task.id

        got = (await client.post("", json=rpc("tasks/get", {"id": task_id, "historyLength": 1}))).json()
        assert got["result"]["kind"] == "task" and got["result"]["history"][0]["role"] == "user"

        async with client.stream("POST", "", json=rpc("message/stream", {"message": message("echo hi")}, 9)) as stream:
            items = [json.loads(line[6:]) async for line in stream.aiter_lines() if line.startswith("data: ")]
        events = [t03.SendStreamingMessageSuccessResponse.model_validate(item).result for item in items]
        assert all(item["id"] == 9 for item in items) and isinstance(events[0], t03.Task)
        finals = [e.final for e in events if isinstance(e, t03.TaskStatusUpdateEvent)]
        assert finals[-1] is True and not any(finals[:-1])
        assert any(isinstance(e, t03.TaskArtifactUpdateEvent) for e in events)

        hook = {
            "url": "https://hooks.example.com/x",
            "token": "t",
            "authentication": {"schemes": ["Bearer"], "credentials": "s"},
        }
        made = (await client.post("", json=rpc(
            "tasks/pushNotificationConfig/set", {"taskId": task_id, "pushNotificationConfig": hook}
        ))).json()["result"]  # fmt: skip
        config = t03.TaskPushNotificationConfig.model_validate(made)
        config_id = config.push_notification_config.id
        assert (
            config.task_id == task_id
            and config_id
            and "credentials" not in made["pushNotificationConfig"]["authentication"]
        )
        # Without a config id, get answers the task's config (0.3's TaskIdParams form).
        first = (await client.post("", json=rpc("tasks/pushNotificationConfig/get", {"id": task_id}))).json()
        assert first["result"] == made
        ref = {"id": task_id, "pushNotificationConfigId": config_id}
        assert (await client.post("", json=rpc("tasks/pushNotificationConfig/get", ref))).json()["result"] == made
        listed = (await client.post("", json=rpc("tasks/pushNotificationConfig/list", {"id": task_id}))).json()
        assert listed["result"] == [made]  # 0.3's list is a bare array
        deleted = (await client.post("", json=rpc("tasks/pushNotificationConfig/delete", ref))).json()
        assert "error" not in deleted and deleted["result"] is None
        assert (await client.post("", json=rpc("tasks/pushNotificationConfig/list", {"id": task_id}))).json()[
            "result"
        ] == []
        gone = (await client.post("", json=rpc("tasks/pushNotificationConfig/get", {"id": task_id}))).json()
        assert (
            gone["error"]["code"] == -32001 and gone["error"]["data"][0]["metadata"]["code"] == "push.config_not_found"
        )

        card = (await client.post("", json=rpc("agent/getAuthenticatedExtendedCard"))).json()["result"]
        assert t03.AgentCard.model_validate(card).url == agent.base


async def test_0_3_errors_and_the_version_a_method_needs(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rpc03-b", loadout="echo")
    async with client_for(agent) as client:
        cases = [
            (rpc("tasks/get", {"id": "nope"}), -32001, "TASK_NOT_FOUND"),
            (rpc("tasks/get", {"id": 5}), -32602, "INVALID_PARAMS"),
            (rpc("message/send", {"message": {"kind": "message", "role": "user"}}), -32602, "INVALID_PARAMS"),
            # A 1.0 method without A2A-Version: 1.0 (missing means 0.3), and 1.0's codes 0.3 lacks.
            (rpc("GetTask", {"id": "nope"}), -32009, "VERSION_NOT_SUPPORTED"),
            (rpc("tasks/nothing"), -32601, "METHOD_NOT_FOUND"),
        ]
        for body, code, why in cases:
            response = await client.post("", json=body)
            assert response.status_code == 200 and response.headers["content-type"] == "application/json"
            error = response.json()["error"]
            assert error["code"] == code and reason(response.json()) == why, (body, error)
        # A 0.3 method in a request that says 1.0: the version is not 0.3's (as 0.3 says it: -32600).
        response = await client.post("", json=rpc("tasks/get", {"id": "x"}), headers={"A2A-Version": "1.0"})
        assert response.json()["error"]["code"] == -32600 and reason(response.json()) == "VERSION_NOT_SUPPORTED"
        # The explicit version is the same as none.
        response = await client.post("", json=rpc("tasks/get", {"id": "x"}), headers={"A2A-Version": "0.3"})
        assert reason(response.json()) == "TASK_NOT_FOUND"
        response = await client.post("", content=b"{}", headers={"content-type": "text/plain"})
        assert response.status_code == 200 and response.json()["error"]["code"] == -32005
    async with client_for(agent, **{"X-A2A-Extensions": ""}) as client:
        body = (await client.post("", json=rpc("message/send", {"message": message("x")}))).json()
        assert body["error"]["code"] == -32600 and reason(body) == "EXTENSION_SUPPORT_REQUIRED"
    async with client_for(agent, Authorization="Bearer wrong") as client:
        response = await client.post("", json=rpc("tasks/get", {"id": "x"}))
        assert response.status_code == 401 and response.json()["error"]["code"] == -32600
        t03.JSONRPCErrorResponse.model_validate(response.json())
