"""The client fails closed: every way hostd can fail surfaces as one typed HostdError.

Each case runs a real Unix-socket server in the test (a scripted fake hostd) so the failure is
real bytes on a real socket, not a mocked call.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable

import msgspec
import pytest
import trio

from agentic_sandbox.proto import (
    PROTOCOL_VERSION,
    FrameBuffer,
    FrameEncoder,
    HostdConnectionLost,
    HostdNotRunning,
    HostdProtocolError,
    HostdRemoteError,
    HostdStreamOverflow,
    HostdTimeout,
    HostdVersionMismatch,
    open_hostd,
)
from agentic_sandbox.proto import messages as m

CLIENT = msgspec.msgpack.Decoder(m.ClientFrame)
ENC = FrameEncoder()

Script = Callable[[trio.SocketStream, "Peer"], Awaitable[None]]


class Peer:
    """Reads the client's frames on the fake server's side."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = FrameBuffer()

    async def recv(self) -> m.Request:
        while (frame := self.buf.next_message(CLIENT)) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError
            self.buf.feed(data)
        return frame

    async def send(self, frame: m.Frame) -> None:
        await self.stream.send_all(ENC.encode(frame))

    async def hello(self, version: int = PROTOCOL_VERSION) -> None:
        req = await self.recv()
        assert isinstance(req, m.HelloRequest)
        await self.send(
            m.HelloResponse(
                id=req.id,
                protocol_version=version,
                host_id="h",
                boot_id="b",
                hostd_version="test",
                pid=os.getpid(),
                peer_uid=os.getuid(),
                peer_gid=os.getgid(),
            )
        )


