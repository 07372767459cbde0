"""The whole hostd over its real socket: handshake, peer credentials, bad input, restarts."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import msgspec
import pytest
import trio

from agentic_sandbox.proto import (
    PROTOCOL_VERSION,
    ErrorCode,
    FrameBuffer,
    FrameEncoder,
    HostdConnectionLost,
    HostdRemoteError,
    Limit,
    open_hostd,
)
from agentic_sandbox.proto import messages as m
from tests.hostd_process import ROOT, HostdProcess
from tests.processes import alive

SERVER = msgspec.msgpack.Decoder(m.ServerFrame)


async def raw_exchange(path: Path, data: bytes) -> list[m.Frame]:
    """Send raw bytes on a fresh connection; return every frame until hostd closes it."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(str(path))
    stream = trio.SocketStream(sock)
    frames = []
    buf = FrameBuffer()
    async with stream:
        await stream.send_all(data)
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                buf.feed(chunk)
                while (frame := buf.next_message(SERVER)) is not None:
                    frames.append(frame)
    return frames


def hello_bytes(version: int = PROTOCOL_VERSION) -> bytes:
    return bytes(FrameEncoder().encode(m.HelloRequest(id=1, protocol_version=version)))


async def test_hello_and_status(hostd: HostdProcess) -> None:
    async with open_hostd(hostd.socket_path, client_name="test") as client:
        assert client.hello.protocol_version == PROTOCOL_VERSION
        assert client.hello.peer_uid == os.getuid()
        status = await client.call(m.StatusRequest())
        assert status.pid == hostd.proc.pid
        assert status.connections == 1
        assert status.state_dir == str(hostd.state_dir)
    assert oct(hostd.socket_path.stat().st_mode & 0o777) == "0o660"


async def test_version_mismatch_gets_error_frame(hostd: HostdProcess) -> None:
    frames = await raw_exchange(hostd.socket_path, hello_bytes(PROTOCOL_VERSION + 7))
    assert [f.code for f in frames] == ["protocol.version_mismatch"]


async def test_first_frame_must_be_hello(hostd: HostdProcess) -> None:
    frames = await raw_exchange(hostd.socket_path, bytes(FrameEncoder().encode(m.PingRequest(id=1))))
    assert [f.code for f in frames] == ["protocol.hello_required"]


async def test_malformed_frame_ends_only_that_connection(hostd: HostdProcess) -> None:
    async with open_hostd(hostd.socket_path) as bystander:
        garbage = hello_bytes() + b"\x00\x00\x00\x04\xc1\xc1\xc1\xc1"
        frames = await raw_exchange(hostd.socket_path, garbage)
        assert isinstance(frames[0], m.HelloResponse)
        assert frames[-1].code == "protocol.malformed_frame"
        oversized = hello_bytes() + (64 * 1024 * 1024).to_bytes(4, "big")
        frames = await raw_exchange(hostd.socket_path, oversized)
        assert frames[-1].code == "protocol.frame_too_large"
        unknown = hello_bytes() + bytes(FrameEncoder().encode({"t": "FormatDisk", "id": 2}))
        frames = await raw_exchange(hostd.socket_path, unknown)
        assert frames[-1].code == "protocol.malformed_frame"
        # The other client never noticed.
        assert (await bystander.call(m.PingRequest(payload=b"still here"))).payload == b"still here"


async def test_invalid_request_is_answered_and_connection_stays(hostd: HostdProcess) -> None:
    async with open_hostd(hostd.socket_path) as client:
        for bad in (
            m.SessionCreateRequest(instance_id="x", argv=[]),
            m.SessionResizeRequest(session_id="s", cols=0, rows=10),
            m.SessionWriteRequest(session_id="s", data=b"x" * (m.MAX_INPUT_BYTES + 1)),
            m.SessionGetRequest(session_id="../etc"),
        ):
            with pytest.raises(HostdRemoteError) as info:
                await client.call(bad)
            assert info.value.code == "request.invalid", bad
        for unknown, code in (
            (m.SessionGetRequest(session_id="nope"), "session.not_found"),
            (m.ExecGetRequest(exec_id="nope"), "exec.not_found"),
            (m.InstanceGetRequest(instance_id="nope"), "instance.not_found"),
            (m.SessionSignalRequest(session_id="nope", signal="SIGINT"), "session.not_found"),
        ):
            with pytest.raises(HostdRemoteError) as info:
                await client.call(unknown)
            assert info.value.code == code
        assert (await client.call(m.PingRequest())).payload == b""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
