"""Admin instances end to end: a real hostd, the controller on a loopback port, real HTTP."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import psutil
import pytest
import trio

from agentic_sandbox.controller.config import load_config
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.contracts import component, validate
from tests.libvirt_service import fake_guest_image
from tests.podman_service import PodmanStorage
from tests.shells import type_into_a_session

from ..conftest import (
    ADMIN_TOKEN,
    LiveController,
    LiveHostd,
    alive,
    controller_env,
    provision,
    serve_controller,
    wait_operation,
)
from ..http.test_problems import assert_problem
from .pages import all_pages

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


async def test_container_requests_are_checked_before_any_work(admin: httpx.AsyncClient) -> None:
    cases = [
        ({"runtime": "docker"}, "image"),  # no image, no loadout naming one
        ({"runtime": "container", "loadout": "echo"}, "loadout"),  # a host loadout
        ({"runtime": "container", "loadout": "nope"}, "loadout"),
        ({"runtime": "container", "image": "Not A Ref"}, "image"),
        ({"runtime": "container", "image": "busybox", "provider": "libvirt"}, "provider"),
        ({"runtime": "container", "image": "busybox", "runtime_options": {"kind": "vm"}}, "runtime_options.kind"),
        ({"runtime": "container", "image": "busybox", "resources": {"pids": 1}}, "resources.pids"),
        ({"runtime": "host", "image": "busybox"}, "image"),
    ]
    for fields, field in cases:
        response = await admin.post("/api/v2/admin/instances", json={"name": "c-bad", **fields})
        body = assert_problem(response, 422, "validation.failed")
        assert [e["field"] for e in body["errors"]] == [field], (fields, body)
    assert (await admin.get("/api/v2/admin/instances")).json()["items"] == []
    # This hostd offers no VM runtime, so no checkpoints either.
    await provision(admin, "no-vm")
    body = {"vm": "no-vm", "checkpoint_id": "c1", "pre_enrollment": True}
    r = await admin.post("/api/v2/admin/libvirt/checkpoints", json=body)
    assert_problem(r, 409, "instance.invalid_state")  # a host instance is no qemu instance
    r = await admin.post("/api/v2/admin/libvirt/checkpoints/c1/restore", json={"name": "x"})
    assert_problem(r, 501, "capability.unsupported")


async def test_provision_validation(admin: httpx.AsyncClient) -> None:
    cases = [
        ({"name": "Bad Name", "runtime": "host"}, "name"),
        ({"name": "ok-name"}, "runtime"),
        ({"name": "ok-name", "runtime": "host", "flavour": "x"}, "flavour"),
        ({"name": "ok-name", "runtime": "host", "provider": "libvirt"}, "provider"),
        ({"name": "ok-name", "runtime": "host", "runtime_options": {"kind": "vm"}}, "runtime_options.kind"),
        ({"name": "ok-name", "runtime": "host", "loadout": "no-such-loadout"}, "loadout"),
        ({"name": "ok-name", "runtime": "qemu", "provider": "vmware"}, "provider"),
        ({"name": "ok-name", "runtime": "qemu", "runtime_options": {"kind": "host"}}, "runtime_options.kind"),
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
        rec = await controller.state.instances.store.instances.get(iid)
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


# -- containers (runtime docker, alias container: podman through hostd) --------------------------


@pytest.fixture
async def podman_admin(
    short_dir: Path, tmp_path: Path, podman_storage: PodmanStorage
) -> AsyncIterator[tuple[httpx.AsyncClient, LiveHostd]]:
    """A hostd that starts its own podman service on the busybox storage, a controller on it."""
    live = LiveHostd(short_dir, env=podman_storage.hostd_env(short_dir / "podman.sock"))
    await live.start()
    try:
        config = load_config(env=controller_env(tmp_path / "controller", live.socket_path))
        async with serve_controller(config) as controller, controller.client() as client:
            yield client, live
    finally:
        await live.close()


@pytest.mark.podman
async def test_container_instance_through_the_admin_api(podman_admin: tuple[httpx.AsyncClient, LiveHostd]) -> None:
    admin, hostd = podman_admin
    response = await admin.post(
        "/api/v2/admin/instances",
        json={"name": "c1", "runtime": "container", "loadout": "busybox", "resources": {"cpus": 0.5, "pids": 64}},
    )
    assert response.status_code == 202, response.text
    op = await wait_operation(admin, response.json()["id"], timeout=60)
    assert op["state"] == "succeeded", op
    iid = op["result"]["instance_id"]

    body = await _instance(admin, iid)
    assert (body["runtime"], body["provider"], body["state"]) == ("docker", "podman", "running")
    assert body["image"] == "localhost/busybox:latest" and body["image_ref"].startswith("localhost/busybox@sha256:")
    state = body["provider_state"]
    assert state["status"] == "running" and state["container_name"] == f"aiwg-{iid}"
    assert state["limits"] == {"cpus": 0.5, "pids": 64, "memory_bytes": None}
    listed = (await admin.get("/api/v2/admin/instances", params={"runtime": "container"})).json()["items"]
    assert [i["id"] for i in listed] == [iid]
    assert b"42-typed" in await type_into_a_session(hostd.socket_path, iid)

    assert (await _verb(admin, iid, "stop"))["state"] == "succeeded"
    stopped = await _instance(admin, iid)
    assert stopped["state"] == "stopped" and stopped["provider_state"]["status"] == "exited"
    assert (await _verb(admin, iid, "start"))["state"] == "succeeded"
    assert (await _instance(admin, iid))["state"] == "running"
    assert (await _verb(admin, iid, "destroy"))["state"] == "succeeded"
    assert await _hostd_info(hostd, iid) is None


async def test_container_request_when_podman_is_down_fails_with_the_reason(short_dir: Path, tmp_path: Path) -> None:
    live = LiveHostd(short_dir, env={"AIWG_PODMAN_SOCKET": str(short_dir / "absent.sock")})
    await live.start()
    try:
        config = load_config(env=controller_env(tmp_path / "controller", live.socket_path))
        async with serve_controller(config) as controller, controller.client() as admin:
            response = await admin.post(
                "/api/v2/admin/instances", json={"name": "c1", "runtime": "container", "image": "localhost/busybox"}
            )
            assert response.status_code == 202, response.text
            op = await wait_operation(admin, response.json()["id"])
            assert op["state"] == "failed" and op["error"]["code"] == "runtime.unavailable", op
            assert "podman" in op["error"]["detail"] and "does not exist" in op["error"]["detail"]
            assert (await admin.get("/api/v2/admin/instances")).json()["items"] == []  # nothing else was made
            assert await live.instances() == []
    finally:
        await live.close()


# -- runtime qemu: VM instances (hostd's libvirt provider on libvirt's test hypervisor) -----------


@asynccontextmanager
async def vm_stack(base: Path, tmp_path: Path, libvirt_uri: str) -> AsyncIterator[httpx.AsyncClient]:
    """hostd with the VM runtime on ``libvirt_uri`` and a controller in front of it."""
    pytest.importorskip("libvirt")
    env = {"AIWG_LIBVIRT_URI": libvirt_uri, "AIWG_VM_IMAGE_DIR": str(fake_guest_image(tmp_path / "image"))}
    live = LiveHostd(base, env=env)
    await live.start()
    try:
        config = load_config(env=controller_env(tmp_path / "controller", live.socket_path))
        async with serve_controller(config) as controller, controller.client(ADMIN_TOKEN) as client:
            yield client
    finally:
        await live.close()


async def test_vm_instances_provision_and_run_their_lifecycle(short_dir: Path, tmp_path: Path) -> None:
    async with vm_stack(short_dir, tmp_path, "test:///default") as admin:
        response = await admin.post(
            "/api/v2/admin/instances", json={"name": "v1", "runtime": "qemu", "loadout": "tiny-vm", "start": True}
        )
        assert response.status_code == 202, response.text
        op = await wait_operation(admin, response.json()["id"])
        assert op["state"] == "succeeded", op
        iid = op["result"]["instance_id"]
        view = (await admin.get(f"/api/v2/admin/instances/{iid}")).json()
        assert (view["runtime"], view["provider"], view["state"], view["loadout"]) == (
            "qemu",
            "libvirt",
            "running",
            "tiny-vm",
        )
        assert [
            i["id"] for i in (await admin.get("/api/v2/admin/instances", params={"runtime": "qemu"})).json()["items"]
        ] == [iid]
        for verb, state in (("stop", "stopped"), ("start", "running"), ("restart", "running")):
            op = await wait_operation(admin, (await admin.post(f"/api/v2/admin/instances/{iid}/{verb}")).json()["id"])
            assert op["state"] == "succeeded", op
            assert (await admin.get(f"/api/v2/admin/instances/{iid}")).json()["state"] == state
        op = await wait_operation(admin, (await admin.delete(f"/api/v2/admin/instances/{iid}?force=true")).json()["id"])
        assert op["state"] == "succeeded", op
        assert_problem(await admin.get(f"/api/v2/admin/instances/{iid}"), 404, "instance.not_found")


async def test_vm_request_while_libvirt_is_down_fails_with_the_reason(short_dir: Path, tmp_path: Path) -> None:
    uri = f"qemu+unix:///system?socket={tmp_path / 'no-libvirtd.sock'}"
    async with vm_stack(short_dir, tmp_path, uri) as admin:
        response = await admin.post("/api/v2/admin/instances", json={"name": "v2", "runtime": "qemu"})
        assert response.status_code == 202, response.text
        op = await wait_operation(admin, response.json()["id"])
        assert op["state"] == "failed"
        assert op["error"]["code"] == "runtime.unavailable" and "cannot connect to libvirt" in str(op["error"]), op
        assert (await admin.get("/api/v2/admin/instances")).json()["items"] == []


async def test_libvirt_checkpoint_and_restore_routes(short_dir: Path, tmp_path: Path) -> None:
    async with vm_stack(short_dir, tmp_path, "test:///default") as admin:
        response = await admin.post("/api/v2/admin/instances", json={"name": "base", "runtime": "qemu", "start": True})
        op = await wait_operation(admin, response.json()["id"])
        assert op["state"] == "succeeded", op
        base_id = op["result"]["instance_id"]
        bad = [
            ({"vm": "base", "checkpoint_id": "c1", "pre_enrollment": False}, 422, "pre_enrollment"),
            ({"vm": "base", "checkpoint_id": "c1"}, 422, "pre_enrollment"),
            ({"vm": "base", "checkpoint_id": "../c1", "pre_enrollment": True}, 422, "checkpoint_id"),
        ]
        for body, status, field in bad:
            problem = assert_problem(
                await admin.post("/api/v2/admin/libvirt/checkpoints", json=body), status, "validation.failed"
            )
            assert problem["errors"][0]["field"] == field, problem
        missing = {"vm": "nope", "checkpoint_id": "c1", "pre_enrollment": True}
        assert_problem(await admin.post("/api/v2/admin/libvirt/checkpoints", json=missing), 404, "instance.not_found")

        response = await admin.post(
            "/api/v2/admin/libvirt/checkpoints", json={"vm": "base", "checkpoint_id": "c1", "pre_enrollment": True}
        )
        assert response.status_code == 202, response.text
        op = await wait_operation(admin, response.json()["id"])
        assert op["state"] == "succeeded", op
        assert op["result"]["source_instance_id"] == base_id and op["result"]["size_bytes"] > 0
        assert (await admin.get("/api/v2/admin/instances")).json()["items"] == []  # retired

        restore = "/api/v2/admin/libvirt/checkpoints/c1/restore"
        problem = assert_problem(await admin.post(restore, json={"name": "someone-else"}), 422, "validation.failed")
        assert problem["errors"][0]["field"] == "name"
        assert_problem(
            await admin.post("/api/v2/admin/libvirt/checkpoints/nope/restore", json={"name": "base"}),
            404,
            "checkpoint.not_found",
        )
        new_id = str(uuid.uuid4())
        op = await wait_operation(
            admin, (await admin.post(restore, json={"name": "base", "instance_id": new_id})).json()["id"]
        )
        assert op["state"] == "succeeded", op
        assert op["result"] == {"instance_id": new_id, "name": "base", "state": "running", "checkpoint_id": "c1"}
        view = (await admin.get(f"/api/v2/admin/instances/{new_id}")).json()
        assert (view["name"], view["runtime"], view["state"]) == ("base", "qemu", "running")
        assert_problem(await admin.post(restore, json={"name": "base"}), 404, "checkpoint.not_found")  # single use
        op = await wait_operation(
            admin, (await admin.delete(f"/api/v2/admin/instances/{new_id}?force=true")).json()["id"]
        )
        assert op["state"] == "succeeded", op


async def test_pages_of_instances_filters_and_the_unpaged_shape(controller: LiveController) -> None:
    async with controller.client() as admin:
        made = []
        for i, labels in enumerate(({"team": "x"}, {"team": "y"}, {"team": "x", "tier": "1"}, {}, {"tier": "2"})):
            made.append((await provision(admin, f"pg-{i}", labels=labels))["result"]["instance_id"])
        hostd_made = await admin.post(
            "/api/v2/admin/instances", json={"name": "pg-run", "runtime": "host", "start": True}
        )
        running = (await wait_operation(admin, hostd_made.json()["id"]))["result"]["instance_id"]
        token = hostd_made.json()["a2a_token"]
        everything = [*made, running]

        # Without limit: upstream's shape, nothing added.
        whole = (await admin.get("/api/v2/admin/instances")).json()
        assert list(whole) == ["items"] and [i["id"] for i in whole["items"]] == everything

        # Every page in creation order, each instance once, whatever the page size.
        for limit in (1, 2, 5, 6, 500):
            items = await all_pages(admin, "/api/v2/admin/instances", limit=limit)
            assert [i["id"] for i in items] == everything
            for item in items:
                validate(item, component("Instance"))
        last = (await admin.get("/api/v2/admin/instances", params={"limit": 6})).json()
        assert last["next_page_token"] == ""

        async def ids(**params: Any) -> list[str]:
            return [i["id"] for i in await all_pages(admin, "/api/v2/admin/instances", limit=1, **params)]

        assert await ids(state="running") == [running]
        assert await ids(state="stopped") == made
        assert await ids(runtime="host") == everything and await ids(runtime="qemu") == []
        assert await ids(label="team=x") == [made[0], made[2]]
        assert await ids(label=["team=x", "tier=1"]) == [made[2]]
        assert await ids(label="tier") == [made[2], made[4]]
        assert await ids(label="team=z") == []
        unpaged = (await admin.get("/api/v2/admin/instances", params={"label": ["team=x", "tier"]})).json()
        assert [i["id"] for i in unpaged["items"]] == [made[2]]

        # Bad limits and tokens: 400 naming the parameter.
        for params, field in (
            ({"limit": "0"}, "limit"),
            ({"limit": "501"}, "limit"),
            ({"limit": "many"}, "limit"),
            ({"limit": "2", "page_token": "garbage!"}, "page_token"),
        ):
            problem = assert_problem(
                await admin.get("/api/v2/admin/instances", params=params), 400, "validation.failed"
            )
            assert problem["errors"][0]["field"] == field
        first = (await admin.get("/api/v2/admin/instances", params={"limit": 1, "state": "stopped"})).json()
        foreign = (await admin.get("/api/v2/admin/operations", params={"limit": 1})).json()["next_page_token"]
        for params in (
            {"limit": 1, "state": "running", "page_token": first["next_page_token"]},  # other filters
            {"limit": 1, "page_token": foreign},  # another list's
        ):
            problem = assert_problem(
                await admin.get("/api/v2/admin/instances", params=params), 400, "validation.failed"
            )
            assert problem["errors"][0]["field"] == "page_token"
        # A token alone continues at the default page size.
        rest = await admin.get(
            "/api/v2/admin/instances", params={"state": "stopped", "page_token": first["next_page_token"]}
        )
        assert [i["id"] for i in rest.json()["items"]] == made[1:] and rest.json()["next_page_token"] == ""
        problem = assert_problem(
            await admin.get("/api/v2/admin/instances", params={"limit": 1, "label": "=x"}), 422, "validation.failed"
        )
        assert problem["errors"][0]["field"] == "label"

    # An instance token sees only its own instance, paged or not.
    async with controller.client(token) as own:
        assert [i["id"] for i in await all_pages(own, "/api/v2/admin/instances", limit=1)] == [running]
        assert [i["id"] for i in (await own.get("/api/v2/admin/instances")).json()["items"]] == [running]
        assert await all_pages(own, "/api/v2/admin/instances", limit=1, state="stopped") == []


async def test_both_lists_fail_closed_while_hostd_is_away(controller: LiveController, hostd: LiveHostd) -> None:
    async with controller.client() as admin:
        await provision(admin, "away-one")
        assert len((await admin.get("/api/v2/admin/instances", params={"limit": 5})).json()["items"]) == 1
        hostd.kill()
        with trio.fail_after(10):
            while controller.state.link.ready:
                await trio.sleep(0.02)
        for params in ({}, {"limit": 5}):
            assert_problem(await admin.get("/api/v2/admin/instances", params=params), 503, "internal.unavailable")
        await hostd.start()
