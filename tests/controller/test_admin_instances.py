"""Admin instances end to end: a real hostd, the controller on a loopback port, real HTTP."""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import httpx
import jsonschema
import psutil
import trio

from proto import messages as m
from proto import open_hostd
from tests.contracts import component, validate

from .conftest import LiveController, LiveHostd, alive, provision, wait_operation
from .test_problems import assert_problem

#: Our stricter reading of the contract's Instance schema (admin-api.openapi.yaml); bodies are
#: validated against the contract file too.
INSTANCE = {
    "type": "object",
    "required": ["id", "name", "runtime", "state", "agent_card_url", "created_at"],
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"},
        "name": {"type": "string"},
        "runtime": {"enum": ["qemu", "docker", "host"]},
        "state": {
            "enum": ["provisioning", "stopped", "starting", "running", "stopping", "failed", "destroying", "destroyed"]
        },
        "agent_card_url": {"type": "string", "pattern": r"^https?://[^/]+/agents/[^/]+/\.well-known/agent-card\.json$"},
        "created_at": {"type": "string", "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$"},
        "capabilities": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "loadout": {"type": "string"},
        "cwd": {"type": "string"},
        "operation_status": {"enum": ["ready", "registered", "bootstrap_pending", "not_ready", "stopped", "unknown"]},
        "transport": {"enum": ["mtls", "uds", "vsock", "bootstrap-pending", "plaintext-dev", "unknown"]},
        "host_daemon": {
            "type": "object",
            "properties": {"status": {"enum": ["available", "unavailable"]}, "label": {"type": "string"}},
        },
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

SLEEPER = 'name: sleeper\nversion: "1"\nruntime: host\ncommand: ["/bin/cat"]\nservice: ["/bin/sleep", "600"]\n'


async def _instance(admin: httpx.AsyncClient, iid: str) -> dict[str, Any]:
    response = await admin.get(f"/api/v2/admin/instances/{iid}")
    assert response.status_code == 200, response.text
    body = response.json()
    validate(body, component("Instance"))  # upstream's schema
    jsonschema.validate(body, INSTANCE)  # and our stricter reading (UUIDv7, UTC timestamps)
    return body


async def _verb(admin: httpx.AsyncClient, iid: str, verb: str) -> dict[str, Any]:
    response = await admin.post(f"/api/v2/admin/instances/{iid}/{verb}")
    assert response.status_code == 202, response.text
    assert response.headers["Location"].endswith(response.json()["id"])
    return await wait_operation(admin, response.json()["id"])


async def _hostd_info(hostd: LiveHostd, iid: str) -> m.InstanceInfo | None:
    return next((i for i in await hostd.instances() if i.instance_id == iid), None)


async def test_provision_to_running_and_detail(admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    op = await provision(admin, "agent-01", start=True, labels={"team": "blue"})
    iid = op["result"]["instance_id"]
    assert uuid.UUID(iid).version == 7
    assert op["kind"] == "instance.provision"

    body = await _instance(admin, iid)
    assert body["name"] == "agent-01"
    assert body["runtime"] == "host"
    assert body["state"] == "running"
    assert body["labels"] == {"team": "blue"}
    assert body["operation_status"] == "ready"
    assert body["host_daemon"]["status"] == "available"
    assert body["agent_card_url"].endswith(f"/agents/{iid}/.well-known/agent-card.json")
    assert "/api/" not in body["agent_card_url"]

    info = await _hostd_info(hostd, iid)
    assert info is not None and info.state == "running" and info.name == "agent-01"
    assert body["cwd"] == info.working_dir

    listing = (await admin.get("/api/v2/admin/instances")).json()
    assert [i["id"] for i in listing["items"]] == [iid]
    jsonschema.validate(listing["items"][0], INSTANCE)


async def test_provision_without_start_is_stopped(admin: httpx.AsyncClient) -> None:
    op = await provision(admin, "cold-one")
    assert op["result"]["state"] == "stopped"
    assert (await _instance(admin, op["result"]["instance_id"]))["state"] == "stopped"


async def test_second_provision_in_flight_returns_the_same_operation(
    admin: httpx.AsyncClient, hostd: LiveHostd
) -> None:
    os.kill(hostd.pid, signal.SIGSTOP)  # hostd hangs: the provision stays in flight
    try:
        first = await admin.post("/api/v2/admin/instances", json={"name": "twin", "runtime": "host"})
        second = await admin.post("/api/v2/admin/instances", json={"name": "twin", "runtime": "host", "start": True})
    finally:
        os.kill(hostd.pid, signal.SIGCONT)
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"]
    assert second.headers["Location"] == first.headers["Location"]
    done = await wait_operation(admin, first.json()["id"])
    assert done["state"] == "succeeded", done
    assert len([i for i in await hostd.instances() if i.name == "twin"]) == 1


async def test_existing_name_is_409(admin: httpx.AsyncClient) -> None:
    await provision(admin, "taken")
    response = await admin.post("/api/v2/admin/instances", json={"name": "taken", "runtime": "host"})
    assert_problem(response, 409, "instance.already_exists")


async def test_other_runtimes_are_501(admin: httpx.AsyncClient) -> None:
    for runtime in ("qemu", "docker"):
        response = await admin.post("/api/v2/admin/instances", json={"name": f"vm-{runtime}", "runtime": runtime})
        body = assert_problem(response, 501, "runtime.not_implemented")
        assert runtime in body["detail"]
    assert (await admin.get("/api/v2/admin/instances")).json()["items"] == []


async def test_provision_validation(admin: httpx.AsyncClient) -> None:
    cases = [
        ({"name": "Bad Name", "runtime": "host"}, "name"),
        ({"name": "ok-name"}, "runtime"),
        ({"name": "ok-name", "runtime": "host", "flavour": "x"}, "flavour"),
        ({"name": "ok-name", "runtime": "host", "provider": "libvirt"}, "provider"),
        ({"name": "ok-name", "runtime": "host", "runtime_options": {"kind": "vm"}}, "runtime_options.kind"),
        ({"name": "ok-name", "runtime": "host", "loadout": "no-such-loadout"}, "loadout"),
    ]
    for body, field in cases:
        problem = assert_problem(await admin.post("/api/v2/admin/instances", json=body), 422, "validation.failed")
        assert problem["errors"][0]["field"] == field, problem
    bad_json = await admin.post("/api/v2/admin/instances", content=b"{", headers={"Content-Type": "application/json"})
    assert_problem(bad_json, 400, "validation.failed")


async def test_list_filters(admin: httpx.AsyncClient) -> None:
    running = (await provision(admin, "f-running", start=True))["result"]["instance_id"]
    stopped = (await provision(admin, "f-stopped"))["result"]["instance_id"]

    async def ids(**params: str) -> list[str]:
        response = await admin.get("/api/v2/admin/instances", params=params)
        assert response.status_code == 200, response.text
        return sorted(i["id"] for i in response.json()["items"])

    assert await ids() == sorted([running, stopped])
    assert await ids(state="running") == [running]
    assert await ids(state="stopped") == [stopped]
    assert await ids(runtime="host") == sorted([running, stopped])
    assert await ids(runtime="qemu") == []
    assert await ids(provider="libvirt") == []
    for params, field in (({"state": "sleepy"}, "state"), ({"runtime": "lxc"}, "runtime")):
        problem = assert_problem(await admin.get("/api/v2/admin/instances", params=params), 422, "validation.failed")
        assert problem["errors"][0]["field"] == field


async def test_lifecycle_verbs(admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    iid = (await provision(admin, "cycle", start=True))["result"]["instance_id"]

    op = await _verb(admin, iid, "stop")
    assert (op["kind"], op["state"], op["result"]["state"]) == ("instance.stop", "succeeded", "stopped")
    assert (await _instance(admin, iid))["state"] == "stopped"
    assert (await _verb(admin, iid, "stop"))["state"] == "succeeded"  # idempotent

    assert (await _verb(admin, iid, "start"))["result"]["state"] == "running"
    assert (await _verb(admin, iid, "start"))["state"] == "succeeded"  # idempotent
    assert (await _verb(admin, iid, "restart"))["result"]["state"] == "running"
    assert (await _hostd_info(hostd, iid)).state == "running"  # type: ignore[union-attr]

    op = await _verb(admin, iid, "destroy")
    assert (op["kind"], op["result"]["state"]) == ("instance.destroy", "destroyed")
    assert (await _instance(admin, iid))["state"] == "destroyed"
    assert await _hostd_info(hostd, iid) is None
    for verb in ("start", "stop", "restart"):
        assert_problem(await admin.post(f"/api/v2/admin/instances/{iid}/{verb}"), 409, "instance.invalid_state")


async def test_unknown_instance_is_404(admin: httpx.AsyncClient) -> None:
    missing = "01900000-0000-7000-8000-000000000000"
    assert_problem(await admin.get(f"/api/v2/admin/instances/{missing}"), 404, "instance.not_found")
    for verb in ("start", "stop", "restart", "destroy", "reprovision", "rotate-secret"):
        assert_problem(await admin.post(f"/api/v2/admin/instances/{missing}/{verb}"), 404, "instance.not_found")
    assert_problem(await admin.delete(f"/api/v2/admin/instances/{missing}"), 404, "instance.not_found")


async def test_reprovision_is_an_operation_that_keeps_the_id_and_the_boxes(
    admin: httpx.AsyncClient, hostd: LiveHostd
) -> None:
    created = await admin.post("/api/v2/admin/loadouts", json={"name": "sleeper", "manifest": SLEEPER})
    assert created.status_code == 201, created.text
    iid = (await provision(admin, "legacy", start=True, loadout="sleeper"))["result"]["instance_id"]
    before = await _hostd_info(hostd, iid)
    assert before is not None and before.host is not None and before.host.pid is not None
    put = await admin.put(
        f"/api/v2/admin/storage/inbox/{iid}/mission.txt", content=b"m-1", headers={"Content-Type": "text/plain"}
    )
    assert put.status_code == 201, put.text

    # Bad bodies are refused before anything happens.
    r = await admin.post(f"/api/v2/admin/instances/{iid}/reprovision", json={"loadout": "no-such"})
    assert_problem(r, 422, "validation.failed")
    assert r.json()["errors"][0]["field"] == "loadout"
    r = await admin.post(f"/api/v2/admin/instances/{iid}/reprovision", json={"image": "x"})
    assert_problem(r, 422, "validation.failed")

    accepted = await admin.post(f"/api/v2/admin/instances/{iid}/reprovision")
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["kind"] == "instance.reprovision"
    op = await wait_operation(admin, accepted.json()["id"])
    assert op["state"] == "succeeded", op
    assert op["result"] == {"instance_id": iid, "state": "running", "loadout": "sleeper"}
    after = await _hostd_info(hostd, iid)
    assert after is not None and after.host is not None
    assert (after.instance_id, after.name, after.state, after.loadout) == (iid, "legacy", "running", "sleeper")
    assert after.host.pid != before.host.pid  # provisioned again: a new main process
    with trio.fail_after(10):
        while alive({before.host.pid}):  # the old tree was destroyed
            await trio.sleep(0.02)
    kept = await admin.get(f"/api/v2/admin/storage/inbox/{iid}/mission.txt", headers={"Accept": "text/plain"})
    assert (kept.status_code, kept.content) == (200, b"m-1")

    # A loadout given in the body replaces the current one (echo has no main process).
    r = await admin.post(f"/api/v2/admin/instances/{iid}/reprovision", json={"loadout": "echo"})
    op = await wait_operation(admin, r.json()["id"])
    assert op["state"] == "succeeded", op
    assert (await _instance(admin, iid))["loadout"] == "echo"
    info = await _hostd_info(hostd, iid)
    assert info is not None and (info.loadout, info.command) == ("echo", None)

    assert_problem(await admin.post(f"/api/v2/admin/instances/{iid}/rotate-secret"), 410, "legacy_agent_secret.retired")


async def test_reprovision_needs_the_admin_role(admin: httpx.AsyncClient, operator: httpx.AsyncClient) -> None:
    iid = (await provision(admin, "guarded"))["result"]["instance_id"]
    assert_problem(await operator.post(f"/api/v2/admin/instances/{iid}/reprovision"), 403, "auth.forbidden")


async def test_loadout_service_goes_to_hostd_and_decommission_leaves_nothing(
    admin: httpx.AsyncClient, hostd: LiveHostd
) -> None:
    created = await admin.post("/api/v2/admin/loadouts", json={"name": "sleeper", "manifest": SLEEPER})
    assert created.status_code == 201, created.text
    iid = (await provision(admin, "sleepy", start=True, loadout="sleeper"))["result"]["instance_id"]
    info = await _hostd_info(hostd, iid)
    assert info is not None
    assert (info.command, info.loadout, info.state) == (["/bin/sleep", "600"], "sleeper", "running")
    pid = info.host.pid if info.host else None
    assert pid is not None and alive({pid}) == [pid]
    tree = {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}
    assert (await _instance(admin, iid))["loadout"] == "sleeper"

    # A running instance is not decommissioned without force.
    assert_problem(await admin.delete(f"/api/v2/admin/instances/{iid}"), 409, "instance.invalid_state")
    assert_problem(await admin.delete(f"/api/v2/admin/instances/{iid}?force=maybe"), 422, "validation.failed")

    response = await admin.delete(f"/api/v2/admin/instances/{iid}", params={"force": "true"})
    assert response.status_code == 202
    op = await wait_operation(admin, response.json()["id"])
    assert (op["kind"], op["state"]) == ("instance.decommission", "succeeded")
    assert op["result"]["decommissioned"] is True

    assert_problem(await admin.get(f"/api/v2/admin/instances/{iid}"), 404, "instance.not_found")
    assert await _hostd_info(hostd, iid) is None
    assert alive(tree) == []
    # The name is free again.
    await provision(admin, "sleepy")


async def test_decommission_of_a_stopped_instance_needs_no_force(admin: httpx.AsyncClient) -> None:
    iid = (await provision(admin, "quiet"))["result"]["instance_id"]
    response = await admin.delete(f"/api/v2/admin/instances/{iid}")
    assert response.status_code == 202
    assert (await wait_operation(admin, response.json()["id"]))["state"] == "succeeded"
    assert (await admin.get("/api/v2/admin/instances")).json()["items"] == []


async def test_instances_made_on_hostd_are_adopted(admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    iid = "01900000-0000-7000-8000-0000000000aa"
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id=iid, name="from-hostctl", start=True))
    body = await _instance(admin, iid)
    assert (body["name"], body["state"], body["source"]) == ("from-hostctl", "running", "hostd")


async def test_hostd_state_changes_show_through(
    admin: httpx.AsyncClient, hostd: LiveHostd, controller: LiveController
) -> None:
    iid = (await provision(admin, "drift", start=True))["result"]["instance_id"]
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceStopRequest(instance_id=iid, grace_s=0))
    assert (await _instance(admin, iid))["state"] == "stopped"
    with trio.fail_after(5):
        rec = await controller.state.store.instances.get(iid)
    assert rec is not None and rec.state == "stopped"


async def test_concurrent_reads_adopt_a_hostd_instance_once(admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    # Several reconciles at once (lists, details, a /metrics scrape) all meet the same unknown
    # instance; each must answer, and the catalog must hold it once.
    iid = "01900000-0000-7000-8000-0000000000bb"
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id=iid, name="made-outside"))
    statuses: list[tuple[str, int]] = []

    async def get(path: str) -> None:
        statuses.append((path, (await admin.get(path)).status_code))

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(get, "/api/v2/admin/instances")
                nursery.start_soon(get, f"/api/v2/admin/instances/{iid}")
                nursery.start_soon(get, "/metrics")
    assert {status for _, status in statuses} == {200}, statuses
    items = (await admin.get("/api/v2/admin/instances")).json()["items"]
    assert [(i["id"], i["name"]) for i in items] == [(iid, "made-outside")]


