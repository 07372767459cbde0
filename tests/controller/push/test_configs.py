"""Push notification configs over both bindings, both path families and the a2a-sdk client."""

from __future__ import annotations

from typing import Any

import httpx
from a2a.types import (
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import InvalidParamsError

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from tests.controller.a2a.helpers import Agent, error_reason, new_agent
from tests.controller.a2a.test_sdk_client import run_in_asyncio, sdk_client
from tests.controller.conftest import LiveController


def message(text: str, **fields: Any) -> dict[str, Any]:
    return {"messageId": f"m-{text}-{len(fields)}", "role": "ROLE_USER", "parts": [{"text": text}], **fields}


def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


async def a_task(client: httpx.AsyncClient, text: str = "sleep 30") -> str:
    response = await client.post(
        "/message:send", json={"message": message(text), "configuration": {"returnImmediately": True}}
    )
    assert response.status_code == 200, response.text
    task_id: str = response.json()["task"]["id"]
    return task_id


async def test_configs_on_both_path_families(push_admin: httpx.AsyncClient, push_controller: LiveController) -> None:
    agent = await new_agent(push_admin, push_controller, "push-rest", loadout="shell")
    async with agent.client(push_controller) as client:
        task_id = await a_task(client)
        for prefix in ("", "/v1"):
            base = f"{prefix}/tasks/{task_id}/pushNotificationConfigs"
            body = {
                "url": "http://127.0.0.1:9/hook",
                "token": "tok",
                "authentication": {"scheme": "Bearer", "credentials": "s3cret"},
            }
            made = await client.post(base, json=body)
            assert made.status_code == 200, made.text
            config = made.json()
            assert config["taskId"] == task_id and config["url"] == body["url"] and config["token"] == "tok"
            assert config["authentication"] == {"scheme": "Bearer"}  # the credentials are never shown
            got = await client.get(f"{base}/{config['id']}")
            assert got.status_code == 200 and got.json() == config
            named = await client.post(base, json={"url": "http://127.0.0.1:9/other", "id": f"mine{prefix[1:]}"})
            assert named.json()["id"] == f"mine{prefix[1:]}"
            listed = (await client.get(base)).json()
            assert {c["id"] for c in listed["configs"]} == {config["id"], f"mine{prefix[1:]}"}
            assert listed["nextPageToken"] == ""
            page = (await client.get(base, params={"pageSize": "1"})).json()
            assert len(page["configs"]) == 1 and page["nextPageToken"]
            rest = (await client.get(base, params={"pageSize": "1", "pageToken": page["nextPageToken"]})).json()
            assert len(rest["configs"]) == 1 and rest["configs"][0]["id"] != page["configs"][0]["id"]
            for _ in range(2):  # delete is idempotent
                deleted = await client.delete(f"{base}/{config['id']}")
                assert deleted.status_code == 200 and deleted.json() == {}
            missing = await client.get(f"{base}/{config['id']}")
            assert missing.status_code == 404
            await client.delete(f"{base}/mine{prefix[1:]}")
            assert (await client.get(base)).json()["configs"] == []
        await client.post(f"/tasks/{task_id}:cancel")


async def test_bad_configs_are_refused(push_admin: httpx.AsyncClient, push_controller: LiveController) -> None:
    agent = await new_agent(push_admin, push_controller, "push-bad", loadout="shell")
    other = await new_agent(push_admin, push_controller, "push-other", loadout="shell")
    async with agent.client(push_controller) as client:
        task_id = await a_task(client)
        base = f"/tasks/{task_id}/pushNotificationConfigs"
        for body in (
            {},
            {"url": ""},
            {"url": "ftp://127.0.0.1/x"},
            {"url": "http:///nohost"},
            {"url": "http://user:pw@127.0.0.1/x"},
            {"url": "http://127.0.0.1/" + "x" * 5000},
            {"url": "http://127.0.0.1/x", "authentication": {"scheme": "Bearer", "credentials": "a\r\nX-Evil: 1"}},
            {"url": "http://127.0.0.1/x", "taskId": "another"},
        ):
            response = await client.post(base, json=body)
            assert response.status_code == 400, (body, response.text)
            assert error_reason(response) == "INVALID_PARAMS", (body, response.text)
        # A name is resolved at delivery, not here: DNS down for a moment must not lose a config.
        unresolved = await client.post(base, json={"url": "http://no-such-host.invalid/x"})
        assert unresolved.status_code == 200, unresolved.text
        await client.delete(f"{base}/{unresolved.json()['id']}")
        unknown = await client.post("/tasks/nope/pushNotificationConfigs", json={"url": "http://127.0.0.1/x"})
        assert unknown.status_code == 404 and error_reason(unknown) == "TASK_NOT_FOUND"
        many = [await client.post(base, json={"url": f"http://127.0.0.1/{n}"}) for n in range(17)]
        assert [r.status_code for r in many].count(200) == 16 and many[-1].status_code == 400
        await client.post(f"/tasks/{task_id}:cancel")
    async with other.client(push_controller) as client:  # another instance's task is not found
        response = await client.get(f"/tasks/{task_id}/pushNotificationConfigs")
        assert response.status_code == 404 and error_reason(response) == "TASK_NOT_FOUND"
    async with agent.client(push_controller, **{"A2A-Extensions": ""}) as client:
        response = await client.get(f"/tasks/{task_id}/pushNotificationConfigs")
        assert error_reason(response) == "EXTENSION_SUPPORT_REQUIRED"


async def test_loopback_webhooks_are_refused_by_default(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "push-private", loadout="shell")
    async with agent.client(controller) as client:
        task_id = await a_task(client)
        for url in ("http://127.0.0.1:8080/hook", "http://localhost/hook", "http://[::1]/hook", "http://10.1.2.3/"):
            response = await client.post(f"/tasks/{task_id}/pushNotificationConfigs", json={"url": url})
            assert response.status_code == 400, response.text
            assert error_reason(response) == "INVALID_PARAMS"
            assert "AIWG_PUSH_ALLOW_PRIVATE" in response.json()["error"]["message"]
        inline = {"taskPushNotificationConfig": {"url": "http://127.0.0.1:8080/hook"}, "returnImmediately": True}
        response = await client.post("/message:send", json={"message": message("echo x"), "configuration": inline})
        assert response.status_code == 400 and error_reason(response) == "INVALID_PARAMS"
        assert (await client.get("/tasks")).json()["totalSize"] == 1  # no task was made for the refused send
        await client.post(f"/tasks/{task_id}:cancel")


async def test_configs_over_jsonrpc(push_admin: httpx.AsyncClient, push_controller: LiveController) -> None:
    agent = await new_agent(push_admin, push_controller, "push-rpc", loadout="shell")
    async with agent.client(push_controller) as client:
        task_id = await a_task(client)
        made = (
            await client.post(
                "", json=rpc("CreateTaskPushNotificationConfig", {"taskId": task_id, "url": "http://127.0.0.1:9/h"})
            )
        ).json()
        config_id = made["result"]["id"]
        assert made["result"]["taskId"] == task_id
        ref = {"taskId": task_id, "id": config_id}
        got = (await client.post("", json=rpc("GetTaskPushNotificationConfig", ref))).json()
        assert got["result"] == made["result"]
        listed = (await client.post("", json=rpc("ListTaskPushNotificationConfigs", {"taskId": task_id}))).json()
        assert [c["id"] for c in listed["result"]["configs"]] == [config_id]
        deleted = (await client.post("", json=rpc("DeleteTaskPushNotificationConfig", ref))).json()
        assert deleted["result"] == {}
        missing = (await client.post("", json=rpc("GetTaskPushNotificationConfig", ref))).json()
        assert missing["error"]["code"] == -32001
        no_task = await client.post("", json=rpc("CreateTaskPushNotificationConfig", {"url": "http://127.0.0.1/"}))
        assert no_task.json()["error"]["code"] == -32602
        await client.post(f"/tasks/{task_id}:cancel")


async def sdk_scenario(agent: Agent, task_id: str, bindings: list[str]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {agent.token}", "A2A-Extensions": RUNTIME_EXTENSION}
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        client = await sdk_client(agent, http, bindings, False)
        made = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, url="http://127.0.0.1:9/sdk", token="t")
        )
        out["made"] = (made.task_id, made.url, made.token)
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task_id, id=made.id)
        )
        out["got"] = got.id == made.id
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        out["listed"] = [c.id for c in listed.configs] == [made.id]
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task_id, id=made.id)
        )
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        out["after_delete"] = list(listed.configs)
        try:
            await client.create_task_push_notification_config(TaskPushNotificationConfig(task_id=task_id, url="x"))
        except Exception as exc:
            out["bad"] = type(exc)
        await client.close()
    return out


async def test_sdk_client_manages_configs(push_admin: httpx.AsyncClient, push_controller: LiveController) -> None:
    agent = await new_agent(push_admin, push_controller, "push-sdk", loadout="shell")
    async with agent.client(push_controller) as client:
        task_id = await a_task(client)
        for bindings in ([], ["HTTP+JSON"]):
            out = await run_in_asyncio(lambda b=bindings: sdk_scenario(agent, task_id, b))  # type: ignore[misc]
            assert out["made"] == (task_id, "http://127.0.0.1:9/sdk", "t")
            assert out["got"] and out["listed"] and out["after_delete"] == []
            assert out["bad"] is InvalidParamsError
        await client.post(f"/tasks/{task_id}:cancel")
