"""SSE: message:stream and subscribe, fan-out to several readers, keep-alives, a reader that leaves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import trio

from agentic_sandbox.controller.config import load_config
from tests.controller.a2a.helpers import Agent, error_reason, new_agent
from tests.controller.a2a.test_rest import message, send
from tests.controller.conftest import LiveController, LiveHostd, controller_env, serve_controller


async def read_stream(
    response: httpx.Response, *, comments: list[str] | None = None, pause_s: float = 0
) -> list[dict[str, Any]]:
    """The stream's events (data lines parsed); ``event: error`` data as {"error": ...}."""
    assert response.status_code == 200, await response.aread()
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
            if pause_s:
                await trio.sleep(pause_s)  # a slow reader
        elif line.startswith(":") and comments is not None:
            comments.append(line)
    return events


def outcome(events: list[dict[str, Any]]) -> tuple[list[str], str]:
    """(member names in order, stdout text assembled from the artifact updates)."""
    members = [next(iter(e)) for e in events]
    text = "".join(p["text"] for e in events if "artifactUpdate" in e for p in e["artifactUpdate"]["artifact"]["parts"])
    return members, text


async def test_message_stream_starts_with_the_task_and_ends_at_its_end(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "sse-echo", loadout="echo")
    async with (
        agent.client(controller) as client,
        client.stream("POST", "/message:stream", json={"message": message("streamed")}) as response,
    ):
        events = await read_stream(response)
    members, text = outcome(events)
    assert members[0] == "task" and events[0]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert events[0]["task"]["history"][0]["parts"] == [{"text": "streamed"}]
    assert events[0]["task"]["metadata"]["runtime.instance_id"] == agent.instance_id
    states = [e["statusUpdate"]["status"]["state"] for e in events if "statusUpdate" in e]
    assert states == ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
    assert members[-1] == "statusUpdate"
    assert text == "streamed"
    chunks = [e["artifactUpdate"] for e in events if "artifactUpdate" in e]
    assert "append" not in chunks[0] and chunks[-1]["lastChunk"] is True and chunks[-1]["append"] is True
    # The stored task says the same as the stream.
    async with agent.client(controller) as client:
        task = (await client.get(f"/tasks/{events[0]['task']['id']}")).json()
    assert task["status"] == events[-1]["statusUpdate"]["status"]


async def test_several_subscribers_see_the_same_events_and_a_slow_one_holds_up_no_one(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "sse-fanout", loadout="shell")
    script = "for i in 1 2 3 4 5; do echo line $i; sleep 0.1; done"
    async with agent.client(controller) as client:
        task = (await send(client, script, configuration={"returnImmediately": True})).json()["task"]
        results: dict[str, list[dict[str, Any]]] = {}

        async def follow(name: str, method: str, pause_s: float) -> None:
            async with (
                agent.client(controller) as own,
                own.stream(method, f"/tasks/{task['id']}:subscribe") as response,
            ):
                results[name] = await read_stream(response, pause_s=pause_s)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, "get", "GET", 0)
            nursery.start_soon(follow, "post", "POST", 0)
            nursery.start_soon(follow, "slow", "POST", 0.3)
    for events in results.values():
        assert next(iter(events[0])) == "task"
        assert outcome(events)[0][-1] == "statusUpdate"
        assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    # Each began from the task as it stood when it came; from there on they read the same events.
    finals = {json.dumps(events[-1], sort_keys=True) for events in results.values()}
    assert len(finals) == 1
    async with agent.client(controller) as client:
        stored = (await client.get(f"/tasks/{task['id']}")).json()
        assert "".join(p["text"] for p in stored["artifacts"][0]["parts"]) == "".join(
            f"line {i}\n" for i in range(1, 6)
        )
        done = await client.post(f"/tasks/{task['id']}:subscribe")
        assert done.status_code == 400 and error_reason(done) == "UNSUPPORTED_OPERATION"
        missing = await client.post("/tasks/01930000-0000-7000-8000-000000000000:subscribe")
        assert missing.status_code == 404 and error_reason(missing) == "TASK_NOT_FOUND"


