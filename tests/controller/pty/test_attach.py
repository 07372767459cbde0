"""The pty-ws/v1 attach socket end to end: a real hostd, the controller on hypercorn, `websockets`
clients; every JSON frame the server sends is validated against upstream's schemas (wsclient)."""

from __future__ import annotations

import base64
import contextlib
import json

import pytest
import trio

from agentic_sandbox.controller.config import load_config
from agentic_sandbox.controller.pty.attach import MAX_BAD_FRAMES

from ..conftest import OPERATOR_TOKEN, LiveHostd, controller_env, serve_controller, wait_operation
from .conftest import Instance
from .wsclient import WS, ConnectionClosed, InvalidStatus, cframe


async def test_hello_join_input_output(instance: Instance) -> None:
    sid = await instance.session(["/bin/cat"])
    ws = await WS.connect(instance.url(sid))
    assert ws.subprotocol == "pty-ws.v1"
    hello = await ws.json()
    assert hello["op"] == "binding_hello" and hello["sequence"] == 0
    assert hello["payload"]["session"]["session_id"] == sid
    assert "https://agentic-sandbox.aiwg.io/extensions/pty-extensions/v1" in hello["payload"]["activated_extensions"]
    assert {"pty.join_session", "pty.session_input"} <= set(hello["payload"]["supported_operations"])

    await ws.send(cframe("pty.join_session", {"role": "controller", "client_label": "t"}))
    kinds = []
    while len(kinds) < 3:
        frame = await ws.json()
        if frame["op"] == "pty.session_frame":
            kinds.append(frame["payload"]["kind"])
    assert kinds == ["RoleAssigned", "MembershipChanged", "Keyframe"]  # the join flush order
    role = ws.frames[-3]["payload"]
    assert role["role"] == "controller"
    membership = ws.frames[-2]["payload"]
    assert membership["controllers"] == [{"client_id": role["client_id"], "label": "t"}]

    await ws.type(b"hello over the socket\n")
    seen = await ws.output_until(b"hello over the socket")
    assert b"hello over the socket" in seen
    outputs = [fr for fr in ws.frames if fr["op"] == "pty.session_frame" and fr["payload"]["kind"] == "Output"]
    seqs = [fr["sequence"] for fr in outputs]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # hostd's, gap-free
    await ws.close()


async def test_upgrade_refusals(instance: Instance, hostd: LiveHostd) -> None:
    sid = await instance.session(["/bin/cat"])

    async def refused(url: str, **kwargs: object) -> tuple[int, dict]:
        with pytest.raises(InvalidStatus) as info:
            await WS.connect(url, **kwargs)  # type: ignore[arg-type]
        response = info.value.response
        return response.status_code, json.loads(response.body or b"{}")

    status, body = await refused(instance.url(sid), subprotocols=("chat", "pty-ws.v2"))
    assert (status, body["error"]["code"]) == (400, "unsupported_subprotocol")
    status, _ = await refused(instance.url(sid), subprotocols=())  # no header, not in dev mode
    assert status == 400
    status, body = await refused(instance.url(sid), token=None)
    assert (status, body["error"]["code"]) == (401, "unauthenticated")
    status, _ = await refused(instance.url(sid), token="wrong-token-" + "x" * 20)
    assert status == 401
    # The query string never carries a token.
    status, _ = await refused(instance.url(sid, "access_token=admin-token-" + "a" * 24), token=None)
    assert status == 401
    unknown = "0190a000-0000-7000-8000-000000000000"
    status, body = await refused(instance.url(unknown))
    assert (status, body["error"]["code"]) == (404, "session.not_found")
    status, _ = await refused(instance.url(sid, "replay_from=-1"))
    assert status == 400

    # A session of another instance is not found under this one.
    other = await instance.admin.post("/api/v2/admin/instances", json={"name": "other-host", "runtime": "host"})
    assert other.status_code == 202
    other_id = other.json()["result"]["instance_id"] if other.json().get("result") else None
    if other_id is None:
        other_id = (await wait_operation(instance.admin, other.json()["id"]))["result"]["instance_id"]
    status, _ = await refused(instance.url(sid).replace(instance.id, other_id))
    assert status == 404


