"""The A2A surface's error body, and its one translation from :mod:`controller.errors`.

Every failure of ``/agents/{id}/...`` is the A2A v1.0.1 body (a ``google.rpc.Status``)::

    {"error": {"code": 404, "status": "NOT_FOUND", "message": "...",
               "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "TASK_NOT_FOUND", "domain": "a2a-protocol.org",
                            "metadata": {"code": "task.not_found", ...}},
                           {"@type": "type.googleapis.com/google.rpc.BadRequest",
                            "fieldViolations": [{"field": "...", "description": "..."}]}]}}

:func:`to_a2a` is the mapping: the domain error's ``code`` first (:data:`BY_CODE`: the A2A errors
of the v1.0.1 table, each with its HTTP status, gRPC status and JSON-RPC code), else its class
(:data:`BY_CLASS`, nearest base wins). The dotted domain code rides in the ErrorInfo metadata, with
the error's ``details``. Validation failures add a BadRequest with one violation per field. The
JSON-RPC binding takes ``jsonrpc_code`` and the same ``details`` as ``error.data``.

A configured limit that is full (:class:`~controller.errors.LimitReached`, ``limit.sessions``, ...)
is 429 / ``RESOURCE_EXHAUSTED`` (gRPC's code for it), its code, bound and setting in the ErrorInfo
metadata; where waiting helps it adds a ``google.rpc.RetryInfo`` detail (``retryDelay``) and, on
HTTP, ``Retry-After``.

A hitl-prompt/v1 answer that breaks its prompt's schema (422 / -32011) carries one more detail,
``{"@type": HITL_VALIDATION_ERRORS, "extension", "prompt_id", "validation_errors": [{path, keyword,
message}]}``: the array the extension's spec names, in the one error model both bindings share.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    CONTENT_TYPE_NOT_SUPPORTED,
    EXTENDED_CARD_NOT_CONFIGURED,
    EXTENSION_REQUIRED,
    EXTENSION_UNSUPPORTED,
    HITL_NOT_ACTIVATED,
    HITL_RESPONSE_INVALID,
    HITL_UNKNOWN,
    IDEMPOTENCY_KEY_REUSED,
    IDEMPOTENCY_MESSAGE_ID_MALFORMED,
    METHOD_NOT_ALLOWED,
    METHOD_NOT_FOUND,
    PUSH_NOT_SUPPORTED,
    TASK_NOT_CANCELABLE,
    TASK_NOT_FOUND,
    UNSUPPORTED_OPERATION,
    VERSION_NOT_SUPPORTED,
    Conflict,
    ControllerError,
    Forbidden,
    Gone,
    InternalError,
    InvalidState,
    LimitReached,
    MalformedInput,
    NotFound,
    OperationFailed,
    TooLarge,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    UnsupportedMedia,
    ValidationFailed,
)

log = logging.getLogger(__name__)

DOMAIN = "a2a-protocol.org"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
HITL_VALIDATION_ERRORS = "https://agentic-sandbox.aiwg.io/extensions/hitl-prompt/v1/ValidationErrors"


@dataclass(frozen=True)
class Kind:
    """One A2A error kind: HTTP status, gRPC status name, ErrorInfo reason, JSON-RPC code."""

    http: int
    status: str
    reason: str
    jsonrpc: int


#: The A2A v1.0.1 error table (spec §5.4), by the domain code that means it.
BY_CODE: dict[str, Kind] = {
    TASK_NOT_FOUND: Kind(404, "NOT_FOUND", "TASK_NOT_FOUND", -32001),
    TASK_NOT_CANCELABLE: Kind(400, "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE", -32002),
    PUSH_NOT_SUPPORTED: Kind(400, "FAILED_PRECONDITION", "PUSH_NOTIFICATION_NOT_SUPPORTED", -32003),
    UNSUPPORTED_OPERATION: Kind(400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION", -32004),
    CONTENT_TYPE_NOT_SUPPORTED: Kind(415, "INVALID_ARGUMENT", "CONTENT_TYPE_NOT_SUPPORTED", -32005),
    EXTENDED_CARD_NOT_CONFIGURED: Kind(400, "FAILED_PRECONDITION", "EXTENDED_AGENT_CARD_NOT_CONFIGURED", -32007),
    EXTENSION_REQUIRED: Kind(400, "FAILED_PRECONDITION", "EXTENSION_SUPPORT_REQUIRED", -32008),
    VERSION_NOT_SUPPORTED: Kind(400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED", -32009),
    METHOD_NOT_FOUND: Kind(404, "NOT_FOUND", "METHOD_NOT_FOUND", -32601),
    METHOD_NOT_ALLOWED: Kind(405, "INVALID_ARGUMENT", "METHOD_NOT_FOUND", -32601),
    "instance.not_found": Kind(404, "NOT_FOUND", "INSTANCE_NOT_FOUND", -32001),
    # An extension of another binding activated here (pty-extensions/v1 over HTTP, its spec §5.2).
    EXTENSION_UNSUPPORTED: Kind(400, "INVALID_ARGUMENT", "UNSUPPORTED_EXTENSION", -32600),
    # idempotency/v1 (its error-codes.json).
    IDEMPOTENCY_KEY_REUSED: Kind(422, "FAILED_PRECONDITION", "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD", -32422),
    IDEMPOTENCY_MESSAGE_ID_MALFORMED: Kind(400, "INVALID_ARGUMENT", "IDEMPOTENCY_MESSAGE_ID_MALFORMED", -32602),
    # hitl-prompt/v1 (its spec §4.3: 409 / -32010, 422 / -32011); answering without activating it is
    # the request lacking an extension it needs.
    HITL_UNKNOWN: Kind(409, "ABORTED", "HITL_ALREADY_ANSWERED_OR_UNKNOWN", -32010),
    HITL_RESPONSE_INVALID: Kind(422, "INVALID_ARGUMENT", "HITL_RESPONSE_INVALID", -32011),
    HITL_NOT_ACTIVATED: Kind(400, "FAILED_PRECONDITION", "EXTENSION_SUPPORT_REQUIRED", -32008),
}

INTERNAL = Kind(500, "INTERNAL", "INTERNAL_ERROR", -32603)

#: Everything else, by class of the domain family (the SDK's extra reasons where one fits).
BY_CLASS: dict[type[ControllerError], Kind] = {
    ControllerError: INTERNAL,
    NotFound: Kind(404, "NOT_FOUND", "NOT_FOUND", -32001),
    Conflict: Kind(409, "ABORTED", "CONFLICT", -32004),
    InvalidState: Kind(400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION", -32004),
    ValidationFailed: Kind(400, "INVALID_ARGUMENT", "INVALID_PARAMS", -32602),
    MalformedInput: Kind(400, "INVALID_ARGUMENT", "INVALID_REQUEST", -32600),
    UnsupportedMedia: Kind(415, "INVALID_ARGUMENT", "CONTENT_TYPE_NOT_SUPPORTED", -32005),
    TooLarge: Kind(413, "INVALID_ARGUMENT", "INVALID_REQUEST", -32600),
    LimitReached: Kind(429, "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", -32603),
    Unauthenticated: Kind(401, "UNAUTHENTICATED", "UNAUTHENTICATED", -32600),
    Forbidden: Kind(403, "PERMISSION_DENIED", "PERMISSION_DENIED", -32600),
    Gone: Kind(404, "NOT_FOUND", "NOT_FOUND", -32601),
    Unimplemented: Kind(400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION", -32004),
    OperationFailed: Kind(500, "INTERNAL", "INTERNAL_ERROR", -32603),
    Unavailable: Kind(503, "UNAVAILABLE", "UNAVAILABLE", -32603),
    InternalError: INTERNAL,
}


@dataclass
class A2AError:
    """A translated error: what each binding needs to answer it."""

    kind: Kind
    message: str
    metadata: dict[str, str]
    violations: list[dict[str, str]] = field(default_factory=list)
    #: Details beyond ErrorInfo and BadRequest (hitl-prompt/v1's validation errors).
    extra: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds worth waiting before a retry, where waiting helps (a full limit; RetryInfo, Retry-After).
    retry_after_s: int | None = None

    @property
    def http_status(self) -> int:
        return self.kind.http

    def details(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [
            {"@type": ERROR_INFO, "reason": self.kind.reason, "domain": DOMAIN, "metadata": self.metadata}
        ]
        if self.violations:
            out.append({"@type": BAD_REQUEST, "fieldViolations": self.violations})
        if self.retry_after_s:
            out.append({"@type": RETRY_INFO, "retryDelay": f"{self.retry_after_s}s"})
        return out + self.extra

    def body(self) -> dict[str, Any]:
        """The HTTP+JSON (and SSE ``event: error``) body."""
        return {
            "error": {
                "code": self.kind.http,
                "status": self.kind.status,
                "message": self.message,
                "details": self.details(),
            }
        }

    def headers(self) -> dict[str, str]:
        if self.kind.http == 401:
            return {"WWW-Authenticate": "Bearer"}
        if self.retry_after_s:
            return {"Retry-After": str(self.retry_after_s)}
        if self.kind.http == 503:
            return {"Retry-After": "1"}
        return {}


def to_a2a(exc: ControllerError) -> A2AError:
    kind = BY_CODE.get(exc.code) or next(BY_CLASS[cls] for cls in type(exc).__mro__ if cls in BY_CLASS)
    metadata = {"code": exc.code, **{k: str(v) for k, v in exc.details.items()}}
    violations = [{"field": f.get("field", "$"), "description": f.get("message", "")} for f in exc.fields]
    extra: list[dict[str, Any]] = []
    if exc.code == HITL_RESPONSE_INVALID:
        errors = [{"path": f["field"], "keyword": f["code"], "message": f["message"]} for f in exc.fields]
        extra.append({"@type": HITL_VALIDATION_ERRORS, **exc.details, "validation_errors": errors})
    retry_after_s = exc.retry_after_s if isinstance(exc, LimitReached) else None
    return A2AError(kind, exc.message, metadata, violations, extra, retry_after_s)


def internal_error() -> A2AError:
    return to_a2a(InternalError("internal.error", "an unexpected error was logged"))
