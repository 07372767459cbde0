"""The JSON-RPC binding's own rules with a raw client: envelopes, error codes, error.data, HTTP status."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.controller.a2a.helpers import new_agent
from tests.controller.a2a.test_rest import message
from tests.controller.conftest import LiveController


def rpc(method: str, params: Any = None, call_id: Any = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": call_id, "method": method}
    if params is not None:
        body["params"] = params
    return body


def reason(body: dict[str, Any]) -> str:
    [info] = [d for d in body["error"]["data"] if d["@type"].endswith("ErrorInfo")]
    return str(info["reason"])


async def test_jsonrpc_methods_and_errors(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rpc-a", loadout="echo")
    other = await new_agent(admin, controller, "rpc-b", loadout="echo")
    async with agent.client(controller) as client:
        sent = (await client.post("", json=rpc("SendMessage", {"message": message("over rpc")}, "call-7"))).json()
        assert sent["id"] == "call-7" and sent["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        task_id = sent["result"]["task"]["id"]
        got = (await client.post("", json=rpc("GetTask", {"id": task_id, "historyLength": 0}))).json()
        assert got["result"]["id"] == task_id and "history" not in got["result"]
        listed = (await client.post("", json=rpc("ListTasks", {"pageSize": 5}))).json()["result"]
        assert listed["totalSize"] == 1 and listed["nextPageToken"] == ""
        async with client.stream(
            "POST", "", json=rpc("SendStreamingMessage", {"message": message("s")}, 9)
        ) as response:
            lines = [json.loads(line[6:]) async for line in response.aiter_lines() if line.startswith("data: ")]
        assert all(item["id"] == 9 and item["jsonrpc"] == "2.0" for item in lines)
        assert (
            "task" in lines[0]["result"]
            and lines[-1]["result"]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        )

        cases = [
            (dict(content=b"{nope", headers={"content-type": "application/json"}), -32700, None),
            (dict(json=[rpc("GetTask", {"id": task_id})]), -32600, "INVALID_REQUEST"),
            (dict(json={"jsonrpc": "1.0", "id": 1, "method": "GetTask"}), -32600, "INVALID_REQUEST"),
            (dict(json={"id": 1, "method": 5}), -32600, "INVALID_REQUEST"),
            (dict(json=rpc("NoSuchMethod")), -32601, "METHOD_NOT_FOUND"),
            (dict(json=rpc("GetTask", {"id": 5})), -32602, "INVALID_PARAMS"),
            (dict(json=rpc("GetTask", {"id": "nope"})), -32001, "TASK_NOT_FOUND"),
            (dict(json=rpc("CancelTask", {"id": task_id})), -32002, "TASK_NOT_CANCELABLE"),
            (dict(json=rpc("SubscribeToTask", {"id": task_id})), -32004, "UNSUPPORTED_OPERATION"),
            (dict(json=rpc("CreateTaskPushNotificationConfig", {"taskId": task_id, "url": "x"})), -32602, None),
            (dict(json=rpc("SendMessage", {"message": {"role": "ROLE_USER"}})), -32602, "INVALID_PARAMS"),
            (dict(content=b"{}", headers={"content-type": "text/plain"}), -32005, "CONTENT_TYPE_NOT_SUPPORTED"),
        ]
        for kwargs, code, why in cases:
            response = await client.post("", **kwargs)
            assert response.status_code == 200, (kwargs, response.text)
            body = response.json()
            assert body["jsonrpc"] == "2.0" and body["error"]["code"] == code, (kwargs, body)
            if why is not None:
                assert reason(body) == why, (kwargs, body)
        version = await client.post("", json=rpc("GetTask", {"id": task_id}), headers={"A2A-Version": "0.3"})
        assert version.json()["error"]["code"] == -32009
    async with agent.client(controller, **{"A2A-Extensions": ""}) as client:
        body = (await client.post("", json=rpc("SendMessage", {"message": message("x")}))).json()
        assert body["error"]["code"] == -32008 and reason(body) == "EXTENSION_SUPPORT_REQUIRED"
    async with agent.client(controller, token="wrong-token") as client:
        response = await client.post("", json=rpc("GetTask", {"id": "x"}))
        assert response.status_code == 401 and response.json()["error"]["code"] == -32600
    async with agent.client(controller) as client:
        response = await client.post(other.base, json=rpc("GetTask", {"id": "x"}))
        assert response.status_code == 404 and reason(response.json()) == "INSTANCE_NOT_FOUND"
