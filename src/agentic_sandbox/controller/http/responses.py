"""Small response helpers shared by the admin and v1 route modules."""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Response, g, request

from ..state import app_state

JSON = "application/json"


#: Set on ``g`` once the handler has read the whole body (the app then need not drain it).
BODY_READ = "body_read"


async def request_body() -> bytes:
    """The request body as bytes (bounded by the app's MAX_CONTENT_LENGTH), not kept in the request."""
    body = await request.get_data(cache=False, as_text=False)
    setattr(g, BODY_READ, True)
    return body if isinstance(body, bytes) else body.encode()


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    response = Response(msgspec.json.encode(obj), status=status, content_type=JSON)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def base_url() -> str:
    """Origin clients reach us at: the configured public URL, else the request's own."""
    public = app_state().config.public_url
    return public or request.host_url.rstrip("/")
