"""The hostd protocol: the only package hostd, the controller and the CLIs (``cli/``) share.

General layout: ``messages`` is the whole API (Structs and unions), ``framing`` the frame
codec, ``errors`` the error codes and the client's exception family, ``client`` the trio
client, ``ids`` identifiers, ``paths`` where hostd's socket is, ``logformat`` the log output
both daemons share (text or JSON lines, with the ids a line concerns), ``settings`` how both
load their ``AIWG_*`` settings (a table each, which docs/configuration.md is rendered from). This
module re-exports what other packages may use; a test pins the list.
"""

from . import messages, settings
from .client import EventStream, HostdClient, HostdStreamOverflow, open_hostd
from .errors import (
    ErrorCode,
    HostdConnectionLost,
    HostdError,
    HostdNotRunning,
    HostdProtocolError,
    HostdRemoteError,
    HostdRestarting,
    HostdTimeout,
    HostdUnavailable,
    HostdVersionMismatch,
    Limit,
)
from .framing import FrameBuffer, FrameEncoder, FrameInvalid, FrameTooLarge, UnknownFrame
from .ids import is_uuid, new_id, uuid7
from .logformat import (
    LogConfigError,
    bind_log_ids,
    configure_logging,
    current_log_ids,
    log_context,
    logs_as_json,
)
from .messages import DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION
from .paths import DEV_STATE_DIR, PROD_HOSTD_SOCKET, dev_hostd_socket, find_hostd_socket

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DEV_STATE_DIR",
    "PROD_HOSTD_SOCKET",
    "PROTOCOL_VERSION",
    "ErrorCode",
    "EventStream",
    "FrameBuffer",
    "FrameEncoder",
    "FrameInvalid",
    "FrameTooLarge",
    "HostdClient",
    "HostdConnectionLost",
    "HostdError",
    "HostdNotRunning",
    "HostdProtocolError",
    "HostdRemoteError",
    "HostdRestarting",
    "HostdStreamOverflow",
    "HostdTimeout",
    "HostdUnavailable",
    "HostdVersionMismatch",
    "Limit",
    "LogConfigError",
    "UnknownFrame",
    "bind_log_ids",
    "configure_logging",
    "current_log_ids",
    "dev_hostd_socket",
    "find_hostd_socket",
    "is_uuid",
    "log_context",
    "logs_as_json",
    "messages",
    "new_id",
    "open_hostd",
    "settings",
    "uuid7",
]
