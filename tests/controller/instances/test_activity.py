"""Instances that sleep when idle and wake on traffic, through the controller (docs/sleep.md): a real
hostd with real cgroups, the controller on loopback, A2A over httpx. What keeps an instance awake
that hostd cannot see is reported by controller/instances/activity.py."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentic_sandbox.controller.config import load_config
from tests.controller.a2a.helpers import Agent, new_agent
from tests.controller.a2a.test_hitl import ACTIVE, answer, ask_script, envelope_of, waiting
from tests.controller.a2a.test_rest import message, send, settled, text_of
from tests.controller.conftest import LiveController, LiveHostd, controller_env, serve_controller, wait_operation
from tests.controller.sse import SseEvent, SseReader
from tests.podman_service import PodmanStorage

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="host instances freeze in the cgroup freezer (root)")

EVENTS = "/api/v2/admin/events"


def _config(hostd: LiveHostd, state: Path) -> Any:
    return load_config(env=controller_env(state, hostd.socket_path, AIWG_WATCH_INTERVAL_S="0.1"))


@pytest.fixture
async def live(hostd: LiveHostd, tmp_path: Path) -> AsyncIterator[LiveController]:
    async with serve_controller(_config(hostd, tmp_path / "controller")) as controller:
        yield controller


async def instance(admin: httpx.AsyncClient, iid: str) -> dict[str, Any]:
    response = await admin.get(f"/api/v2/admin/instances/{iid}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def wait_state(admin: httpx.AsyncClient, iid: str, state: str, within: float = 10.0) -> dict[str, Any]:
    with trio.fail_after(within):
        while (body := await instance(admin, iid))["state"] != state:
            await trio.sleep(0.05)
    return body


async def next_event(reader: SseReader, kind: str, iid: str) -> SseEvent:
    with trio.fail_after(15):
        return await reader.until(lambda e: e.event == kind and e.data["subject"] == f"instance/{iid}")


async def test_requests_keep_it_awake_then_it_sleeps_and_a_send_wakes_it(live: LiveController) -> None:
    async with live.client() as admin:
        idle = {"after_s": 1.5}
        agent = await new_agent(admin, live, "sleepy", loadout="echo", idle=idle)
        body = await instance(admin, agent.instance_id)
        assert body["idle"] == {"after_s": 1.5, "sleep": "freeze", "wake_on_traffic": True}
        async with (
            agent.client(live) as client,
            admin.stream("GET", EVENTS, params={"follow": "true", "kind": "instance.*"}) as events,
        ):
            reader = SseReader(events)
            # A2A requests that need no process (a task listing) are traffic too: hostd hears of them.
            for _ in range(8):
                assert (await client.get("/tasks")).status_code == 200
                await trio.sleep(0.4)
            assert (await instance(admin, agent.instance_id))["state"] == "running"
            # Left alone, it sleeps; the card is still served, and reading it does not wake it.
            asleep = await wait_state(admin, agent.instance_id, "sleeping", within=6)
            assert asleep["sleep"]["how"] == "freeze" and asleep["sleep"]["cause"] == "idle"
            assert asleep["operation_status"] == "ready"
            slept = await next_event(reader, "instance.slept", agent.instance_id)
            assert slept.data["data"] == {"how": "freeze", "cause": "idle"}
            card = await httpx.AsyncClient().get(f"{agent.base}/.well-known/agent-card.json")
            assert card.status_code == 200
            assert (await instance(admin, agent.instance_id))["state"] == "sleeping"

            response = await send(client, "wake up")
            assert response.status_code == 200, response.text
            task = response.json()["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED"
            assert text_of(task, "stdout") == "wake up"
            woke = await next_event(reader, "instance.woke", agent.instance_id)
        assert woke.data["data"]["cause"] == "exec" and woke.data["data"]["how"] == "freeze"
        assert 0 < woke.data["data"]["took_ms"] < 1000
        body = await instance(admin, agent.instance_id)
        assert body["state"] == "running" and "sleep" not in body
        assert body["provider_state"]["wakes"] == 1 and body["provider_state"]["last_wake"]["cause"] == "exec"
        metrics = (await admin.get("/metrics")).text
        assert 'aiwg_instance_wakes_total{cause="exec",runtime="host"} 1.0' in metrics
        assert 'aiwg_instance_sleeps_total{how="freeze",runtime="host"} 1.0' in metrics
        assert 'aiwg_instance_wake_seconds_count{runtime="host"} 1.0' in metrics


async def test_a_task_waiting_for_an_answer_lets_it_sleep_and_the_answer_wakes_it(live: LiveController) -> None:
    async with live.client() as admin:
        agent = await new_agent(admin, live, "asker", loadout="shell", idle={"after_s": 1})
        async with agent.client(live, **ACTIVE) as client:
            task = await waiting(client, ask_script())
            # Its exec runs, but waits for the answer: parked, it keeps nothing awake.
            await wait_state(admin, agent.instance_id, "sleeping", within=8)
            prompt_id = envelope_of(task)["prompt_id"]
            response = await client.post("/message:send", json=answer(task["id"], prompt_id, {"approved": True}))
            assert response.status_code == 200, response.text
            done = await settled(client, task["id"])
        assert done["status"]["state"] == "TASK_STATE_COMPLETED", done["status"]
        assert text_of(done, "stdout").startswith("got: ")
        body = await instance(admin, agent.instance_id)
        assert body["provider_state"]["last_wake"]["cause"] == "exec.control"


async def test_a_subscriber_to_a_waiting_task_wakes_its_instance(live: LiveController) -> None:
    async with live.client() as admin:
        agent = await new_agent(admin, live, "watched", loadout="shell", idle={"after_s": 1})
        async with agent.client(live, **ACTIVE) as client:
            task = await waiting(client, ask_script())
            await wait_state(admin, agent.instance_id, "sleeping", within=8)
            async with client.stream("POST", f"/tasks/{task['id']}:subscribe") as stream:
                assert stream.status_code == 200
                body = await wait_state(admin, agent.instance_id, "running", within=5)
                assert body["provider_state"]["last_wake"]["cause"] == "a2a.subscribe"
            prompt_id = envelope_of(task)["prompt_id"]
            response = await client.post("/message:send", json=answer(task["id"], prompt_id, {"approved": True}))
            assert response.status_code == 200, response.text
            assert (await settled(client, task["id"]))["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_operator_sleep_wake_and_idle_policy(live: LiveController) -> None:
    async with live.client() as admin:
        agent: Agent = await new_agent(admin, live, "operated", loadout="shell")
        iid = agent.instance_id
        async with agent.client(live) as client:
            # A running task keeps it awake: the operator's sleep is refused, naming why.
            response = await client.post(
                "/message:send", json={"message": message("sleep 3"), "configuration": {"returnImmediately": True}}
            )
            assert response.status_code == 200, response.text
            busy = await admin.post(f"/api/v2/admin/instances/{iid}/sleep")
            assert busy.status_code == 409 and busy.json()["code"] == "instance.busy", busy.text
            assert "stays awake: exec" in busy.text
            await settled(client, response.json()["task"]["id"])
        refused = await admin.post(f"/api/v2/admin/instances/{iid}/sleep", json={"how": "save"})
        assert refused.status_code == 501 and refused.json()["code"] == "capability.unsupported", refused.text
        bad = await admin.post(f"/api/v2/admin/instances/{iid}/sleep", json={"how": "hibernate"})
        assert bad.status_code == 422, bad.text
        response = await admin.post(f"/api/v2/admin/instances/{iid}/sleep")
        assert response.status_code == 200, response.text
        assert response.json()["state"] == "sleeping" and response.json()["sleep"]["cause"] == "operator"
        listed = (await admin.get("/api/v2/admin/instances", params={"state": "sleeping"})).json()["items"]
        assert [i["id"] for i in listed] == [iid] and listed[0]["sleep"]["how"] == "freeze"
        # No wake on traffic: a send is refused with the reason, until an operator wakes it.
        policy = {"idle": {"after_s": 3600, "wake_on_traffic": False}}
        response = await admin.put(f"/api/v2/admin/instances/{iid}/idle", json=policy)
        assert response.status_code == 200 and response.json()["idle"]["wake_on_traffic"] is False
        async with agent.client(live) as client:
            refused = await send(client, "echo hi")
            # A2A's word for an instance that cannot run a task now, with hostd's reason.
            assert refused.status_code == 503, refused.text
            assert iid in refused.text and "does not wake it on traffic; wake it first" in refused.text
            response = await admin.post(f"/api/v2/admin/instances/{iid}/wake")
            assert response.status_code == 200 and response.json()["state"] == "running", response.text
            response = await send(client, "echo hi")
            assert response.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        response = await admin.put(f"/api/v2/admin/instances/{iid}/idle", json={"idle": None})
        assert response.status_code == 200 and "idle" not in response.json()
        unknown = await admin.post("/api/v2/admin/instances/01a2437f-0000-7000-8000-000000000000/sleep")
        assert unknown.status_code == 404


async def test_a_controller_restart_while_it_sleeps_keeps_it_asleep_and_wakeable(
    hostd: LiveHostd, tmp_path: Path
) -> None:
    state = tmp_path / "controller"
    async with serve_controller(_config(hostd, state)) as first, first.client() as admin:
        agent = await new_agent(admin, first, "restarted", loadout="echo")
        assert (await admin.post(f"/api/v2/admin/instances/{agent.instance_id}/sleep")).status_code == 200
    async with serve_controller(_config(hostd, state)) as second, second.client() as admin:
        body = await instance(admin, agent.instance_id)
        assert body["state"] == "sleeping" and body["sleep"]["cause"] == "operator"
        moved = Agent(agent.instance_id, agent.token, f"{second.url}/agents/{agent.instance_id}")
        async with moved.client(second) as client:
            response = await send(client, "good morning")
        assert response.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert (await instance(admin, agent.instance_id))["state"] == "running"


# -- containers: a loadout's idle policy, a wake through A2A, a wake that fails -----------------

SLEEPY_BOX = """name: sleepy-box
version: "1"
runtime: docker
image: localhost/busybox:latest
command: ["/bin/sh"]
idle:
  after_s: 1
