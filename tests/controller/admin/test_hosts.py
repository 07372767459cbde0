"""The admin hosts routes on one host (the embedded store): the host registers itself, cordon keeps
placement off it, drain refuses new work on it, and a host that is available cannot be forgotten.
Two hosts on PostgreSQL, with forwarding and an unavailable host: ``tests/scenarios/test_hosts.py``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import trio

from agentic_sandbox.controller.config import load_config
from agentic_sandbox.controller.store import HostFacts, InstanceRecord
from tests.controller.a2a.helpers import new_agent
from tests.controller.conftest import LiveController, LiveHostd, controller_env, provision, serve_controller
from tests.controller.http.test_problems import assert_problem


async def registered(admin: httpx.AsyncClient) -> dict[str, Any]:
    with trio.fail_after(15):
        while not (items := (await admin.get("/api/v2/admin/hosts")).json()["items"]):
            await trio.sleep(0.05)
    assert len(items) == 1, items
    return dict(items[0])


async def test_the_host_registers_itself_with_its_facts(controller: LiveController, admin: httpx.AsyncClient) -> None:
    host = await registered(admin)
    assert host["id"] == controller.state.link.host_id
    assert host["state"] == "available" and not host["cordoned"] and not host["draining"]
    assert "host" in host["runtimes"]
    assert host["capacity"]["cpus"] >= 1 and host["capacity"]["memory_available_bytes"] > 0
    [me] = host["controllers"]
    assert me["url"] == controller.url and me["alive"] is True
    made = await provision(admin, "counted", start=True)
    got = (await admin.get(f"/api/v2/admin/hosts/{host['id']}")).json()
    assert got["instances"]["by_state"].get("running") == 1 and got["instances"]["total"] >= 1
    listed = (await admin.get("/api/v2/admin/instances")).json()["items"]
    view = next(i for i in listed if i["id"] == made["result"]["instance_id"])
    assert view["host_id"] == host["id"] and view["host_state"] == "available"
    by_host = await admin.get("/api/v2/admin/instances", params={"host": host["id"], "limit": 10})
    assert [i["id"] for i in by_host.json()["items"]] == [i["id"] for i in listed]
    elsewhere = await admin.get("/api/v2/admin/instances", params={"host": "other", "limit": 10})
    assert elsewhere.json()["items"] == []
    assert_problem(await admin.get("/api/v2/admin/hosts/nope"), 404, "host.not_found")


async def test_cordon_and_drain_on_one_host(admin: httpx.AsyncClient, operator: httpx.AsyncClient) -> None:
    host = await registered(admin)
    hid = host["id"]
    made = await provision(admin, "before-drain", start=True)
    iid = made["result"]["instance_id"]

    cordoned = await operator.post(f"/api/v2/admin/hosts/{hid}/cordon")
    assert cordoned.status_code == 200 and cordoned.json()["cordoned"] is True
    refused = await admin.post("/api/v2/admin/instances", json={"name": "nowhere", "runtime": "host"})
    assert "cordoned" in assert_problem(refused, 503, "placement.unavailable")["detail"]
    await operator.post(f"/api/v2/admin/hosts/{hid}/uncordon")
    await provision(admin, "after-uncordon")
    unknown = await admin.post("/api/v2/admin/instances", json={"name": "x", "runtime": "host", "host": "mars"})
    assert_problem(unknown, 404, "host.not_found")
    no_label = await admin.post("/api/v2/admin/instances", json={"name": "x", "runtime": "host", "host_label": "gpu"})
    assert_problem(no_label, 409, "placement.no_host")
    bad_runtime = await admin.post("/api/v2/admin/instances", json={"name": "x", "runtime": "bogus"})
    assert bad_runtime.status_code == 422  # the app's own check, not placement's

    drained = await operator.post(f"/api/v2/admin/hosts/{hid}/drain")
    assert drained.json()["draining"] is True
    session = await admin.post(f"/api/v2/admin/instances/{iid}/sessions", json={"argv": ["/bin/cat"]})
    assert_problem(session, 503, "host.draining")
    assert (await admin.get(f"/api/v2/admin/instances/{iid}")).status_code == 200  # reads go on
    await operator.post(f"/api/v2/admin/hosts/{hid}/undrain")
    session = await admin.post(f"/api/v2/admin/instances/{iid}/sessions", json={"argv": ["/bin/cat"]})
    assert session.status_code == 201, session.text


async def test_who_may_and_what_cannot_be_forgotten(
    controller: LiveController, admin: httpx.AsyncClient, operator: httpx.AsyncClient
) -> None:
    host = await registered(admin)
    assert (await operator.get("/api/v2/admin/hosts")).status_code == 200
    assert_problem(await operator.delete(f"/api/v2/admin/hosts/{host['id']}"), 403, "auth.forbidden")
    assert_problem(await admin.delete(f"/api/v2/admin/hosts/{host['id']}"), 409, "host.available")
    async with controller.client(None) as anonymous:
        assert_problem(await anonymous.get("/api/v2/admin/hosts"), 401, "auth.unauthorized")


async def test_cards_can_name_the_instances_own_host(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(
        tmp_path / "c", hostd.socket_path, AIWG_CARD_URLS="host", AIWG_ADVERTISE_URL="http://host-b.example:8122"
    )
    async with serve_controller(load_config(env=env)) as live, live.client() as admin:
        agent = await new_agent(admin, live, "carded")
        card = (await admin.get(f"/agents/{agent.instance_id}/.well-known/agent-card.json")).json()
    urls = [i["url"] for i in card["supportedInterfaces"]]
    assert urls and all(u.startswith("http://host-b.example:8122/agents/") for u in urls), urls


async def test_a_host_gone_for_good_is_forgotten_with_or_without_its_instances(
    controller: LiveController, admin: httpx.AsyncClient
) -> None:
    await registered(admin)
    store = controller.state.hosts.store
    gone = time.time() - 3600
    for host_id in ("h-empty", "h-full"):
        await store.hosts.heartbeat(
            HostFacts(id=host_id, boot_id="b", name=host_id), f"c-{host_id}", "http://x:1", gone
        )
    now = time.time()
    await store.instances.insert(
        InstanceRecord(
            id="i-left", name="left", runtime="host", state="running", created_at=now, updated_at=now, host_id="h-full"
        )
    )
    got = (await admin.get("/api/v2/admin/hosts/h-full")).json()
    assert got["state"] == "unavailable" and got["controllers"][0]["alive"] is False
    assert_problem(await admin.delete("/api/v2/admin/hosts/h-full"), 409, "host.not_empty")
    assert_problem(await admin.post("/api/v2/admin/hosts/h-never/cordon"), 404, "host.not_found")
    assert_problem(await admin.delete("/api/v2/admin/hosts/h-never"), 404, "host.not_found")
    forgotten = await admin.delete("/api/v2/admin/hosts/h-empty")
    assert forgotten.status_code == 204 and forgotten.content == b""
    assert (await admin.get("/api/v2/admin/hosts")).status_code == 200  # the connection lives on
    assert (await admin.delete("/api/v2/admin/hosts/h-full", params={"force": "true"})).status_code == 204
    assert await store.instances.get("i-left") is None
    assert {h["id"] for h in (await admin.get("/api/v2/admin/hosts")).json()["items"]} == {
        controller.state.link.host_id
    }