async def test_peer_with_other_uid_is_refused(tmp_path: Path) -> None:
    # The socket sits in a directory others may enter, and the client keeps gid 0 so the
    # 0660 root:root socket lets it connect: only SO_PEERCRED stands between it and hostd.
    # pytest's tmp_path sits under a 0700 directory; the socket needs a path others can walk.
    sock_dir = Path(tempfile.mkdtemp(prefix="hostd-peer-"))
    os.chmod(sock_dir, 0o755)
    proc = HostdProcess(tmp_path / "state", socket_path=sock_dir / "h.sock").start()
    try:
        # The other uid may not be able to read this checkout or its venv (a clone under a 0700
        # directory), so its client is stdlib only: a raw Hello out, raw frames back as hex.
        script = textwrap.dedent(
            f"""
            import socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect({str(proc.socket_path)!r})
            sent = "sent"
            try:
                s.sendall(bytes.fromhex({hello_bytes().hex()!r}))
            except (BrokenPipeError, ConnectionResetError):
                sent = "refused"  # hostd may close before our Hello is even written
            data = b""
            try:
                while chunk := s.recv(65536):
                    data += chunk
            except ConnectionResetError:
                pass  # hostd closed with our Hello unread: the reset follows its error frame
            print(sent, data.hex())
            """
        )
        python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=0", "--clear-groups", python, "-I", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
            cwd="/",
        )
        assert out.returncode == 0, out.stderr
        sent, _, raw = out.stdout.strip().partition(" ")
        buf = FrameBuffer()
        buf.feed(bytes.fromhex(raw))
        frames = []
        while (frame := buf.next_message(SERVER)) is not None:
            frames.append(frame)
        # The refused peer never gets an answer to its Hello. It may see its own send fail (hostd
        # closed first) and may then find nothing to read; whatever it does read is the refusal.
        if frames or sent == "sent":
            assert [(type(f), f.code) for f in frames] == [(m.ErrorResponse, "auth.peer_refused")], (sent, frames)
        # hostd still serves allowed peers.
        async with open_hostd(proc.socket_path) as client:
            await client.call(m.PingRequest())
    finally:
        proc.cleanup()
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_refuses_to_start_while_another_hostd_answers(hostd: HostdProcess) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"],
        env=hostd.env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert second.returncode == 1
    assert "already listening" in second.stderr
    assert hostd.answers()


def test_refuses_to_start_on_a_newer_state_file(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "hostd-state.json").write_text('{"version": 99, "instances": []}')
    env = {**HostdProcess(state_dir).env}
    result = subprocess.run(
        [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert "has version 99; this hostd reads up to 2" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (state_dir / "hostd.sock").exists()


async def test_provider_list(hostd: HostdProcess) -> None:
    async with open_hostd(hostd.socket_path) as client:
        providers = (await client.call(m.ProviderListRequest())).providers
    assert [(p.runtime, p.provider, p.available, p.default) for p in providers] == [
        ("host", "hostd", True, True),
        ("container", "podman", False, True),  # no podman socket configured
    ]


def test_stale_socket_is_replaced_and_foreign_file_is_not(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(state / "hostd.sock"))
    stale.close()
    proc = HostdProcess(state).start()
    proc.cleanup()
    assert not (state / "hostd.sock").exists(), "clean shutdown removes its own socket"

    (state / "hostd.sock").write_text("not a socket")
    out = subprocess.run(
        [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"],
        env=proc.env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert out.returncode == 1
    assert "not a socket" in out.stderr
    assert (state / "hostd.sock").read_text() == "not a socket"


async def test_hostd_killed_mid_call_fails_the_call_at_once(hostd: HostdProcess) -> None:
    async with open_hostd(hostd.socket_path) as client:
        inst = (
            await client.call(m.InstanceProvisionRequest(instance_id="mid-call", name="mid-call", start=True))
        ).instance
        session = (
            await client.call(m.SessionCreateRequest(instance_id=inst.instance_id, argv=["sleep", "60"]))
        ).session

        async def kill_soon() -> None:
            await trio.sleep(0.3)
            hostd.kill()

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill_soon)
                with pytest.raises(HostdConnectionLost):
                    async with client.stream(m.SessionSubscribeRequest(session_id=session.session_id)) as events:
                        async for _ in events:
                            pass
        with pytest.raises(HostdConnectionLost):
            await client.call(m.PingRequest())
        # hostd died without cleanup: its session's shell lost its PTY master and must end.
        with trio.fail_after(5):
            while alive({session.pid}):
                await trio.sleep(0.05)


async def test_sessions_outlive_the_client_connection(hostd: HostdProcess) -> None:
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id="keep", name="keep"))
        created = await client.call(
            m.SessionCreateRequest(instance_id="keep", argv=["sh", "-c", "echo first; read x; echo got $x"])
        )
        sid = created.session.session_id
    # The first connection is gone; the shell is still there, and so is its output.
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.SessionWriteRequest(session_id=sid, data=b"second\n"))
        out = b""
        async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=1)) as events:
            async for ev in events:
                if isinstance(ev, m.SessionOutput):
                    out += ev.data
                elif isinstance(ev, m.SessionExited):
                    assert ev.exit_code == 0
        assert b"first" in out and b"got second" in out


