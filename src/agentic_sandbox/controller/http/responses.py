"""Small response helpers shared by the admin and v1 route modules."""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Response, g, request

from ..auth.tokens import FORWARDED
from ..config import advertised_url
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
    """Origin clients reach us at: the one the client asked at when a peer controller forwarded the
    request here (it says which), else the configured public URL, else the request's own."""
    forwarded = FORWARDED.get()
    if forwarded is not None and forwarded.edge_url:
        return forwarded.edge_url
    public = app_state().config.public_url
    return public or request.host_url.rstrip("/")


def card_base_url() -> str:
    """Origin an AgentCard's interfaces name: :func:`base_url`, or with ``AIWG_CARD_URLS=host`` a
    controller of the instance's own host, this one (a request about an instance is served on its
    host), so a client can go straight there."""
    config = app_state().config
    if config.card_urls == "host":
        return advertised_url(config)
    return base_url()