async def test_provision_of_a_name_being_decommissioned_is_409(admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    iid = (await provision(admin, "going"))["result"]["instance_id"]
    os.kill(hostd.pid, signal.SIGSTOP)  # the decommission's destroy call waits on a frozen hostd
    try:
        deleted = await admin.delete(f"/api/v2/admin/instances/{iid}", params={"force": "true"})
        assert deleted.status_code == 202, deleted.text
        response = await admin.post("/api/v2/admin/instances", json={"name": "going", "runtime": "host"})
        # Not the decommission's operation passed off as a provision: the name is still taken.
        assert_problem(response, 409, "instance.already_exists")
    finally:
        os.kill(hostd.pid, signal.SIGCONT)
    assert (await wait_operation(admin, deleted.json()["id"]))["state"] in ("succeeded", "failed")


async def test_decommission_without_force_rereads_hostd(admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    iid = (await provision(admin, "started-behind"))["result"]["instance_id"]
    async with open_hostd(hostd.socket_path) as client:  # started on hostd, the catalog still says stopped
        await client.call(m.InstanceStartRequest(instance_id=iid))
    assert_problem(await admin.delete(f"/api/v2/admin/instances/{iid}"), 409, "instance.invalid_state")
    info = await _hostd_info(hostd, iid)
    assert info is not None and info.state == "running"
