"""Frame codec: a 4-byte big-endian body length, then a msgpack body.

Encoding writes the body straight into a buffer that already holds room for the length, so
a frame is built with one allocation and no copy. Decoding keeps one growing buffer per
connection and hands out zero-copy views of complete bodies.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from .errors import HostdProtocolError
from .messages import DEFAULT_MAX_FRAME_BYTES, Frame

T = TypeVar("T")

HEADER_BYTES = 4


class FrameTooLarge(HostdProtocolError):
    """A frame's declared or encoded body is larger than the limit."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte limit")
        self.size = size
        self.limit = limit


class FrameEncoder:
    """Encodes Structs into frames. Not shared between tasks that may interleave."""

    __slots__ = ("_encoder", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self.max_frame_bytes = max_frame_bytes

    def encode(self, message: Any) -> bytearray:
        buf = bytearray()
        self.append(message, buf)
        return buf

    def append(self, message: Any, buf: bytearray) -> None:
        """Encode ``message`` as one more frame at the end of ``buf``, in place."""
        start = len(buf)
        self._encoder.encode_into(message, buf, start + HEADER_BYTES)
        size = len(buf) - start - HEADER_BYTES
        if size > self.max_frame_bytes:
            del buf[start:]
            raise FrameTooLarge(size, self.max_frame_bytes)
        buf[start : start + HEADER_BYTES] = size.to_bytes(HEADER_BYTES, "big")


class FrameInvalid(HostdProtocolError):
    """A well-formed frame whose content fails validation; ``frame_id`` names its call.

    Unlike a malformed frame this does not end the connection: the peer is answered with
    ``request.invalid`` for that id.
    """

    def __init__(self, frame_id: int, reason: str) -> None:
        super().__init__(reason)
        self.frame_id = frame_id
        self.reason = reason


class UnknownFrame(HostdProtocolError):
    """A frame whose tag names no message of this protocol version."""


class _IdOnly(msgspec.Struct):
    t: str = ""
    id: int = 0


def _all_tags(cls: type[Any]) -> set[str]:
    tags: set[str] = set()
    for sub in cls.__subclasses__():
        tags.add(sub.__name__)
        tags |= _all_tags(sub)
    return tags


_KNOWN_TAGS = frozenset(_all_tags(Frame))


_ID_DECODER = msgspec.msgpack.Decoder(_IdOnly)


class FrameBuffer:
    """Accumulates received bytes and decodes complete frames from them.

    ``feed`` appends what the socket gave; ``next_message`` decodes the next complete frame
    (or returns None) straight from the buffer through a view that is released before it
    returns. A declared length above the limit raises :class:`FrameTooLarge` before any of
    that body is buffered; undecodable bytes raise ``msgspec.DecodeError``; a frame that
    decodes but breaks a constraint raises :class:`FrameInvalid`.
    """

    __slots__ = ("_buf", "_pos", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_frame_bytes = max_frame_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos:
            # Compact only when something was consumed: one memmove per received chunk.
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data
        self._check_header()

    def _check_header(self) -> None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos >= HEADER_BYTES:
            size = int.from_bytes(buf[pos : pos + HEADER_BYTES], "big")
            if size > self.max_frame_bytes:
                raise FrameTooLarge(size, self.max_frame_bytes)

    def next_message(self, decoder: msgspec.msgpack.Decoder[T]) -> T | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_BYTES:
            return None
        size = int.from_bytes(buf[pos : pos + HEADER_BYTES], "big")
        if size > self.max_frame_bytes:
            raise FrameTooLarge(size, self.max_frame_bytes)
        end = pos + HEADER_BYTES + size
        if len(buf) < end:
            return None
        self._pos = end
        with memoryview(buf) as whole, whole[pos + HEADER_BYTES : end] as body:
            try:
                message = decoder.decode(body)
            except msgspec.ValidationError as exc:
                try:
                    head = _ID_DECODER.decode(body)
                except msgspec.DecodeError:
                    raise exc from None
                if head.t not in _KNOWN_TAGS:
                    raise UnknownFrame(f"unknown frame tag {head.t[:64]!r}") from exc
                raise FrameInvalid(head.id, str(exc)) from exc
        self._check_header()
        return message

    @property
    def pending_bytes(self) -> int:
        return len(self._buf) - self._pos
