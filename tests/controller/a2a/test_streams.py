"""Task streams: each update encoded once per wire form, and a stalled watcher beside fast ones.

The framings in memory first (the bytes each binding writes, made by wrapping a shared payload);
then real hypercorn and a real hostd: watchers of one task over both bindings, one of which never
reads while the task writes far more than its socket holds.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
from a2a.types import a2a_pb2

from agentic_sandbox.controller.a2a import proto03, wire03
from agentic_sandbox.controller.a2a.grpcwire import GrpcFraming, message_bytes
from agentic_sandbox.controller.a2a.rest03 import Framing03 as RestFraming03
from agentic_sandbox.controller.a2a.rpc03 import Framing03 as RpcFraming03
from agentic_sandbox.controller.a2a.rpcframing import RpcFraming
from agentic_sandbox.controller.a2a.streams import Framing
from agentic_sandbox.controller.tasks.hub import TAIL_EVENTS
from tests.controller.a2a.helpers import A2A_HEADERS, new_agent
from tests.controller.a2a.test_rest import send
from tests.controller.conftest import LiveController

UPDATE = {
    "artifactUpdate": {
        "taskId": "t1",
        "contextId": "c1",
        "artifact": {"artifactId": "stdout", "parts": [{"text": 'a "quoted" line\n'}]},
        "append": True,
    }
}


# ---------------------------------------------------------------------------------------------
# In memory: the framings


@pytest.mark.parametrize("call_id", [7, 'req-"1"', None])
def test_a_json_rpc_item_is_the_shared_payload_in_the_requests_envelope(call_id: Any) -> None:
    framing = RpcFraming(call_id)
    expected = b"data: " + msgspec.json.encode({"jsonrpc": "2.0", "id": call_id, "result": UPDATE}) + b"\n\n"
    assert framing.data(UPDATE) == expected
    assert framing.wrap(Framing().payload(UPDATE)) == expected  # the same bytes as the REST stream's payload
    assert framing.form == Framing.form


def test_each_framing_makes_its_items_from_a_payload_named_by_its_form() -> None:
    rest = Framing()
    assert rest.data(UPDATE) == b"data: " + msgspec.json.encode(UPDATE) + b"\n\n"
    rest03 = RestFraming03("json")
    assert rest03.data(UPDATE) == b"data: " + msgspec.json.encode(wire03.stream_out(UPDATE)) + b"\n\n"
    rest03p = RestFraming03("proto")
    assert rest03p.data(UPDATE) == b"data: " + msgspec.json.encode(proto03.stream_out(UPDATE)) + b"\n\n"
    rpc03 = RpcFraming03(3)
    envelope = {"jsonrpc": "2.0", "id": 3, "result": wire03.stream_out(UPDATE)}
    assert rpc03.data(UPDATE) == b"data: " + msgspec.json.encode(envelope) + b"\n\n"
    grpc = GrpcFraming()
    assert grpc.data(UPDATE) == message_bytes(a2a_pb2.StreamResponse, UPDATE)
    assert not grpc.joins  # one message per item: never joined into one write
    # Different payloads, different forms (a shared cache never mixes them); same payload, same form.
    assert len({rest.form, rest03.form, rest03p.form, grpc.form}) == 4
    assert rpc03.form == rest03.form and rpc03.payload(UPDATE) == rest03.payload(UPDATE)


# ---------------------------------------------------------------------------------------------
# For real: watchers of one task


LINES = 300
PAD = 4000


def _script(gate: Path) -> str:
    """Waits for ``gate``, then writes LINES lines of about PAD bytes (1.2 MB: far more than a
    socket holds)."""
    return (
        f"while [ ! -e {gate} ]; do sleep 0.01; done; "
        f"p=$(head -c {PAD} /dev/zero | tr '\\0' x); "
        f'i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo "line-$i-$p"; sleep 0.002; done'
    )


def _expected() -> list[str]:
    return [f"line-{i}-{'x' * PAD}" for i in range(1, LINES + 1)]


def _lines(items: list[dict[str, Any]]) -> list[str]:
    """The output lines a stream's updates carry (artifact updates after the first Task)."""
    text = ""
    for item in items:
        update = item.get("artifactUpdate")
        if update is not None and update["artifact"]["artifactId"] == "stdout":
            text += "".join(p["text"] for p in update["artifact"]["parts"])
    return text.splitlines()


def _items(sse: bytes) -> list[dict[str, Any]]:
    """Each ``data:`` line's JSON (JSON-RPC results unwrapped)."""
    out = []
    for line in sse.split(b"\n"):
        if line.startswith(b"data: "):
            item = json.loads(line[6:])
            out.append(item.get("result", item) if "jsonrpc" in item else item)
    return out


def _dechunk(raw: bytes) -> bytes:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    out = bytearray()
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out += rest[:n]
        body = rest[n + 2 :]
    return bytes(out)


