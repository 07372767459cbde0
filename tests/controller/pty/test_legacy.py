"""The legacy v1 PTY WebSocket on its own listener, over the same hostd sessions (and the same
controller lease as pty-ws/v1 clients)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
import trio
from hypercorn.trio import serve

from agentic_sandbox.controller.main import hypercorn_config
from agentic_sandbox.controller.pty.legacy import LegacyPort

from .conftest import Instance
from .wsclient import WS, InvalidStatus


@pytest.fixture
async def legacy_url(instance: Instance) -> AsyncIterator[str]:
    hc = hypercorn_config(instance.controller.config, graceful_timeout_s=1)
    hc.bind = ["127.0.0.1:0"]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, LegacyPort(instance.controller.app), hc, shutdown_trigger=stop.wait))
        yield binds[0].replace("http", "ws", 1)
        stop.set()


async def v1(url: str, **kwargs: Any) -> WS:
    return await WS.connect(url, subprotocols=(), **kwargs)


async def message(ws: WS, kind: str | None = None, frame_kind: str | None = None) -> dict[str, Any]:
    with trio.fail_after(15):
        while True:
            raw = await ws.recv()
            assert isinstance(raw, str)
            msg = json.loads(raw)
            if (kind is None or msg["type"] == kind) and (frame_kind is None or msg.get("kind") == frame_kind):
                return msg


async def test_join_input_output_replay_roles(instance: Instance, legacy_url: str) -> None:
    sid = await instance.session(["/bin/cat"])
    ws = await v1(f"{legacy_url}/sessions/{sid}")
    await ws.send({"type": "join_session", "session_id": sid, "role": "controller"})
    joined = await message(ws, "session_joined")
    assert joined["role"] == "controller" and joined["session_id"] == sid
    await message(ws, "session_frame", "Keyframe")
    await ws.send({"type": "session_input", "session_id": sid, "data": base64.b64encode(b"legacy hi\n").decode()})
    seen = b""
    while b"legacy hi" not in seen:
        frame = await message(ws, "session_frame", "Output")
        seen += base64.b64decode(frame["data"])
        last = frame["seq"]

    # The lease is shared with pty-ws/v1 clients: a new-binding controller is downgraded.
    modern = await instance.attach(sid)
    assert (await modern.join())["role"] == "observer"
    await modern.close()

    again = await v1(f"{legacy_url}/sessions/{sid}")
    await again.send({"type": "join_session", "session_id": sid, "role": "controller", "replay_from": 0})
    assert (await message(again, "session_joined"))["role"] == "observer"
    replayed = b""
    while b"legacy hi" not in replayed:
        replayed += base64.b64decode((await message(again, "session_frame", "Output"))["data"])
    await again.send({"type": "session_input", "session_id": sid, "data": "eA=="})
    assert "controller" in (await message(again, "error"))["message"]
    await again.send({"type": "session_resize", "session_id": sid, "cols": 0, "rows": 0})
    await message(again, "error")
    assert last >= 1

    await ws.send({"type": "session_resize", "session_id": sid, "cols": 0, "rows": 5})
    assert "cols and rows" in (await message(ws, "error"))["message"]
    await ws.send("not json")
    await message(ws, "error")
    await ws.send({"type": "leave_session", "session_id": sid})
    await message(ws, "session_left")
    assert await ws.close_code() == 1000
    await again.close()


async def test_refusals(instance: Instance, legacy_url: str) -> None:
    sid = await instance.session(["/bin/cat"])
    for url, kwargs, status in (
        (f"{legacy_url}/sessions/{sid}", {"token": None}, 401),
        (f"{legacy_url}/sessions/0190a000-0000-7000-8000-000000000000", {}, 404),
        # The main port does not serve the legacy path.
        (instance.url(sid).split("/agents/")[0] + f"/sessions/{sid}", {}, 404),
    ):
        with pytest.raises(InvalidStatus) as info:
            await v1(url, **kwargs)
        assert info.value.response.status_code == status, url


async def test_a_controller_join_starts_a_pending_session_as_created(instance: Instance, legacy_url: str) -> None:
    response = await instance.admin.post(
        f"/api/v2/admin/instances/{instance.id}/sessions",
        json={"start": False, "argv": ["/bin/sh", "-c", "echo legacy-start; exec cat"]},
    )
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    observer = await v1(f"{legacy_url}/sessions/{sid}")
    await observer.send({"type": "join_session", "session_id": sid, "role": "observer"})
    assert (await message(observer, "session_joined"))["role"] == "observer"
    info = await instance.admin.get(f"/api/v2/admin/instances/{instance.id}/sessions/{sid}")
    assert info.json()["state"] == "pending"  # an observer starts nothing

    ws = await v1(f"{legacy_url}/sessions/{sid}")
    await ws.send({"type": "join_session", "session_id": sid, "role": "controller"})
    assert (await message(ws, "session_joined"))["role"] == "controller"
    seen = b""
    while b"legacy-start" not in seen:
        seen += base64.b64decode((await message(observer, "session_frame", "Output"))["data"])
    info = await instance.admin.get(f"/api/v2/admin/instances/{instance.id}/sessions/{sid}")
    assert info.json()["state"] == "running"
    await ws.close()
    await observer.close()