"""


@pytest.fixture
async def podman_live(short_dir: Path, tmp_path: Path, podman_storage: PodmanStorage) -> AsyncIterator[LiveController]:
    hostd = LiveHostd(short_dir, env=podman_storage.hostd_env(short_dir / "podman.sock"))
    await hostd.start()
    try:
        async with serve_controller(_config(hostd, tmp_path / "controller")) as controller:
            yield controller
    finally:
        await hostd.close()


@pytest.mark.podman
async def test_a_container_sleeps_by_its_loadout_wakes_on_a_send_and_a_failed_wake_is_named(
    podman_live: LiveController, podman_storage: PodmanStorage
) -> None:
    async with podman_live.client() as admin:
        created = await admin.post("/api/v2/admin/loadouts", json={"name": "sleepy-box", "manifest": SLEEPY_BOX})
        assert created.status_code == 201, created.text
        assert created.json()["idle"] == {"after_s": 1, "sleep": "freeze", "wake_on_traffic": True}
        response = await admin.post(
            "/api/v2/admin/instances", json={"name": "box", "runtime": "docker", "loadout": "sleepy-box"}
        )
        assert response.status_code == 202, response.text
        token = response.json()["a2a_token"]
        op = await wait_operation(admin, response.json()["id"], timeout=60)
        assert op["state"] == "succeeded", op
        iid = op["result"]["instance_id"]
        agent = Agent(iid, token, f"{podman_live.url}/agents/{iid}")
        asleep = await wait_state(admin, iid, "sleeping")
        assert asleep["sleep"]["how"] == "freeze" and asleep["provider_state"]["status"] == "paused"
        async with agent.client(podman_live) as client:
            response = await send(client, "echo from-a-paused-box")
            assert response.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED", response.text
            assert text_of(response.json()["task"], "stdout") == "from-a-paused-box\n"
            await wait_state(admin, iid, "sleeping")
            # Its container removed behind hostd's back while it sleeps: the wake fails, and says why.
            removed = await trio.run_process(
                [*podman_storage.argv(), "rm", "-f", f"aiwg-{iid}"], capture_stdout=True, check=False
            )
            assert removed.returncode == 0
            refused = await send(client, "echo never")
        assert refused.status_code == 503, refused.text
        assert iid in refused.text and "could not be woken" in refused.text and f"aiwg-{iid}" in refused.text
        body = await instance(admin, iid)
        assert body["state"] == "failed" and "sleep" not in body
