"""hostd upgraded in place under a live controller: an attached terminal sees no gap, no repeat and
no close, a key typed during the handover is written after it, a running task completes, and the
controller never lost its instances."""

from __future__ import annotations

import httpx
import trio

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.controller.a2a.helpers import new_agent
from tests.controller.a2a.test_rest import send, settled, text_of
from tests.controller.conftest import LiveController, LiveHostd
from tests.controller.pty.wsclient import WS, attach_url

TASK = "for i in $(seq 1 40); do echo $i; sleep 0.05; done"


async def _output(ws: WS, until: bytes, seqs: list[int], seen: bytearray) -> None:
    """Binary output frames until ``until`` was seen; every sequence recorded, JSON frames checked."""
    with trio.fail_after(20):
        while until not in seen:
            frame = await ws.frame()
            if isinstance(frame, tuple):
                seqs.append(frame[0])
                seen += frame[1]
            else:
                assert frame["op"] not in ("binding_goodbye", "Error"), frame
                assert frame["payload"].get("kind") != "Error", frame


async def test_an_attached_terminal_and_a_task_go_through_an_upgrade(
    hostd: LiveHostd, controller: LiveController, admin: httpx.AsyncClient
) -> None:
    agent = await new_agent(admin, controller, "upgraded", loadout="shell")
    response = await admin.post(f"/api/v2/admin/instances/{agent.instance_id}/sessions", json={"argv": ["/bin/cat"]})
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    ws = await WS.connect(attach_url(controller.url, agent.instance_id, sid), subprotocols=("pty-ws.v1.binary",))
    assert (await ws.json())["op"] == "binding_hello"
    await ws.join()
    await ws.kind("Keyframe")
    seqs: list[int] = []
    seen = bytearray()
    await ws.send(b"PW1I" + b"before\n")
    await _output(ws, b"before\r\nbefore\r\n", seqs, seen)

    async with agent.client(controller) as client:
        task = (await send(client, TASK, configuration={"returnImmediately": True})).json()["task"]
        pid = hostd.pid
        async with open_hostd(hostd.socket_path) as direct:
            await direct.call(m.UpgradeRequest())
        # Typed while hostd hands over: the controller holds it until the new image takes it.
        await ws.send(b"PW1I" + b"during\n")
        # A request that needs hostd meanwhile waits for the new image instead of failing.
        made = await admin.post(f"/api/v2/admin/instances/{agent.instance_id}/sessions", json={"argv": ["/bin/cat"]})
        assert made.status_code == 201, made.text
        await _output(ws, b"during\r\nduring\r\n", seqs, seen)
        await ws.send(b"PW1I" + b"after\n")
        await _output(ws, b"after\r\nafter\r\n", seqs, seen)
        assert bytes(seen) == b"before\r\nbefore\r\nduring\r\nduring\r\nafter\r\nafter\r\n"
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"a gap or a repeat: {seqs}"

        done = await settled(client, task["id"])
        assert done["status"]["state"] == "TASK_STATE_COMPLETED", done
        assert text_of(done, "stdout") == "".join(f"{i}\n" for i in range(1, 41))

    async with open_hostd(hostd.socket_path) as direct:
        status = await direct.call(m.StatusRequest())
    assert (status.pid, status.upgrades) == (pid, 1)
    instance = (await admin.get(f"/api/v2/admin/instances/{agent.instance_id}")).json()
    assert instance["state"] == "running"
    await ws.close()