def _subscribe_rpc(task_id: str, call_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": call_id, "method": "SubscribeToTask", "params": {"id": task_id}}


async def test_a_stalled_watcher_delays_no_one_and_catches_up_with_nothing_lost(
    admin: httpx.AsyncClient, controller: LiveController, tmp_path: Path
) -> None:
    """Four watchers read as fast as they can (REST and JSON-RPC), one never reads (a tiny receive
    buffer, so its stream soon waits in its own socket write): the fast ones get every update,
    once and in order, as soon as the task has written it; the stalled one, which the task's
    output left far behind the hub's in-memory tail, then reads and gets every update too."""
    agent = await new_agent(admin, controller, "stream-stall", loadout="shell")
    gate = tmp_path / "gate"
    async with agent.client(controller) as client:
        task = (await send(client, _script(gate), configuration={"returnImmediately": True})).json()["task"]
    task_id = task["id"]

    host, port = controller.url.removeprefix("http://").rsplit(":", 1)
    raw_sock = socket.socket()
    raw_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled = trio.socket.from_stdlib_socket(raw_sock)
    await stalled.connect((host, int(port)))
    body = json.dumps(_subscribe_rpc(task_id, "stalled")).encode()
    headers = "".join(f"{k}: {v}\r\n" for k, v in {**A2A_HEADERS, "Authorization": f"Bearer {agent.token}"}.items())
    await stalled.send(
        f"POST /agents/{agent.instance_id} HTTP/1.1\r\nHost: {host}\r\n{headers}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )

    fast: dict[str, list[dict[str, Any]]] = {}
    finished: dict[str, float] = {}
    opened = trio.Semaphore(0)

    async def follow(name: str, method: str, path: str, payload: dict[str, Any] | None) -> None:
        async with agent.client(controller) as own:
            own.timeout = httpx.Timeout(30)
            async with own.stream(method, path, json=payload) as response:
                assert response.status_code == 200
                items: list[dict[str, Any]] = []
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        item = json.loads(line[6:])
                        items.append(item.get("result", item) if "jsonrpc" in item else item)
                        if len(items) == 1:
                            opened.release()
                fast[name] = items
                finished[name] = trio.current_time()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, "rest-get", "GET", f"/tasks/{task_id}:subscribe", None)
            nursery.start_soon(follow, "rest-post", "POST", f"/tasks/{task_id}:subscribe", None)
            for i in range(2):
                nursery.start_soon(follow, f"rpc-{i}", "POST", agent.base, _subscribe_rpc(task_id, f"rpc-{i}"))
            for _ in range(4):
                await opened.acquire()
            await trio.sleep(0.2)  # the stalled watcher's request is in too
            gate.touch()
        # Every fast watcher is done: the task has ended, and the stalled one still waits.
        async with agent.client(controller) as client:
            done = (await client.get(f"/tasks/{task_id}")).json()
        assert done["status"]["state"] == "TASK_STATE_COMPLETED"
        for name, items in fast.items():
            assert next(iter(items[0])) == "task", name
            assert _lines(items) == _expected(), f"{name}: lost, repeated or out of order"
            assert items[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        # The fast ones ended together (none waited for the stalled one, nor for each other).
        assert max(finished.values()) - min(finished.values()) < 2.0

        # What the stalled watcher's socket holds now is a small part of its stream...
        held = bytearray()
        while True:
            try:
                chunk = raw_sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            held += chunk
        raw = bytes(held)
        # ...and reading on, it gets the rest: every update once and in order.
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            chunk = await stalled.recv(65536)
            assert chunk, "the stalled watcher's stream was closed before its end"
            raw += chunk
    stalled.close()
    store = controller.state.store
    assert store is not None
    stored = await store.tasks.events_after(task_id, 0, limit=100_000)
    assert len(stored) > TAIL_EVENTS  # the tail had let go of what the stalled watcher had not sent
    assert len(held) < len(raw) // 4, (len(held), len(raw))
    items = _items(_dechunk(raw))
    assert next(iter(items[0])) == "task"
    assert _lines(items) == _expected()
    assert items[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_many_watchers_of_one_task_share_one_encoding_per_update(
    admin: httpx.AsyncClient, controller: LiveController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight watchers over both bindings (one wire form): each update is encoded once, not once
    per watcher (the Task each stream begins with is its own)."""
    encoded: list[int] = []
    payload = Framing.payload

    def counting(self: Framing, obj: dict[str, Any]) -> bytes:
        encoded.append(1)
        return payload(self, obj)

    monkeypatch.setattr(Framing, "payload", counting)
    agent = await new_agent(admin, controller, "stream-once", loadout="shell")
    gate = tmp_path / "gate"
    script = f"while [ ! -e {gate} ]; do sleep 0.01; done; for i in $(seq 20); do echo $i; sleep 0.01; done"
    async with agent.client(controller) as client:
        task = (await send(client, script, configuration={"returnImmediately": True})).json()["task"]
    seen: list[list[dict[str, Any]]] = []
    opened = trio.Semaphore(0)

    async def follow(rpc: bool) -> None:
        async with agent.client(controller) as own:
            if rpc:
                request = own.stream("POST", agent.base, json=_subscribe_rpc(task["id"], "x"))
            else:
                request = own.stream("GET", f"/tasks/{task['id']}:subscribe")
            async with request as response:
                items = []
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        item = json.loads(line[6:])
                        items.append(item.get("result", item) if "jsonrpc" in item else item)
                        if len(items) == 1:
                            opened.release()
                seen.append(items)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(follow, i % 2 == 0)
            for _ in range(8):
                await opened.acquire()
            gate.touch()
    updates = [len(items) - 1 for items in seen]
    assert len(set(updates)) == 1 and updates[0] >= 3  # the same updates each (working, output, completed)
    assert all(_lines(items) == [str(i) for i in range(1, 21)] for items in seen)
    assert len(encoded) == 8 + updates[0]  # eight Tasks, then each update once