async def test_restart_reloads_instances(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = HostdProcess(state).start()
    try:
        async with open_hostd(proc.socket_path) as client:
            await client.call(m.InstanceProvisionRequest(instance_id="idle", name="idle", start=True))
            main = await client.call(
                m.InstanceProvisionRequest(instance_id="svc", name="svc", command=["sleep", "300"], start=True)
            )
            doomed = await client.call(
                m.InstanceProvisionRequest(instance_id="doomed", name="doomed", command=["sleep", "300"], start=True)
            )
        proc.stop()
        # While hostd is down one main process dies; the other keeps running.
        os.kill(doomed.instance.host.pid, signal.SIGKILL)
        proc.start()
        async with open_hostd(proc.socket_path) as client:
            listed = {i.instance_id: i for i in (await client.call(m.InstanceListRequest())).instances}
            assert set(listed) == {"idle", "svc", "doomed"}
            assert listed["svc"].state == "running" and listed["svc"].adopted is True
            assert listed["svc"].host.pid == main.instance.host.pid
            assert listed["doomed"].state == "failed" and listed["doomed"].adopted is False
            assert listed["doomed"].note
            for iid in listed:
                await client.call(m.InstanceDestroyRequest(instance_id=iid, grace_s=0.5))
        assert not alive({main.instance.host.pid})
    finally:
        proc.cleanup()


def test_sigterm_stops_cleanly_and_ends_sessions(hostd: HostdProcess) -> None:
    async def make_session() -> int:
        async with open_hostd(hostd.socket_path) as client:
            await client.call(m.InstanceProvisionRequest(instance_id="t", name="t"))
            created = await client.call(m.SessionCreateRequest(instance_id="t", argv=["sleep", "300"]))
            return created.session.pid

    pid = trio.run(make_session)
    assert hostd.stop(signal.SIGTERM) == 0
    assert not hostd.socket_path.exists()
    assert not alive({pid})
    assert "shutting down" in hostd.log()


async def test_random_frames_never_take_hostd_down(hostd: HostdProcess) -> None:
    """Valid framing around random msgpack-ish bodies and random field values: hostd answers or
    drops that one connection, and keeps serving."""
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    enc = FrameEncoder()
    # Not UpgradeRequest: valid whatever its fields, it hands hostd over and so ends every
    # connection by design (tests/hostd/test_upgrade.py).
    names = [cls.__name__ for cls in m.ClientFrame.__args__ if cls is not m.UpgradeRequest]
    values = [None, -1, 0, 2**63, "x" * 300, "../../etc", b"\x00\xff", [], {}, [1, "a"], {"k": None}, 1.5, True]
    async with open_hostd(hostd.socket_path) as bystander:
        for _ in range(60):
            body: dict[str, object] = {"t": rng.choice(names), "id": rng.choice([0, 1, 2, rng.randrange(2**31)])}
            for field in rng.sample(
                ["session_id", "instance_id", "exec_id", "argv", "data", "cols", "rows", "signal", "from_seq", "env"],
                k=rng.randrange(0, 6),
            ):
                body[field] = rng.choice(values)
            payload = hello_bytes() + bytes(enc.encode(body))
            if rng.random() < 0.3:
                garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
                payload += len(garbage).to_bytes(4, "big") + garbage
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            await sock.connect(str(hostd.socket_path))
            async with trio.SocketStream(sock) as stream:
                await stream.send_all(payload)
                await stream.send_eof()  # hostd answers what it read, then closes
                with trio.fail_after(5):
                    while await stream.receive_some(65536):
                        pass
        assert (await bystander.call(m.PingRequest(payload=b"alive"))).payload == b"alive", f"seed {seed}"
    assert "Traceback" not in hostd.log(), f"seed {seed}:\n{hostd.log()}"


async def test_a_call_outlives_the_client_that_hung_up(hostd: HostdProcess) -> None:
    """A client that sends a provision and hangs up at once never leaves it half done."""
    provision = FrameEncoder().encode(
        m.InstanceProvisionRequest(id=2, instance_id="orphaned", name="orphaned", command=["sleep", "60"])
    )
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(str(hostd.socket_path))
    async with trio.SocketStream(sock) as stream:
        await stream.send_all(hello_bytes())
        with trio.fail_after(5):
            assert await stream.receive_some(65536)  # the Hello answer
        await stream.send_all(bytes(provision))
    async with open_hostd(hostd.socket_path) as client:
        with trio.fail_after(10):
            while True:
                try:
                    info = (await client.call(m.InstanceGetRequest(instance_id="orphaned"))).instance
                except HostdRemoteError:
                    await trio.sleep(0.02)
                    continue
                if info.state == "running":
                    break
                await trio.sleep(0.02)
        assert info.host and info.host.pid and alive({info.host.pid})
        await client.call(m.InstanceDestroyRequest(instance_id="orphaned", grace_s=0.2))
        assert not alive({info.host.pid})


async def test_stopping_an_instance_spares_a_session_that_shares_its_name(hostd: HostdProcess) -> None:
    """Tree marks carry the kind: a session named like an instance is not swept with it."""
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id="twin", name="twin", command=["sleep", "60"]))
        await client.call(m.InstanceProvisionRequest(instance_id="other", name="other"))
        created = await client.call(
            m.SessionCreateRequest(instance_id="other", session_id="twin", argv=["sleep", "60"])
        )
        await client.call(m.InstanceStopRequest(instance_id="twin", grace_s=0.2))
        assert alive({created.session.pid}) == [created.session.pid]
        assert (await client.call(m.SessionGetRequest(session_id="twin"))).session.state == "running"
        for iid in ("twin", "other"):
            await client.call(m.InstanceDestroyRequest(instance_id=iid, grace_s=0.2))
        assert not alive({created.session.pid})