def stdout_seen(events: list[dict[str, Any]]) -> str:
    """What a stream shows of stdout: the first Task's artifact, then each appended chunk."""
    first = events[0]["task"]
    text = "".join(p["text"] for a in first.get("artifacts", []) if a["artifactId"] == "stdout" for p in a["parts"])
    for e in events[1:]:
        if "artifactUpdate" in e and e["artifactUpdate"]["artifact"]["artifactId"] == "stdout":
            text += "".join(p["text"] for p in e["artifactUpdate"]["artifact"]["parts"])
    return text


async def test_a_stream_that_joins_a_busy_task_shows_each_chunk_once(
    admin: httpx.AsyncClient, controller: LiveController, tmp_path: Path
) -> None:
    """Subscriptions and follow-up streams that start while the agent writes: the first Task's
    artifacts and the updates after it add up to the output, nothing twice and nothing missed
    (the Task and the cursor it hands on come from one read of the store)."""
    agent = await new_agent(admin, controller, "sse-busy", loadout="shell")
    gate = tmp_path / "gate"  # the agent writes until every stream has begun, then a little more
    script = f"i=0; while [ ! -e {gate} ]; do echo $i; i=$((i+1)); sleep 0.003; done; echo end"
    streams = 24
    seen: list[list[dict[str, Any]]] = []
    begun = 0
    all_begun = trio.Event()
    async with agent.client(controller) as client:
        task = (await send(client, script, configuration={"returnImmediately": True})).json()["task"]

        async def follow(how: str) -> None:
            nonlocal begun
            events: list[dict[str, Any]] = []
            async with agent.client(controller) as own:
                if how == "subscribe":
                    request = own.stream("POST", f"/tasks/{task['id']}:subscribe")
                else:
                    body = {"message": {**message("more"), "taskId": task["id"]}}
                    request = own.stream("POST", "/message:stream", json=body)
                async with request as response:
                    assert response.status_code == 200, await response.aread()
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            events.append(json.loads(line[6:]))
                            if len(events) == 1:
                                begun += 1
                                if begun == streams:
                                    all_begun.set()
            seen.append(events)

        async with trio.open_nursery() as nursery:
            for i in range(streams):
                nursery.start_soon(follow, "subscribe" if i % 2 else "follow-up")
                await trio.sleep(0.02)
            with trio.fail_after(30):
                await all_begun.wait()
            gate.touch()
        final = (await client.get(f"/tasks/{task['id']}")).json()
    expected = "".join(p["text"] for p in final["artifacts"][0]["parts"])
    numbers = expected.split()
    assert numbers[-1] == "end" and numbers[:-1] == [str(i) for i in range(len(numbers) - 1)], expected[-200:]
    assert len(seen) == streams
    for events in seen:
        assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED", events[-1]
        assert stdout_seen(events) == expected


async def test_keepalives_and_a_reader_that_leaves_leaves_nothing_behind(hostd: LiveHostd, short_dir: Path) -> None:
    config = load_config(env=controller_env(short_dir / "ctl", hostd.socket_path, AIWG_SSE_KEEPALIVE_S="0.1"))
    async with serve_controller(config) as live, live.client() as admin:
        agent: Agent = await new_agent(admin, live, "sse-leave", loadout="shell")
        async with agent.client(live) as client:
            task = (await send(client, "sleep 1; echo late", configuration={"returnImmediately": True})).json()["task"]
            comments: list[str] = []
            async with client.stream("POST", f"/tasks/{task['id']}:subscribe") as response:
                events = await read_stream(response, comments=comments)
            assert ": keep-alive" in comments
            assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"

            slow = (await send(client, "sleep 2; echo done", configuration={"returnImmediately": True})).json()["task"]
            async with client.stream("POST", f"/tasks/{slow['id']}:subscribe") as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        break  # the first event, then the client goes away
            hub = live.state.tasks.hub
            with trio.fail_after(10):
                while hub.watchers(slow["id"]):
                    await trio.sleep(0.05)
            # The task itself was not the reader's: it still ends as it would have.
            with trio.fail_after(15):
                while (await client.get(f"/tasks/{slow['id']}")).json()["status"]["state"] == "TASK_STATE_WORKING":
                    await trio.sleep(0.1)
            assert (await client.get(f"/tasks/{slow['id']}")).json()["status"]["state"] == "TASK_STATE_COMPLETED"
