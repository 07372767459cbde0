"""What every A2A request passes: instance tokens, the instance, A2A-Version, A2A-Extensions."""

from __future__ import annotations

import sqlite3

import httpx

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from tests.controller.a2a.helpers import error_reason, new_agent
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
    agent = await new_agent(admin, controller, "edge-version")
    async with httpx.AsyncClient(
        base_url=agent.base, headers={"Authorization": f"Bearer {agent.token}"}, timeout=15
    ) as client:
        missing = await client.get("/extendedAgentCard")
        assert missing.status_code == 400 and error_reason(missing) == "VERSION_NOT_SUPPORTED"
        assert "1.0" in missing.json()["error"]["message"]
        # The agentic-sandbox /v1/ paths read a missing header as 1.0.
        assert (await client.get("/v1/extendedAgentCard")).status_code == 200
        for good in ("1.0", "1", "1.7"):
            assert (await client.get("/extendedAgentCard", headers={"A2A-Version": good})).status_code == 200
        assert (await client.get("/extendedAgentCard", params={"A2A-Version": "1.0"})).status_code == 200
        for bad in ("99.0", "0.3", "2.0", "one", "1.0.1"):
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
