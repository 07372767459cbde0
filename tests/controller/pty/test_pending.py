"""Pending sessions end to end: created unstarted through the admin route, started by the first
controller's ``pty.join_session`` launch fields. A real hostd, the controller on hypercorn,
`websockets` clients; every JSON frame the server sends is validated against upstream's schemas."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ..conftest import ADMIN_TOKEN, ControllerProcess, LiveHostd, controller_env, provision
from ..http.test_problems import assert_problem
from .conftest import Instance
from .wsclient import WS, ConnectionClosed, InvalidStatus, attach_url, cframe

SHELL = ["/bin/bash", "--norc", "--noprofile", "-i"]


async def pending(instance: Instance, **body: Any) -> dict[str, Any]:
    response = await instance.admin.post(
        f"/api/v2/admin/instances/{instance.id}/sessions", json={"start": False, **body}
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    assert (created["state"], created["pid"]) == ("pending", None), created
    return created


async def info(instance: Instance, sid: str) -> dict[str, Any]:
    response = await instance.admin.get(f"/api/v2/admin/instances/{instance.id}/sessions/{sid}")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_create_pending_then_join_with_launch_fields_and_type(instance: Instance) -> None:
    created = await pending(instance, argv=["/bin/cat"], size={"cols": 90, "rows": 20})
    sid = created["id"]
    assert created["attach"]["url"] == instance.url(sid)
    assert created["argv"] == ["/bin/cat"] and (created["cols"], created["rows"]) == (90, 20)
    listed = (await instance.admin.get(f"/api/v2/admin/instances/{instance.id}/sessions")).json()["items"]
    assert [(item["id"], item["state"]) for item in listed] == [(sid, "pending")]

    ws = await instance.attach(sid)
    launch = {
        "argv": SHELL,
        "env": {"PS1": "$ ", "GREETING": "hi"},
        "working_dir": "/tmp",
        "terminal_size": {"cols": 100, "rows": 30},
    }
    assert (await ws.join(payload=launch))["role"] == "controller"
    assert (await ws.kind("MembershipChanged"))["payload"]["controllers"]
    keyframe = (await ws.kind("Keyframe"))["payload"]
    assert (keyframe["snapshot_cols"], keyframe["snapshot_rows"]) == (100, 30)  # the join's size
    assert keyframe["anchor_sequence"] == 0  # the joiner that starts it sees every byte it writes

    await ws.type(b'echo "$GREETING-$(pwd)-$(stty size)"\n')
    await ws.output_until(b"hi-/tmp-30 100")
    now = await info(instance, sid)
    assert now["state"] == "running" and now["pid"] and now["argv"] == SHELL
    assert (now["cwd"], now["cols"], now["rows"]) == ("/tmp", 100, 30)
    outputs = [fr["sequence"] for fr in ws.frames if fr["payload"].get("kind") == "Output"]
    assert outputs[0] == 1 and outputs == list(range(1, len(outputs) + 1))  # from the very first byte
    await ws.close()

    # A session that runs ignores launch fields: the next controller drives the same shell.
    again = await instance.attach(sid)
    assert (await again.join(payload={"argv": ["/bin/false"], "cwd": "/"}))["role"] == "controller"
    await again.type(b"echo still-$GREETING\n")
    await again.output_until(b"still-hi")
    assert (await info(instance, sid))["pid"] == now["pid"]
    await again.close()


async def test_observer_first_waits_then_sees_the_start(instance: Instance) -> None:
    sid = (await pending(instance, size={"cols": 90, "rows": 20}))["id"]
    observer = await instance.attach(sid)
    assert (await observer.join("observer", payload={"argv": ["/bin/false"]}))["role"] == "observer"
    keyframe = (await observer.kind("Keyframe"))["payload"]
    assert (keyframe["anchor_sequence"], keyframe["snapshot_cols"]) == (0, 90)
    await observer.type(b"nope\n")
    assert (await observer.error())["payload"]["code"] == "PERMISSION_DENIED"
    await trio.sleep(0.2)
    assert (await info(instance, sid))["state"] == "pending"  # an observer starts nothing, whatever it names

    controller = await instance.attach(sid, subprotocols=("pty-ws.v1.binary",))
    command = 'echo "started by $0 at $(stty size)"; exec cat'
    assert (await controller.join(payload={"command": command, "cols": 100, "rows": 25}))["role"] == "controller"
    resize = await observer.kind("Resize")  # the observer learns the size it started with
    assert (resize["payload"]["cols"], resize["payload"]["rows"]) == (100, 25)
    await observer.output_until(b"started by /bin/sh at 25 100")
    assert (await info(instance, sid))["argv"] == ["/bin/sh", "-lc", command]
    await controller.send(b"PW1I" + b"typed\n")
    await observer.output_until(b"typed")
    await controller.close()
    await observer.close()


async def test_an_observer_taking_the_controller_role_starts_it_as_created(instance: Instance) -> None:
    sid = (await pending(instance, argv=["/bin/sh", "-c", "echo as-created; exec cat"]))["id"]
    ws = await instance.attach(sid)
    await ws.join("observer")
    await ws.send(cframe("pty.request_role", {"role": "controller"}))
    await ws.output_until(b"as-created")  # (its output may come before the answer to the request)
    roles = [fr["payload"]["role"] for fr in ws.frames if fr["payload"].get("kind") == "RoleAssigned"]
    if len(roles) < 2:
        roles.append((await ws.kind("RoleAssigned"))["payload"]["role"])
    assert roles == ["observer", "controller"]
    await ws.close()


async def test_two_controllers_joining_at_once_start_it_once(instance: Instance) -> None:
    sid = (await pending(instance))["id"]
    sockets = [await instance.attach(sid) for _ in range(2)]
    roles: dict[int, dict[str, Any]] = {}

    async def join(i: int) -> None:
        roles[i] = await sockets[i].join(payload={"argv": ["/bin/sh", "-c", f"echo run-{i}; exec cat"]})

    async with trio.open_nursery() as nursery:
        for i in range(2):
            nursery.start_soon(join, i)
    assert sorted(role["role"] for role in roles.values()) == ["controller", "observer"]
    winner = next(i for i, role in roles.items() if role["role"] == "controller")
    loser = 1 - winner
    assert roles[loser]["downgraded"] is True
    assert (await info(instance, sid))["argv"][-1] == f"echo run-{winner}; exec cat"
    await sockets[winner].type(b"from the winner\n")
    await sockets[loser].output_until(b"from the winner")
    for ws in sockets:
        await ws.close()


BAD_LAUNCHES: list[tuple[dict[str, Any], str, str]] = [
    ({"argv": []}, "INVALID_REQUEST", "argv"),
    ({"argv": "bash"}, "INVALID_REQUEST", "argv"),
    ({"argv": ["/bin/sh"], "command": "true"}, "INVALID_REQUEST", "not both"),
    ({"command": ""}, "INVALID_REQUEST", "command"),
    ({"cwd": "/tmp", "working_dir": "/"}, "INVALID_REQUEST", "differ"),
    ({"cwd": "x" * 5000}, "INVALID_REQUEST", "cwd"),
    ({"env": {"A": 1}}, "INVALID_REQUEST", "env"),
    ({"env": {"AIWG_TREE": "mine"}}, "INVALID_REQUEST", "set by hostd"),
    ({"cwd": "/no/such/dir", "terminal_size": {"cols": 100, "rows": 40}}, "INVALID_REQUEST", "does not exist"),
    ({"argv": ["/no/such/program"]}, "INVALID_REQUEST", "/no/such/program"),
    ({"terminal_size": {"cols": 0, "rows": 5}}, "INVALID_REQUEST", "terminal_size"),
    ({"terminal_size": {"cols": 100000, "rows": 100000}}, "INVALID_REQUEST", "terminal_size"),
    ({"terminal_size": {"cols": 80, "rows": 24}, "cols": 81}, "INVALID_REQUEST", "differ"),
    ({"session_backend": "tmux"}, "UNSUPPORTED_OPERATION", "tmux"),
    ({"session_class": "managed"}, "UNSUPPORTED_OPERATION", "managed"),
    ({"shell": "bash"}, "INVALID_REQUEST", "shell"),
]


async def test_bad_launch_fields_are_errors_and_the_session_stays_pending(instance: Instance) -> None:
    sid = (await pending(instance, argv=["/bin/cat"]))["id"]
    ws = await instance.attach(sid)
    for payload, code, words in BAD_LAUNCHES:
        await ws.send(cframe("pty.join_session", {"role": "controller", **payload}))
        error = (await ws.error())["payload"]
        assert error["code"] == code and words in error["message"], (payload, error)
        assert error.get("retryable") is not True, (payload, error)
    assert not any(fr["payload"].get("kind") == "RoleAssigned" for fr in ws.frames if fr["op"] != "Error")
    assert (await info(instance, sid))["state"] == "pending"
    # The same socket joins again, with good fields this time.
    good = {"argv": ["/bin/sh", "-c", "echo good; exec cat"], "session_backend": "native"}
    assert (await ws.join(payload=good))["role"] == "controller"
    keyframe = (await ws.kind("Keyframe"))["payload"]
    assert (keyframe["snapshot_cols"], keyframe["snapshot_rows"]) == (120, 30)  # failed starts' sizes undone
    await ws.output_until(b"good")
    await ws.close()


async def test_delete_while_pending(instance: Instance) -> None:
    sid = (await pending(instance))["id"]
    observer = await instance.attach(sid)
    await observer.join("observer")
    await observer.kind("Keyframe")
    response = await instance.admin.delete(f"/api/v2/admin/instances/{instance.id}/sessions/{sid}")
    assert response.status_code == 204
    closed = (await observer.kind("Closed"))["payload"]
    assert closed["reason"] == "killed"
    assert (await observer.until(lambda fr: fr["op"] == "binding_goodbye"))["payload"]["reason"] == "session_closed"
    assert await observer.close_code() == 1000
    assert_problem(
        await instance.admin.get(f"/api/v2/admin/instances/{instance.id}/sessions/{sid}"), 404, "session.not_found"
    )
    with pytest.raises(InvalidStatus) as refused:
        await WS.connect(instance.url(sid))
    assert refused.value.response.status_code == 404


async def test_pending_sessions_die_with_hostd(instance: Instance, hostd: LiveHostd) -> None:
    sid = (await pending(instance))["id"]
    observer = await instance.attach(sid)
    await observer.join("observer")
    await observer.kind("Keyframe")
    hostd.kill()  # SIGKILL: like a running session, a pending one does not outlive hostd
    assert (await observer.until(lambda fr: fr["op"] == "binding_goodbye"))["payload"]["reason"] == "other"
    assert await observer.close_code() == 1011  # hostd went away: the client may reconnect...
    await hostd.start()
    with trio.fail_after(20):
        while (await instance.admin.get("/readyz")).status_code != 200:
            await trio.sleep(0.05)
    with pytest.raises(InvalidStatus) as refused:  # ...and learns the session is gone
        await WS.connect(instance.url(sid))
    assert refused.value.response.status_code == 404
    assert_problem(
        await instance.admin.get(f"/api/v2/admin/instances/{instance.id}/sessions/{sid}"), 404, "session.not_found"
    )


async def test_a_pending_session_survives_a_controller_restart(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "c", hostd.socket_path)
    async with trio.open_nursery() as nursery:
        proc = ControllerProcess(env)
        url = await proc.start(nursery)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=15) as admin:
            await _ready(admin)
            iid = (await provision(admin, "waiting", start=True))["result"]["instance_id"]
            response = await admin.post(f"/api/v2/admin/instances/{iid}/sessions", json={"start": False})
            sid = response.json()["id"]
        observer = await WS.connect(attach_url(url, iid, sid))
        await observer.json()
        await observer.join("observer")
        assert await proc.stop(signal.SIGKILL) == -signal.SIGKILL
        with pytest.raises(ConnectionClosed):
            while True:
                await observer.frame()

        proc = ControllerProcess(env)
        url = await proc.start(nursery)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=15) as admin:
            await _ready(admin)
            assert (await admin.get(f"/api/v2/admin/instances/{iid}/sessions/{sid}")).json()["state"] == "pending"
            observer = await WS.connect(attach_url(url, iid, sid))  # back, still waiting
            await observer.json()
            await observer.join("observer")
            ws = await WS.connect(attach_url(url, iid, sid))
            await ws.json()
            await ws.join(payload={"argv": ["/bin/sh", "-c", "echo after-restart; exec cat"]})
            await observer.output_until(b"after-restart")
            assert (await admin.get(f"/api/v2/admin/instances/{iid}/sessions/{sid}")).json()["state"] == "running"
            await ws.close()
            await observer.close()
        await proc.stop()
        nursery.cancel_scope.cancel()


async def _ready(client: httpx.AsyncClient) -> None:
    with trio.fail_after(20):
        while (await client.get("/readyz")).status_code != 200:
            await trio.sleep(0.05)
