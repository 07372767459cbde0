"""pty-ws/v1 frames: the envelope both ways, the pty-extensions/v1 payloads, the binary frames.

Server frames are built as msgspec Structs and encoded once (a broadcast is encoded once for every
member); ``bytes`` fields encode as base64, which is what the schema's ``Base64`` strings are. In
the binary subprotocol output is ``PW1O`` + 8-byte big-endian sequence + stream byte (1 = stdout)
+ the raw bytes, and input is ``PW1I`` + raw bytes; everything else stays JSON text.

Client frames decode into :class:`ClientFrame` (the envelope, unknown fields refused, as the
schema's ``additionalProperties: false`` says) and then the payload into the op's Struct;
:class:`FrameError` carries the binding's error code and the request id to answer with (and, where
the code says less than the domain error did, the A2A error object: a full limit is ``RATE_LIMITED``
with ``limit.sessions`` in its ``a2a_error``).

Sequences: output frames carry hostd's sequence (gap-free, shared by every client of the
session); ``binding_hello`` carries 0. Other server frames (roles, membership, resize, keyframes,
closed, errors) carry none: they are not part of the replayable output stream, and giving them
numbers of their own would break the gap-free count.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import new_id

from ..values import Cwd

BINDING_URI = "https://agentic-sandbox.aiwg.io/bindings/pty-ws/v1"
BINDING_VERSION = "1.0.0"
PTY_EXTENSIONS_URI = "https://agentic-sandbox.aiwg.io/extensions/pty-extensions/v1"
JSON_SUBPROTOCOL = "pty-ws.v1"
BINARY_SUBPROTOCOL = "pty-ws.v1.binary"
OUTPUT_MAGIC = b"PW1O"
INPUT_MAGIC = b"PW1I"
STDOUT = 1
SNAPSHOT_FORMAT = "vt100-screen-state-v1"
#: Largest client frame read (a base64 input of hostd's largest write fits, with room to spare).
MAX_CLIENT_FRAME_BYTES = 2 * 1024 * 1024

SUPPORTED_OPERATIONS = [
    "binding_hello",
    "binding_goodbye",
    "ping",
    "pong",
    "pty.join_session",
    "pty.leave_session",
    "pty.session_input",
    "pty.session_resize",
    "pty.request_role",
    "pty.request_keyframe",
]

UUID7 = Annotated[
    str, msgspec.Meta(pattern=r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$")
]
Dim = Annotated[int, msgspec.Meta(ge=1, le=m.MAX_TERMINAL_DIM)]
Label = Annotated[str, msgspec.Meta(max_length=128)]
Role = Literal["controller", "observer"]
ErrorCode = Literal[
    "TASK_NOT_FOUND",
    "TASK_NOT_CANCELABLE",
    "INVALID_REQUEST",
    "UNSUPPORTED_OPERATION",
    "UNAUTHENTICATED",
    "PERMISSION_DENIED",
    "RATE_LIMITED",
    "INTERNAL",
    "REPLAY_OUT_OF_RANGE",
]

# Close codes of the binding.
CLOSE_NORMAL = 1000
CLOSE_SERVER_ERROR = 1011
CLOSE_PROTOCOL = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_RATE_LIMITED = 4429


def now_ts() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- client frames ---------------------------------------------------------------------------------


class ClientFrame(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    op: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    id: UUID7
    ts: Annotated[str, msgspec.Meta(max_length=64)]
    replay_from: Annotated[int, msgspec.Meta(ge=0)] | None = None
    service_parameters: dict[str, Any] | None = None
    extensions: list[Annotated[str, msgspec.Meta(max_length=1024)]] | None = None
    #: Decoded by op once the envelope is read (JSON ``null`` reads as ``{}``).
    payload: msgspec.Raw = msgspec.Raw(b"null")


class _Payload(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class TerminalSize(_Payload):
    cols: Dim
    rows: Dim


class JoinSession(_Payload):
    role: Role
    cols: Dim | None = None
    rows: Dim | None = None
    client_label: Label | None = None
    # Launch fields (upstream's, beyond the published schema; :mod:`controller.pty.launch`): they
    # start a pending session when this join is its first controller, and are ignored otherwise.
    argv: m.Argv | None = None
    #: Run as ``/bin/sh -lc <command>``; give ``argv`` or this.
    command: Annotated[str, msgspec.Meta(min_length=1, max_length=65536)] | None = None
    cwd: Cwd | None = None
    working_dir: Cwd | None = None
    env: m.Env | None = None
    terminal_size: TerminalSize | None = None
    #: Upstream's session host choice: only ``native`` / ``direct`` are offered here (the hello says so).
    session_backend: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    backend: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    session_class: Annotated[str, msgspec.Meta(max_length=64)] | None = None


class LeaveSession(_Payload):
    pass


class SessionInput(_Payload):
    data: Annotated[bytes, msgspec.Meta(max_length=m.MAX_INPUT_BYTES)]


class SessionResize(_Payload):
    cols: Dim
    rows: Dim


class RequestRole(_Payload):
    role: Role


class RequestKeyframe(_Payload):
    pass


class Ping(msgspec.Struct, kw_only=True):
    client_ts: str = ""


class Anything(msgspec.Struct, kw_only=True):
    """A payload whose fields this side does not use (``pong``, a client's ``binding_hello``)."""


class Goodbye(msgspec.Struct, kw_only=True, omit_defaults=True):
    reason: str = "other"
    detail: str | None = None


#: Client ops with a payload Struct (an absent payload reads as ``{}``).
PAYLOADS: dict[str, type[msgspec.Struct]] = {
    "pty.join_session": JoinSession,
    "pty.leave_session": LeaveSession,
    "pty.session_input": SessionInput,
    "pty.session_resize": SessionResize,
    "pty.request_role": RequestRole,
    "pty.request_keyframe": RequestKeyframe,
    "ping": Ping,
    "pong": Anything,
    "binding_hello": Anything,
    "binding_goodbye": Goodbye,
}

_CLIENT_DECODER = msgspec.json.Decoder(ClientFrame)
_PAYLOAD_DECODERS = {op: msgspec.json.Decoder(type_) for op, type_ in PAYLOADS.items()}


class FrameError(Exception):
    """A client frame the binding refuses: ``code`` for the Error frame, ``request_id`` to answer."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        request_id: str | None = None,
        *,
        retryable: bool = False,
        a2a_error: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.request_id = request_id
        self.retryable = retryable
        self.a2a_error = a2a_error


def decode_client(text: str | bytes) -> tuple[ClientFrame, Any]:
    """The envelope and its decoded payload; :class:`FrameError` for anything the binding refuses."""
    try:
        frame = _CLIENT_DECODER.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise FrameError("INVALID_REQUEST", f"not a pty-ws/v1 frame: {exc}") from None
    decoder = _PAYLOAD_DECODERS.get(frame.op)
    if decoder is None:
        raise FrameError("UNSUPPORTED_OPERATION", f"operation {frame.op!r} is not supported here", frame.id)
    raw = b"{}" if bytes(frame.payload) == b"null" else frame.payload
    try:
        return frame, decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise FrameError("INVALID_REQUEST", f"{frame.op} payload: {exc}", frame.id) from None


# -- server frames ---------------------------------------------------------------------------------


class ClientRef(msgspec.Struct, kw_only=True, omit_defaults=True):
    client_id: str
    label: str | None = None


class SessionFrame(msgspec.Struct, tag_field="kind", kw_only=True, omit_defaults=True):
    pass


class Output(SessionFrame, tag="Output"):
    data: bytes
    stream: str


class Resize(SessionFrame, tag="Resize"):
    cols: int
    rows: int


class RoleAssigned(SessionFrame, tag="RoleAssigned"):
    role: str
    client_id: str
    downgraded: bool | None = None
    reason: str | None = None


class MembershipChanged(SessionFrame, tag="MembershipChanged"):
    controllers: list[ClientRef]
    observers: list[ClientRef]


class Keyframe(SessionFrame, tag="Keyframe"):
    snapshot: bytes
    snapshot_cols: int
    snapshot_rows: int
    anchor_sequence: int
    snapshot_format: str


class Closed(SessionFrame, tag="Closed"):
    reason: str
    exit_code: int | None = None
    detail: str | None = None


class PtyError(SessionFrame, tag="Error"):
    code: str
    message: str


class ErrorPayload(msgspec.Struct, kw_only=True):
    code: str
    message: str
    retryable: bool = False
    #: The canonical A2A error object (``{code, status, message, details}``) where the binding's
    #: code says less than it: a full limit is ``RATE_LIMITED``, the limit itself is named here.
    a2a_error: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class SessionRef(msgspec.Struct, kw_only=True):
    session_id: str
    current_sequence: int


class SessionHost(msgspec.Struct, kw_only=True):
    supported_backends: list[str]
    default_backend: str
    supported_classes: list[str]
    default_class: str
    observe_supported: bool = True
    drive_supported: bool = True
    reattach_supported: bool = True


class HelloPayload(msgspec.Struct, kw_only=True):
    binding_uri: str
    binding_version: str
    supported_operations: list[str]
    activated_extensions: list[str]
    session: SessionRef
    session_host: SessionHost


class Envelope(msgspec.Struct, kw_only=True, omit_defaults=True):
    op: str
    id: str
    ts: str
    payload: Any
    sequence: int | None = None


_ENCODER = msgspec.json.Encoder()
_OUTPUT_HEADER = struct.Struct(">4sQB")


def encode(op: str, payload: Any, *, sequence: int | None = None, request_id: str | None = None) -> str:
    envelope = Envelope(op=op, id=request_id or new_id(), ts=now_ts(), payload=payload, sequence=sequence)
    return _ENCODER.encode(envelope).decode()


def session_frame(frame: SessionFrame, *, sequence: int | None = None) -> str:
    return encode("pty.session_frame", frame, sequence=sequence)


def error_frame(
    code: ErrorCode,
    message: str,
    request_id: str | None = None,
    *,
    retryable: bool = False,
    a2a_error: dict[str, Any] | None = None,
) -> str:
    payload = ErrorPayload(code=code, message=message, retryable=retryable)
    if a2a_error is not None:
        payload.a2a_error = a2a_error
    return encode("Error", payload, request_id=request_id)


def pty_error(code: str, message: str) -> str:
    """A ``pty.session_frame`` error (``PTY_WRITE_FAILED``, ...), its message cut to 1024 characters."""
    return session_frame(PtyError(code=code, message=message[:1024]))


def output_json(seq: int, data: bytes) -> str:
    return session_frame(Output(data=data, stream="stdout"), sequence=seq)


def output_binary(seq: int, data: bytes) -> bytes:
    return _OUTPUT_HEADER.pack(OUTPUT_MAGIC, seq, STDOUT) + data


def hello(session_id: str, current_sequence: int, extensions: list[str]) -> str:
    payload = HelloPayload(
        binding_uri=BINDING_URI,
        binding_version=BINDING_VERSION,
        supported_operations=list(SUPPORTED_OPERATIONS),
        activated_extensions=extensions,
        session=SessionRef(session_id=session_id, current_sequence=current_sequence),
        session_host=SessionHost(
            supported_backends=["native"],
            default_backend="native",
            supported_classes=["direct"],
            default_class="direct",
        ),
    )
    return encode("binding_hello", payload, sequence=0)


def goodbye(reason: str, detail: str | None = None) -> str:
    # Not the Goodbye Struct: it omits its default reason ("other"), which the schema requires.
    payload = {"reason": reason} if detail is None else {"reason": reason, "detail": detail}
    return encode("binding_goodbye", payload)


#: hostd's end reasons as the Closed frame's reasons.
CLOSED_REASONS = {"exited": "normal", "signaled": "killed", "killed": "killed", "timeout": "timeout"}


def closed(exited: m.SessionExited) -> Closed:
    reason = CLOSED_REASONS.get(exited.reason, "error")
    detail = f"signal {exited.signal}" if exited.signal else None
    return Closed(reason=reason, exit_code=exited.exit_code, detail=detail)