async def test_an_instance_token_drives_its_own_shells_and_sees_no_other(instance: Instance) -> None:
    sid = await instance.session(["/bin/cat"])
    response = await instance.admin.post(
        "/api/v2/admin/instances", json={"name": "pty-tokened", "runtime": "host", "start": True}
    )
    assert response.status_code == 202, response.text
    token = response.json()["a2a_token"]
    own_id = (await wait_operation(instance.admin, response.json()["id"]))["result"]["instance_id"]
    own = Instance(instance.controller, instance.admin, str(own_id))
    own_sid = await own.session(["/bin/cat"])

    ws = await WS.connect(own.url(own_sid), token=token)
    await ws.json()
    assert (await ws.join())["role"] == "controller"  # its own instance: pty:control
    await ws.close()
    with pytest.raises(InvalidStatus) as info:  # another instance's session: not even its existence
        await WS.connect(instance.url(sid), token=token)
    assert info.value.response.status_code == 404
    assert json.loads(info.value.response.body or b"{}")["error"]["code"] == "instance.not_found"


async def test_subprotocol_choice_and_bearer_subprotocol(instance: Instance) -> None:
    sid = await instance.session(["/bin/cat"])
    token = base64.urlsafe_b64encode(OPERATOR_TOKEN.encode()).decode().rstrip("=")
    ws = await WS.connect(instance.url(sid), token=None, subprotocols=("pty-ws.v1", f"bearer.{token}"))
    assert ws.subprotocol == "pty-ws.v1"  # the token entry is never echoed
    await ws.json()
    assert (await ws.join())["role"] == "controller"  # operator -> pty:control
    await ws.close()

    ws = await WS.connect(instance.url(sid), subprotocols=("pty-ws.v1", "pty-ws.v1.binary"))
    assert ws.subprotocol == "pty-ws.v1.binary"  # binary wins when both are offered
    await ws.close()


async def test_binary_subprotocol(instance: Instance) -> None:
    sid = await instance.session(["/bin/cat"])
    ws = await instance.attach(sid, subprotocols=("pty-ws.v1.binary",))
    await ws.join()
    await ws.kind("Keyframe")
    await ws.send(b"PW1I" + b"binary keys\n")
    seen = b""
    seqs = []
    with trio.fail_after(15):
        while b"binary keys" not in seen:
            frame = await ws.frame()
            if isinstance(frame, tuple):  # PW1O, never JSON Output
                seqs.append(frame[0])
                seen += frame[1]
            else:
                assert frame["payload"].get("kind") != "Output"
    assert seqs == sorted(seqs) and seqs[0] >= 1
    await ws.send(b"XXXX" + b"no magic")
    assert (await ws.error())["payload"]["code"] == "INVALID_REQUEST"

    observer = await instance.attach(sid, subprotocols=("pty-ws.v1.binary",))
    assert (await observer.join("observer"))["role"] == "observer"
    await observer.send(b"PW1I" + b"not allowed\n")
    assert (await observer.error())["payload"]["code"] == "PERMISSION_DENIED"
    await observer.close()
    await ws.close()


