"""Discovery routes: the signed AgentCard and the JWKS (per instance and all); no token needed.

(The extended card, the same card for an authenticated caller, is an operation: ``rest``.) The
card carries ``ETag`` (its bytes' SHA-256), ``Cache-Control: max-age`` and ``Last-Modified``;
``If-None-Match`` gets a 304.
"""

from __future__ import annotations

import hashlib
from email.utils import formatdate

import msgspec
from quart import Response, request

from ..http.responses import card_base_url, json_response
from ..state import app_state
from .blueprint import a2a
from .edge import A2A_JSON

CARD_MAX_AGE_S = 300


@a2a.get("/agents/<instance_id>/.well-known/agent-card.json")
async def agent_card(instance_id: str) -> Response:
    service = app_state().a2a
    rec = await service.instance(instance_id)
    card, key_rec = await service.signed_card(rec, card_base_url())
    body = msgspec.json.encode(card)
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {
        "ETag": etag,
        "Cache-Control": f"max-age={CARD_MAX_AGE_S}",
        "Last-Modified": formatdate(max(rec.created_at, key_rec.created_at), usegmt=True),
    }
    if etag in [tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")]:
        response = Response(b"", status=304)
    else:
        response = Response(body, status=200, content_type=A2A_JSON)
    for name, value in headers.items():
        response.headers[name] = value
    return response


@a2a.get("/agents/<instance_id>/.well-known/jwks.json")
async def instance_jwks(instance_id: str) -> Response:
    service = app_state().a2a
    rec = await service.instance(instance_id)
    return json_response(await service.jwks(rec.id))


@a2a.get("/.well-known/jwks.json")
async def server_jwks() -> Response:
    return json_response(await app_state().a2a.jwks())
