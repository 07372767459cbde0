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

from ..http.responses import base_url, json_response
from ..state import app_state
from ..store import InstanceRecord
from . import a2a, hitl, idempotency, ptyext, tenancy
from .card import build_card, instance_url, sign_card
from .edge import A2A_JSON, instance_not_found

CARD_MAX_AGE_S = 300
#: The bindings served at the base URL: JSON-RPC first (what a2a-sdk clients pick by default).
BINDINGS = ("JSONRPC", "HTTP+JSON")
STREAMING = True


async def signed_card(rec: InstanceRecord) -> dict[str, object]:
    state = app_state()
    loadout = state.loadouts.get(rec.loadout) if rec.loadout else None
    card = build_card(
        rec,
        base_url(),
        loadout_description=loadout.manifest.description if loadout is not None else None,
        streaming=STREAMING,
        bindings=BINDINGS,
    )
    card["capabilities"]["extensions"] += [
        idempotency.card_extension(),
        hitl.card_extension(),
        tenancy.card_extension(),
        ptyext.card_extension(),
    ]
    key_rec, key = await state.credentials.signing_key(rec.id)
    jku = f"{instance_url(base_url(), rec.id)}/.well-known/jwks.json"
    return sign_card(card, key, kid=key_rec.kid, jku=jku)


async def _public_record(instance_id: str) -> InstanceRecord:
    rec = await app_state().store.instances.get(instance_id)
    if rec is None or rec.state == "destroyed":
        raise instance_not_found(instance_id)
    return rec


@a2a.get("/agents/<instance_id>/.well-known/agent-card.json")
async def agent_card(instance_id: str) -> Response:
    rec = await _public_record(instance_id)
    body = msgspec.json.encode(await signed_card(rec))
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    key_rec, _ = await app_state().credentials.signing_key(rec.id)
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
    rec = await _public_record(instance_id)
    return json_response(await app_state().credentials.jwks(rec.id))


@a2a.get("/.well-known/jwks.json")
async def server_jwks() -> Response:
    return json_response(await app_state().credentials.jwks())