async def test_roles_membership_and_permissions(instance: Instance) -> None:
    sid = await instance.session(["/bin/cat"])
    first = await instance.attach(sid)
    one = await first.join(payload={"client_label": "first"})
    assert one["role"] == "controller"
    second = await instance.attach(sid)
    two = await second.join(payload={"client_label": "second"})
    assert two["role"] == "observer" and two["downgraded"] is True  # max_controllers is 1
    membership = (
        await first.until(
            lambda fr: fr["payload"].get("kind") == "MembershipChanged" and len(fr["payload"]["observers"]) == 1
        )
    )["payload"]
    assert membership["controllers"] == [{"client_id": one["client_id"], "label": "first"}]
    assert membership["observers"] == [{"client_id": two["client_id"], "label": "second"}]

    for op, payload in (
        ("pty.session_input", {"data": base64.b64encode(b"x").decode()}),
        ("pty.session_resize", {"cols": 90, "rows": 20}),
    ):
        await second.send(cframe(op, payload))
        error = await second.error()
        assert error["payload"]["code"] == "PERMISSION_DENIED", error
    await second.send(cframe("pty.request_role", {"role": "controller"}))
    again = (await second.kind("RoleAssigned"))["payload"]
    assert again["role"] == "observer" and again["downgraded"] is True

    # The controller steps down; the observer may then take the role.
    await first.send(cframe("pty.request_role", {"role": "observer"}))
    assert (await first.kind("RoleAssigned"))["payload"]["role"] == "observer"
    await second.send(cframe("pty.request_role", {"role": "controller"}))
    assert (await second.kind("RoleAssigned"))["payload"]["role"] == "controller"

    # Resize is broadcast to every member.
    await second.send(cframe("pty.session_resize", {"cols": 100, "rows": 40}))
    for ws in (first, second):
        resize = (await ws.kind("Resize"))["payload"]
        assert (resize["cols"], resize["rows"]) == (100, 40)

    # Leaving: a final MembershipChanged, then close 1000; the others are told.
    await first.send(cframe("pty.leave_session"))
    final = (await first.kind("MembershipChanged"))["payload"]
    assert one["client_id"] not in [ref["client_id"] for ref in final["controllers"] + final["observers"]]
    assert await first.close_code() == 1000
    left = await second.until(
        lambda fr: fr["payload"].get("kind") == "MembershipChanged" and not fr["payload"]["observers"]
    )
    assert [ref["client_id"] for ref in left["payload"]["controllers"]] == [two["client_id"]]
    await second.close()


async def _output_seqs(ws: WS, until_seq: int) -> list[tuple[int, bytes]]:
    got = []
    with trio.fail_after(15):
        while not got or got[-1][0] < until_seq:
            frame = await ws.json()
            if frame["op"] == "pty.session_frame" and frame["payload"]["kind"] == "Output":
                got.append((frame["sequence"], base64.b64decode(frame["payload"]["data"])))
    return got


async def _next_seq(instance: Instance, sid: str, at_least: int) -> int:
    with trio.fail_after(15):
        while True:
            info = (await instance.admin.get(f"/api/v2/admin/instances/{instance.id}/sessions/{sid}")).json()
            if info["next_seq"] >= at_least:
                return int(info["next_seq"])
            await trio.sleep(0.02)


async def _written(instance: Instance, sid: str, marker: bytes) -> int:
    """The sequence of the output that completes ``marker``, read from the start over a socket.

    (Counting sequences instead would assume one output chunk per line written: under load hostd's
    reader may find two lines in one read.)"""
    ws = await instance.attach(sid)
    await ws.join(replay_from=0)
    data, seq = b"", 0
    with trio.fail_after(15):
        while marker not in data:
            frame = await ws.json()
            if frame["op"] == "pty.session_frame" and frame["payload"]["kind"] == "Output":
                data += base64.b64decode(frame["payload"]["data"])
                seq = frame["sequence"]
    await ws.close()
    return int(seq)


async def test_replay(instance: Instance) -> None:
    sid = await instance.session(["/bin/sh", "-c", "for i in $(seq 1 20); do echo line-$i; sleep 0.05; done; exec cat"])
    last = await _written(instance, sid, b"line-20\r\n")
    assert last >= 6, last  # enough output frames to replay some after 5
    nxt = last + 1
    for how in ("envelope", "query"):
        if how == "envelope":
            ws = await instance.attach(sid)
            await ws.join(replay_from=5)
        else:
            ws = await instance.attach(sid, "replay_from=5")
            await ws.join()
        got = await _output_seqs(ws, last)
        assert [seq for seq, _ in got] == list(range(6, last + 1))  # after N, in order, gap-free
        keyframe = (await ws.kind("Keyframe"))["payload"]  # then a keyframe
        assert keyframe["anchor_sequence"] >= 5
        screen = base64.b64decode(keyframe["snapshot"])
        assert b"line-20" in screen
        await ws.close()

    ws = await instance.attach(sid)
    await ws.join(replay_from=nxt + 50)  # from another ring
    error = await ws.error()
    assert error["payload"]["code"] == "REPLAY_OUT_OF_RANGE"
    assert ws.frames[-1] is error
    keyframe = await ws.kind("Keyframe")
    assert b"line-20" in base64.b64decode(keyframe["payload"]["snapshot"])
    await ws.close()


