"""The AgentCard's A2A 0.3 face: what a 0.3 client reads to connect, beside the 1.0 card.

A 0.3 client (a2a-sdk 0.3's ``A2ACardResolver`` and ``ClientFactory``) reads ``url`` with
``preferredTransport`` and ``additionalInterfaces``, ``protocolVersion``,
``supportsAuthenticatedExtendedCard``, ``security``, and a ``type`` in each security scheme; it
ignores 1.0's fields, as a 1.0 client ignores these (a2a-sdk 1.x drops them when it parses a
card). :func:`with_v03_fields` adds them to the 1.0 card, as a2a-sdk 1.3's own server does
(``agent_card_to_dict``): a scheme keeps its 1.0 wrapper and gets 0.3's members beside it. The
0.3 interfaces are the JSON-RPC and HTTP+JSON ones (both served in 0.3 at the same URL); gRPC's
is 1.0 only and not listed.

The card served is then signed over three payloads (:func:`signing_payloads`), one signature
each, and a verifier accepts a card if one of them verifies:

1. JCS (RFC 8785) of the card as served, minus ``signatures``: what the spec, and an
   independent JCS + JWS check, verify;
2. JCS of the 1.0 card alone: a2a-sdk 1.x parses the card into its 1.0 protobuf (dropping 0.3's
   fields) and canonicalizes that;
3. a2a-sdk 0.3's canonical form: the card as its 0.3 model reads it, dumped without defaults and
   empty values, as sorted compact JSON (``json.dumps``, not JCS).
"""

from __future__ import annotations

import json
from typing import Any

import rfc8785
from a2a.compat.v0_3 import types as t03

#: The bindings a 0.3 client may use, and the version its card names.
V03_BINDINGS = ("JSONRPC", "HTTP+JSON")
V03_PROTOCOL_VERSION = "0.3.0"


def _scheme(scheme: dict[str, Any]) -> dict[str, Any]:
    """0.3's members of a security scheme (``{"type": "http", "scheme", ...}``); this card
    declares HTTP auth only."""
    http = scheme.get("httpAuthSecurityScheme")
    if http is None:
        return {}
    return {"type": "http", **{k: v for k, v in http.items() if k in ("scheme", "bearerFormat", "description")}}


def with_v03_fields(card: dict[str, Any]) -> dict[str, Any]:
    """The 1.0 ``card`` with 0.3's connection fields added (module docstring)."""
    interfaces = [i for i in card["supportedInterfaces"] if i["protocolBinding"] in V03_BINDINGS]
    out = dict(card)
    out["url"] = interfaces[0]["url"]
    out["preferredTransport"] = interfaces[0]["protocolBinding"]
    out["additionalInterfaces"] = [{"url": i["url"], "transport": i["protocolBinding"]} for i in interfaces]
    out["protocolVersion"] = V03_PROTOCOL_VERSION
    if card["capabilities"].get("extendedAgentCard"):
        out["supportsAuthenticatedExtendedCard"] = True
    if card.get("securityRequirements"):
        out["security"] = [
            {name: scopes.get("list") or [] for name, scopes in req["schemes"].items()}
            for req in card["securityRequirements"]
        ]
    if card.get("securitySchemes"):
        out["securitySchemes"] = {name: {**s, **_scheme(s)} for name, s in card["securitySchemes"].items()}
    return out


def _clean_empty(value: Any) -> Any:
    """a2a-sdk 0.3's ``_clean_empty``: empty strings, lists and objects left out, recursively."""
    if isinstance(value, dict):
        cleaned = {k: c for k, v in value.items() if (c := _clean_empty(v)) is not None}
        return cleaned or None
    if isinstance(value, list):
        items = [c for v in value if (c := _clean_empty(v)) is not None]
        return items or None
    if value == "" and isinstance(value, str):
        return None
    return value


def v03_canonical(served: dict[str, Any]) -> bytes:
    """What a2a-sdk 0.3's verifier signs and checks (``canonicalize_agent_card``)."""
    card = t03.AgentCard.model_validate(served)
    dumped = card.model_dump(exclude={"signatures"}, exclude_defaults=True, exclude_none=True, by_alias=True)
    return json.dumps(_clean_empty(dumped), separators=(",", ":"), sort_keys=True).encode()


def signing_payloads(card: dict[str, Any], served: dict[str, Any]) -> list[bytes]:
    """The payloads 2 and 3 (module docstring) of the 1.0 ``card`` served as ``served``."""
    v1_form: bytes = rfc8785.dumps(card)
    return [v1_form, v03_canonical(served)]
