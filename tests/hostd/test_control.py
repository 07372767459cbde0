"""An exec's control channel (hostd.control.ControlChannel) over a real socketpair, the test playing
the child: how lines are cut and checked, bounded sends that never interleave, closing either end.
A child's JSON and non-JSON lines through a real exec: tests/hostd/test_execs.py."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import trio

from agentic_sandbox.hostd import control
from agentic_sandbox.hostd.control import ControlChannel
from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m


@dataclass
class Pair:
    channel: ControlChannel
    child: trio.SocketStream

    async def received(self, *writes: bytes) -> list[object]:
        """What ``receive`` delivers (decoded) for the child's ``writes``, sent one by one, then EOF."""
        delivered: list[bytes] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.channel.receive, delivered.append)
            for data in writes:
                await self.child.send_all(data)
                await trio.testing.wait_all_tasks_blocked()  # each write is its own read
            await self.child.send_eof()
        return [msgspec.json.decode(line) for line in delivered]


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    ours, theirs = control.socketpair()
    child = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    channel = ControlChannel("exec-1", sock=ours)
    try:
        yield Pair(channel, child)
    finally:
        channel.close()
        await child.aclose()


def test_the_pair_is_a_unix_stream_socketpair() -> None:
    ours, theirs = control.socketpair()
    with ours, theirs:
        assert (ours.family, ours.type) == (socket.AF_UNIX, socket.SOCK_STREAM)
        assert not ours.get_inheritable()  # only the child's end is passed on, explicitly


async def test_lines_are_cut_wherever_the_writes_fall(pair: Pair) -> None:
    got = await pair.received(b'{"a": 1}\n{"b"', b": [1, 2]", b'}\n\n   \n  {"c": {"d": null}}  \n{"e"', b': "last"}')
    assert got == [{"a": 1}, {"b": [1, 2]}, {"c": {"d": None}}, {"e": "last"}]  # blanks skipped, last counts


async def test_what_is_not_a_json_object_becomes_an_invalid_notice(pair: Pair) -> None:
    got = await pair.received(b'"text"\nnull\n{"open": \n\xff\xfe\n' + b"z" * 500 + b"\n")
    assert got == [
        {"type": "invalid", "raw": '"text"'},
        {"type": "invalid", "raw": "null"},
        {"type": "invalid", "raw": '{"open":'},
        {"type": "invalid", "raw": "\ufffd\ufffd"},
        {"type": "invalid", "raw": "z" * 200},  # what is kept of it is bounded
    ]


async def test_an_overlong_line_is_one_notice_and_the_next_line_counts(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "MAX_CONTROL_LINE", 100)
    got = await pair.received(b'{"big": "' + b"x" * 80, b"x" * 80, b"x" * 80, b'"}\n{"after": 1}\n')
    # Noticed once past the bound (with what was read by then), dropped up to its newline.
    assert got == [{"type": "invalid", "raw": '{"big": "' + "x" * 160}, {"after": 1}]


async def test_a_line_over_the_bound_is_refused_however_it_arrives(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "MAX_CONTROL_LINE", 100)
    got = await pair.received(b'{"big": "' + b"x" * 200 + b'"}\n')
    assert got == [{"type": "invalid", "raw": '{"big": "' + "x" * 191}]


async def test_sends_are_lines_and_never_interleave(pair: Pair) -> None:
    """Big enough to fill the socket's buffer, so each send is cut into several writes."""
    messages = [{"n": n, "pad": str(n) * 300_000} for n in range(4)]
    async with trio.open_nursery() as nursery:
        for message in messages:
            nursery.start_soon(pair.channel.send, message)
        received = bytearray()
        while received.count(b"\n") < len(messages):
            received += await pair.child.receive_some()
    lines = bytes(received).splitlines()
    assert sorted((msgspec.json.decode(line) for line in lines), key=lambda msg: msg["n"]) == messages


async def test_a_message_over_the_input_limit_is_refused_and_nothing_sent(pair: Pair) -> None:
    with pytest.raises(RpcError) as refused:
        await pair.channel.send({"pad": "x" * m.MAX_CONTROL_MESSAGE_BYTES})
    assert refused.value.code is ErrorCode.INPUT_TOO_LARGE and refused.value.details == {
        "limit": m.MAX_CONTROL_MESSAGE_BYTES
    }
    await pair.channel.send({"small": True})
    assert await pair.child.receive_some() == b'{"small":true}\n'


async def test_closing_hostds_end_ends_receive_and_fails_sends(pair: Pair) -> None:
    delivered: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pair.channel.receive, delivered.append)
        await pair.child.send_all(b'{"partial": ')
        await trio.testing.wait_all_tasks_blocked()
        pair.channel.close()
    assert delivered == [msgspec.json.encode({"type": "invalid", "raw": '{"partial":'})]
    with pytest.raises(trio.ClosedResourceError):
        await pair.channel.send({"late": True})


async def test_a_child_that_closed_its_end_fails_sends(pair: Pair) -> None:
    await pair.child.aclose()
    with pytest.raises(trio.BrokenResourceError):
        await pair.channel.send({"gone": True})
    delivered: list[bytes] = []
    with trio.fail_after(5):
        await pair.channel.receive(delivered.append)  # the EOF ends it
    assert delivered == []


# -- a socket to connect to (containers) -----------------------------------------------------------


async def _listening(path: str) -> tuple[ControlChannel, trio.Event]:
    return ControlChannel("exec-2", listener=control.listen(path), path=path), trio.Event()


async def test_a_listening_channel_takes_one_connection_and_removes_its_path(tmp_path: Path) -> None:
    # Deeper than a socket address holds: bound through /proc/self/fd.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "x.sock")
    channel, exited = await _listening(path)
    assert os.stat(path).st_mode & 0o777 == 0o666
    delivered: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(channel.receive, delivered.append, leader_exited=exited))
        child = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dirfd = os.open(deep, os.O_PATH)
        await child.connect(f"/proc/self/fd/{dirfd}/x.sock")
        os.close(dirfd)
        stream = trio.SocketStream(child)
        await channel.send({"hello": 1})  # waits for the connection, then goes
        assert await stream.receive_some(100) == b'{"hello":1}\n'
        await trio.testing.wait_all_tasks_blocked()
        assert not os.path.exists(path)  # nobody else can reach this channel now
        await stream.send_all(b'{"a": 1}\n')
        await stream.send_eof()
    assert delivered == [b'{"a": 1}']
    channel.close()
    await stream.aclose()


async def test_a_listening_channel_whose_child_never_connects_ends_with_its_leader(tmp_path: Path) -> None:
    path = str(tmp_path / "y.sock")
    channel, exited = await _listening(path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(channel.receive, lambda _: None, leader_exited=exited))
        await trio.testing.wait_all_tasks_blocked()
        exited.set()
    assert not os.path.exists(path)
    with pytest.raises(trio.ClosedResourceError):
        await channel.send({"late": True})
    channel.close()


async def test_a_connection_made_just_before_the_leader_exited_is_still_read(tmp_path: Path) -> None:
    path = str(tmp_path / "z.sock")
    channel, exited = await _listening(path)
    child = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    child.connect(path)  # in the backlog, not accepted yet
    child.sendall(b'{"last": true}\n')
    child.close()
    exited.set()
    delivered: list[bytes] = []
    await channel.receive(delivered.append, leader_exited=exited)
    assert delivered == [b'{"last": true}']
    channel.close()
