"""Two hosts on one machine, one PostgreSQL: real processes end to end.

Each "host" is a hostd of its own (its own state dir, socket and host id) with a controller beside
it (``agentic-controller`` as a child process on its own loopback port, its own state dir, the
host's socket), every controller on one fresh database of the run's PostgreSQL server. A request
for an instance of host B made at A's controller is forwarded to B's; B's controllers are killed
and their instances answer 503 at A while A's work; B comes back and its catalog is reconciled.
"""

from __future__ import annotations

import base64
import json
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.controller.a2a.helpers import A2A_HEADERS
from tests.controller.a2a.test_rest import message
from tests.controller.a2a.test_sse import read_stream, stdout_seen
from tests.controller.conftest import ADMIN_TOKEN, ControllerProcess, LiveHostd, controller_env, wait_operation
from tests.controller.pty.wsclient import WS, InvalidStatus, attach_url
from tests.controller.push.conftest import PUSH_ENV
from tests.controller.push.receiver import Receiver
from tests.controller.push.test_delivery import send_with_push
from tests.scenarios.test_controllers_share_postgres import _ready as ready

#: Quick heartbeats, so a host is seen unavailable (and back) within a test's patience.
HOST_ENV = {"AIWG_HOST_HEARTBEAT_S": "0.2", "AIWG_HOST_TIMEOUT_S": "1.5", "AIWG_LEASE_TTL_S": "1.0"}


@dataclass
class Host:
    """One host: its hostd and the controllers beside it (started and stopped by the test)."""

    name: str
    hostd: LiveHostd
    env: dict[str, str]
    nursery: trio.Nursery
    controllers: list[ControllerProcess] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    id: str = ""

    async def start_controller(self) -> str:
        proc = ControllerProcess(self.env)
        url = await proc.start(self.nursery)
        await ready(url)
        self.controllers.append(proc)
        self.urls.append(url)
        return url

    @property
    def url(self) -> str:
        return self.urls[-1]

    async def stop_controllers(self, sig: int = signal.SIGTERM) -> None:
        for proc in self.controllers:
            await proc.stop(sig)
        self.controllers.clear()
        self.urls.clear()


@asynccontextmanager
async def two_hosts(tmp_path: Path, pg_url: str, short: Path) -> AsyncIterator[tuple[Host, Host]]:
    hostds = [LiveHostd(short / name) for name in ("a", "b")]
    for hostd in hostds:
        await hostd.start()
    try:
        async with trio.open_nursery() as nursery:
            hosts = []
            for name, hostd in zip(("a", "b"), hostds, strict=True):
                env = controller_env(
                    tmp_path / f"state-{name}",
                    hostd.socket_path,
                    AIWG_DATABASE_URL=pg_url,
                    AIWG_HOST_LABELS=f"zone={name}",
                    AIWG_NOTIFY_POLL_S="0.5",
                    **HOST_ENV,
                    **PUSH_ENV,
                )
                host = Host(name, hostd, env, nursery)
                await host.start_controller()
                hosts.append(host)
            async with admin(hosts[0].url) as client:
                with trio.fail_after(15):
                    while len(listed := (await client.get("/api/v2/admin/hosts")).json()["items"]) < 2:
                        await trio.sleep(0.1)
            by_zone = {h["labels"]["zone"]: h["id"] for h in listed}
            for host in hosts:
                host.id = by_zone[host.name]
            try:
                yield hosts[0], hosts[1]
            except BaseException:
                for host in hosts:
                    for i, proc in enumerate(host.controllers):
                        print(f"--- host {host.name} controller {i}:\n{proc.output()[-6000:]}")
                raise
            finally:
                for host in hosts:
                    await host.stop_controllers()
                nursery.cancel_scope.cancel()
    finally:
        for hostd in hostds:
            await hostd.close()


@pytest.fixture
def short() -> Any:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="aiwg-h-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def admin(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=15)


def a2a(url: str, instance_id: str, token: str) -> httpx.AsyncClient:
    headers = {**A2A_HEADERS, "Authorization": f"Bearer {token}"}
    return httpx.AsyncClient(base_url=f"{url}/agents/{instance_id}", headers=headers, timeout=30)