async def test_children_cannot_pass_for_another_instance_or_tree(hostd: HostdProcess) -> None:
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id="env", name="env"))
        for bad in ({"AIWG_INSTANCE_ID": "someone-else"}, {"AIWG_TREE": "x"}, {"BAD NAME": "1"}, {"A": "nul\0"}):
            for request in (
                m.SessionCreateRequest(instance_id="env", argv=["true"], env=bad),
                m.ExecStartRequest(instance_id="env", argv=["true"], env=bad),
            ):
                with pytest.raises(HostdRemoteError) as info:
                    await client.call(request)
                assert info.value.code == "request.invalid", (bad, type(request).__name__)
        # A newline is fine in a child's environment (only agent.env is line-based).
        ok = await client.call(m.ExecStartRequest(instance_id="env", argv=["true"], env={"MULTI": "a\nb"}))
        assert ok.exec.state in ("running", "exited")


async def test_sessions_and_execs_leave_no_cgroup_behind(hostd: HostdProcess) -> None:
    if hostd.cgroup is None:
        pytest.skip("needs root and a writable cgroup v2 hierarchy")
    async with open_hostd(hostd.socket_path) as client:
        info = (await client.call(m.InstanceProvisionRequest(instance_id="cg", name="cg"))).instance
        instance_cgroup = Path(info.host.cgroup)
        for _ in range(5):
            sid = (await client.call(m.SessionCreateRequest(instance_id="cg", argv=["sleep", "60"]))).session.session_id
            await client.call(m.SessionDeleteRequest(session_id=sid))
            ex = (await client.call(m.ExecStartRequest(instance_id="cg", argv=["true"]))).exec
            async with client.stream(m.ExecSubscribeRequest(exec_id=ex.exec_id)) as events:
                async for _ in events:
                    pass
        with trio.fail_after(5):
            while [p.name for p in instance_cgroup.iterdir() if p.is_dir()]:
                await trio.sleep(0.05)
        await client.call(m.InstanceDestroyRequest(instance_id="cg", grace_s=0.2))
        assert not instance_cgroup.exists()


