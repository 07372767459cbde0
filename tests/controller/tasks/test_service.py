"""Tasks across a controller SIGKILL: nothing acknowledged is lost, the running exec is followed
again, and a subscriber that reconnects misses nothing. (The operations of the service are driven
end to end in tests/controller/a2a/.)"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import trio

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from agentic_sandbox.controller.store import Store, TaskEvent
from tests.controller.a2a.helpers import process_agent
from tests.controller.a2a.test_rest import message
from tests.controller.conftest import ControllerProcess, LiveHostd, controller_env

EXPECTED = "".join(f"line {i}\n" for i in range(1, 9))


def script(gate: Path) -> str:
    """Four lines, a wait until the test opens the gate, four more lines."""
    first = "for i in 1 2 3 4; do echo line $i; sleep 0.05; done"
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    return f"{first}; {wait}; for i in 5 6 7 8; do echo line $i; sleep 0.05; done"


def agent_client(url: str, instance_id: str, token: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0", "A2A-Extensions": RUNTIME_EXTENSION}
    return httpx.AsyncClient(base_url=f"{url}/agents/{instance_id}", headers=headers, timeout=15)


def artifact_text(events: list[dict[str, Any]]) -> str:
    text = ""
    for event in events:
        if "task" in event:
            text += "".join(p["text"] for a in event["task"].get("artifacts", []) for p in a["parts"])
        elif "artifactUpdate" in event:
            text += "".join(p["text"] for p in event["artifactUpdate"]["artifact"]["parts"])
    return text


async def _stored_events(path: Path, task_id: str) -> list[TaskEvent]:
    """A task's events as the store reads them back (its rows are compact: :mod:`controller.store.tasks`)."""
    store = Store.open(path)
    try:
        return await store.tasks.events_after(task_id, 0, limit=100_000)
    finally:
        store.close()


