"""What every A2A request passes: instance tokens, the instance, A2A-Version, A2A-Extensions."""

from __future__ import annotations

import json
import sqlite3

import httpx

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from tests.controller.a2a.helpers import error_reason, new_agent
from tests.controller.a2a.test_rest import message
from tests.controller.conftest import LiveController


async def test_instance_token_reaches_its_own_instance_only(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    one = await new_agent(admin, controller, "edge-one")
    two = await new_agent(admin, controller, "edge-two")
    assert one.token != two.token
    async with one.client(controller) as client:
        assert (await client.get("/extendedAgentCard")).status_code == 200
        other = await client.get(f"{two.base}/extendedAgentCard")
        assert other.status_code == 404 and error_reason(other) == "INSTANCE_NOT_FOUND"
        missing = await client.get(f"{controller.url}/agents/01930000-0000-7000-8000-000000000000/extendedAgentCard")
        assert missing.status_code == 404 and missing.json()["error"] == other.json()["error"] | {
            "message": missing.json()["error"]["message"]
        }
        # An instance token is no operator credential: on the admin surface it sees its own instance
        # only (what the web console shows it) and may use no operator route.
        listed = await client.get(f"{controller.url}/api/v2/admin/instances")
        assert [item["id"] for item in listed.json()["items"]] == [one.instance_id]
        assert (await client.get(f"{controller.url}/api/v2/admin/events")).status_code == 403
    async with one.client(controller, token="not-a-token") as client:
        response = await client.get("/extendedAgentCard")
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert error_reason(response) == "UNAUTHENTICATED"
    # The admin token is accepted on every instance.
    async with two.client(controller, token=controller.config.admin_token) as client:
        assert (await client.get("/extendedAgentCard")).status_code == 200


async def test_tokens_are_stored_hashed_and_a_new_one_replaces_the_old(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "edge-hash")
    raw = controller.config.database_path.read_bytes()
    for suffix in ("-wal", ""):
        path = controller.config.database_path.with_name(controller.config.database_path.name + suffix)
        if path.exists():
            assert agent.token.encode() not in path.read_bytes()
    assert raw  # the database exists
    with sqlite3.connect(controller.config.database_path) as db:
        [(digest,)] = db.execute("SELECT hash FROM instance_tokens WHERE instance_id = ?", (agent.instance_id,))
    assert len(digest) == 64 and digest != agent.token
    response = await admin.post(f"/api/v2/admin/instances/{agent.instance_id}/a2a-token")
    assert response.status_code == 200, response.text
    fresh = response.json()["token"]
    async with agent.client(controller) as old, agent.client(controller, token=fresh) as new:
        assert (await old.get("/extendedAgentCard")).status_code == 401
        assert (await new.get("/extendedAgentCard")).status_code == 200
    unknown = await admin.post("/api/v2/admin/instances/01930000-0000-7000-8000-000000000000/a2a-token")
    assert unknown.status_code == 404


async def test_a2a_version_rules(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "edge-version", loadout="echo")
    async with httpx.AsyncClient(
        base_url=agent.base, headers={"Authorization": f"Bearer {agent.token}"}, timeout=15
    ) as client:
        sent = await client.post(
            "/message:send",
            json={"message": message("hi")},
            headers={"A2A-Version": "1.0", "A2A-Extensions": RUNTIME_EXTENSION},
        )
        tid = sent.json()["task"]["id"]
        # A missing version means 0.3 (spec §3.6): answered in 0.3's shape, on the standard paths
        # and on the agentic-sandbox /v1/ paths (upstream's own 0.3 shape there).
        for path in (f"/tasks/{tid}", f"/v1/tasks/{tid}"):
            missing = await client.get(path)
            assert missing.status_code == 200, missing.text
            assert missing.json()["kind"] == "task" and missing.json()["status"]["state"] == "completed"
        for v03 in ("0.3", "0.3.0"):
            task = (await client.get(f"/tasks/{tid}", headers={"A2A-Version": v03})).json()
            assert task["kind"] == "task", v03
        for good in ("1.0", "1", "1.7"):
            response = await client.get(f"/tasks/{tid}", headers={"A2A-Version": good})
            assert response.status_code == 200 and response.json()["status"]["state"] == "TASK_STATE_COMPLETED"
        assert "kind" not in (await client.get(f"/tasks/{tid}", params={"A2A-Version": "1.0"})).json()
        for bad in ("99.0", "0.2", "2.0", "one", "1.0.1"):
            response = await client.get("/extendedAgentCard", headers={"A2A-Version": bad})
            assert response.status_code == 400 and error_reason(response) == "VERSION_NOT_SUPPORTED", bad
            response = await client.get("/v1/extendedAgentCard", headers={"A2A-Version": bad})
            assert response.status_code == 400, bad


async def test_unknown_paths_and_methods_answer_in_a2a_form(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "edge-paths")
    async with agent.client(controller) as client:
        response = await client.get("/no/such/operation")
        assert response.status_code == 404 and error_reason(response) == "METHOD_NOT_FOUND"
        response = await client.delete("/extendedAgentCard")
        assert response.status_code == 405 and error_reason(response) == "METHOD_NOT_FOUND"
        # Extension activation is echoed only for what the card declares.
        response = await client.get(
            "/extendedAgentCard", headers={"A2A-Extensions": f"urn:unknown:ext, {RUNTIME_EXTENSION}"}
        )
        assert response.headers["a2a-extensions"] == RUNTIME_EXTENSION


async def test_what_a_strict_client_checks(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "edge-strict", loadout="echo")
    async with agent.client(controller) as client:
        # HTTP+JSON answers in the media type the client used (its body's, else its Accept's).
        for media_type in ("application/json", "application/a2a+json"):
            body = json.dumps({"message": message("hi")}).encode()
            sent = await client.post("/message:send", content=body, headers={"Content-Type": media_type})
            assert sent.status_code == 200 and sent.headers["content-type"] == media_type
            missing = await client.get("/tasks/nope", headers={"Content-Type": media_type})
            assert missing.status_code == 404 and missing.headers["content-type"] == media_type
        task_id = sent.json()["task"]["id"]
        assert (await client.get(f"/tasks/{task_id}")).headers["content-type"] == "application/a2a+json"
        as_json = await client.get(f"/tasks/{task_id}", headers={"Accept": "application/json"})
        assert as_json.headers["content-type"] == "application/json"
        # A body in a media type the binding does not take: 415 here, -32005 on JSON-RPC.
        for path in ("/message:send", f"/tasks/{task_id}/pushNotificationConfigs", "/v1/message:send"):
            refused = await client.post(path, content=b"{}", headers={"Content-Type": "text/plain"})
            assert refused.status_code == 415 and error_reason(refused) == "CONTENT_TYPE_NOT_SUPPORTED", path
        rpc_refused = await client.post("", content=b"{}", headers={"Content-Type": "text/plain"})
        assert rpc_refused.status_code == 200 and rpc_refused.json()["error"]["code"] == -32005
        # JSON-RPC answers application/json (spec §9), whatever the request's media type.
        call = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}
        for media_type in ("application/json", "application/a2a+json"):
            got = await client.post("", content=json.dumps(call).encode(), headers={"Content-Type": media_type})
            assert got.headers["content-type"] == "application/json" and got.json()["result"]["id"] == task_id
        # A push config made at the task's path needs no taskId in its body; a different one is refused.
        configs = f"/tasks/{task_id}/pushNotificationConfigs"
        made = await client.post(configs, json={"url": "https://hooks.example.com/a2a"})
        assert made.status_code == 200 and made.json()["taskId"] == task_id, made.text
        other = await client.post(configs, json={"url": "https://hooks.example.com/a2a", "taskId": "another"})
        assert other.status_code == 400 and error_reason(other) == "INVALID_PARAMS"