async def test_keyframe_on_request_is_the_screen(instance: Instance) -> None:
    sid = await instance.session(
        ["/bin/sh", "-c", "printf 'top\\033[5;10Hplaced'; exec cat"], size={"cols": 40, "rows": 8}
    )
    await _next_seq(instance, sid, 2)
    ws = await instance.attach(sid)
    await ws.join()
    await ws.kind("Keyframe")
    await ws.send(cframe("pty.request_keyframe"))
    keyframe = (await ws.kind("Keyframe"))["payload"]
    assert (keyframe["snapshot_cols"], keyframe["snapshot_rows"]) == (40, 8)
    import pyte

    screen = pyte.Screen(40, 8)
    pyte.ByteStream(screen).feed(base64.b64decode(keyframe["snapshot"]))
    assert screen.display[0].rstrip() == "top"
    assert screen.display[4][9:15] == "placed"
    await ws.send(cframe("pty.request_keyframe"))  # a second within the second is refused
    assert (await ws.error())["payload"]["code"] == "RATE_LIMITED"
    await ws.close()


async def test_bad_input_gets_errors_and_the_socket_lives(instance: Instance) -> None:
    sid = await instance.session(["/bin/cat"])
    ws = await instance.attach(sid)
    await ws.type(b"too early")  # before the join
    assert (await ws.error())["payload"]["code"] == "INVALID_REQUEST"
    await ws.join()
    cases = [
        "not json",
        json.dumps([1, 2]),
        json.dumps({"op": "pty.session_input"}),  # no id, no ts
        json.dumps(cframe("pty.session_input", {"data": "%%% not base64 %%%"})),
        json.dumps(cframe("pty.session_input", {"data": "aGk=", "extra": 1})),
        json.dumps(cframe("pty.no_such_op")),
        json.dumps(cframe("SendMessage", {"message": {}})),
        json.dumps(cframe("pty.session_resize", {"cols": 0, "rows": 0})),
        json.dumps(cframe("pty.session_resize", {"cols": 100000, "rows": 100000})),
        json.dumps(cframe("pty.join_session", {"role": "controller"})),  # already joined
        json.dumps(cframe("pty.session_input", {"data": "A" * (3 * 1024 * 1024)})),  # oversized
        b"binary on a JSON socket",
    ]
    expected = ["INVALID_REQUEST"] * 5 + ["UNSUPPORTED_OPERATION"] * 2 + ["INVALID_REQUEST"] * 5
    for case, code in zip(cases, expected, strict=True):
        await ws.send(case)
        error = await ws.error()
        assert error["payload"]["code"] == code, (case[:80], error)
    # Still alive: input works, ping is answered.
    await ws.send(cframe("ping", {"client_ts": "2026-01-01T00:00:00Z"}))
    pong = await ws.until(lambda fr: fr["op"] == "pong")
    assert pong["payload"]["client_ts"] == "2026-01-01T00:00:00Z"
    await ws.type(b"still here\n")
    await ws.output_until(b"still here")
    await ws.close()


async def test_too_many_bad_frames_close_4400(instance: Instance) -> None:
    sid = await instance.session(["/bin/cat"])
    ws = await instance.attach(sid)
    for _ in range(MAX_BAD_FRAMES):
        await ws.send("garbage")
    assert await ws.close_code() == 4400
    errors = [fr for fr in ws.frames if fr["op"] == "Error"]
    assert len(errors) == MAX_BAD_FRAMES


