"""An exec's control channel: JSON objects, one per line, both ways, over a Unix socketpair.

:func:`socketpair` makes the two ends; the child's end is passed to the child (its fd number in
``AIWG_CONTROL_FD``) and hostd's end becomes a :class:`ControlChannel`. The child's lines are
bounded (:data:`MAX_CONTROL_LINE`) and checked: what is not one JSON object is logged and
replaced by an ``{"type": "invalid", "raw": ...}`` notice, so a misbehaving child can neither
grow hostd's memory nor feed subscribers something that is not a JSON object.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from .errors import RpcError

log = logging.getLogger(__name__)

#: The child's variable holding its end's fd number.
CONTROL_FD_ENV = "AIWG_CONTROL_FD"
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


class ControlChannel:
    """hostd's end of one exec's control channel; owns the socket (see :meth:`close`)."""

    def __init__(self, sock: socket.socket, exec_id: str) -> None:
        self._stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        self._exec_id = exec_id
        self._send_lock = trio.Lock()

    async def receive(self, deliver: Callable[[bytes], None]) -> None:
        """Read the child's lines until EOF (or the socket is closed) and ``deliver`` each one.

        ``deliver`` gets the JSON bytes of each line that is a JSON object, or the encoded
        ``invalid`` notice in place of a line that is not or is longer than
        :data:`MAX_CONTROL_LINE` (that line is dropped up to its newline). Blank lines are
        skipped; a last line without a newline still counts. Returns normally at EOF.
        """
        buf = bytearray()
        skipping = False  # inside a line that was too long: drop it up to its newline
        while True:
            try:
                data = await self._stream.receive_some(_READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                if buf and not skipping:
                    self._line(bytes(buf), deliver)
                return
            start = len(buf)
            buf += data
            while (nl := buf.find(b"\n", start)) >= 0:
                if not skipping:
                    self._line(bytes(buf[:nl]), deliver)
                skipping = False
                del buf[: nl + 1]
                start = 0
            if len(buf) > MAX_CONTROL_LINE:
                if not skipping:
                    self._invalid(bytes(buf[:800]), "line longer than 1 MiB", deliver)
                skipping = True
                buf.clear()

    def _line(self, line: bytes, deliver: Callable[[bytes], None]) -> None:
        line = line.strip()
        if not line:
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

        Raises ``INPUT_TOO_LARGE`` (nothing sent) for a message over ``MAX_INPUT_BYTES``;
        ``trio.BrokenResourceError``/``trio.ClosedResourceError`` propagate when the child closed
        its end or the channel was closed: the caller knows whether the exec has exited.
        """
        payload = msgspec.json.encode(message) + b"\n"
        if len(payload) > m.MAX_INPUT_BYTES:
            raise RpcError(
                ErrorCode.INPUT_TOO_LARGE, f"control message is {len(payload)} bytes", limit=m.MAX_INPUT_BYTES
            )
        async with self._send_lock:
            await self._stream.send_all(payload)

    def close(self) -> None:
        """Close hostd's end now (synchronously); a pending :meth:`receive` returns, sends fail."""
        self._stream.socket.close()