async def test_stream_cancelled_mid_write_never_leaves_half_a_frame(hostd: HostdProcess) -> None:
    """StreamCancel lands while hostd is blocked writing a large batch to a client that stopped
    reading: the batch still goes out whole, and the connection stays usable."""
    enc = FrameEncoder()
    async with open_hostd(hostd.socket_path) as setup:
        await setup.call(m.InstanceProvisionRequest(instance_id="flood", name="flood"))
        sid = (
            await setup.call(
                m.SessionCreateRequest(instance_id="flood", argv=["sh", "-c", "sleep 0.3; head -c 30000000 /dev/zero"])
            )
        ).session.session_id
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(str(hostd.socket_path))
    async with trio.SocketStream(sock) as stream:
        await stream.send_all(
            hello_bytes() + bytes(enc.encode(m.SessionSubscribeRequest(id=2, session_id=sid, from_seq=1)))
        )
        await trio.sleep(1.0)  # not reading: hostd blocks mid-batch on a full socket buffer
        await stream.send_all(
            bytes(enc.encode(m.StreamCancel(id=3, stream_id=2))) + bytes(enc.encode(m.PingRequest(id=4)))
        )
        await trio.sleep(0.5)  # hostd takes the cancel while still blocked in that write
        buf = FrameBuffer()
        seen: list[m.Frame] = []
        with trio.fail_after(8):
            while not (
                any(isinstance(f, m.PingResponse) for f in seen)
                and any(f.id == 2 and isinstance(f, m.StreamEnd) for f in seen)
            ):
                data = await stream.receive_some(1 << 20)
                assert data, "hostd closed the connection"
                buf.feed(data)
                while (frame := buf.next_message(SERVER)) is not None:  # raises on half a frame
                    seen.append(frame)
        # Every frame decoded whole (next_message raises on half a frame), the stream ended, and
        # the connection still answers.


async def test_posted_writes_need_no_reply_and_errors_arrive_in_order(hostd: HostdProcess) -> None:
    errors: list[BaseException] = []
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id="typing", name="typing"))
        sid = (
            await client.call(
                m.SessionCreateRequest(instance_id="typing", argv=["sh", "-c", "stty raw -echo; echo READY; exec cat"])
            )
        ).session.session_id
        async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=1)) as events:
            seen = b""

            async def read_until(needle: bytes) -> None:
                nonlocal seen
                with trio.fail_after(10):
                    while needle not in seen:
                        event = await anext(events)
                        if isinstance(event, m.SessionOutput):
                            seen += event.data

            await read_until(b"READY")
            for key in b"hello":  # no reply awaited: the echo is what the typist waits for
                await client.post(m.SessionWriteRequest(session_id=sid, data=bytes([key])), errors.append)
            await read_until(b"hello")
        assert seen.replace(b"\r", b"") == b"READY\nhello"
        # Errors come back to the poster, in order: an unknown session, then a deleted one.
        await client.post(m.SessionWriteRequest(session_id="nope", data=b"x"), errors.append)
        await client.call(m.SessionDeleteRequest(session_id=sid))
        await client.post(m.SessionWriteRequest(session_id=sid, data=b"x"), errors.append)
        await client.call(m.PingRequest())
        with trio.fail_after(5):
            while len(errors) < 2:
                await trio.sleep(0.01)
        assert [e.code for e in errors] == ["session.not_found", "session.not_found"]  # type: ignore[attr-defined]
        await client.call(m.InstanceDestroyRequest(instance_id="typing", grace_s=0.5))


