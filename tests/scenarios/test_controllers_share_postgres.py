"""Several controllers, one PostgreSQL, one hostd: real processes end to end.

Every controller here is ``agentic-controller`` as a child process on its own loopback port, all of
them on one fresh database of the run's PostgreSQL server and one state dir, beside one real hostd.
A controller is killed with SIGKILL mid-task, mid-stream and mid-send, and what the surviving one
serves is checked for a gap or a duplicate.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.controller.a2a.helpers import A2A_HEADERS, Agent, process_agent
from tests.controller.a2a.test_rest import message
from tests.controller.a2a.test_sse import read_stream, stdout_seen
from tests.controller.conftest import ADMIN_TOKEN, ControllerProcess, LiveHostd, controller_env, provision
from tests.controller.pty.test_attach_restart import COUNTER, Transcript, _hostd_record
from tests.controller.pty.wsclient import attach_url
from tests.controller.push.conftest import PUSH_ENV
from tests.controller.push.receiver import Receiver
from tests.controller.push.test_delivery import send_with_push
from tests.controller.tasks.test_agentio import AGENT
from tests.postgres_service import PgCluster
from tests.tcpproxy import TcpProxy

#: Short claims, so a takeover happens within a test's patience (the default is 2 s).
LEASE_TTL_S = "1.0"
IDEMPOTENCY = f"{A2A_HEADERS['A2A-Extensions']}, https://agentic-sandbox.aiwg.io/extensions/idempotency/v1"


def shared_env(tmp_path: Path, hostd: LiveHostd, url: str) -> dict[str, str]:
    return controller_env(
        tmp_path / "state",
        hostd.socket_path,
        AIWG_DATABASE_URL=url,
        AIWG_LEASE_TTL_S=LEASE_TTL_S,
        AIWG_NOTIFY_POLL_S="0.5",
    )


@asynccontextmanager
async def controllers(env: dict[str, str], count: int) -> AsyncIterator[list[tuple[ControllerProcess, str]]]:
    async with trio.open_nursery() as nursery:
        started = []
        for _ in range(count):
            proc = ControllerProcess(env)
            started.append((proc, await proc.start(nursery)))
        for _, url in started:
            await _ready(url)
        try:
            yield started
        except BaseException:
            for i, (proc, _) in enumerate(started):  # what each said, beside the failure
                print(f"--- controller {i}:\n{proc.output()[-6000:]}")
            raise
        finally:
            for proc, _ in started:
                await proc.stop()
            nursery.cancel_scope.cancel()


async def _ready(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        with trio.fail_after(20):
            while (await client.get("/readyz")).status_code != 200:
                await trio.sleep(0.05)


def a2a(url: str, agent: Agent, **headers: str) -> httpx.AsyncClient:
    auth = {"Authorization": f"Bearer {agent.token}"}
    return httpx.AsyncClient(
        base_url=f"{url}/agents/{agent.instance_id}", headers={**A2A_HEADERS, **auth, **headers}, timeout=30
    )


def admin(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=15)


async def settled(client: httpx.AsyncClient, task_id: str, timeout: float = 30) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while True:
            task: dict[str, Any] = (await client.get(f"/tasks/{task_id}")).json()
            if task["status"]["state"] not in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"):
                return task
            await trio.sleep(0.05)


def _without_url(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "agent_card_url"} for item in items]


def stdout_of(task: dict[str, Any]) -> str:
    return "".join(p["text"] for a in task.get("artifacts", []) if a["artifactId"] == "stdout" for p in a["parts"])


LINES = 30
SCRIPT = f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.1; done"
EXPECTED = "".join(f"line {i}\n" for i in range(1, LINES + 1))


async def test_any_controller_answers_and_an_instance_token_changes_everywhere_at_once(
    hostd: LiveHostd, tmp_path: Path, pg_url: str
) -> None:
    async with controllers(shared_env(tmp_path, hostd, pg_url), 2) as [(_, url_a), (_, url_b)]:
        agent = await process_agent(url_a, "shared", "echo")
        async with a2a(url_b, agent) as at_b:
            sent = await at_b.post("/message:send", json={"message": message("hello from b")})
            assert sent.status_code == 200, sent.text
            task = sent.json()["task"]
        async with a2a(url_a, agent) as at_a:
            assert (await settled(at_a, task["id"]))["artifacts"][0]["parts"] == [{"text": "hello from b"}]
        async with admin(url_a) as client:
            listed = (await client.get("/api/v2/admin/instances")).json()["items"]
        async with admin(url_b) as client:
            # The same catalog (the card's URL follows the address each client used).
            assert _without_url((await client.get("/api/v2/admin/instances")).json()["items"]) == _without_url(listed)
            rotated = await client.post(f"/api/v2/admin/instances/{agent.instance_id}/a2a-token")
            assert rotated.status_code in (200, 201), rotated.text
            new_token = rotated.json()["token"]
        # The old token fails at the controller that did not issue the new one, as soon as it commits.
        with trio.fail_after(2):
            while True:
                async with a2a(url_a, agent) as at_a:
                    if (await at_a.get(f"/tasks/{task['id']}")).status_code == 401:
                        break
                await trio.sleep(0.01)
        fresh = Agent(agent.instance_id, new_token, agent.base)
        async with a2a(url_a, fresh) as at_a:
            assert (await at_a.get(f"/tasks/{task['id']}")).status_code == 200


async def test_a_task_and_its_stream_go_on_when_the_controller_following_it_is_killed(
    hostd: LiveHostd, tmp_path: Path, pg_url: str
) -> None:
    async with controllers(shared_env(tmp_path, hostd, pg_url), 2) as [(proc_a, url_a), (_, url_b)]:
        agent = await process_agent(url_a, "worker", "shell")
        async with a2a(url_a, agent) as at_a:
            sent = await at_a.post(
                "/message:send", json={"message": message(SCRIPT), "configuration": {"returnImmediately": True}}
            )
            task = sent.json()["task"]  # started at A: A follows its exec
        events: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:

            async def follow() -> None:
                async with a2a(url_b, agent) as at_b, at_b.stream("POST", f"/tasks/{task['id']}:subscribe") as stream:
                    events.extend(await read_stream(stream))

            nursery.start_soon(follow)
            await trio.sleep(1.0)  # a few lines in
            await proc_a.stop(signal.SIGKILL)
            with trio.fail_after(30):
                while not events:
                    await trio.sleep(0.05)
        assert stdout_seen(events) == EXPECTED  # each line once, none missing
        assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        async with a2a(url_b, agent) as at_b:
            stored = await settled(at_b, task["id"])
        assert stdout_of(stored) == EXPECTED
        assert stored["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_one_message_id_at_two_controllers_at_once_makes_one_task(
    hostd: LiveHostd, tmp_path: Path, pg_url: str
) -> None:
    async with controllers(shared_env(tmp_path, hostd, pg_url), 2) as [(_, url_a), (_, url_b)]:
        agent = await process_agent(url_a, "once", "shell")
        body = {"message": {**message("sleep 0.5; echo once"), "messageId": str(uuid.uuid4())}}
        answers: dict[str, httpx.Response] = {}

        async def send(name: str, url: str) -> None:
            async with a2a(url, agent, **{"A2A-Extensions": IDEMPOTENCY}) as client:
                answers[name] = await client.post("/message:send", json=body)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "a", url_a)
            nursery.start_soon(send, "b", url_b)
        assert answers["a"].status_code == answers["b"].status_code == 200
        assert answers["a"].json() == answers["b"].json()
        async with a2a(url_a, agent) as client:
            tasks = (await client.get("/tasks")).json()["tasks"]
        assert len(tasks) == 1 and stdout_of(answers["a"].json()["task"]) == "once\n"


async def test_a_send_cut_by_its_controllers_death_is_answered_by_another_with_the_same_task(
    hostd: LiveHostd, tmp_path: Path, pg_url: str
) -> None:
    async with controllers(shared_env(tmp_path, hostd, pg_url), 2) as [(proc_a, url_a), (_, url_b)]:
        agent = await process_agent(url_a, "cut", "shell")
        body = {"message": {**message("sleep 2; echo done"), "messageId": str(uuid.uuid4())}}
        headers = {"A2A-Extensions": IDEMPOTENCY}
        async with trio.open_nursery() as nursery:

            async def first() -> None:
                async with a2a(url_a, agent, **headers) as client:
                    try:
                        await client.post("/message:send", json=body)
                    except httpx.HTTPError:
                        pass  # its controller dies under it

            nursery.start_soon(first)
            await trio.sleep(0.7)  # the task runs, its answer is not there yet
            await proc_a.stop(signal.SIGKILL)
        async with a2a(url_b, agent, **headers) as client:
            retry = await client.post("/message:send", json=body)
            assert retry.status_code == 200, retry.text
            task = retry.json()["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED" and stdout_of(task) == "done\n"
            tasks = (await client.get("/tasks")).json()["tasks"]
        assert [t["id"] for t in tasks] == [task["id"]]


async def test_a_terminal_whose_controller_is_killed_reattaches_at_another_from_its_last_sequence(
    hostd: LiveHostd, tmp_path: Path, pg_url: str
) -> None:
    async with controllers(shared_env(tmp_path, hostd, pg_url), 2) as [(proc_a, url_a), (_, url_b)]:
        async with admin(url_a) as client:
            iid = (await provision(client, "tty", start=True))["result"]["instance_id"]
            response = await client.post(
                f"/api/v2/admin/instances/{iid}/sessions", json={"argv": ["/bin/sh", "-c", COUNTER]}
            )
            assert response.status_code == 201, response.text
            sid = response.json()["id"]
        transcript = Transcript(sid, binary=True)
        for url in (url_a, url_b):
            async with trio.open_nursery() as clients:
                transcript.frames_this_cycle = 0
                transcript.progress = trio.Event()
                clients.start_soon(transcript.follow, attach_url(url, iid, sid))
                with trio.fail_after(30):
                    await transcript.progress.wait()
                if url == url_a:
                    await proc_a.stop(signal.SIGKILL)  # the client's connection drops with it
                else:
                    clients.cancel_scope.cancel()
        assert bytes(transcript.data) == await _hostd_record(hostd.socket_path, sid, transcript.last)
        counts = [int(n) for n in re.findall(rb"count (\d+)\r\n", bytes(transcript.data))]
        assert counts == list(range(1, len(counts) + 1))


async def test_a_controller_that_loses_the_database_fails_closed_while_another_carries_on(
    hostd: LiveHostd, tmp_path: Path, pg_url: str
) -> None:
    direct = httpx.URL(pg_url)
    async with trio.open_nursery() as proxies:
        proxy = TcpProxy(direct.host, direct.port or 5432)
        port = await proxies.start(proxy.run)
        cut_url = pg_url.replace(f":{direct.port}/", f":{port}/")
        env = shared_env(tmp_path, hostd, pg_url)
        env_a = {**env, "AIWG_DATABASE_URL": cut_url, "AIWG_DATABASE_TIMEOUT_S": "1"}
        async with trio.open_nursery() as nursery:
            proc_a, proc_b = ControllerProcess(env_a), ControllerProcess(env)
            url_a, url_b = await proc_a.start(nursery), await proc_b.start(nursery)
            await _ready(url_a)
            await _ready(url_b)
            agent = await process_agent(url_b, "split", "shell")
            async with a2a(url_a, agent) as at_a:
                sent = await at_a.post(
                    "/message:send", json={"message": message(SCRIPT), "configuration": {"returnImmediately": True}}
                )
                task = sent.json()["task"]  # A follows it
            events: list[dict[str, Any]] = []

            async def follow() -> None:
                async with a2a(url_b, agent) as at_b, at_b.stream("POST", f"/tasks/{task['id']}:subscribe") as stream:
                    events.extend(await read_stream(stream))

            nursery.start_soon(follow)
            await trio.sleep(0.8)
            proxy.cut()
            async with a2a(url_a, agent) as at_a, httpx.AsyncClient(base_url=url_a, timeout=10) as plain:
                with trio.fail_after(10):
                    while (ready := await plain.get("/readyz")).status_code != 503:
                        await trio.sleep(0.1)
                assert "database" in ready.json()["reason"]
                refused = await at_a.get(f"/tasks/{task['id']}")
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["status"] == "UNAVAILABLE"
            with trio.fail_after(30):  # B takes the task over and it ends there, its stream with it
                while not events:
                    await trio.sleep(0.05)
            assert stdout_seen(events) == EXPECTED
            proxy.restore()
            await _ready(url_a)
            async with a2a(url_a, agent) as at_a:
                stored = await settled(at_a, task["id"])
            assert stdout_of(stored) == EXPECTED and stored["status"]["state"] == "TASK_STATE_COMPLETED"
            await proc_a.stop()
            await proc_b.stop()
            nursery.cancel_scope.cancel()
        proxies.cancel_scope.cancel()


async def test_sends_acknowledged_across_a_database_restart_are_all_kept(hostd: LiveHostd, tmp_path: Path) -> None:
    """A server of its own (restarted mid-load): sends at two controllers while PostgreSQL restarts.
    Each is answered 200 or 503 (never hangs, never a 500); every one answered 200 is there after,
    completed with its output, and no task is left unfinished (one whose send failed is failed)."""
    cluster = PgCluster().start()
    try:
        env = {**shared_env(tmp_path, hostd, cluster.create_database("restart")), "AIWG_DATABASE_TIMEOUT_S": "1"}
        async with controllers(env, 2) as [(_, url_a), (_, url_b)]:
            agent = await process_agent(url_a, "steady", "echo")
            acknowledged: dict[str, str] = {}
            statuses: list[int] = []
            stop = trio.Event()

            async def load(url: str, name: str) -> None:
                async with a2a(url, agent) as client:
                    n = 0
                    while not stop.is_set():
                        n += 1
                        text = f"{name}-{n}"
                        try:
                            response = await client.post("/message:send", json={"message": message(text)})
                        except httpx.HTTPError:
                            continue
                        statuses.append(response.status_code)
                        if response.status_code == 200:
                            acknowledged[response.json()["task"]["id"]] = text

            async with trio.open_nursery() as nursery:
                nursery.start_soon(load, url_a, "a")
                nursery.start_soon(load, url_b, "b")
                await trio.sleep(1.0)
                await trio.to_thread.run_sync(cluster.restart)
                restarted_at = len(statuses)
                await trio.sleep(1.5)
                stop.set()
            # A send that met the restart failed closed (503), or was served on a fresh connection.
            assert set(statuses) <= {200, 503}
            assert 200 in statuses[restarted_at:]  # served again after the restart, without help
            await _ready(url_a)
            await _ready(url_b)
            async with a2a(url_b, agent) as client:
                for task_id, text in acknowledged.items():
                    task = await settled(client, task_id)
                    assert task["status"]["state"] == "TASK_STATE_COMPLETED" and stdout_of(task) == text
                with trio.fail_after(30):
                    while True:
                        page = (await client.get("/tasks", params={"pageSize": 100})).json()["tasks"]
                        states = {t["status"]["state"] for t in page}
                        if not states & {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"}:
                            break
                        await trio.sleep(0.2)
    finally:
        cluster.remove()


async def test_push_deliveries_go_on_in_order_when_the_delivering_controller_is_killed(
    hostd: LiveHostd, tmp_path: Path, pg_url: str
) -> None:
    env = {**shared_env(tmp_path, hostd, pg_url), **PUSH_ENV, "AIWG_PUSH_RETRY_S": "600"}
    receiver = Receiver(delay_s=0.05, keep_alive=True)  # a receiver a little slower than the agent
    async with trio.open_nursery() as outer:
        await outer.start(receiver.serve)
        async with controllers(env, 2) as [(proc_a, url_a), (_, url_b)]:
            agent = await process_agent(url_a, "pushed", "shell")
            async with a2a(url_a, agent) as at_a:
                sent = await at_a.post("/message:send", json=send_with_push(SCRIPT, receiver))
                assert sent.status_code == 200, sent.text
                task_id = sent.json()["task"]["id"]  # A delivers its config (it made it)
            await receiver.wait_for(lambda: len(receiver.received) >= 8)
            await proc_a.stop(signal.SIGKILL)
            await receiver.wait_for(lambda: "TASK_STATE_COMPLETED" in receiver.states(), timeout=60)
            async with a2a(url_b, agent) as at_b:
                assert stdout_of(await settled(at_b, task_id)) == EXPECTED
        outer.cancel_scope.cancel()
    lines = [
        int(part["text"].split()[1])
        for r in receiver.received
        if "artifactUpdate" in r.body
        for part in r.body["artifactUpdate"]["artifact"]["parts"]
        if part.get("text")
    ]
    # At least once, in order: every line; a line twice only where B resumed from A's last cursor.
    assert sorted(set(lines)) == list(range(1, LINES + 1))
    backs = [i for i in range(1, len(lines)) if lines[i] <= lines[i - 1]]
    assert len(backs) <= 1, lines
    for part in (lines[: backs[0]], lines[backs[0] :]) if backs else (lines,):
        assert part == sorted(set(part)), lines
    assert receiver.most_in_flight == 1  # one config, one delivery at a time, across both controllers


async def test_follow_ups_sent_at_another_controller_reach_the_agent_once_and_in_order(
    hostd: LiveHostd, tmp_path: Path, pg_url: str
) -> None:
    async with controllers(shared_env(tmp_path, hostd, pg_url), 2) as [(_, url_a), (_, url_b)]:
        manifest = {"name": "ctl-agent", "version": "1", "runtime": "host", "command": [sys.executable, "-c", AGENT]}
        async with admin(url_a) as client:
            made = await client.post(
                "/api/v2/admin/loadouts", json={"name": "ctl-agent", "manifest": json.dumps(manifest)}
            )
            assert made.status_code in (200, 201), made.text
        agent = await process_agent(url_a, "talker", "ctl-agent")
        async with a2a(url_a, agent) as at_a:
            body = {"message": message("hello"), "configuration": {"returnImmediately": True}}
            tid = (await at_a.post("/message:send", json=body)).json()["task"]["id"]  # followed at A
            with trio.fail_after(15):
                while (await at_a.get(f"/tasks/{tid}")).json()["status"].get("message", {}).get("parts") != [
                    {"text": "ready for more"}
                ]:
                    await trio.sleep(0.05)
        async with a2a(url_b, agent) as at_b:  # the follow-ups go to B, which hands them to A's agent
            follow = {"message": message("more please", taskId=tid), "configuration": {"returnImmediately": True}}
            assert (await at_b.post("/message:send", json=follow)).status_code == 200
            final = (await at_b.post("/message:send", json={"message": message("bye", taskId=tid)})).json()["task"]
    assert final["status"]["state"] == "TASK_STATE_COMPLETED", final
    assert stdout_of(final).splitlines() == [f"first: hello task: {tid}", "follow-up: more please", "follow-up: bye"]
