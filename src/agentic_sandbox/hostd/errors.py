"""hostd's one error type: a failure to report to the caller as an ``ErrorResponse``.

Handlers raise :class:`RpcError` with a stable :class:`proto.ErrorCode`; the RPC server turns
it into the wire error for the request's id. Anything else that escapes a handler is a bug:
the server logs it with a traceback and answers ``internal.error``; the connection and hostd
keep running.
"""

from __future__ import annotations

from typing import Any

from agentic_sandbox.proto import ErrorCode


class RpcError(Exception):
    def __init__(self, code: ErrorCode, message: str | None = None, **details: Any) -> None:
        super().__init__(message or code.phrase)  # type: ignore[attr-defined]
        self.code = code
        self.message = message or code.phrase  # type: ignore[attr-defined]
        self.details = details