async def test_a_subscription_from_now_sees_what_the_next_request_causes(hostd: HostdProcess) -> None:
    """``from_seq=None`` means "from when hostd read the subscribe", not "from when its task ran":
    a write sent in the same packet right behind it has its echo on the stream."""
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id="pin", name="pin"))
        argv = ["sh", "-c", "stty raw -echo; echo READY; exec cat"]
        sid = (await client.call(m.SessionCreateRequest(instance_id="pin", argv=argv))).session.session_id
        with trio.fail_after(10):
            while (await client.call(m.SessionGetRequest(session_id=sid))).session.next_seq < 2:
                await trio.sleep(0.01)
    encoder = FrameEncoder()
    packet = bytearray(hello_bytes())
    for round_ in range(20):  # the race this guards against lost about one round in three
        encoder.append(m.SessionSubscribeRequest(id=100 + round_, session_id=sid, from_seq=None), packet)
        encoder.append(m.SessionWriteRequest(id=200 + round_, session_id=sid, data=b"%d," % round_), packet)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(str(hostd.socket_path))
    async with trio.SocketStream(sock) as stream:
        await stream.send_all(bytes(packet))
        seen: dict[int, bytes] = {}
        buf = FrameBuffer()
        with trio.fail_after(10):
            while len(seen) < 20 or any(not seen[100 + r].endswith(b"19,") for r in range(20)):
                buf.feed(await stream.receive_some(65536))
                while (frame := buf.next_message(SERVER)) is not None:
                    if isinstance(frame, m.SessionOutput):
                        seen[frame.id] = seen.get(frame.id, b"") + frame.data
                    elif isinstance(frame, m.StreamOpened):
                        seen.setdefault(frame.id, b"")
    everything = b"".join(b"%d," % r for r in range(20))
    for round_ in range(20):
        # Subscribe r was read before write r: its stream holds write r's echo and all that follow
        # (and maybe the echo of an earlier write that was still on its way).
        stream = seen[100 + round_]
        assert everything.endswith(stream)
        assert stream.endswith(b"".join(b"%d," % r for r in range(round_, 20)))
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceDestroyRequest(instance_id="pin", grace_s=0.5))


async def test_a_stream_cancelled_before_its_task_ran_is_ended(hostd: HostdProcess) -> None:
    """A StreamCancel read right behind its subscribe (one packet) still finds the stream."""
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id="cancel", name="cancel"))
        sid = (await client.call(m.SessionCreateRequest(instance_id="cancel", argv=["/bin/cat"]))).session.session_id
    encoder = FrameEncoder()
    packet = bytearray(hello_bytes())
    for stream_id in range(10, 20):
        encoder.append(m.SessionSubscribeRequest(id=stream_id, session_id=sid, from_seq=1), packet)
        encoder.append(m.StreamCancel(stream_id=stream_id), packet)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(str(hostd.socket_path))
    async with trio.SocketStream(sock) as stream:
        await stream.send_all(bytes(packet))
        ended: set[int] = set()
        buf = FrameBuffer()
        with trio.fail_after(10):
            while len(ended) < 10:
                buf.feed(await stream.receive_some(65536))
                while (frame := buf.next_message(SERVER)) is not None:
                    if isinstance(frame, m.StreamEnd):
                        assert frame.reason == "canceled"
                        ended.add(frame.id)
        async with open_hostd(hostd.socket_path) as client:
            assert (await client.call(m.SessionGetRequest(session_id=sid))).session.subscribers == 0
            await client.call(m.InstanceDestroyRequest(instance_id="cancel", grace_s=0.5))


async def test_a_connection_past_the_limit_is_told_which_limit(tmp_path: Path) -> None:
    proc = HostdProcess(tmp_path / "state", env={"AIWG_MAX_CONNECTIONS": "1"}).start()
    try:
        # start() probed the socket with a connection of its own; hostd counts it until it has read
        # its end, which a loaded machine can delay past our Hello: try again until it is gone.
        frames: list[m.Frame] | None = None
        with trio.fail_after(10):
            while frames is None:
                try:
                    async with open_hostd(proc.socket_path):
                        # Nothing sent: refused before its Hello, it is told why and closed.
                        frames = await raw_exchange(proc.socket_path, b"")
                except HostdRemoteError as exc:
                    assert exc.code == ErrorCode.LIMIT_REACHED.value, exc
                    await trio.sleep(0.05)
    finally:
        proc.stop()
    assert frames is not None and len(frames) == 1 and isinstance(frames[0], m.ErrorResponse), frames
    assert frames[0].code == ErrorCode.LIMIT_REACHED.value
    # Which limit and the setting that raises it; no retry_after_s: hostd cannot say when one ends.
    assert Limit.from_details(frames[0].details) == Limit(name="connections", limit=1, setting="AIWG_MAX_CONNECTIONS")
