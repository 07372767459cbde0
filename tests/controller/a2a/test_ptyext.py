"""pty-extensions/v1 on the card: params that match the PTY binding, and no activation over HTTP.

A real hostd, the controller on loopback, httpx for the card and the HTTP bindings, the
`websockets` client of the PTY tests for what the binding does.
"""

from __future__ import annotations

import httpx
import trio

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from agentic_sandbox.controller.pty.frames import PTY_EXTENSIONS_URI
from tests.controller.a2a.helpers import error_reason, new_agent
from tests.controller.a2a.test_rest import message
from tests.controller.conftest import LiveController
from tests.controller.pty.conftest import Instance
from tests.controller.pty.wsclient import cframe


async def card_params(admin: httpx.AsyncClient, instance_id: str) -> dict[str, int]:
    card = (await admin.get(f"/agents/{instance_id}/.well-known/agent-card.json")).json()
    [ext] = [e for e in card["capabilities"]["extensions"] if e["uri"] == PTY_EXTENSIONS_URI]
    assert "required" not in ext  # false, the default (a card holds no false outside the capability flags)
    assert "/sessions/{session_id}/attach" in ext["description"]
    params: dict[str, int] = ext["params"]
    return params


async def test_card_params_are_what_the_binding_does(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "pty-card")
    params = await card_params(admin, agent.instance_id)
    assert params == {
        "max_controllers": 1,
        "max_observers": 32,
        "keyframe_interval_seconds": 5,
        "keyframe_interval_frames": 100,
        "replay_buffer_frames": 1000,
        "replay_buffer_retention_seconds": 86400,
        "default_cols": 120,
        "default_rows": 30,
    }
    instance = Instance(controller, admin, agent.instance_id)
    # A session started without a size has the default one (its keyframe says so).
    created = await admin.post(f"/api/v2/admin/instances/{agent.instance_id}/sessions", json={"argv": ["/bin/cat"]})
    assert created.status_code == 201, created.text
    sid = str(created.json()["id"])
    sockets = [await instance.attach(sid) for _ in range(params["max_controllers"] + params["max_observers"] + 1)]
    first = sockets[0]
    assert (await first.join())["role"] == "controller"
    keyframe = (await first.kind("Keyframe"))["payload"]
    assert (keyframe["snapshot_cols"], keyframe["snapshot_rows"]) == (params["default_cols"], params["default_rows"])
    # max_controllers: the next one asking for control is downgraded; max_observers more fit in.
    for ws in sockets[1:-1]:
        assigned = await ws.join()
        assert assigned["role"] == "observer" and assigned["downgraded"] is True
    # One past max_controllers + max_observers is refused.
    await sockets[-1].send(cframe("pty.join_session", {"role": "observer"}))
    assert (await sockets[-1].error())["payload"]["code"] == "RATE_LIMITED"
    async with trio.open_nursery() as nursery:
        for ws in sockets:
            nursery.start_soon(ws.close)


async def test_activation_over_http_is_refused(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "pty-rest", loadout="echo")
    activated = {"A2A-Extensions": f"{RUNTIME_EXTENSION}, {PTY_EXTENSIONS_URI}"}
    async with agent.client(controller, **activated) as client:
        sent = await client.post("/message:send", json={"message": message("x")})
        assert sent.status_code == 400
        assert error_reason(sent) == "UNSUPPORTED_EXTENSION"
        assert PTY_EXTENSIONS_URI in sent.json()["error"]["message"]
        assert (await client.get("/tasks")).status_code == 400
        rpc = await client.post(
            "", json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message("x")}}
        )
        assert rpc.json()["error"]["code"] == -32600
    async with agent.client(controller) as plain:
        assert (await plain.get("/tasks")).json()["totalSize"] == 0  # nothing was done
