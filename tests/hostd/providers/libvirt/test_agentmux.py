"""A VM's agent channel on the host (hostd.providers.libvirt.agentmux): the test plays the guest's
helper on a real unix socket (the port), hostd's side is a real listening ControlChannel per exec.
The whole path through a real guest: tests/hostd/providers/libvirt/test_guest.py."""

from __future__ import annotations

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


async def test_the_mux_relays_each_execs_lines_both_ways(tmp_path: Path) -> None:
    # A deep control dir: the exec sockets are reached through /proc/self/fd.
    control_dir = tmp_path / ("d" * 80) / "control"
    control_dir.mkdir(parents=True)
    port_path = tmp_path / "port.sock"
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(port_path))
    listener.listen(1)
    alive = True
    mux = AgentMux("vm-1", lambda: _path(port_path), lambda: control_dir, lambda: alive)
    channel = ControlChannel(
        "x1", listener=control.listen(str(control_dir / "x1.sock")), path=str(control_dir / "x1.sock")
    )
    delivered: list[bytes] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mux.run)
            conn, _ = await listener.accept()
            guest, buf = trio.SocketStream(conn), bytearray()
            exited = trio.Event()
            nursery.start_soon(lambda: channel.receive(delivered.append, leader_exited=exited))
            # An exec without a socket on the host: refused at once.
            await guest.send_all(b"O nobody\n")
            assert await read_line(guest, buf) == b"C nobody"
            # The agent of x1 opens its channel and writes; hostd's channel gets the line.
            await guest.send_all(b'O x1\nD x1 {"type": "hello", "version": 2}\n')
            await channel.send({"type": "task"})
            assert await read_line(guest, buf) == b'D x1 {"type":"task"}'
            await guest.send_all(b"E x1\n")  # the agent closed its end: hostd's reader sees EOF
            with trio.fail_after(5):
                while not delivered:
                    await trio.sleep(0.01)
            channel.close()  # hostd is done with the exec: the guest is told
            assert await read_line(guest, buf) == b"C x1"
            alive = False
            await guest.aclose()
    assert delivered == [b'{"type": "hello", "version": 2}']
    listener.close()


async def test_a_channel_outlives_the_ports_reconnect(tmp_path: Path) -> None:
    """A VM saved and restored has a new QEMU (a new port socket) but the same guest, whose helper
    kept its channels: the relay goes on over the new connection, both ways."""
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    port_path = tmp_path / "port.sock"
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(port_path))
    listener.listen(1)
    alive = True
    mux = AgentMux("vm-1", lambda: _path(port_path), lambda: control_dir, lambda: alive)
    channel = ControlChannel(
        "x1", listener=control.listen(str(control_dir / "x1.sock")), path=str(control_dir / "x1.sock")
    )
    delivered: list[bytes] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mux.run)
            conn, _ = await listener.accept()
            guest = trio.SocketStream(conn)
            nursery.start_soon(lambda: channel.receive(delivered.append, leader_exited=trio.Event()))
            await guest.send_all(b'O x1\nD x1 {"type": "hello", "version": 2}\n')
            with trio.fail_after(5):
                while not delivered:
                    await trio.sleep(0.01)
            await guest.aclose()  # the save: the old QEMU and its socket are gone
            await channel.send({"type": "task"})  # the answer, sent while the port is away
            conn, _ = await listener.accept()  # the restore: the mux connects to the new port
            guest, buf = trio.SocketStream(conn), bytearray()
            assert await read_line(guest, buf) == b'D x1 {"type":"task"}'
            await guest.send_all(b'D x1 {"type": "bye"}\n')
            with trio.fail_after(5):
                while len(delivered) < 2:
                    await trio.sleep(0.01)
            channel.close()
            assert await read_line(guest, buf) == b"C x1"
            alive = False
            await guest.aclose()
    assert delivered == [b'{"type": "hello", "version": 2}', b'{"type": "bye"}']
    listener.close()


async def _path(path: Path) -> str:
    return str(path)
