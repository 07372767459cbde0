"""hostd's one error type: a failure to report to the caller as an ``ErrorResponse``.

Handlers raise :class:`RpcError` with a stable :class:`proto.ErrorCode`; the RPC server turns
it into the wire error for the request's id. Anything else that escapes a handler is a bug:
the server logs it with a traceback and answers ``internal.error``; the connection and hostd
keep running.

A refusal at a configured limit is :func:`limit_reached`: ``limit.reached`` with the
:class:`proto.Limit` it hit in its details, so the controller can say which limit, what raises it,
and whether waiting helps.
"""

from __future__ import annotations

from typing import Any

from agentic_sandbox.proto import ErrorCode, Limit

#: Retry-After of a full table of running things (sessions, execs): one ending frees a slot.
SLOT_RETRY_S = 5
#: Retry-After of a full queue that drains on its own (requests in flight, input not yet read).
QUEUE_RETRY_S = 1


class RpcError(Exception):
    def __init__(self, code: ErrorCode, message: str | None = None, **details: Any) -> None:
        super().__init__(message or code.phrase)  # type: ignore[attr-defined]
        self.code = code
        self.message = message or code.phrase  # type: ignore[attr-defined]
        self.details = details


def limit_reached(message: str, limit: Limit, **extra: Any) -> RpcError:
    """A ``limit.reached`` refusal naming the limit it hit (and any ``extra`` details)."""
    return RpcError(ErrorCode.LIMIT_REACHED, message, **limit.details(), **extra)