async def provision(url: str, name: str, **fields: Any) -> tuple[str, str, dict[str, Any]]:
    """Provision a started host instance at ``url``: its id, A2A token and the operation."""
    async with admin(url) as client:
        body = {"name": name, "runtime": "host", "start": True, **fields}
        response = await client.post("/api/v2/admin/instances", json=body)
        assert response.status_code == 202, response.text
        op = await wait_operation(client, response.json()["id"])
        assert op["state"] == "succeeded", op
        return op["result"]["instance_id"], response.json()["a2a_token"], op


async def host_of(url: str, instance_id: str) -> str:
    async with admin(url) as client:
        listed = (await client.get("/api/v2/admin/instances")).json()["items"]
    return str(next(i for i in listed if i["id"] == instance_id)["host_id"])


def stdout_of(task: dict[str, Any]) -> str:
    return "".join(p["text"] for a in task.get("artifacts", []) if a["artifactId"] == "stdout" for p in a["parts"])


async def test_instances_are_placed_on_each_host_and_served_through_the_other(
    tmp_path: Path, pg_url: str, short: Path
) -> None:
    async with two_hosts(tmp_path, pg_url, short) as (a, b):
        async with admin(a.url) as client:
            hosts = {h["id"]: h for h in (await client.get("/api/v2/admin/hosts")).json()["items"]}
        assert {hosts[a.id]["state"], hosts[b.id]["state"]} == {"available"}
        assert "host" in hosts[b.id]["runtimes"] and hosts[b.id]["capacity"]["cpus"] >= 1

        # Placed by label at A's controller, on B; by host id at B's controller, on A.
        on_b, token_b, _ = await provision(a.url, "on-b", loadout="shell", host_label="zone=b")
        on_a, token_a, _ = await provision(b.url, "on-a", loadout="shell", host=a.id)
        assert await host_of(a.url, on_b) == b.id and await host_of(b.url, on_a) == a.id

        # A2A at A for B's instance: send, stream, cancel, push; the card names the edge (A).
        async with a2a(a.url, on_b, token_b) as at_a:
            card = (await at_a.get("/.well-known/agent-card.json")).json()
            assert all(i["url"].startswith(a.url) for i in card["supportedInterfaces"]), card
            sent = await at_a.post("/message:send", json={"message": message("echo hello from b; hostname")})
            assert sent.status_code == 200, sent.text
            task = sent.json()["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED" and "hello from b" in stdout_of(task)
            async with at_a.stream(
                "POST", "/message:stream", json={"message": message("for i in 1 2 3; do echo s$i; sleep 0.1; done")}
            ) as stream:
                events = await read_stream(stream)
            assert stdout_seen(events) == "s1\ns2\ns3\n"
            long = await at_a.post(
                "/message:send", json={"message": message("sleep 30"), "configuration": {"returnImmediately": True}}
            )
            canceled = await at_a.post(f"/tasks/{long.json()['task']['id']}:cancel")
            assert canceled.status_code == 200, canceled.text
            assert canceled.json()["status"]["state"] == "TASK_STATE_CANCELED"
            receiver = Receiver()
            async with trio.open_nursery() as nursery:
                await nursery.start(receiver.serve)
                pushed = await at_a.post("/message:send", json=send_with_push("echo pushed", receiver))
                assert pushed.status_code == 200, pushed.text
                with trio.fail_after(15):
                    while not any(
                        r.body.get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED"
                        for r in receiver.received
                    ):
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
        # The task is B's: B's controller answers it the same.
        async with a2a(b.url, on_b, token_b) as at_b:
            again = (await at_b.get(f"/tasks/{task['id']}")).json()
            assert again["id"] == task["id"] and stdout_of(again) == stdout_of(task)

        # A terminal on B's instance, attached and typed into through A's controller.
        async with admin(a.url) as client:
            made = await client.post(f"/api/v2/admin/instances/{on_b}/sessions", json={"argv": ["/bin/cat"]})
            assert made.status_code == 201, made.text
            sid = made.json()["id"]
        ws = await WS.connect(attach_url(a.url, on_b, sid), token=ADMIN_TOKEN)
        try:
            hello = await ws.json()
            assert hello["op"] == "binding_hello" and hello["payload"]["session"]["session_id"] == sid
            await ws.join()
            await ws.type(b"typed through the edge\n")
            assert b"typed through the edge" in await ws.output_until(b"typed through the edge")
        finally:
            await ws.close()
        # The instance token's bearer subprotocol works through the edge too (it is not sent on).
        offered = "bearer." + base64.urlsafe_b64encode(token_a.encode()).decode().rstrip("=")
        async with admin(b.url) as client:
            made = await client.post(f"/api/v2/admin/instances/{on_a}/sessions", json={"argv": ["/bin/cat"]})
            sid_a = made.json()["id"]
        ws = await WS.connect(attach_url(b.url, on_a, sid_a), subprotocols=("pty-ws.v1", offered), token=None)
        try:
            assert ws.subprotocol == "pty-ws.v1"
            await ws.json()
        finally:
            await ws.close()

        # Legacy v1: a dispatch for B's instance at A, and its mission stream (a task path) at A.
        headers = {**A2A_HEADERS, "Authorization": f"Bearer {token_b}"}
        async with httpx.AsyncClient(base_url=a.url, headers=headers, timeout=30) as v1:
            dispatched = await v1.post(f"/api/v1/sessions/{on_b}/dispatch", json={"message": message("echo v1")})
            assert dispatched.status_code == 200, dispatched.text
            assert stdout_of(dispatched.json()["task"]) == "v1\n"
            script = "for i in 1 2 3; do echo m$i; sleep 0.2; done"
            running = await v1.post(
                f"/api/v1/sessions/{on_b}/dispatch",
                json={"message": message(script), "configuration": {"returnImmediately": True}},
            )
            async with v1.stream("GET", f"/api/v1/ws/missions/{running.json()['task']['id']}") as stream:
                events = await read_stream(stream)
            assert stdout_seen(events) == "m1\nm2\nm3\n"


async def test_a_host_whose_controllers_stop_answers_503_and_is_reconciled_when_back(
    tmp_path: Path, pg_url: str, short: Path
) -> None:
    async with two_hosts(tmp_path, pg_url, short) as (a, b):
        on_b, token_b, _ = await provision(b.url, "stays-on-b", loadout="shell", host=b.id)
        on_a, token_a, _ = await provision(a.url, "stays-on-a", loadout="shell", host=a.id)
        assert await host_of(a.url, on_b) == b.id

        await b.stop_controllers(signal.SIGKILL)
        async with admin(a.url) as client:
            with trio.fail_after(15):
                while (await client.get(f"/api/v2/admin/hosts/{b.id}")).json()["state"] != "unavailable":
                    await trio.sleep(0.1)
            refused = await client.get(f"/api/v2/admin/instances/{on_b}")
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "host.unavailable", refused.json()
            listed = {i["id"]: i for i in (await client.get("/api/v2/admin/instances")).json()["items"]}
            assert listed[on_b]["host_state"] == "unavailable"  # kept in the catalog, marked
            assert listed[on_b]["state"] == "running"  # not moved, not guessed
        async with a2a(a.url, on_b, token_b) as at_a:
            sent = await at_a.post("/message:send", json={"message": message("echo never")})
            assert sent.status_code == 503, sent.text
        with pytest.raises(InvalidStatus) as refusal:  # the attach socket: refused with 503
            await WS.connect(attach_url(a.url, on_b, "s-1"), token=ADMIN_TOKEN)
        assert refusal.value.response.status_code == 503
        async with a2a(a.url, on_a, token_a) as at_a:  # A's own instance: business as usual
            sent = await at_a.post("/message:send", json={"message": message("echo still here")})
            assert sent.status_code == 200 and "still here" in stdout_of(sent.json()["task"])

        # While B has no controller its hostd changes: the instance stops. Back, B folds it in.
        async with open_hostd(b.hostd.socket_path) as hostd:
            await hostd.call(m.InstanceStopRequest(instance_id=on_b))
        await b.start_controller()
        async with admin(a.url) as client:
            with trio.fail_after(20):
                while True:
                    got = await client.get(f"/api/v2/admin/instances/{on_b}")
                    if got.status_code == 200 and got.json()["state"] == "stopped":
                        break
                    await trio.sleep(0.1)
            assert got.json()["host_state"] == "available"


async def test_cordon_and_drain(tmp_path: Path, pg_url: str, short: Path) -> None:
    async with two_hosts(tmp_path, pg_url, short) as (a, b):
        on_a, token_a, _ = await provision(a.url, "drained", loadout="shell", host=a.id)
        async with admin(b.url) as client:
            cordoned = await client.post(f"/api/v2/admin/hosts/{b.id}/cordon")
            assert cordoned.status_code == 200 and cordoned.json()["cordoned"] is True
        for n in range(3):  # nothing new lands on a cordoned host
            placed, _, _ = await provision(b.url, f"anywhere-{n}")
            assert await host_of(a.url, placed) == a.id
        async with admin(a.url) as client:
            refused = await client.post(
                "/api/v2/admin/instances", json={"name": "on-cordoned", "runtime": "host", "host": b.id}
            )
            assert refused.status_code == 503 and refused.json()["code"] == "placement.unavailable", refused.text
            unknown = await client.post(
                "/api/v2/admin/instances", json={"name": "nowhere", "runtime": "host", "host_label": "zone=mars"}
            )
            assert unknown.status_code == 409 and unknown.json()["code"] == "placement.no_host", unknown.text
            await client.post(f"/api/v2/admin/hosts/{b.id}/uncordon")

            # A draining host keeps its instances running and readable, but takes no new work.
            session = await client.post(f"/api/v2/admin/instances/{on_a}/sessions", json={"argv": ["/bin/cat"]})
            assert session.status_code == 201
            drained = await client.post(f"/api/v2/admin/hosts/{a.id}/drain")
            assert drained.json()["draining"] is True
        async with admin(b.url) as client:
            with trio.fail_after(10):  # A's controller hears of its drain at its next heartbeat
                while True:
                    refused = await client.post(f"/api/v2/admin/instances/{on_a}/sessions", json={"argv": ["/bin/cat"]})
                    if refused.status_code == 503:
                        break
                    await trio.sleep(0.1)
            assert refused.json()["code"] == "host.draining", refused.text
            still = await client.get(f"/api/v2/admin/instances/{on_a}/sessions/{session.json()['id']}")
            assert still.status_code == 200 and still.json()["state"] == "running"
            placed, _, _ = await provision(b.url, "not-on-drained")
            assert await host_of(b.url, placed) == b.id
        async with a2a(b.url, on_a, token_a) as at_b:
            sent = await at_b.post("/message:send", json={"message": message("echo new work")})
            assert sent.status_code == 503, sent.text
        async with admin(a.url) as client:
            await client.post(f"/api/v2/admin/hosts/{a.id}/undrain")
        async with a2a(b.url, on_a, token_a) as at_b:
            with trio.fail_after(10):
                while (await at_b.post("/message:send", json={"message": message("echo ok")})).status_code != 200:
                    await trio.sleep(0.1)


async def test_a_forged_peer_identity_is_refused_and_a_stalled_peer_stalls_nobody_else(
    tmp_path: Path, pg_url: str, short: Path
) -> None:
    async with two_hosts(tmp_path, pg_url, short) as (a, b):
        on_b, _, _ = await provision(b.url, "guarded", loadout="shell", host=b.id)
        claimed = base64.urlsafe_b64encode(json.dumps({"role": "admin", "label": "x"}).encode()).decode()
        forged = f"v1.{int(time.time())}.{claimed}.{base64.urlsafe_b64encode(b'x' * 32).decode()}"
        async with httpx.AsyncClient(base_url=b.url, timeout=10) as client:
            for value in (forged, "v1.garbage", ""):
                answer = await client.get("/api/v2/admin/instances", headers={"x-aiwg-peer": value})
                assert answer.status_code == 401, (value, answer.text)
            # Credentials beside a forged signature are not taken either.
            answer = await client.get(
                "/api/v2/admin/instances", headers={"x-aiwg-peer": forged, "Authorization": f"Bearer {ADMIN_TOKEN}"}
            )
            assert answer.status_code == 401, answer.text

        # B's controller stops answering (SIGSTOP): a call through A for B's instance waits on it,
        # and A answers everything else meanwhile.
        proc = b.controllers[0].proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        try:
            async with trio.open_nursery() as nursery, admin(a.url) as client:
                stalled: list[httpx.Response] = []

                async def wait_on_b() -> None:
                    stalled.append(await client.get(f"/api/v2/admin/instances/{on_b}", timeout=30))

                nursery.start_soon(wait_on_b)
                await trio.sleep(0.3)
                started = time.monotonic()
                for _ in range(20):
                    assert (await client.get("/api/v2/admin/hosts")).status_code == 200
                    assert (await client.get("/readyz")).status_code == 200
                assert time.monotonic() - started < 5
                assert not stalled
                proc.send_signal(signal.SIGCONT)
                with trio.fail_after(20):
                    while not stalled:
                        await trio.sleep(0.05)
                assert stalled[0].status_code == 200, stalled[0].text
        finally:
            proc.send_signal(signal.SIGCONT)
