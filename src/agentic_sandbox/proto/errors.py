"""Error codes of the hostd protocol and the client's exception family.

Every failure a caller of hostd can see is a :class:`HostdError`::

    HostdError
    ├── HostdUnavailable        hostd cannot be reached or went away
    │   ├── HostdNotRunning     no socket, or nothing listens on it
    │   └── HostdConnectionLost the connection dropped mid-call
    ├── HostdTimeout            the call's deadline passed
    ├── HostdProtocolError      the peer spoke something we cannot trust
    │   └── HostdVersionMismatch
    └── HostdRemoteError        hostd answered with an explicit error (``code``)

Callers fail their own operation on any of these; nothing falls back or retries.

A ``limit.reached`` answer says which limit it hit in its ``details``: the keys of :class:`Limit`
(``name``, ``limit``, ``setting``, ``retry_after_s``), beside any others the refusal adds. A peer
that sends fewer (an older hostd) still decodes: :meth:`Limit.from_details` is None for it.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec


class ErrorCode(enum.Enum):
    """Stable wire error codes, each with its phrase. Never reuse or rename a value."""

    def __new__(cls, value: str, phrase: str) -> ErrorCode:
        obj = object.__new__(cls)
        obj._value_ = value
        obj.phrase = phrase  # type: ignore[attr-defined]
        return obj

    PROTOCOL_VERSION_MISMATCH = "protocol.version_mismatch", "protocol versions differ"
    PROTOCOL_MALFORMED_FRAME = "protocol.malformed_frame", "frame could not be decoded"
    PROTOCOL_FRAME_TOO_LARGE = "protocol.frame_too_large", "frame exceeds the size limit"
    PROTOCOL_HELLO_REQUIRED = "protocol.hello_required", "the first frame must be Hello"
    PROTOCOL_DUPLICATE_ID = "protocol.duplicate_id", "request id already in flight"
    PEER_REFUSED = "auth.peer_refused", "peer credentials are not allowed"
    REQUEST_INVALID = "request.invalid", "request failed validation"
    INPUT_TOO_LARGE = "request.input_too_large", "input exceeds the size limit"
    SIGNAL_UNKNOWN = "request.signal_unknown", "unknown signal"
    INSTANCE_NOT_FOUND = "instance.not_found", "no such instance"
    INSTANCE_EXISTS = "instance.exists", "instance already exists"
    INSTANCE_INVALID_STATE = "instance.invalid_state", "instance is not in a state that allows this"
    #: The instance sleeps and its idle policy says traffic does not wake it (``wake_on_traffic``
    #: false): an operator's wake (``InstanceWake``) is needed first.
    INSTANCE_SLEEPING = "instance.sleeping", "instance is asleep and does not wake on traffic"
    #: A wake the request needed failed or took longer than ``AIWG_WAKE_TIMEOUT_S``; the message says
    #: why, ``details.state`` what the instance is now.
    INSTANCE_WAKE_FAILED = "instance.wake_failed", "the instance could not be woken"
    #: An operator's sleep refused: work runs in the instance (``details.busy`` says what).
    INSTANCE_BUSY = "instance.busy", "work runs in the instance"
    PROVIDER_UNAVAILABLE = "provider.unavailable", "the runtime provider is not available"
    PROVIDER_FAILED = "provider.failed", "the runtime provider failed the request"
    IMAGE_NOT_FOUND = "image.not_found", "no such image"
    UNSUPPORTED = "capability.unsupported", "the instance's provider cannot do this"
    CHECKPOINT_NOT_FOUND = "checkpoint.not_found", "no such checkpoint"
    POOL_NOT_FOUND = "pool.not_found", "no such warm pool"
    POOL_EMPTY = "pool.empty", "the warm pool has no ready slot"
    WORKING_DIR_NOT_FOUND = "working_dir.not_found", "working directory does not exist"
    SESSION_NOT_FOUND = "session.not_found", "no such session"
    SESSION_EXITED = "session.exited", "session has exited"
    SESSION_PENDING = "session.pending", "session has not been started yet"
    SEQ_OUT_OF_RANGE = "stream.seq_out_of_range", "sequence is no longer (or not yet) available"
    EXEC_NOT_FOUND = "exec.not_found", "no such exec"
    EXEC_EXITED = "exec.exited", "exec has exited"
    CONTROL_UNAVAILABLE = "exec.control_unavailable", "exec has no control channel"
    SPAWN_FAILED = "spawn.failed", "process could not be started"
    LIMIT_REACHED = "limit.reached", "a configured limit was reached"
    SHUTTING_DOWN = "hostd.shutting_down", "hostd is shutting down"
    #: Sent as a connection-level notice (id 0) when hostd hands itself over to a new image, and
    #: answered to requests it will not start before that: nothing of them was done; send them again
    #: once connected to the new image (same socket, same sessions).
    RESTARTING = "hostd.restarting", "hostd is restarting in place"
    UPGRADE_REFUSED = "hostd.upgrade_refused", "the upgrade was refused; this hostd goes on serving"
    INTERNAL = "internal.error", "internal error"

    @classmethod
    def parse(cls, value: str) -> ErrorCode | None:
        member = cls._value2member_map_.get(value)
        return member if isinstance(member, cls) else None


class Limit(msgspec.Struct, frozen=True, kw_only=True):
    """Which configured limit a ``limit.reached`` refusal hit, carried in its ``details``.

    ``name`` says what is full, in the controller's ``limit.<name>`` codes (``sessions``, ``execs``,
    ``pending_sessions``, ``checkpoints``, ...); ``limit`` is the bound; ``setting`` the hostd
    variable that raises it (empty when the bound is fixed); ``retry_after_s`` how long a caller
    might wait before trying again when waiting helps (a running session or exec ends and frees its
    slot), 0 when it does not (something must be deleted, or the setting raised).
    """

    name: str
    limit: int
    setting: str = ""
    retry_after_s: int = 0

    def details(self) -> dict[str, object]:
        """The ``details`` entries of a refusal that hit this limit."""
        return msgspec.structs.asdict(self)

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> Limit | None:
        """The limit a refusal's ``details`` name, or None when they name none (an older hostd)."""
        try:
            return msgspec.convert(details, type=cls)
        except msgspec.ValidationError:
            return None


class HostdError(Exception):
    """Base of every failure the hostd client reports."""


class HostdUnavailable(HostdError):
    """hostd cannot be reached, or the connection to it is gone."""


class HostdNotRunning(HostdUnavailable):
    """The socket does not exist or nothing accepts connections on it."""


class HostdConnectionLost(HostdUnavailable):
    """The connection dropped while calls or streams were in flight."""


class HostdRestarting(HostdConnectionLost):
    """hostd handed itself over to a new image (an upgrade in place). A request that failed with it
    was not done (hostd answered every request it had read before it closed): send it again once
    connected anew."""


class HostdTimeout(HostdError):
    """The call's deadline passed before hostd answered."""


class HostdProtocolError(HostdError):
    """The peer sent a frame we cannot decode, an oversized frame, or an unexpected reply."""


class HostdVersionMismatch(HostdProtocolError):
    """hostd speaks another protocol version."""


class HostdRemoteError(HostdError):
    """hostd answered the call with an explicit error."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details or {}

    @property
    def error_code(self) -> ErrorCode | None:
        return ErrorCode.parse(self.code)
