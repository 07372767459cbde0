"""Problem details (RFC 7807, ``application/problem+json``) for the admin and v1 surfaces.

Every non-2xx answer of those surfaces is a :class:`Problem` turned into a body per
``contracts/admin-api/error-envelope.schema.json``: ``type``, ``title``, ``status``, ``code``
(``domain.condition``), ``detail``, ``instance`` (the request path), ``trace_id`` (32 hex) and, for
validation failures, ``errors[{field, message, code}]``.

Translation happens once, here, at the edge; services raise only :mod:`controller.errors`:

* a :class:`~controller.errors.ControllerError` -> the status of its class in :data:`STATUS` (the
  nearest listed base class wins), its ``code``, ``message`` as ``detail`` and ``fields`` as
  ``errors``; the title is the code's (one title per problem type, as RFC 7807 asks), else the
  class's. hostd failures arrive here already translated by :mod:`controller.hostlink` (503
  ``internal.unavailable`` with the reason when hostd cannot serve: fail closed; 429
  ``limit.<name>`` when it is at a limit, with ``Retry-After`` where waiting helps);
* werkzeug HTTP errors (routing 404/405, 413 from the body limit) -> the same status as a problem;
* anything else -> 500 ``internal.error``, logged with its traceback, never shown to the client.

:func:`error_body` gives the same envelope as a dict for an operation's stored ``error``.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any
from urllib.parse import quote

import msgspec
from quart import Response, g, has_request_context, request
from werkzeug.exceptions import HTTPException

from ..errors import (
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

PROBLEM_TYPE_BASE = "https://agentic-sandbox.aiwg.io/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"

_PATH_SAFE = "/:@!$&'()*+,;=-._~"
_TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")

#: Status and default title per class of the domain family.
STATUS: dict[type[ControllerError], tuple[int, str]] = {
    ControllerError: (500, "Internal server error"),  # a bare base class raised is our bug
    NotFound: (404, "Not found"),
    Conflict: (409, "Conflict"),
    InvalidState: (409, "Invalid state"),
    ValidationFailed: (422, "Validation failed"),
    MalformedInput: (400, "Validation failed"),
    UnsupportedMedia: (415, "Unsupported media type"),
    TooLarge: (413, "Request too large"),
    LimitReached: (429, "Too many requests"),
    Unauthenticated: (401, "Unauthorized"),
    Forbidden: (403, "Forbidden"),
    Gone: (410, "Gone"),
    Unimplemented: (501, "Not implemented"),
    OperationFailed: (422, "Operation failed"),
    Unavailable: (503, "Service unavailable"),
    InternalError: (500, "Internal server error"),
}

#: Titles of the codes whose title is more specific than their class's.
TITLES: dict[str, str] = {
    "instance.not_found": "Instance not found",
    "operation.not_found": "Operation not found",
    "instance.already_exists": "Instance already exists",
    "instance.invalid_state": "Invalid instance state",
    "instance.spawn_failed": "Agent command could not be started",
    "instance.start_failed": "Instance failed to start",
    "storage.scope_disabled": "Storage scope is read-only",
    "storage.too_large": "Object too large",
    "storage.unavailable": "Storage unavailable",
    "legacy_agent_secret.retired": "Legacy agent shared-secret retired",
    "operation.interrupted": "Operation interrupted",
    "provider.unavailable": "Provider not available",
    "rate_limit.exceeded": "Too many requests",
}

#: Headers a problem carries, by code (a client may retry hostd soon; a storage fault is not so brief).
HEADERS: dict[str, dict[str, str]] = {
    "internal.unavailable": {"Retry-After": "1"},
    "rate_limit.exceeded": {"Retry-After": "1"},
    "auth.unauthorized": {"WWW-Authenticate": "Bearer"},
}


class Problem:
    """One problem+json answer: status, code, title, detail, field errors, extra headers."""

    def __init__(
        self,
        status: int,
        code: str,
        title: str,
        detail: str | None = None,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.errors = errors
        self.headers = headers or {}

    def __repr__(self) -> str:
        return f"Problem({self.status}, {self.code!r}, {self.detail or self.title!r})"

    def body(self, instance_path: str | None = None, trace_id: str | None = None) -> dict[str, Any]:
        """The envelope as a dict (also used for an operation's ``error``)."""
        out: dict[str, Any] = {
            "type": problem_type(self.code),
            "title": self.title,
            "status": self.status,
            "code": self.code,
        }
        if self.detail:
            out["detail"] = self.detail
        if instance_path:
            out["instance"] = instance_path
        if trace_id:
            out["trace_id"] = trace_id
        if self.errors:
            out["errors"] = self.errors
        return out


def problem_type(code: str) -> str:
    return PROBLEM_TYPE_BASE + code.replace(".", "-").replace("_", "-")


def trace_id() -> str:
    """The request's trace id: the W3C ``traceparent`` trace-id when given, else a fresh one."""
    if not has_request_context():
        return secrets.token_hex(16)
    existing = g.get("trace_id")
    if existing is None:
        match = _TRACEPARENT_RE.match(request.headers.get("traceparent", ""))
        existing = match.group(1) if match and match.group(1) != "0" * 32 else secrets.token_hex(16)
        g.trace_id = existing
    return existing


def problem_response(problem: Problem, instance_path: str | None = None) -> Response:
    if instance_path is None and has_request_context():
        # ``instance`` is a URI reference: the decoded path may hold spaces or control characters.
        instance_path = quote(request.path, safe=_PATH_SAFE)
    body = msgspec.json.encode(problem.body(instance_path, trace_id()))
    response = Response(body, status=problem.status, content_type=PROBLEM_MEDIA_TYPE)
    for name, value in problem.headers.items():
        response.headers[name] = value
    return response


# -- translation ----------------------------------------------------------------------------------


def to_problem(exc: ControllerError) -> Problem:
    """The one mapping of the domain family onto problems (see the module docstring)."""
    status, title = next(STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS)
    headers = dict(HEADERS.get(exc.code, {}))
    if isinstance(exc, LimitReached) and exc.retry_after_s:
        headers["Retry-After"] = str(exc.retry_after_s)
    return Problem(
        status,
        exc.code,
        TITLES.get(exc.code, title),
        exc.message,
        errors=[dict(e) for e in exc.fields] or None,
        headers=headers,
    )


def internal_error() -> InternalError:
    return InternalError("internal.error", "an unexpected error was logged")


def error_body(exc: BaseException, instance_path: str) -> dict[str, Any]:
    """An operation's ``error``: the envelope of a domain error, else of ``internal.error``.

    The caller logs an unexpected exception before asking; nothing of it is shown here.
    """
    domain = exc if isinstance(exc, ControllerError) else internal_error()
    return to_problem(domain).body(instance_path)


def from_http_exception(exc: HTTPException) -> Problem:
    status = exc.code or 500
    codes = {
        400: "validation.failed",
        404: "route.not_found",
        405: "route.method_not_allowed",
        413: "request.too_large",
        415: "validation.failed",
    }
    problem = Problem(status, codes.get(status, "http.error"), exc.name, exc.description)
    valid_methods = getattr(exc, "valid_methods", None)
    if status == 405 and valid_methods:
        problem.headers["Allow"] = ", ".join(valid_methods)
    return problem


def install_problem_handlers(target: Any) -> None:
    """Register the problem+json error handlers on a blueprint or app."""

    @target.errorhandler(ControllerError)
    async def _domain(exc: ControllerError) -> Response:
        return problem_response(to_problem(exc))

    @target.errorhandler(HTTPException)
    async def _http(exc: HTTPException) -> Response:
        return problem_response(from_http_exception(exc))

    @target.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)
        return problem_response(to_problem(internal_error()))