async def test_session_end_and_input_after_it(instance: Instance) -> None:
    sid = await instance.session(["/bin/sh", "-c", "read line; echo got-$line; exit 3"])
    ws = await instance.attach(sid)
    await ws.join()
    await ws.type(b"it\n")
    await ws.output_until(b"got-it")
    closed = (await ws.kind("Closed"))["payload"]
    assert closed == {"kind": "Closed", "exit_code": 3, "reason": "normal"}
    goodbye = await ws.until(lambda fr: fr["op"] == "binding_goodbye")
    assert goodbye["payload"]["reason"] == "session_closed"
    assert await ws.close_code() == 1000

    # A later attach replays the whole session, Closed included; input is refused as a PTY error
    # (unless the server has already said all and closed: the session is over either way). A socket
    # closed because the controller lost hostd (goodbye "other", 1011) is attached again, as the
    # binding tells a client to: a dropped link is not this test's subject.
    for _ in range(3):
        again = await instance.attach(sid)
        await again.join(replay_from=0)
        with contextlib.suppress(ConnectionClosed):
            await again.type(b"late\n")
        code = await again.close_code()
        goodbyes = [fr["payload"]["reason"] for fr in again.frames if fr["op"] == "binding_goodbye"]
        if code != 1011 or goodbyes != ["other"]:
            break
    seen = [(fr["op"], fr["payload"].get("kind"), fr["payload"].get("reason")) for fr in again.frames]
    assert code == 1000 and goodbyes == ["session_closed"], (code, seen)
    session_frames = [fr["payload"] for fr in again.frames if fr["op"] == "pty.session_frame"]
    assert [fr["kind"] for fr in session_frames].count("Closed") == 1, seen
    errors = [fr for fr in session_frames if fr["kind"] == "Error"]
    assert all(err["code"] == "PTY_WRITE_FAILED" for err in errors), errors


async def test_a_flooding_client_slows_no_one(instance: Instance) -> None:
    sid = await instance.session(["/bin/cat"])
    flooder = await instance.attach(sid)
    await flooder.join()
    watcher = await instance.attach(sid)
    await watcher.join("observer")
    frame = json.dumps(cframe("pty.session_input", {"data": base64.b64encode(b"f" * 1000 + b"\n").decode()}))
    for _ in range(300):
        await flooder.send(frame)
    await flooder.type(b"the end of the flood\n")
    await watcher.output_until(b"the end of the flood", timeout=60)
    other = await instance.session(["/bin/cat"])
    ws = await instance.attach(other)
    await ws.join()
    await ws.type(b"independent\n")
    await ws.output_until(b"independent")
    for sock in (ws, watcher, flooder):
        await sock.close()


async def test_a_silent_controller_is_reaped(hostd: LiveHostd, tmp_path: trio.Path) -> None:
    env = controller_env(
        tmp_path / "c", hostd.socket_path, AIWG_PTY_PING_INTERVAL_S="0.1", AIWG_PTY_PING_TIMEOUT_S="0.5"
    )
    async with serve_controller(load_config(env=env)) as live, live.client() as admin:
        from ..conftest import provision

        iid = (await provision(admin, "reaped", start=True))["result"]["instance_id"]
        instance = Instance(live, admin, iid)
        sid = await instance.session(["/bin/cat"])
        silent = await instance.attach(sid)
        assert (await silent.join())["role"] == "controller"
        pings = 0
        with trio.fail_after(15):
            while True:  # read (pings among them) without ever answering
                try:
                    frame = await silent.json()
                except ConnectionClosed:
                    break
                pings += frame["op"] == "ping"
        assert pings >= 1
        nxt = await instance.attach(sid)
        assert (await nxt.join())["role"] == "controller"  # the role was freed
        # A client that answers stays.
        with trio.move_on_after(1.5):
            while True:
                frame = await nxt.json()
                if frame["op"] == "ping":
                    await nxt.send(cframe("pong", {"client_ts": frame["payload"]["client_ts"]}))
        await nxt.type(b"alive\n")
        await nxt.output_until(b"alive")
        await nxt.close()
