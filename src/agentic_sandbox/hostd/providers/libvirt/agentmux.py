"""The agent channel of a VM: execs' control channels, multiplexed over one virtio-serial port.

A fd cannot cross into a VM, and the guest has no Python, so the guest image ships a small static
helper (``scripts/guest/aiwg-guest.c``) whose daemon owns the ``org.aiwg.agent.0`` port. An exec
with a control channel is started in the guest as ``aiwg-guest exec <exec id> -- ARGV`` (its
:class:`~..base.ControlSocket` ``argv_prefix``): the launcher connects to the daemon, names the
exec and becomes ARGV with that connection as fd 3 (``AIWG_CONTROL_FD=3``), so an agent in a VM
finds its channel as one on the host does.

On the host side hostd listens for each such exec at ``<instance_dir>/control/<exec id>.sock``, as
for a container (:mod:`hostd.control`). :class:`AgentMux` holds the port's other end (the unix
socket libvirt made for the channel) and relays: when the guest says ``O <id>`` it connects to that
exec's socket; ``D <id> <line>`` lines go to it, what hostd writes there goes back as
``D <id> <line>``; ``E <id>`` (the agent closed its end) ends the relay's writes, and when hostd
closes the channel the guest is told ``C <id>``. Lines are the protocol's JSON lines (no newline
inside), bounded as hostd bounds them; a relay whose exec socket is gone is refused with ``C``.

One mux per running VM, started the first time an exec asks for a channel; it reconnects when the
port's socket goes away (a reboot, a VM restored from a save: its relays go on over the new
connection) and ends when the provider forgets the instance.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import trio

from ...control import socket_address

log = logging.getLogger(__name__)

#: Longest line relayed either way (hostd refuses a longer one anyway).
MAX_LINE = 4 * 1024 * 1024 + 128
_READ = 65536
_RETRY_S = 0.5


async def _lines(stream: trio.SocketStream) -> AsyncIterator[bytes]:
    """The stream's lines (without their newline) until it ends; a line longer than
    :data:`MAX_LINE` is dropped whole."""
    buf = bytearray()
    skipping = False
    while True:
        try:
            data = await stream.receive_some(_READ)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            return
        start = len(buf)
        buf += data
        while (nl := buf.find(b"\n", start)) >= 0:
            if not skipping:
                yield bytes(buf[:nl])
            skipping = False
            del buf[: nl + 1]
            start = 0
        if len(buf) > MAX_LINE:
            skipping, buf = True, bytearray()


class AgentMux:
    def __init__(
        self,
        instance_id: str,
        port_path: Callable[[], Awaitable[str | None]],
        control_dir: Callable[[], Path],
        alive: Callable[[], bool],
    ) -> None:
        self.instance_id = instance_id
        #: The unix socket of the domain's agent channel (None: not running, or no such channel).
        self._port_path = port_path
        self._control_dir = control_dir
        self._alive = alive
        self._relays: dict[str, trio.SocketStream] = {}
        #: The port while it is connected; ``_connected`` is set then (a fresh event once it drops).
        self._port: trio.SocketStream | None = None
        self._connected = trio.Event()
        self._send_lock = trio.Lock()

    async def run(self) -> None:
        """Hold the port while the instance lives, reconnecting when it drops.

        The relays outlive a reconnect: the guest's helper keeps its end of every channel while
        the host side is away (a VM restored from a save has a new QEMU, and a new socket, but the
        same guest), so a parked agent still gets its answer. They end when hostd closes an exec's
        channel, when the guest closes one, or with the instance."""
        try:
            async with trio.open_nursery() as relays:
                while self._alive():
                    path = await self._port_path()
                    if path is not None:
                        try:
                            port = await trio.open_unix_socket(path)
                        except OSError as exc:
                            log.debug("instance %s: agent channel %s not there yet: %s", self.instance_id, path, exc)
                        else:
                            async with port:
                                await self._serve(port, relays)
                    await trio.sleep(_RETRY_S)
                relays.cancel_scope.cancel()
        finally:
            for relay in self._relays.values():
                relay.socket.close()
            self._relays.clear()

    async def _serve(self, port: trio.SocketStream, relays: trio.Nursery) -> None:
        self._port = port
        self._connected.set()
        try:
            async for line in _lines(port):
                await self._from_guest(line, relays)
        finally:
            self._port = None
            self._connected = trio.Event()

    async def _to_guest(self, line: bytes) -> None:
        """Send ``line`` on the port, waiting for it to be connected (again)."""
        while True:
            connected = self._connected
            await connected.wait()
            port = self._port
            if port is None:
                continue
            try:
                async with self._send_lock:
                    await port.send_all(line)
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                while self._port is port:  # the reader notices the drop
                    await trio.sleep(_RETRY_S / 10)

    async def _from_guest(self, line: bytes, relays: trio.Nursery) -> None:
        kind, _, rest = line.partition(b" ")
        exec_id, _, payload = rest.partition(b" ")
        name = exec_id.decode(errors="replace")
        if kind == b"O":
            await self._open(name, relays)
        elif kind == b"D" and (relay := self._relays.get(name)) is not None:
            try:
                await relay.send_all(payload + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # hostd closed it: the relay's reader tells the guest
        elif kind == b"E" and (relay := self._relays.get(name)) is not None:
            try:
                await relay.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def _open(self, exec_id: str, relays: trio.Nursery) -> None:
        path = self._control_dir() / f"{exec_id}.sock"
        if "/" in exec_id or exec_id in self._relays:
            return
        try:
            with socket_address(str(path)) as address:  # the state dir may be deep
                relay = await trio.open_unix_socket(address)
        except OSError as exc:
            log.info(
                "instance %s: the guest opened a channel for exec %s, which has none: %s",
                self.instance_id,
                exec_id,
                exc,
            )
            await self._to_guest(f"C {exec_id}\n".encode())
            return
        self._relays[exec_id] = relay
        relays.start_soon(self._relay, exec_id, relay)

    async def _relay(self, exec_id: str, relay: trio.SocketStream) -> None:
        """What hostd writes on the exec's channel, line by line, to the guest; then ``C``."""
        prefix = f"D {exec_id} ".encode()
        try:
            async for line in _lines(relay):
                await self._to_guest(prefix + line + b"\n")
            await self._to_guest(f"C {exec_id}\n".encode())
        finally:
            self._relays.pop(exec_id, None)
            relay.socket.close()
