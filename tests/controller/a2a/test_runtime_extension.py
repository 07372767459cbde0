"""runtime/v1 (upstream spec 1.2.0): RUNTIME-CONF-001..008, one test each, and conformance mode."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import trio

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION, runtime_params
from agentic_sandbox.controller.a2a.views import runtime_metadata
from agentic_sandbox.controller.config import load_config
from agentic_sandbox.controller.store import InstanceRecord
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.contracts import validate_runtime
from tests.controller.a2a.helpers import A2A_HEADERS, error_reason, new_agent
from tests.controller.a2a.test_rest import message, send
from tests.controller.conftest import ADMIN_TOKEN, LiveController, LiveHostd, controller_env, serve_controller

UUID_V4_OR_V7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[47][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


async def card_of(client: httpx.AsyncClient, instance_id: str) -> dict[str, Any]:
    response = await client.get(f"/agents/{instance_id}/.well-known/agent-card.json")
    assert response.status_code == 200, response.text
    return dict(response.json())


def runtime_entries(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in card["capabilities"]["extensions"] if e["uri"] == RUNTIME_EXTENSION]


async def test_conf_001_one_required_entry_with_valid_params(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "rt-one", loadout="echo")
    [entry] = runtime_entries(await card_of(admin, agent.instance_id))
    assert entry["required"] is True
    validate_runtime("params", entry["params"])


async def test_conf_002_activation_is_echoed(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rt-echo", loadout="echo")
    async with agent.client(controller, **{"A2A-Extensions": RUNTIME_EXTENSION.upper().replace("HTTPS", "https")}) as c:
        response = await send(c, "x")
    assert response.status_code == 200
    # Compared case-insensitively, echoed as the client spelt it.
    assert response.headers["a2a-extensions"].lower() == RUNTIME_EXTENSION.lower()
    async with agent.client(controller) as c:
        response = await c.get(f"/tasks/{response.json()['task']['id']}")
    assert response.headers["a2a-extensions"] == RUNTIME_EXTENSION


async def test_conf_003_missing_activation_is_extension_required(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "rt-miss", loadout="echo")
    async with agent.client(controller, **{"A2A-Extensions": "urn:something:else"}) as c:
        for path in ("/message:send", "/message:stream", "/v1/messages:send"):
            response = await c.post(path, json={"message": message("x")})
            assert response.status_code == 400, path
            assert error_reason(response) == "EXTENSION_SUPPORT_REQUIRED"
            error = response.json()["error"]
            assert "EXTENSION_REQUIRED" in error["message"] and RUNTIME_EXTENSION in error["message"]
            assert error["details"][0]["metadata"]["extension"] == RUNTIME_EXTENSION
            assert "a2a-extensions" not in response.headers  # nothing was activated


async def test_conf_004_task_metadata_equals_the_card_on_get_list_send_stream_subscribe(
    admin: httpx.AsyncClient, controller: LiveController, tmp_path: Path
) -> None:
    agent = await new_agent(admin, controller, "rt-meta", loadout="shell")
    params = runtime_entries(await card_of(admin, agent.instance_id))[0]["params"]
    # The capabilities are the provider's own of this instance (hostd's), as the admin API shows them.
    shown = (await admin.get(f"/api/v2/admin/instances/{agent.instance_id}")).json()
    assert params["capabilities"] == shown["capabilities"] and "exec" in params["capabilities"]
    seen: list[dict[str, Any]] = []
    async with agent.client(controller) as c:
        sent = (await send(c, "true")).json()["task"]
        seen.append(sent["metadata"])
        seen.append((await c.get(f"/tasks/{sent['id']}")).json()["metadata"])
        seen += [t["metadata"] for t in (await c.get("/tasks")).json()["tasks"]]
        gate = tmp_path / "gate"  # the streamed task runs until the subscriber below has its Task
        script = f"while [ ! -e {gate} ]; do sleep 0.02; done"
        async with c.stream("POST", "/message:stream", json={"message": message(script)}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    first = json.loads(line[6:])["task"]
                    seen.append(first["metadata"])
                    async with (
                        agent.client(controller) as other,
                        other.stream("POST", f"/tasks/{first['id']}:subscribe") as sub,
                    ):
                        async for sub_line in sub.aiter_lines():
                            if sub_line.startswith("data: "):
                                seen.append(json.loads(sub_line[6:])["task"]["metadata"])
                                break
                    gate.touch()
                    break
    assert len(seen) >= 5
    for meta in seen:
        validate_runtime("task-metadata", meta)
        assert meta["runtime.instance_id"] == params["instance_id"]
        assert meta["runtime.kind"] == params["runtime"]
        assert meta["runtime.provider"] == params["provider"]
        assert meta["runtime.capabilities"] == params["capabilities"]
        assert "runtime.host" not in meta  # policy: not for an instance token
    async with agent.client(controller, token=ADMIN_TOKEN) as c:
        meta = (await c.get(f"/tasks/{sent['id']}")).json()["metadata"]
        assert meta["runtime.host"].strip()  # present and non-empty where policy allows


async def test_conf_005_no_image_ref_for_host(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rt-image", loadout="echo")
    params = runtime_entries(await card_of(admin, agent.instance_id))[0]["params"]
    assert params["runtime"] == "host" and "image_ref" not in params


async def test_conf_006_instance_id_is_byte_identical_across_fetches(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "rt-stable", loadout="echo")
    raw = [(await admin.get(f"/agents/{agent.instance_id}/.well-known/agent-card.json")).content for _ in range(3)]
    ids = {json.loads(r)["capabilities"]["extensions"][0]["params"]["instance_id"].encode() for r in raw}
    assert ids == {agent.instance_id.encode()}


async def test_conf_007_uuid_v4_and_v7_instances_validate_and_match(
    admin: httpx.AsyncClient, controller: LiveController, hostd: LiveHostd
) -> None:
    v7 = await new_agent(admin, controller, "rt-v7", loadout="echo")
    v4_id = str(uuid.uuid4())
    async with open_hostd(hostd.socket_path, client_name="test") as client:  # adopted from hostd
        await client.call(m.InstanceProvisionRequest(instance_id=v4_id, name="rt-v4", start=True))
    assert (await admin.get(f"/api/v2/admin/instances/{v4_id}")).status_code == 200
    for instance_id in (v7.instance_id, v4_id):
        assert UUID_V4_OR_V7.match(instance_id)
        params = runtime_entries(await card_of(admin, instance_id))[0]["params"]
        validate_runtime("params", params)
        async with httpx.AsyncClient(
            base_url=f"{controller.url}/agents/{instance_id}",
            headers={**A2A_HEADERS, "Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=15,
        ) as c:
            task = (await send(c, "echo uuid")).json()["task"]
        assert task["metadata"]["runtime.instance_id"] == params["instance_id"] == instance_id
    assert uuid.UUID(v4_id).version == 4 and uuid.UUID(v7.instance_id).version == 7


def test_conf_008_unknown_provider_and_capability_ids_validate_and_are_preserved() -> None:
    now = time.time()
    rec = InstanceRecord(
        id=str(uuid.uuid4()),
        name="future",
        runtime="quantum-vm",
        provider="cloud-hypervisor-next",
        state="running",
        loadout="echo",
        created_at=now,
        updated_at=now,
    )
    params = runtime_params(rec)
    validate_runtime("params", params)
    assert params["runtime"] == "quantum-vm" and params["provider"] == "cloud-hypervisor-next"
    meta = runtime_metadata(rec, disclose_host=False)
    validate_runtime("task-metadata", meta)
    assert meta["runtime.kind"] == "quantum-vm" and meta["runtime.provider"] == "cloud-hypervisor-next"


async def test_conformance_mode_registers_its_instance_and_does_not_enforce(hostd: LiveHostd, short_dir: Path) -> None:
    config = load_config(env=controller_env(short_dir / "ctl", hostd.socket_path, AIWG_CONFORMANCE_MODE="1"))
    iid = "00000000-0000-7000-8000-000000000001"
    async with serve_controller(config) as live, live.client() as admin:
        with trio.fail_after(20):
            while (await admin.get(f"/agents/{iid}/.well-known/agent-card.json")).status_code != 200:
                await trio.sleep(0.05)
        params = runtime_entries(await card_of(admin, iid))[0]["params"]
        assert params["loadout"] == "echo" and params["instance_id"] == iid
        async with httpx.AsyncClient(
            base_url=f"{live.url}/agents/{iid}",
            headers={"A2A-Version": "1.0", "Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=15,
        ) as c:
            response = await send(c, "no extension header")
        assert response.status_code == 200, response.text
        task = response.json()["task"]
        assert "".join(p["text"] for p in task["artifacts"][0]["parts"]) == "no extension header"
        assert "a2a-extensions" not in response.headers
