"""Problem details (RFC 7807, ``application/problem+json``) for the admin and v1 surfaces.

Every non-2xx answer of those surfaces is a :class:`Problem` turned into a body per
``contracts/admin-api/error-envelope.schema.json``: ``type``, ``title``, ``status``, ``code``
(``domain.condition``), ``detail``, ``instance`` (the request path), ``trace_id`` (32 hex) and, for
validation failures, ``errors[{field, message, code}]``.

Translation happens once, here, at the edge:

* :class:`Problem` raised anywhere in a handler → its own status;
* any :class:`proto.HostdError` → 503 ``internal.unavailable`` with the reason (fail closed), except
  the explicit hostd answers that name a caller mistake (unknown instance, wrong state, ...);
* werkzeug HTTP errors (routing 404/405, 413 from the body limit) → the same status as a problem;
* anything else → 500 ``internal.error``, logged with its traceback, never shown to the client.
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

from proto import ErrorCode, HostdError, HostdRemoteError

log = logging.getLogger(__name__)

PROBLEM_TYPE_BASE = "https://agentic-sandbox.aiwg.io/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"

_PATH_SAFE = "/:@!$&'()*+,;=-._~"
_TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


class Problem(Exception):
    """An HTTP error with a stable ``domain.condition`` code; raise it from any handler."""

    def __init__(
        self,
        status: int,
        code: str,
        title: str,
        detail: str | None = None,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {detail or title}")
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.errors = errors
        self.headers = headers or {}

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


# -- helpers ---------------------------------------------------------------------------------------


def not_found(code: str, detail: str | None = None) -> Problem:
    titles = {
        "instance.not_found": "Instance not found",
        "operation.not_found": "Operation not found",
    }
    return Problem(404, code, titles.get(code, "Not found"), detail)


def conflict(code: str, detail: str) -> Problem:
    return Problem(409, code, "Conflict", detail)


def validation_failed(errors: list[dict[str, str]], *, status: int = 422, detail: str | None = None) -> Problem:
    if detail is None and errors:
        detail = f"{errors[0]['field']}: {errors[0]['message']}"
    return Problem(status, "validation.failed", "Validation failed", detail, errors=errors)


def unavailable(detail: str) -> Problem:
    return Problem(503, "internal.unavailable", "Service unavailable", detail, headers={"Retry-After": "1"})


def unauthorized(detail: str = "a valid bearer token is required") -> Problem:
    return Problem(401, "auth.unauthorized", "Unauthorized", detail, headers={"WWW-Authenticate": "Bearer"})


def forbidden(detail: str = "this role may not do that") -> Problem:
    return Problem(403, "auth.forbidden", "Forbidden", detail)


def not_implemented(code: str, detail: str) -> Problem:
    return Problem(501, code, "Not implemented", detail)


def internal_error() -> Problem:
    return Problem(500, "internal.error", "Internal server error", "an unexpected error was logged")


# -- translation of foreign errors ----------------------------------------------------------------

_HOSTD_CODES: dict[ErrorCode, tuple[int, str, str]] = {
    ErrorCode.INSTANCE_NOT_FOUND: (404, "instance.not_found", "Instance not found"),
    ErrorCode.INSTANCE_EXISTS: (409, "instance.already_exists", "Instance already exists"),
    ErrorCode.INSTANCE_INVALID_STATE: (409, "instance.invalid_state", "Invalid instance state"),
    ErrorCode.WORKING_DIR_NOT_FOUND: (422, "validation.failed", "Validation failed"),
    ErrorCode.SPAWN_FAILED: (422, "instance.spawn_failed", "Agent command could not be started"),
    ErrorCode.REQUEST_INVALID: (422, "validation.failed", "Validation failed"),
}


def from_hostd_error(exc: HostdError) -> Problem:
    """One hostd failure as a problem: explicit caller mistakes keep their meaning, the rest is 503."""
    if isinstance(exc, HostdRemoteError):
        mapped = _HOSTD_CODES.get(exc.error_code) if exc.error_code else None
        if mapped is not None:
            status, code, title = mapped
            errors = None
            if exc.error_code is ErrorCode.WORKING_DIR_NOT_FOUND:
                errors = [{"field": "working_dir", "message": exc.message, "code": exc.code}]
            return Problem(status, code, title, exc.message, errors=errors)
        return unavailable(f"hostd refused the call: {exc.code}: {exc.message}")
    return unavailable(f"hostd is unavailable: {exc}")


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

    @target.errorhandler(Problem)
    async def _problem(exc: Problem) -> Response:
        return problem_response(exc)

    @target.errorhandler(HostdError)
    async def _hostd(exc: HostdError) -> Response:
        return problem_response(from_hostd_error(exc))

    @target.errorhandler(HTTPException)
    async def _http(exc: HTTPException) -> Response:
        return problem_response(from_http_exception(exc))

    @target.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)
        return problem_response(internal_error())


# -- request bodies ----------------------------------------------------------------------------

_AT_RE = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_NAMED_RE = re.compile(r"(?:missing required field|unknown field) `(?P<name>[^`]+)`")


def _field_of(message: str) -> tuple[str, str, str]:
    """Split a msgspec validation message into (field path, message, error code)."""
    path = ""
    at = _AT_RE.search(message)
    if at is not None:
        path = at["path"].lstrip(".")
        message = message[: at.start()]
    named = _NAMED_RE.search(message)
    if named is not None:
        path = f"{path}.{named['name']}" if path else named["name"]
    if "missing required field" in message:
        code = "required"
    elif "unknown field" in message:
        code = "unknown_field"
    elif message.startswith("Expected `") and "`, got `" in message:
        code = "type"
    else:
        code = "constraint"
    return path or "$", message, code


def decode_json(body: bytes, type_: type[Any]) -> Any:
    """Decode a JSON body into ``type_``: 400 if it is not JSON, 422 naming the field if it does not fit."""
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        field, message, code = _field_of(str(exc))
        raise validation_failed([{"field": field, "message": message, "code": code}]) from None
    except msgspec.DecodeError as exc:
        raise validation_failed(
            [{"field": "$", "message": f"body is not valid JSON: {exc}", "code": "json.invalid"}], status=400
        ) from None
