"""An exec's control channel: JSON objects, one per line, both ways, over a Unix stream socket.

Two ways to hand the child its end, one protocol:

* an inherited fd (host instances): :func:`socketpair` makes the two ends; the child's end is
  passed to the child (its fd number in ``AIWG_CONTROL_FD``) and hostd's end becomes a
  :class:`ControlChannel`;
* a socket to connect to (containers, where an fd cannot cross ``podman exec``'s API): hostd
  listens at a path inside a directory bound into the instance (:func:`listen`), the child
  connects to it (``AIWG_CONTROL_SOCKET``), and the first connection becomes the channel; the
  path is removed once it is taken, so nobody else can reach that channel.

The child's lines are bounded (:data:`MAX_CONTROL_LINE`) and checked: what is not one JSON object
is logged and replaced by an ``{"type": "invalid", "raw": ...}`` notice, so a misbehaving child can
neither grow hostd's memory nor feed subscribers something that is not a JSON object.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterator

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from .errors import RpcError

log = logging.getLogger(__name__)

#: The child's variable holding its end's fd number.
CONTROL_FD_ENV = "AIWG_CONTROL_FD"
#: The child's variable holding the path of the socket to connect to.
CONTROL_SOCKET_ENV = "AIWG_CONTROL_SOCKET"
#: Longest control line accepted from a child; longer ones are recorded as invalid and skipped.
MAX_CONTROL_LINE = 1024 * 1024
_READ_CHUNK = 64 * 1024


def socketpair() -> tuple[socket.socket, socket.socket]:
    """``(hostd's end, the child's end)``.

    The caller passes the child's end to the child and closes its own copy of it right after
    the spawn (else the child's EOF never shows); it closes hostd's end itself if the spawn
    fails, and otherwise hands it to :class:`ControlChannel`, which owns it from then on.
    """
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


@contextlib.contextmanager
def socket_address(path: str) -> Iterator[str]:
    """An address for the unix socket at ``path``, to bind or connect to while the block runs: the
    path itself, or one through ``/proc/self/fd`` of its directory when the path is longer than a
    socket address holds (108 bytes), so deep state directories work too."""
    if len(os.fsencode(path)) < 100:
        yield path
        return
    dirfd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{dirfd}/{os.path.basename(path)}"
    finally:
        os.close(dirfd)


def listen(path: str) -> socket.socket:
    """A listening socket at ``path`` (however long) that anyone inside the instance may connect to."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        with socket_address(path) as address:
            sock.bind(address)
        os.chmod(path, 0o666)
        sock.listen(1)
    except BaseException:
        sock.close()
        raise
    return sock


class ControlChannel:
    """hostd's end of one exec's control channel; owns its socket (see :meth:`close`).

    Built on a connected socket (``sock``) or a listening one (``listener`` at ``path``); in the
    second case :meth:`receive` first takes the child's connection.
    """

    def __init__(
        self,
        exec_id: str,
        *,
        sock: socket.socket | None = None,
        listener: socket.socket | None = None,
        path: str | None = None,
    ) -> None:
        self._exec_id = exec_id
        self._send_lock = trio.Lock()
        self._stream: trio.SocketStream | None = None
        self._listener_sock = listener  # nonblocking once wrapped: a last look needs no wait
        self._listener = trio.socket.from_stdlib_socket(listener) if listener is not None else None
        self._path = path
        self._connected = trio.Event()
        self._closed = False
        #: A line read in part, and whether it is one too long being dropped up to its newline:
        #: kept here, not in :meth:`receive`, so that the reader can be stopped and started again.
        self.partial = bytearray()
        self.skipping = False
        if sock is not None:
            self._stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
            self._connected.set()

    async def _accept(self, leader_exited: trio.Event) -> bool:
        """Take the child's connection (True), or give up once its leader exited without one."""
        listener = self._listener
        assert listener is not None
        conn: trio.socket.SocketType | None = None
        async with trio.open_nursery() as nursery:

            async def give_up() -> None:
                await leader_exited.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(give_up)
            with contextlib.suppress(OSError):
                conn, _ = await listener.accept()
            nursery.cancel_scope.cancel()
        if conn is None and self._listener_sock is not None:
            # It may have connected just before it exited: what waits in the backlog, if anything.
            with contextlib.suppress(OSError):
                conn = trio.socket.from_stdlib_socket(self._listener_sock.accept()[0])
        self._stop_listening()
        if conn is None or self._closed:
            if conn is not None:
                conn.close()
            self._closed = True
            self._connected.set()  # a send waiting for the child fails now
            return False
        self._stream = trio.SocketStream(conn)
        self._connected.set()
        return True

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = self._listener_sock = None
        if self._path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._path)
            self._path = None

    async def receive(
        self,
        deliver: Callable[[bytes], None],
        *,
        ready: Callable[[], Awaitable[None]] | None = None,
        leader_exited: trio.Event | None = None,
    ) -> None:
        """Read the child's lines until EOF (or the socket is closed) and ``deliver`` each one.

        ``ready`` is awaited before each read (flow control: it returns once the subscriber has
        caught up). A listening channel first takes the child's connection, and returns at once
        when ``leader_exited`` is set with none made.

        ``deliver`` gets the JSON bytes of each line that is a JSON object, or the encoded
        ``invalid`` notice in place of a line that is not or is longer than
        :data:`MAX_CONTROL_LINE` (that line is dropped up to its newline). Blank lines are
        skipped; a last line without a newline still counts. Returns normally at EOF.
        """
        if self._stream is None and not await self._accept(
            leader_exited if leader_exited is not None else trio.Event()
        ):
            return
        stream = self._stream
        assert stream is not None
        buf = self.partial
        while True:
            if ready is not None:
                await ready()
            try:
                data = await stream.receive_some(_READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                if buf and not self.skipping:
                    self._line(bytes(buf), deliver)
                buf.clear()
                return
            start = len(buf)
            buf += data
            while (nl := buf.find(b"\n", start)) >= 0:
                if not self.skipping:
                    self._line(bytes(buf[:nl]), deliver)
                self.skipping = False
                del buf[: nl + 1]
                start = 0
            if len(buf) > MAX_CONTROL_LINE:
                if not self.skipping:
                    self._invalid(bytes(buf[:800]), "line longer than 1 MiB", deliver)
                self.skipping = True
                buf.clear()

    def _line(self, line: bytes, deliver: Callable[[bytes], None]) -> None:
        line = line.strip()
        if not line:
            return
        if len(line) > MAX_CONTROL_LINE:  # it arrived whole, in the read that also held its newline
            self._invalid(line[:800], "line longer than 1 MiB", deliver)
            return
        try:
            message = msgspec.json.decode(line)
        except msgspec.DecodeError:
            message = None
        if isinstance(message, dict):
            deliver(line)
        else:
            self._invalid(line, "not a JSON object", deliver)

    def _invalid(self, raw: bytes, why: str, deliver: Callable[[bytes], None]) -> None:
        text = raw.decode("utf-8", "replace")[:200]
        log.warning("exec %s wrote an invalid control line (%s): %r", self._exec_id, why, text)
        deliver(msgspec.json.encode({"type": "invalid", "raw": text}))

    async def send(self, message: dict[str, object]) -> None:
        """Send one message as a line; concurrent sends never interleave.

        Raises ``INPUT_TOO_LARGE`` (nothing sent) for a message over ``MAX_CONTROL_MESSAGE_BYTES``;
        ``trio.BrokenResourceError``/``trio.ClosedResourceError`` propagate when the child closed
        its end or the channel was closed: the caller knows whether the exec has exited.
        """
        payload = msgspec.json.encode(message) + b"\n"
        if len(payload) > m.MAX_CONTROL_MESSAGE_BYTES:
            raise RpcError(
                ErrorCode.INPUT_TOO_LARGE,
                f"control message is {len(payload)} bytes",
                limit=m.MAX_CONTROL_MESSAGE_BYTES,
            )
        async with self._send_lock:
            await self._connected.wait()  # a listening channel: once the child has connected
            if self._stream is None:
                raise trio.ClosedResourceError("the control channel was closed before the child connected")
            await self._stream.send_all(payload)

    def fds(self) -> tuple[int | None, int | None, str | None]:
        """(connected socket, listening socket, its path): what a handover carries of the channel."""
        connected = self._stream.socket.fileno() if self._stream is not None and not self._closed else None
        listening = self._listener.fileno() if self._listener is not None else None
        return connected, listening, self._path if listening is not None else None

    @classmethod
    def adopt(
        cls, exec_id: str, connected: int | None, listening: int | None, path: str | None
    ) -> ControlChannel | None:
        """The channel an earlier image of hostd handed over (:meth:`fds`); None if it had none left."""
        if connected is not None:
            os.set_inheritable(connected, False)
            return cls(exec_id, sock=socket.socket(fileno=connected))
        if listening is not None:
            os.set_inheritable(listening, False)
            return cls(exec_id, listener=socket.socket(fileno=listening), path=path)
        return None

    def close(self) -> None:
        """Close hostd's end now (synchronously); a pending :meth:`receive` returns, sends fail."""
        self._closed = True
        self._stop_listening()
        if self._stream is not None:
            self._stream.socket.close()
        self._connected.set()