async def serve_script(
    path: str, script: Script, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(8)
    listener = trio.SocketListener(sock)
    async with listener, trio.open_nursery() as nursery:
        task_status.started()
        while True:
            stream = await listener.accept()

            async def run(stream: trio.SocketStream = stream) -> None:
                async with stream:
                    try:
                        await script(stream, Peer(stream))
                    except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass

            nursery.start_soon(run)


@pytest.fixture
def sock_path(tmp_path) -> str:
    return str(tmp_path / "h.sock")


async def test_missing_socket_is_not_running(sock_path: str) -> None:
    with pytest.raises(HostdNotRunning, match="does not exist"):
        async with open_hostd(sock_path):
            pass


async def test_stale_socket_file_is_not_running(sock_path: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sock_path)
    s.close()  # the file stays, nobody listens
    with pytest.raises(HostdNotRunning, match="nothing listens"):
        async with open_hostd(sock_path):
            pass


async def test_hello_deadline(sock_path: str, nursery: trio.Nursery) -> None:
    async def silent(stream, peer):
        await trio.sleep_forever()

    await nursery.start(serve_script, sock_path, silent)
    with pytest.raises(HostdTimeout):
        async with open_hostd(sock_path, connect_timeout=0.3):
            pass


async def test_version_mismatch_reported_by_server(sock_path: str, nursery: trio.Nursery) -> None:
    async def refuse(stream, peer):
        await peer.recv()
        await peer.send(m.ErrorResponse(id=0, code="protocol.version_mismatch", message="hostd speaks 99"))

    await nursery.start(serve_script, sock_path, refuse)
    with pytest.raises(HostdVersionMismatch):
        async with open_hostd(sock_path):
            pass


async def test_version_mismatch_in_hello_reply(sock_path: str, nursery: trio.Nursery) -> None:
    async def other_version(stream, peer):
        await peer.hello(version=PROTOCOL_VERSION + 1)
        await trio.sleep_forever()

    await nursery.start(serve_script, sock_path, other_version)
    with pytest.raises(HostdVersionMismatch):
        async with open_hostd(sock_path):
            pass


async def test_call_deadline_passes(sock_path: str, nursery: trio.Nursery) -> None:
    async def never_answers(stream, peer):
        await peer.hello()
        while True:
            await peer.recv()

    await nursery.start(serve_script, sock_path, never_answers)
    async with open_hostd(sock_path) as client:
        with pytest.raises(HostdTimeout):
            await client.call(m.PingRequest(), timeout=0.2)
        # A timed-out call does not break the connection for others.
        assert client.broken is None


async def test_drop_mid_call_fails_every_in_flight_call_at_once(sock_path: str, nursery: trio.Nursery) -> None:
    async def drop_after_three(stream, peer):
        await peer.hello()
        for _ in range(3):
            await peer.recv()
        await stream.aclose()

    await nursery.start(serve_script, sock_path, drop_after_three)
    errors: list[BaseException] = []
    async with open_hostd(sock_path) as client:

        async def one() -> None:
            try:
                await client.call(m.PingRequest(), timeout=30)
            except Exception as exc:
                errors.append(exc)

        with trio.fail_after(5):  # "at once": long before the 30 s deadline
            async with trio.open_nursery() as calls:
                for _ in range(3):
                    calls.start_soon(one)
        assert len(errors) == 3
        assert all(isinstance(e, HostdConnectionLost) for e in errors)
        # The client stays broken: no silent reconnect, no retry.
        with pytest.raises(HostdConnectionLost):
            await client.call(m.PingRequest())


async def test_garbage_from_server_is_a_protocol_error(sock_path: str, nursery: trio.Nursery) -> None:
    async def garbage(stream, peer):
        await peer.hello()
        await peer.recv()
        await stream.send_all(b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1")

    await nursery.start(serve_script, sock_path, garbage)
    async with open_hostd(sock_path) as client:
        with pytest.raises(HostdProtocolError):
            await client.call(m.PingRequest())


async def test_oversized_frame_from_server_is_a_protocol_error(sock_path: str, nursery: trio.Nursery) -> None:
    async def huge(stream, peer):
        await peer.hello()
        await peer.recv()
        await stream.send_all((512 * 1024 * 1024).to_bytes(4, "big"))
        await trio.sleep_forever()

    await nursery.start(serve_script, sock_path, huge)
    async with open_hostd(sock_path) as client:
        with pytest.raises(HostdProtocolError, match="limit"):
            await client.call(m.PingRequest())


async def test_wrong_reply_type_is_a_protocol_error(sock_path: str, nursery: trio.Nursery) -> None:
    async def wrong(stream, peer):
        await peer.hello()
        req = await peer.recv()
        await peer.send(m.SessionResizeResponse(id=req.id))

    await nursery.start(serve_script, sock_path, wrong)
    async with open_hostd(sock_path) as client:
        with pytest.raises(HostdProtocolError, match="answered with"):
            await client.call(m.PingRequest())


async def test_explicit_error_is_remote_error_with_code(sock_path: str, nursery: trio.Nursery) -> None:
    async def not_found(stream, peer):
        await peer.hello()
        while True:
            req = await peer.recv()
            await peer.send(m.ErrorResponse(id=req.id, code="session.not_found", message="no", details={"x": 1}))

    await nursery.start(serve_script, sock_path, not_found)
    async with open_hostd(sock_path) as client:
        with pytest.raises(HostdRemoteError) as info:
            await client.call(m.SessionGetRequest(session_id="nope"))
        assert info.value.code == "session.not_found"
        assert info.value.details == {"x": 1}
        # An explicit error is an answer, not a broken connection.
        with pytest.raises(HostdRemoteError):
            await client.call(m.SessionGetRequest(session_id="nope"))


async def test_concurrent_calls_are_matched_by_id(sock_path: str, nursery: trio.Nursery) -> None:
    async def reverse(stream, peer):
        await peer.hello()
        pending = [await peer.recv() for _ in range(20)]
        for req in reversed(pending):
            await peer.send(m.PingResponse(id=req.id, payload=req.payload))

    await nursery.start(serve_script, sock_path, reverse)
    results: dict[int, bytes] = {}
    async with open_hostd(sock_path) as client:

        async def one(i: int) -> None:
            reply = await client.call(m.PingRequest(payload=str(i).encode()))
            results[i] = reply.payload

        async with trio.open_nursery() as calls:
            for i in range(20):
                calls.start_soon(one, i)
    assert results == {i: str(i).encode() for i in range(20)}


async def test_stream_ends_and_drop_mid_stream(sock_path: str, nursery: trio.Nursery) -> None:
    async def streamer(stream, peer):
        await peer.hello()
        req = await peer.recv()
        await peer.send(m.StreamOpened(id=req.id, first_seq=1, next_seq=1))
        for seq in range(1, 4):
            await peer.send(m.SessionOutput(id=req.id, seq=seq, data=b"x"))
        await stream.aclose()

    await nursery.start(serve_script, sock_path, streamer)
    seen = []
    async with open_hostd(sock_path) as client:
        with pytest.raises(HostdConnectionLost):
            async with client.stream(m.SessionSubscribeRequest(session_id="s", from_seq=1)) as events:
                async for ev in events:
                    seen.append(ev.seq)
    assert seen == [1, 2, 3]


async def test_slow_stream_consumer_overflows_without_stalling_calls(sock_path: str, nursery: trio.Nursery) -> None:
    cancelled = trio.Event()

    async def firehose(stream, peer):
        await peer.hello()
        sub = await peer.recv()
        await peer.send(m.StreamOpened(id=sub.id, first_seq=1, next_seq=1))
        for seq in range(1, 200):
            await peer.send(m.SessionOutput(id=sub.id, seq=seq, data=b"y"))
        while True:
            req = await peer.recv()
            if isinstance(req, m.StreamCancel):
                cancelled.set()
                await peer.send(m.StreamEnd(id=req.stream_id, reason="canceled"))
            else:
                await peer.send(m.PingResponse(id=req.id))

    await nursery.start(serve_script, sock_path, firehose)
    async with open_hostd(sock_path, stream_buffer=16) as client:
        with pytest.raises(HostdStreamOverflow):
            async with client.stream(m.SessionSubscribeRequest(session_id="s", from_seq=1)) as events:
                await trio.sleep(0.3)  # do not read while the server floods
                # Calls on the same connection still complete while the stream is stuck, and hostd
                # is told to stop the stream at once, not once its consumer moves again.
                await client.call(m.PingRequest(), timeout=2)
                with trio.fail_after(2):
                    await cancelled.wait()
                async for _ in events:
                    pass
        with trio.fail_after(2):
            await cancelled.wait()
        await client.call(m.PingRequest(), timeout=2)
