"""Warm pools, forks and restores through the admin API, against a real hostd and a real controller.

* VMs on libvirt's test hypervisor (``test:///default``, in the hostd process): a pool configured
  with ``AIWG_WARM_POOLS`` fills, a provision of its loadout takes a slot (with its own token and
  key, its card and admin view naming the real provider), the pool refills; upstream's libvirt warm
  pool routes make a pool of checkpoints and hand its slots off; ``runtime_options`` launch intents
  (warm_pool, restore, fork) and their refusals; the metrics.
* Containers on real podman: a slot claimed through the admin API runs A2A tasks as its new
  instance, its card carries the resolved image; a fork through ``runtime_options``; a controller
  restarted while its pool is half filled finds it as it was, and nothing of it in the catalog.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from agentic_sandbox.controller.app import create_app
from agentic_sandbox.controller.config import ConfigError, load_config
from tests.contracts import validate_runtime
from tests.controller.conftest import ADMIN_TOKEN, LiveHostd, controller_env, serve_controller, wait_operation
from tests.controller.http.test_problems import assert_problem
from tests.libvirt_service import fake_guest_image
from tests.podman_service import PodmanStorage

API = "/api/v2/admin"
WAIT_S = 60.0


@asynccontextmanager
async def stack(
    base: Path, tmp_path: Path, hostd_env: dict[str, str], **controller: str
) -> AsyncIterator[tuple[httpx.AsyncClient, LiveHostd, str]]:
    live = LiveHostd(base, env=hostd_env)
    await live.start()
    try:
        config = load_config(env=controller_env(tmp_path / "controller", live.socket_path, **controller))
        async with serve_controller(config) as ctl, ctl.client(ADMIN_TOKEN) as client:
            yield client, live, ctl.url
    finally:
        await live.close()


def vm_env(tmp_path: Path) -> dict[str, str]:
    pytest.importorskip("libvirt")
    return {"AIWG_LIBVIRT_URI": "test:///default", "AIWG_VM_IMAGE_DIR": str(fake_guest_image(tmp_path / "image"))}


async def pool(admin: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """The pool as the admin API shows it; a configured pool appears once the controller has told
    hostd of it (right after it connected, a little after it is ready)."""
    with trio.fail_after(WAIT_S):
        while (response := await admin.get(f"{API}/warm-pools/{name}")).status_code == 404:
            await trio.sleep(0.05)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def until_ready(admin: httpx.AsyncClient, name: str, ready: int) -> dict[str, Any]:
    with trio.fail_after(WAIT_S):
        while (body := await pool(admin, name))["ready"] != ready or body["filling"]:
            await trio.sleep(0.05)
    return body


async def provisioned(admin: httpx.AsyncClient, body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """POST /instances, wait: (the finished operation, the A2A token of the 202)."""
    response = await admin.post(f"{API}/instances", json=body)
    assert response.status_code == 202, response.text
    op = await wait_operation(admin, response.json()["id"], timeout=WAIT_S)
    return op, response.json().get("a2a_token")


def runtime_params(card: dict[str, Any]) -> dict[str, Any]:
    [entry] = [e for e in card["capabilities"]["extensions"] if e["uri"] == RUNTIME_EXTENSION]
    validate_runtime("params", entry["params"])
    return dict(entry["params"])


# -- VMs (test driver) -----------------------------------------------------------------------------


async def test_a_vm_provision_takes_a_warm_slot_with_an_identity_of_its_own(short_dir: Path, tmp_path: Path) -> None:
    async with stack(short_dir, tmp_path, vm_env(tmp_path), AIWG_WARM_POOLS="tiny-vm=2") as (admin, _live, url):
        await until_ready(admin, "tiny-vm", 2)
        listed = (await admin.get(f"{API}/warm-pools")).json()["items"]
        assert [(p["pool"], p["runtime"], p["source"], p["configured"]) for p in listed] == [
            ("tiny-vm", "vm", "template", True)
        ]
        op, token = await provisioned(admin, {"name": "v1", "runtime": "qemu", "loadout": "tiny-vm", "start": True})
        assert op["state"] == "succeeded", op
        iid = op["result"]["instance_id"]
        assert op["result"]["launch"] == {
            "mode": "warm_pool",
            "asset_ref": "tiny-vm",
            "launched_from": "warm_pool:tiny-vm",
        }
        view = (await admin.get(f"{API}/instances/{iid}")).json()
        assert (view["name"], view["state"], view["loadout"]) == ("v1", "running", "tiny-vm")
        assert view["provider_state"]["launched_from"] == "warm_pool:tiny-vm" and view["provider_state"]["uuid"]
        assert view["image_ref"].startswith("direct://")
        # The real provider on the card: the test driver's capabilities, no image_ref (direct boot
        # has no runtime/v1 form), and a key and token of this instance's own.
        async with httpx.AsyncClient(base_url=url) as anon:
            card = (await anon.get(f"/agents/{iid}/.well-known/agent-card.json")).json()
            jwks = (await anon.get(f"/agents/{iid}/.well-known/jwks.json")).json()
        params = runtime_params(card)
        assert (params["runtime"], params["provider"], params["instance_id"]) == ("vm", "libvirt", iid)
        assert params["capabilities"] == view["capabilities"] and "warm_pool.manage" in params["capabilities"]
        assert "image_ref" not in params
        assert [k["kid"] for k in jwks["keys"]] == [iid]
        assert token is not None
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as own:
            assert (
                await own.get(f"/agents/{iid}/extendedAgentCard", headers={"A2A-Version": "1.0"})
            ).status_code == 200
        body = await until_ready(admin, "tiny-vm", 2)  # refilled
        assert (body["hits"], body["misses"]) == (1, 0)

        # A request a slot cannot serve as it is (stopped) is made cold: no claim, no miss.
        op, _ = await provisioned(admin, {"name": "v2", "runtime": "qemu", "loadout": "tiny-vm"})
        assert op["state"] == "succeeded" and op["result"]["launch"] == {"mode": "cold"}, op
        assert op["result"]["state"] == "stopped"

        metrics = (await admin.get("/metrics")).text
        assert 'aiwg_warm_pool_ready{pool="tiny-vm"} 2.0' in metrics
        assert 'aiwg_warm_pool_hits_total{pool="tiny-vm"} 1.0' in metrics
        assert 'aiwg_warm_pool_misses_total{pool="tiny-vm"} 0.0' in metrics


async def test_launch_intents_and_their_refusals(short_dir: Path, tmp_path: Path) -> None:
    async with stack(short_dir, tmp_path, vm_env(tmp_path)) as (admin, _live, _url):

        def intent(mode: str, asset: str | None = None, **more: Any) -> dict[str, Any]:
            strategy: dict[str, Any] = {"mode": mode, **({"asset_ref": asset} if asset else {})}
            return {"launch_strategy": strategy, **more}

        asset, mode = "runtime_options.launch_strategy.asset_ref", "runtime_options.launch_strategy.mode"
        refusals = [
            ({"runtime": "qemu", "runtime_options": intent("warm_pool")}, asset),
            ({"runtime": "qemu", "runtime_options": intent("warm_pool", "nope")}, asset),
            ({"runtime": "qemu", "loadout": "tiny-vm", "runtime_options": intent("restore", "c1")}, "loadout"),
            ({"runtime": "qemu", "labels": {"a": "b"}, "runtime_options": intent("fork", "x")}, "labels"),
            ({"runtime": "qemu", "start": False, "runtime_options": intent("fork", "x")}, "start"),
            ({"runtime": "docker", "runtime_options": intent("restore", "c1")}, mode),
            ({"runtime": "host", "runtime_options": intent("fork", "x")}, mode),
            ({"runtime": "qemu", "runtime_options": intent("restore", "c1")}, asset),
            ({"runtime": "qemu", "runtime_options": {"provider": "cloud-hypervisor"}}, "runtime_options.provider"),
            ({"runtime": "qemu", "runtime_options": {"launch_strategy": {"mode": "hot"}}}, mode),
            ({"runtime": "qemu", "runtime_options": {"surprise": 1}}, "runtime_options.surprise"),
        ]
        for body, field in refusals:
            problem = assert_problem(
                await admin.post(f"{API}/instances", json={"name": "x1", **body}), 422, "validation.failed"
            )
            assert problem["errors"][0]["field"] == field, (body, problem)

        op, _ = await provisioned(admin, {"name": "base", "runtime": "qemu", "start": True})
        base = op["result"]["instance_id"]
        # The test driver cannot fork (no QEMU save image): refused up front, nothing made.
        assert_problem(
            await admin.post(
                f"{API}/instances", json={"name": "copy", "runtime": "qemu", "runtime_options": intent("fork", "base")}
            ),
            501,
            "capability.unsupported",
        )
        # restore: a checkpoint comes back as the instance the request names.
        taken = await admin.post(
            f"{API}/libvirt/checkpoints", json={"vm": base, "checkpoint_id": "cp1", "pre_enrollment": True}
        )
        assert (await wait_operation(admin, taken.json()["id"]))["state"] == "succeeded"
        op, token = await provisioned(
            admin, {"name": "again", "runtime": "qemu", "runtime_options": intent("restore", "cp1")}
        )
        assert op["state"] == "succeeded", op
        assert op["result"]["launch"] == {"mode": "restore", "asset_ref": "cp1", "launched_from": "checkpoint:cp1"}
        assert token and (await admin.get(f"{API}/instances/{op['result']['instance_id']}")).json()["name"] == "again"
        assert (await admin.get(f"{API}/instances")).json()["items"][0]["state"] == "running"


async def test_upstream_libvirt_warm_pool_routes(short_dir: Path, tmp_path: Path) -> None:
    async with stack(short_dir, tmp_path, vm_env(tmp_path)) as (admin, live, _url):
        for i in range(2):
            op, _ = await provisioned(admin, {"name": f"base-{i}", "runtime": "qemu", "start": True})
            taken = await admin.post(
                f"{API}/libvirt/checkpoints",
                json={"vm": f"base-{i}", "checkpoint_id": f"slot-{i}", "pre_enrollment": True},
            )
            assert (await wait_operation(admin, taken.json()["id"]))["state"] == "succeeded"
        bad = {"checkpoint_ids": [], "pool": "p"}
        assert_problem(await admin.post(f"{API}/libvirt/warm-pools", json=bad), 422, "validation.failed")
        response = await admin.post(
            f"{API}/libvirt/warm-pools", json={"checkpoint_ids": ["slot-0", "slot-1"], "pool": "given"}
        )
        assert response.status_code == 202, response.text
        op = await wait_operation(admin, response.json()["id"])
        assert (op["kind"], op["state"], op["result"]["slots"]) == ("libvirt.warm_pool.init", "succeeded", 2)
        missing = await admin.post(f"{API}/libvirt/warm-pools", json={"checkpoint_ids": ["nope"], "pool": "other"})
        op = await wait_operation(admin, missing.json()["id"])
        assert op["state"] == "failed" and op["error"]["code"] == "checkpoint.not_found", op
        body = await pool(admin, "given")
        assert (body["source"], body["size"], body["ready"], body["configured"]) == ("checkpoints", 2, 2, False)
        # A slot is handed off through its pool, not restored around it.
        restore = await admin.post(f"{API}/libvirt/checkpoints/slot-0/restore", json={"name": "base-0"})
        assert "warm pool 'given'" in assert_problem(restore, 409, "instance.invalid_state")["detail"]

        handed = []
        for _ in range(2):
            response = await admin.post(f"{API}/libvirt/warm-pools/given/handoff", json={})
            assert response.status_code == 202 and response.json()["a2a_token"], response.text
            op = await wait_operation(admin, response.json()["id"])
            assert (op["kind"], op["state"]) == ("libvirt.warm_pool.handoff", "succeeded"), op
            handed.append(op["result"])
        assert all(r["name"].startswith("given-") and r["state"] == "running" for r in handed)
        assert len({r["instance_id"] for r in handed}) == 2
        view = (await admin.get(f"{API}/instances/{handed[0]['instance_id']}")).json()
        assert view["provider_state"]["launched_from"] == "warm_pool:given"
        # Empty now: the handoff operation fails with the reason; an unknown pool is a 404.
        op = await wait_operation(admin, (await admin.post(f"{API}/libvirt/warm-pools/given/handoff")).json()["id"])
        assert op["state"] == "failed" and op["error"]["code"] == "warm_pool.empty", op
        assert_problem(await admin.post(f"{API}/libvirt/warm-pools/nope/handoff"), 404, "warm_pool.not_found")
        assert_problem(
            await admin.post(f"{API}/libvirt/warm-pools/given/handoff", json={"x": 1}), 422, "validation.failed"
        )
        body = await pool(admin, "given")
        assert (body["hits"], body["misses"], body["ready"]) == (2, 1, 0)
        assert {i.instance_id for i in await live.instances()} == {r["instance_id"] for r in handed}


def test_warm_pools_of_unknown_or_host_loadouts_stop_the_start(tmp_path: Path) -> None:
    for value, why in (("nope=1", "does not exist"), ("echo=1", "has no warm pools")):
        config = load_config(env=controller_env(tmp_path / value, "/tmp/unused.sock", AIWG_WARM_POOLS=value))
        with pytest.raises(ConfigError, match=why):
            create_app(config)


# -- containers (real podman) ----------------------------------------------------------------------


@pytest.mark.podman
async def test_a_container_slot_runs_tasks_as_its_new_instance_and_forks(
    short_dir: Path, tmp_path: Path, podman_storage: PodmanStorage
) -> None:
    env = podman_storage.hostd_env(short_dir / "podman.sock")
    async with stack(short_dir, tmp_path, env, AIWG_WARM_POOLS="busybox=1") as (admin, _live, url):
        await until_ready(admin, "busybox", 1)
        op, token = await provisioned(admin, {"name": "c1", "runtime": "container", "loadout": "busybox"})
        assert op["state"] == "succeeded" and op["result"]["launch"]["mode"] == "warm_pool", op
        iid = op["result"]["instance_id"]
        view = (await admin.get(f"{API}/instances/{iid}")).json()
        assert view["provider_state"]["container_name"] == f"aiwg-{iid}"
        assert view["image_ref"].startswith("localhost/busybox@sha256:")
        async with httpx.AsyncClient(base_url=f"{url}/agents/{iid}", timeout=30) as agent:
            params = runtime_params((await agent.get("/.well-known/agent-card.json")).json())
            assert (params["runtime"], params["provider"]) == ("container", "podman")
            assert params["image_ref"] == view["image_ref"] and "instance.fork" in params["capabilities"]
            headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0", "A2A-Extensions": RUNTIME_EXTENSION}
            message = {
                "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "echo $AIWG_INSTANCE_ID"}]}
            }
            answer = await agent.post("/message:send", json=message, headers=headers)
            assert answer.status_code == 200, answer.text
            sent = answer.json()["task"]
        assert sent["status"]["state"] == "TASK_STATE_COMPLETED", sent
        out = "".join(p["text"] for a in sent["artifacts"] if a["name"] == "stdout" for p in a["parts"])
        assert out == f"{iid}\n"  # the slot's container runs with the new instance's identity
        assert sent["metadata"]["runtime.capabilities"] == params["capabilities"]

        fork = {
            "name": "c2",
            "runtime": "container",
            "runtime_options": {"launch_strategy": {"mode": "fork", "asset_ref": "c1"}},
        }
        op, _ = await provisioned(admin, fork)
        assert op["state"] == "succeeded", op
        assert op["result"]["launch"]["launched_from"] == f"fork:{iid}"
        forked = (await admin.get(f"{API}/instances/{op['result']['instance_id']}")).json()
        assert (forked["state"], forked["loadout"]) == ("running", "busybox")


@pytest.mark.podman
async def test_a_controller_restarted_with_its_pool_half_filled_finds_it_as_it_was(
    short_dir: Path, tmp_path: Path, podman_storage: PodmanStorage
) -> None:
    live = LiveHostd(short_dir, env=podman_storage.hostd_env(short_dir / "podman.sock"))
    await live.start()
    try:
        config = load_config(env=controller_env(tmp_path / "controller", live.socket_path, AIWG_WARM_POOLS="busybox=3"))
        async with serve_controller(config) as ctl, ctl.client(ADMIN_TOKEN) as admin:
            with trio.fail_after(WAIT_S):
                while not ((body := await pool(admin, "busybox"))["ready"] >= 1 and body["filling"]):
                    await trio.sleep(0.02)
        # The controller is gone mid-fill; hostd goes on filling.
        async with serve_controller(config) as ctl, ctl.client(ADMIN_TOKEN) as admin:
            body = await until_ready(admin, "busybox", 3)
            assert (body["refills"], body["failures"]) == (3, 0)  # nothing was thrown away and made again
            assert (await admin.get(f"{API}/instances")).json()["items"] == []  # slots are nobody's instances
            op, _ = await provisioned(admin, {"name": "late", "runtime": "container", "loadout": "busybox"})
            assert op["state"] == "succeeded" and op["result"]["launch"]["mode"] == "warm_pool", op
    finally:
        await live.close()