async def test_a_task_survives_a_controller_sigkill(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "c", hostd.socket_path)
    async with trio.open_nursery() as nursery:
        first = ControllerProcess(env)
        url = await first.start(nursery)
        agent = await process_agent(url, "durable", "shell")
        instance_id, token = agent.instance_id, agent.token
        seen: list[dict[str, Any]] = []
        async with agent_client(url, instance_id, token) as client:
            gate = tmp_path / "gate"
            body = {"message": message(script(gate))}
            async with client.stream("POST", "/message:stream", json=body) as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        if "line 4" in artifact_text(seen):
                            break
            task_id = seen[0]["task"]["id"]
        await first.stop(signal.SIGKILL)
        # What the first controller sent was stored before it was sent.
        stored = [e.body for e in await _stored_events(Path(env["AIWG_STATE_DIR"]) / "controller.db", task_id)]
        sent_updates = [e.get("artifactUpdate") or e.get("statusUpdate") for e in seen[1:]]
        assert all(update in stored for update in sent_updates)

        second = ControllerProcess(env)
        url = await second.start(nursery)
        async with agent_client(url, instance_id, token) as client:
            resumed: list[dict[str, Any]] = []
            async with client.stream("POST", f"/tasks/{task_id}:subscribe") as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        resumed.append(json.loads(line[6:]))
                        gate.touch()  # the rest of the output comes while this subscriber reads
            task = (await client.get(f"/tasks/{task_id}")).json()
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
        assert "".join(p["text"] for p in task["artifacts"][0]["parts"]) == EXPECTED  # no gap, no repeat
        # The reconnected subscriber: the snapshot plus the updates after it are the whole output.
        assert resumed[0]["task"]["id"] == task_id
        assert artifact_text(resumed) == EXPECTED
        assert resumed[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        positions = [
            e.body["artifact"]["metadata"]["kagent.dev/a2a/timeline-position"]
            for e in await _stored_events(Path(env["AIWG_STATE_DIR"]) / "controller.db", task_id)
            if e.kind == "artifact"
        ]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        assert await second.stop() == 0, second.output()
        nursery.cancel_scope.cancel()


async def test_ended_tasks_are_purged_after_the_retention(hostd: LiveHostd, short_dir: Path) -> None:
    from agentic_sandbox.controller.config import load_config
    from tests.controller.a2a.helpers import new_agent
    from tests.controller.conftest import serve_controller

    config = load_config(env=controller_env(short_dir / "ctl", hostd.socket_path, AIWG_TASK_RETENTION_S="0.5"))
    async with serve_controller(config) as live, live.client() as admin:
        agent = await new_agent(admin, live, "purged", loadout="shell")
        async with agent.client(live) as client:
            running = (
                await client.post(
                    "/message:send", json={"message": message("sleep 3"), "configuration": {"returnImmediately": True}}
                )
            ).json()["task"]
            done = (await client.post("/message:send", json={"message": message("true")})).json()["task"]
            with trio.fail_after(15):
                while (await client.get(f"/tasks/{done['id']}")).status_code != 404:
                    await trio.sleep(0.05)
            # A task still running is never purged, however old.
            assert (await client.get(f"/tasks/{running['id']}")).status_code == 200
            with sqlite3.connect(config.database_path) as db:
                left = db.execute("SELECT COUNT(*) FROM task_events WHERE task_id = ?", (done["id"],)).fetchone()[0]
            assert left == 0
            await client.post(f"/tasks/{running['id']}:cancel")


async def test_the_retention_keeps_a_count_of_ended_tasks_per_instance(hostd: LiveHostd, short_dir: Path) -> None:
    from agentic_sandbox.controller.config import load_config
    from tests.controller.a2a.helpers import new_agent
    from tests.controller.conftest import serve_controller

    env = controller_env(short_dir / "ctl", hostd.socket_path, AIWG_TASK_RETENTION_PER_INSTANCE="2")
    config = load_config(env=env)
    async with serve_controller(config) as live, live.client() as admin:
        agent = await new_agent(admin, live, "kept", loadout="shell")
        async with agent.client(live) as client:
            ids = [
                (await client.post("/message:send", json={"message": message("true")})).json()["task"]["id"]
                for _ in range(4)
            ]
            assert await live.state.tasks.prune() == 2  # what the purger's timer does
            assert [(await client.get(f"/tasks/{t}")).status_code for t in ids] == [404, 404, 200, 200]
            listed = (await client.get("/tasks")).json()
            assert listed["totalSize"] == 2 and {t["id"] for t in listed["tasks"]} == set(ids[2:])
        metrics = (await admin.get("/metrics")).text
        assert 'aiwg_tasks_pruned_total{reason="count"} 2.0' in metrics


async def test_an_ended_tasks_exec_is_deleted_on_hostd(hostd: LiveHostd, short_dir: Path) -> None:
    """The runner deletes the exec once the end is stored (a moment after the answer went out),
    so hostd does not keep an exited exec per task."""
    from agentic_sandbox.controller.config import load_config
    from agentic_sandbox.proto import HostdRemoteError, open_hostd
    from agentic_sandbox.proto import messages as m
    from tests.controller.a2a.helpers import new_agent
    from tests.controller.conftest import serve_controller

    config = load_config(env=controller_env(short_dir / "ctl", hostd.socket_path))
    async with serve_controller(config) as live, live.client() as admin:
        agent = await new_agent(admin, live, "reaped", loadout="echo")
        async with agent.client(live) as client:
            done = (await client.post("/message:send", json={"message": message("hi")})).json()["task"]
        assert done["status"]["state"] == "TASK_STATE_COMPLETED"
        with sqlite3.connect(config.database_path) as db:
            (exec_id,) = db.execute("SELECT exec_id FROM tasks WHERE id = ?", (done["id"],)).fetchone()
        async with open_hostd(hostd.socket_path, client_name="test") as hostd_client:
            with trio.fail_after(10):
                while True:
                    try:
                        await hostd_client.call(m.ExecGetRequest(exec_id=exec_id))
                    except HostdRemoteError as exc:
                        assert exc.code == "exec.not_found"
                        break
                    await trio.sleep(0.01)
