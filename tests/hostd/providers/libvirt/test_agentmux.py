"""A VM's agent channel on the host (hostd.providers.libvirt.agentmux): the test plays the guest's
helper on a real unix socket (the port), hostd's side is a real listening ControlChannel per exec.
The whole path through a real guest: tests/hostd/providers/libvirt/test_guest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from agentic_sandbox.hostd import control
from agentic_sandbox.hostd.control import ControlChannel
from agentic_sandbox.hostd.providers.libvirt.agentmux import AgentMux


async def read_line(stream: trio.SocketStream, buf: bytearray) -> bytes:
    while b"\n" not in buf:
        data = await stream.receive_some(65536)
        assert data, "the mux closed the port"
        buf += data
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


class Rig:
    """The mux of ``vm-1`` on a real port socket the test accepts as the guest's helper would, and
    hostd's listening channel of exec ``x1``, whose delivered lines it collects."""

    def __init__(self, control_dir: Path, port_path: Path, listener: trio.socket.SocketType) -> None:
        self.alive = True
        self.listener = listener
        self.mux = AgentMux("vm-1", lambda: _path(port_path), lambda: control_dir, lambda: self.alive)
        self.channel = ControlChannel(
            "x1", listener=control.listen(str(control_dir / "x1.sock")), path=str(control_dir / "x1.sock")
        )
        self.delivered: list[bytes] = []

    async def guest(self) -> trio.SocketStream:
        """The port's next connection from the mux, as the guest's end sees it."""
        conn, _ = await self.listener.accept()
        return trio.SocketStream(conn)

    async def until_delivered(self, count: int) -> None:
        with trio.fail_after(5):
            while len(self.delivered) < count:
                await trio.sleep(0.01)


@asynccontextmanager
async def rig(control_dir: Path, port_path: Path) -> AsyncIterator[Rig]:
    control_dir.mkdir(parents=True)
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(port_path))
    listener.listen(1)
    running = Rig(control_dir, port_path, listener)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(running.mux.run)
                nursery.start_soon(
                    lambda: running.channel.receive(running.delivered.append, leader_exited=trio.Event())
                )
                yield running
    finally:
        listener.close()


async def test_the_mux_relays_each_execs_lines_both_ways(tmp_path: Path) -> None:
    # A deep control dir: the exec sockets are reached through /proc/self/fd.
    async with rig(tmp_path / ("d" * 80) / "control", tmp_path / "port.sock") as mux:
        guest, buf = await mux.guest(), bytearray()
        # An exec without a socket on the host: refused at once.
        await guest.send_all(b"O nobody\n")
        assert await read_line(guest, buf) == b"C nobody"
        # The agent of x1 opens its channel and writes; hostd's channel gets the line.
        await guest.send_all(b'O x1\nD x1 {"type": "hello", "version": 2}\n')
        await mux.channel.send({"type": "task"})
        assert await read_line(guest, buf) == b'D x1 {"type":"task"}'
        await guest.send_all(b"E x1\n")  # the agent closed its end: hostd's reader sees EOF
        await mux.until_delivered(1)
        mux.channel.close()  # hostd is done with the exec: the guest is told
        assert await read_line(guest, buf) == b"C x1"
        mux.alive = False
        await guest.aclose()
    assert mux.delivered == [b'{"type": "hello", "version": 2}']


async def test_a_channel_outlives_the_ports_reconnect(tmp_path: Path) -> None:
    """A VM saved and restored has a new QEMU (a new port socket) but the same guest, whose helper
    kept its channels: the relay goes on over the new connection, both ways."""
    async with rig(tmp_path / "control", tmp_path / "port.sock") as mux:
        guest = await mux.guest()
        await guest.send_all(b'O x1\nD x1 {"type": "hello", "version": 2}\n')
        await mux.until_delivered(1)
        await guest.aclose()  # the save: the old QEMU and its socket are gone
        await mux.channel.send({"type": "task"})  # the answer, sent while the port is away
        guest, buf = await mux.guest(), bytearray()  # the restore: the mux connects to the new port
        assert await read_line(guest, buf) == b'D x1 {"type":"task"}'
        await guest.send_all(b'D x1 {"type": "bye"}\n')
        await mux.until_delivered(2)
        mux.channel.close()
        assert await read_line(guest, buf) == b"C x1"
        mux.alive = False
        await guest.aclose()
    assert mux.delivered == [b'{"type": "hello", "version": 2}', b'{"type": "bye"}']


async def _path(path: Path) -> str:
    return str(path)
