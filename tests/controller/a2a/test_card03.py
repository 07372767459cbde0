"""The AgentCard's 0.3 face, in memory: the fields a 0.3 client connects with, and signatures that
a2a-sdk 1.x's verifier, an independent JCS + JWS check and a2a-sdk 0.3's canonical form accept.
(a2a-sdk 0.3's own verifier runs against a live card in tests/scenarios/test_v03_clients.py.)"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import rfc8785
from a2a.client.card_resolver import parse_agent_card
from a2a.compat.v0_3 import types as t03
from a2a.utils.signing import _canonicalize_agent_card, create_signature_verifier
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt import PyJWK

from agentic_sandbox.controller.a2a import card03
from agentic_sandbox.controller.a2a.card import build_card, check_signable, sign_card
from agentic_sandbox.controller.store import InstanceRecord

BASE = "https://sandbox.example"


def v1_card() -> dict[str, Any]:
    rec = InstanceRecord(id="i-1", name="cat", runtime="host", state="running", created_at=0, updated_at=0)
    return build_card(rec, BASE, loadout_description=None, streaming=True, bindings=("JSONRPC", "HTTP+JSON"))


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_the_0_3_fields_name_the_jsonrpc_and_http_json_interfaces() -> None:
    card = v1_card()
    card["supportedInterfaces"].append(
        {"url": "sandbox.example:50051", "protocolBinding": "GRPC", "protocolVersion": "1.0"}
    )
    served = card03.with_v03_fields(card)
    url = f"{BASE}/agents/i-1"
    assert (served["url"], served["preferredTransport"], served["protocolVersion"]) == (url, "JSONRPC", "0.3.0")
    assert served["additionalInterfaces"] == [
        {"url": url, "transport": "JSONRPC"},
        {"url": url, "transport": "HTTP+JSON"},
    ]
    assert served["supportsAuthenticatedExtendedCard"] is True and served["security"] == [{"bearer": ["a2a"]}]
    bearer = served["securitySchemes"]["bearer"]
    assert bearer["type"] == "http" and bearer["scheme"] == "Bearer"
    assert bearer["httpAuthSecurityScheme"] == card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]
    assert {k: v for k, v in served.items() if k in card} | {"securitySchemes": card["securitySchemes"]} == card
    check_signable(served)
    legacy = t03.AgentCard.model_validate(served)
    assert legacy.url == url and legacy.preferred_transport == "JSONRPC"
    assert [i.transport for i in legacy.additional_interfaces or []] == ["JSONRPC", "HTTP+JSON"]
    # a2a-sdk 1.x reads the 1.0 card out of it, 0.3's fields dropped.
    parsed = parse_agent_card(copy.deepcopy(served))
    assert [i.protocol_binding for i in parsed.supported_interfaces] == ["JSONRPC", "HTTP+JSON", "GRPC"]
    assert rfc8785.dumps(card) == _canonicalize_agent_card(parsed).encode()


def test_three_signatures_one_for_each_verifier() -> None:
    key = Ed25519PrivateKey.generate()
    card = v1_card()
    served = card03.with_v03_fields(card)
    signed = sign_card(served, key, kid="k1", jku=f"{BASE}/jwks", also=tuple(card03.signing_payloads(card, served)))
    assert len(signed["signatures"]) == 3
    raw = key.public_key().public_bytes_raw()
    jwk = PyJWK({"kty": "OKP", "crv": "Ed25519", "x": b64(raw), "kid": "k1", "alg": "EdDSA"})

    def verifies(payload: bytes) -> list[bool]:
        out = []
        for sig in signed["signatures"]:
            signing_input = f"{sig['protected']}.{b64(payload)}".encode()
            signature = base64.urlsafe_b64decode(sig["signature"] + "==")
            try:
                key.public_key().verify(signature, signing_input)
            except Exception:
                out.append(False)
            else:
                out.append(True)
        return out

    # JCS of the card as served (the spec's form), the 1.0 card's, a2a-sdk 0.3's canonical form.
    assert verifies(rfc8785.dumps({k: v for k, v in signed.items() if k != "signatures"})) == [True, False, False]
    assert verifies(rfc8785.dumps(card)) == [False, True, False]
    assert verifies(card03.v03_canonical(signed)) == [False, False, True]
    header = json.loads(base64.urlsafe_b64decode(signed["signatures"][0]["protected"] + "=="))
    assert header == {"alg": "EdDSA", "kid": "k1", "typ": "JOSE", "jku": f"{BASE}/jwks"}
    create_signature_verifier(lambda _kid, _jku: jwk, ["EdDSA"])(parse_agent_card(copy.deepcopy(signed)))
    # Signing twice gives the same bytes (Ed25519 is deterministic: the card's ETag holds).
    again = sign_card(served, key, kid="k1", jku=f"{BASE}/jwks", also=tuple(card03.signing_payloads(card, served)))
    assert again == signed
