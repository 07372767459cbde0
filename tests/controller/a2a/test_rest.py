"""The HTTP+JSON binding end to end: tasks run by a real hostd, the controller on loopback, httpx."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psutil
import trio

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from tests.contracts import validate_runtime
from tests.controller.a2a.helpers import error_reason, new_agent
from tests.controller.conftest import LiveController, LiveHostd


def message(text: str, **fields: Any) -> dict[str, Any]:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **fields}


async def send(client: httpx.AsyncClient, text: str, path: str = "/message:send", **body: Any) -> httpx.Response:
    return await client.post(path, json={"message": message(text), **body})


async def settled(client: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    with trio.fail_after(20):
        while True:
            task = (await client.get(f"/tasks/{task_id}")).json()
            if task["status"]["state"] not in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"):
                return task
            await trio.sleep(0.05)


def text_of(task: dict[str, Any], artifact_id: str) -> str:
    [artifact] = [a for a in task.get("artifacts", []) if a["artifactId"] == artifact_id]
    return "".join(p["text"] for p in artifact["parts"])


async def test_echo_send_blocks_until_done_with_output_runtime_metadata_and_history(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "rest-echo", loadout="echo")
    async with agent.client(controller) as client:
        response = await send(client, "hello, agent", metadata={"app.key": "kept", "runtime.kind": "vm"})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/json"  # the media type the client used
        assert response.headers["a2a-extensions"] == RUNTIME_EXTENSION
        task = response.json()["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        assert text_of(task, "stdout") == "hello, agent"
        meta = task["metadata"]
        validate_runtime("task-metadata", meta)
        assert meta["runtime.instance_id"] == agent.instance_id and meta["runtime.kind"] == "host"
        assert "runtime.host" not in meta  # an instance token: the host name is not disclosed
        assert meta["app.key"] == "kept"
        assert "kagent.dev/a2a/task-created-at" in meta
        [first] = task["history"]
        assert first["role"] == "ROLE_USER" and first["parts"] == [{"text": "hello, agent"}]
        assert first["taskId"] == task["id"] and first["contextId"] == task["contextId"]
        assert "kagent.dev/a2a/timeline-position" in first["metadata"]
        assert "kagent.dev/a2a/timeline-position" in task["artifacts"][0]["metadata"]
        # The same task read back (and by an operator token, which sees the host name).
        again = (await client.get(f"/tasks/{task['id']}", params={"historyLength": 0})).json()
        assert "history" not in again and again["status"] == task["status"]
    async with agent.client(controller, token=controller.config.admin_token) as client:
        as_admin = (await client.get(f"/tasks/{task['id']}")).json()
        assert as_admin["metadata"]["runtime.host"]


async def test_shell_outcomes_streams_and_caller_owned_keys(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "rest-shell", loadout="shell")
    async with agent.client(controller) as client:
        ok = (await send(client, "echo out; echo err >&2")).json()["task"]
        assert ok["status"]["state"] == "TASK_STATE_COMPLETED"
        assert text_of(ok, "stdout") == "out\n" and text_of(ok, "stderr") == "err\n"
        failed = (await send(client, "exit 3")).json()["task"]
        assert failed["status"]["state"] == "TASK_STATE_FAILED"
        assert failed["metadata"]["failKind"] == "application" and failed["metadata"]["exitCode"] == 3
        assert not {"fail_kind", "exit_code"} & set(failed["metadata"])  # camelCase on the 1.0 wire
        assert failed["status"]["message"]["role"] == "ROLE_AGENT"
        forged = message("true", metadata={"kagent.dev/a2a/timeline-position": "1999-01-01T00:00:00Z"})
        task = (await client.post("/message:send", json={"message": forged})).json()["task"]
        assert task["history"][0]["metadata"]["kagent.dev/a2a/timeline-position"] != "1999-01-01T00:00:00Z"


async def test_return_immediately_then_cancel_kills_the_tree(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "rest-cancel", loadout="shell")
    async with agent.client(controller) as client:
        marker = f"sleep 3{uuid.uuid4().int % 1000}"
        response = await send(client, f"{marker} & wait", configuration={"returnImmediately": True})
        task = response.json()["task"]
        assert task["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
        with trio.fail_after(10):
            while not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == marker.split()]:
                await trio.sleep(0.05)
        canceled = await client.post(f"/tasks/{task['id']}:cancel")
        assert canceled.status_code == 200, canceled.text
        assert canceled.json()["status"]["state"] == "TASK_STATE_CANCELED"
        left = [p for p in psutil.process_iter(["cmdline", "status"]) if p.info["cmdline"] == marker.split()]
        assert all(p.info["status"] == psutil.STATUS_ZOMBIE for p in left), left
        again = await client.post(f"/tasks/{task['id']}:cancel")
        assert again.status_code == 400 and error_reason(again) == "TASK_NOT_CANCELABLE"
        # A message to a terminal task is refused.
        follow = await client.post("/message:send", json={"message": message("more", taskId=task["id"])})
        assert follow.status_code == 400 and error_reason(follow) == "UNSUPPORTED_OPERATION"


async def test_list_filters_and_pages(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rest-list", loadout="echo")
    other = await new_agent(admin, controller, "rest-list-other", loadout="echo")
    async with agent.client(controller) as client, other.client(controller) as other_client:
        ids = []
        for n in range(5):
            body = {"message": message(f"m{n}", contextId="ctx-a" if n % 2 else "ctx-b")}
            ids.append((await client.post("/message:send", json=body)).json()["task"]["id"])
        await send(other_client, "elsewhere")
        page = (await client.get("/tasks", params={"pageSize": 2})).json()
        assert set(page) == {"tasks", "nextPageToken", "pageSize", "totalSize"}
        assert page["pageSize"] == 2 and page["totalSize"] == 5 and page["nextPageToken"]
        assert all("artifacts" not in t for t in page["tasks"])
        seen = [t["id"] for t in page["tasks"]]
        while page["nextPageToken"]:
            page = (await client.get("/tasks", params={"pageSize": 2, "pageToken": page["nextPageToken"]})).json()
            seen += [t["id"] for t in page["tasks"]]
        assert seen == list(reversed(ids))  # newest status first, each once
        ctx = (await client.get("/tasks", params={"contextId": "ctx-a", "includeArtifacts": "true"})).json()
        assert ctx["totalSize"] == 2 and ctx["nextPageToken"] == ""
        assert all(t["artifacts"] for t in ctx["tasks"])
        done = (await client.get("/tasks", params={"status": "TASK_STATE_COMPLETED"})).json()
        assert done["totalSize"] == 5
        assert (await client.get("/tasks", params={"status": "TASK_STATE_FAILED"})).json()["tasks"] == []
        for bad in (
            {"pageSize": 0},
            {"pageSize": 101},
            {"pageToken": "garbage!"},
            {"status": "done"},
            {"pageSize": "x"},
        ):
            response = await client.get("/tasks", params=bad)
            assert response.status_code == 400 and error_reason(response) == "INVALID_PARAMS", bad
        # Another instance's task is not found here, even for the admin token.
        theirs = (await other_client.get("/tasks")).json()["tasks"][0]["id"]
        missing = await client.get(f"/tasks/{theirs}")
        assert missing.status_code == 404 and error_reason(missing) == "TASK_NOT_FOUND"


async def test_bad_input_gets_a2a_errors(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rest-bad", loadout="echo")
    async with agent.client(controller) as client:
        cases = [
            (dict(content=b"{not json", headers={"content-type": "application/json"}), "INVALID_REQUEST"),
            (dict(json={"message": {"messageId": 1, "role": "ROLE_USER", "parts": []}}), "INVALID_PARAMS"),
            (dict(json={"message": message("x") | {"role": "user"}}), "INVALID_PARAMS"),
            (dict(json={"message": message("x") | {"parts": [{"text": "a", "data": 1}]}}), "INVALID_PARAMS"),
            (dict(json={"nomessage": True}), "INVALID_PARAMS"),
            (dict(content=b"{}", headers={"content-type": "text/plain"}), "CONTENT_TYPE_NOT_SUPPORTED"),
            (dict(json={"message": message("x", taskId="nope")}), "TASK_NOT_FOUND"),
            (dict(json={"message": message("x", referenceTaskIds=["nope"])}), "TASK_NOT_FOUND"),
            (
                dict(json={"message": message("x"), "configuration": {"taskPushNotificationConfig": {"url": "x"}}}),
                "INVALID_PARAMS",
            ),
        ]
        for kwargs, reason in cases:
            response = await client.post("/message:send", **kwargs)
            assert response.status_code in (400, 404, 415), (kwargs, response.text)
            assert error_reason(response) == reason, (kwargs, response.text)
            assert (response.status_code == 415) == (reason == "CONTENT_TYPE_NOT_SUPPORTED")
        typed = await client.post("/message:send", json={"message": {"messageId": 1, "role": "ROLE_USER"}})
        violations = [d for d in typed.json()["error"]["details"] if d["@type"].endswith("BadRequest")]
        assert violations and violations[0]["fieldViolations"][0]["field"].startswith("message")
        big = await client.post("/message:send", content=b" " * (controller.config.max_request_bytes + 1))
        assert big.status_code == 413 and error_reason(big) == "INVALID_REQUEST"
        for path in ("/tasks/x/pushNotificationConfigs", "/v1/tasks/x/pushNotificationConfigs"):
            response = await client.post(path, json={"url": "http://127.0.0.1/"})
            assert response.status_code == 404 and error_reason(response) == "TASK_NOT_FOUND"
        unknown = await client.get("/tasks/01930000-0000-7000-8000-000000000000")
        assert unknown.status_code == 404 and error_reason(unknown) == "TASK_NOT_FOUND"
        assert (await client.get("/tasks/x", params={"historyLength": "-1"})).status_code == 400
    # runtime/v1 is required on send (RUNTIME-CONF-003).
    async with agent.client(controller, **{"A2A-Extensions": ""}) as client:
        response = await send(client, "x")
        assert response.status_code == 400 and error_reason(response) == "EXTENSION_SUPPORT_REQUIRED"
        body = response.text
        assert "EXTENSION_REQUIRED" in body and RUNTIME_EXTENSION in body


async def test_v1_paths_answer_through_the_same_handlers(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rest-v1", loadout="shell")
    async with httpx.AsyncClient(
        base_url=agent.base,
        headers={"Authorization": f"Bearer {agent.token}", "A2A-Extensions": RUNTIME_EXTENSION},
        timeout=15,
    ) as client:  # no A2A-Version: 0.3, in upstream's shape on its /v1/ paths (kind, lowercase states)
        body = {
            "message": {"messageId": str(uuid.uuid4()), "role": "user", "parts": [{"kind": "text", "text": "sleep 30"}]}
        }
        task = (await client.post("/v1/messages:send", json=body | {"configuration": {"blocking": False}})).json()
        assert task["kind"] == "task" and task["status"]["state"] in ("submitted", "working"), task
        tid = task["id"]
        got = (await client.get(f"/v1/tasks/{tid}")).json()
        assert got["id"] == tid and got["kind"] == "task"
        assert tid in [t["id"] for t in (await client.get("/v1/tasks")).json()["tasks"]]
        canceled = await client.post(f"/v1/tasks/{tid}/cancel")
        assert canceled.status_code == 200, canceled.text
        status = canceled.json()["status"]
        assert status["state"] == "canceled" and status["terminal_at"] == status["timestamp"]
        # The same paths in 1.0 when the request says so.
        one = await client.get(f"/v1/tasks/{tid}", headers={"A2A-Version": "1.0"})
        assert one.json()["status"]["state"] == "TASK_STATE_CANCELED" and "kind" not in one.json()


async def test_hostd_gone_fails_the_send_closed_and_the_task_with_infrastructure(
    admin: httpx.AsyncClient, controller: LiveController, hostd: LiveHostd
) -> None:
    agent = await new_agent(admin, controller, "rest-down", loadout="echo")
    await hostd.stop()
    async with agent.client(controller) as client:
        with trio.fail_after(10):
            while controller.state.link.ready:
                await trio.sleep(0.05)
        response = await send(client, "anyone?")
        assert response.status_code == 503 and response.json()["error"]["status"] == "UNAVAILABLE"
        [task] = (await client.get("/tasks")).json()["tasks"]
        assert task["status"]["state"] == "TASK_STATE_FAILED"
        assert task["metadata"]["failKind"] == "infrastructure"
