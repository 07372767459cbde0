"""fleet-workload/v1 through a controller SIGKILL, driven by ``agentic fleet`` as an orchestrator
would (upstream's live proof, with an orchestrator that is not AIWG's): admit two children and bind
each to an A2A task of this executor, kill the controller, start it again on the same state, retry
the admission with a new transport timestamp, read the inventory back and reconcile. A real hostd
and real controller processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.controller.a2a.helpers import RUNTIME_EXTENSION
from tests.controller.conftest import ADMIN_TOKEN, ControllerProcess, LiveHostd, controller_env
from tests.controller.fleet.workloads import admission, records

A2A = {"A2A-Version": "1.0", "A2A-Extensions": RUNTIME_EXTENSION, "Authorization": f"Bearer {ADMIN_TOKEN}"}


def agentic(url: str, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIWG_")}
    command = [sys.executable, "-m", "agentic_sandbox.cli.agentic", "--url", url, "--token", ADMIN_TOKEN, *argv]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, env=env, timeout=60)


async def run_agentic(url: str, *argv: str, stdin: str | None = None) -> Any:
    done = await trio.to_thread.run_sync(lambda: agentic(url, *argv, stdin=stdin))
    assert done.returncode == 0, done.stderr
    return done


async def start_task(url: str, instance_id: str, text: str) -> str:
    body = {
        "message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]},
        "configuration": {"returnImmediately": True},
    }
    async with httpx.AsyncClient(base_url=f"{url}/agents/{instance_id}", headers=A2A, timeout=20) as client:
        sent = await client.post("/message:send", json=body)
        assert sent.status_code == 200, sent.text
        return str(sent.json()["task"]["id"])


async def test_admitted_work_survives_a_controller_sigkill(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "controller", hostd.socket_path)
    async with trio.open_nursery() as nursery:
        first = ControllerProcess(env)
        url = await first.start(nursery)
        async with httpx.AsyncClient(base_url=url, headers=A2A, timeout=20) as admin:
            body = {"name": "fleet-host", "runtime": "host", "loadout": "shell", "start": True}
            op_id = (await admin.post("/api/v2/admin/instances", json=body)).json()["id"]
            with trio.fail_after(20):
                while (op := (await admin.get(f"/api/v2/admin/operations/{op_id}")).json())["state"] != "succeeded":
                    assert op["state"] in ("pending", "running"), op
                    await trio.sleep(0.05)
        instance_id = op["result"]["instance_id"]
        long_task = await start_task(url, instance_id, "sleep 60")
        short_task = await start_task(url, instance_id, "echo done")

        fixture = records()
        agent = admission(fixture["child-agent"], orchestrator_id="other-orchestrator", task_id=long_task)
        command = admission(fixture["child-command"], orchestrator_id="other-orchestrator", task_id=short_task)
        workload = tmp_path / "agent.json"
        workload.write_text(json.dumps(agent))
        admitted = await run_agentic(url, "fleet", "dispatch", "--file", str(workload))
        assert "admitted" in admitted.stderr and json.loads(admitted.stdout) == agent
        await run_agentic(url, "fleet", "dispatch", "--file", "-", stdin=json.dumps(command))
        assert await first.stop(signal.SIGKILL) == -signal.SIGKILL

        second = ControllerProcess(env)
        url = await second.start(nursery)
        agent["status"]["last_seen"] = "2026-08-02T15:59:00Z"  # the retry's new transport timestamp
        workload.write_text(json.dumps(agent))
        replay = await run_agentic(url, "fleet", "dispatch", "--file", str(workload))
        assert "already admitted" in replay.stderr
        assert json.loads(replay.stdout)["lineage"]["task_id"] == long_task

        with trio.fail_after(20):  # the echo task ends once the restarted controller follows it again
            while (got := json.loads((await run_agentic(url, "fleet", "get", "child-command")).stdout))["status"][
                "observed_state"
            ] != "succeeded":
                await trio.sleep(0.2)
        assert got["status"]["exit_classification"] == "success"
        assert got["status"]["artifacts"][0]["uri"] == f"/agents/{instance_id}/v1/tasks/{short_task}"

        inventory = json.loads((await run_agentic(url, "fleet", "inventory")).stdout)
        children = {r["lineage"]["child_id"]: r for r in inventory["records"]}
        assert set(children) == {"child-agent", "child-command"}
        assert children["child-agent"]["lineage"]["task_id"] == long_task  # one identity, not a second task
        assert children["child-agent"]["status"]["observed_state"] == "running"

        before = str(inventory["inventory_revision"])
        argv = ["fleet", "reconcile", "--before-revision", before, "--child-id", "child-agent"]
        report = json.loads((await run_agentic(url, *argv, "--child-id", "child-command")).stdout)
        assert {r["child_id"]: r["classification"] for r in report["rows"]} == {
            "child-agent": "re-adopted",
            "child-command": "terminal",
        }
        assert report["after_revision"] == inventory["inventory_revision"]  # nothing changed meanwhile
        async with httpx.AsyncClient(base_url=f"{url}/agents/{instance_id}", headers=A2A, timeout=20) as client:
            listed = await client.get("/tasks")
        assert listed.status_code == 200, listed.text
        assert sorted(t["id"] for t in listed.json()["tasks"]) == sorted([long_task, short_task])  # none added
        assert await second.stop() == 0
