"""Discovery routes: the signed AgentCard, the extended card, the JWKS (per instance and all).

The card and the JWKS need no token (discovery); the extended card does (A2A: it is the card an
authenticated client gets) and is the same card here. The card carries ``ETag`` (its bytes'
SHA-256), ``Cache-Control: max-age`` and ``Last-Modified``; ``If-None-Match`` gets a 304.
"""

from __future__ import annotations

import hashlib
from email.utils import formatdate

import msgspec
from quart import Response, request

from ..http import base_url, json_response
from ..state import app_state
from ..store import InstanceRecord
from . import a2a
from .card import build_card, instance_url, sign_card
from .edge import A2A_JSON, a2a_response, begin, instance_not_found, is_legacy_path

CARD_MAX_AGE_S = 300
#: What the HTTP+JSON surface serves so far (the card names nothing it cannot answer).
BINDINGS = ("HTTP+JSON",)
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


@a2a.get("/agents/<instance_id>/extendedAgentCard")
@a2a.get("/agents/<instance_id>/v1/extendedAgentCard")
async def extended_agent_card(instance_id: str) -> Response:
    caller = await begin(instance_id, legacy_path=is_legacy_path(), enforce_extensions=False)
    return a2a_response(await signed_card(caller.instance), caller)


@a2a.get("/agents/<instance_id>/.well-known/jwks.json")
async def instance_jwks(instance_id: str) -> Response:
    rec = await _public_record(instance_id)
    return json_response(await app_state().credentials.jwks(rec.id))


@a2a.get("/.well-known/jwks.json")
async def server_jwks() -> Response:
    return json_response(await app_state().credentials.jwks())
