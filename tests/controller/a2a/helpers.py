"""What the A2A tests share: an instance with its token, and clients that speak A2A 1.0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import trio

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from tests.controller.conftest import ADMIN_TOKEN, LiveController, provision, wait_operation

A2A_HEADERS = {"A2A-Version": "1.0", "A2A-Extensions": RUNTIME_EXTENSION}


@dataclass
class Agent:
    """One provisioned instance as an A2A agent: its id, token and base URL."""

    instance_id: str
    token: str
    base: str

    def client(self, controller: LiveController, token: str | None = None, **headers: str) -> httpx.AsyncClient:
        """A client under the agent's base URL with its token (or ``token``) and A2A 1.0 headers."""
        auth = {"Authorization": f"Bearer {token or self.token}"}
        return httpx.AsyncClient(base_url=self.base, headers={**A2A_HEADERS, **auth, **headers}, timeout=15)


async def new_agent(admin: httpx.AsyncClient, controller: LiveController, name: str, **fields: Any) -> Agent:
    response = await admin.post(
        "/api/v2/admin/instances", json={"name": name, "runtime": "host", "start": True, **fields}
    )
    assert response.status_code == 202, response.text
    token = response.json()["a2a_token"]
    op = await wait_operation(admin, response.json()["id"])
    assert op["state"] == "succeeded", op
    instance_id = op["result"]["instance_id"]
    return Agent(instance_id, token, f"{controller.url}/agents/{instance_id}")


async def process_agent(url: str, name: str, loadout: str) -> Agent:
    """A started host instance of a controller running as a process (:class:`ControllerProcess`),
    provisioned once the controller is ready."""
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
        with trio.fail_after(15):
            while (await admin.get("/readyz")).status_code != 200:
                await trio.sleep(0.05)
        body = {"name": name, "runtime": "host", "loadout": loadout, "start": True}
        response = await admin.post("/api/v2/admin/instances", json=body)
        op = await wait_operation(admin, response.json()["id"])
        instance_id = op["result"]["instance_id"]
        return Agent(instance_id, response.json()["a2a_token"], f"{url}/agents/{instance_id}")


def error_reason(response: httpx.Response) -> str:
    body = response.json()
    info = next(d for d in body["error"]["details"] if d["@type"].endswith("ErrorInfo"))
    assert body["error"]["code"] == response.status_code
    assert info["domain"] == "a2a-protocol.org"
    reason: str = info["reason"]
    return reason


__all__ = ["A2A_HEADERS", "Agent", "error_reason", "new_agent", "process_agent", "provision"]
