"""The A2A surface's blueprint and its error handlers: every error answers as the A2A error body."""

from __future__ import annotations

import logging

import msgspec
from quart import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from ..errors import (
    METHOD_NOT_ALLOWED,
    METHOD_NOT_FOUND,
    ControllerError,
    MalformedInput,
    NotFound,
    TooLarge,
    ValidationFailed,
)
from .edge import response_media_type
from .errors import A2AError, internal_error, to_a2a

log = logging.getLogger(__name__)

a2a = Blueprint("a2a", __name__)


def error_response(error: A2AError) -> Response:
    """The A2A error body, in the media type the client used (as every HTTP+JSON answer is)."""
    body = msgspec.json.encode(error.body())
    response = Response(body, status=error.http_status, content_type=response_media_type())
    for name, value in error.headers().items():
        response.headers[name] = value
    return response


def from_http_exception(exc: HTTPException) -> A2AError:
    """Routing and body-limit errors in A2A form (a path or verb this surface has not)."""
    status = exc.code or 500
    if status == 413:
        return to_a2a(TooLarge("request.too_large", "the request body is larger than this agent accepts"))
    if status == 404:
        return to_a2a(NotFound(METHOD_NOT_FOUND, f"no A2A operation at {request.path}"))
    if status == 405:
        return to_a2a(
            ValidationFailed([], f"{request.method} is not allowed on {request.path}", code=METHOD_NOT_ALLOWED)
        )
    return to_a2a(MalformedInput(exc.description or "the request cannot be read", code="request.invalid"))


@a2a.errorhandler(ControllerError)
async def _domain(exc: ControllerError) -> Response:
    return error_response(to_a2a(exc))


@a2a.errorhandler(HTTPException)
async def _http(exc: HTTPException) -> Response:
    return error_response(from_http_exception(exc))


@a2a.errorhandler(Exception)
async def _unexpected(exc: Exception) -> Response:
    log.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)
    return error_response(internal_error())
