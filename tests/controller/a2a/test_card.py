"""The signed AgentCard, its caching headers and the JWKS, on a live controller and hostd.

The signature is checked twice: with a2a-sdk's own verifier (``a2a.utils.signing``) and by hand
(RFC 8785 with the ``rfc8785`` package, Ed25519 with ``cryptography``), against the public key the
JWKS publishes.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from typing import Any

import httpx
import msgspec
import pytest
import rfc8785
from a2a.client.card_resolver import parse_agent_card
from a2a.compat.v0_3 import types as t03
from a2a.utils.signing import create_signature_verifier
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from jwt import PyJWK

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION, runtime_params
from agentic_sandbox.controller.config import load_config
from agentic_sandbox.controller.store import InstanceRecord
from tests.contracts import validate_runtime
from tests.controller.a2a.helpers import new_agent
from tests.controller.conftest import LiveController, LiveHostd, controller_env, serve_controller


def _b64(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


def verify_by_hand(card: dict[str, Any], jwks: dict[str, Any]) -> dict[str, Any]:
    """JCS of the card as served without ``signatures``, detached JWS, EdDSA: one of the card's
    signatures must verify (spec §8.4); returns its protected header."""
    payload = rfc8785.dumps({k: v for k, v in card.items() if k != "signatures"})
    for sig in card["signatures"]:
        header = json.loads(_b64(sig["protected"]))
        [jwk] = [k for k in jwks["keys"] if k["kid"] == header["kid"]]
        signing_input = sig["protected"].encode() + b"." + base64.urlsafe_b64encode(payload).rstrip(b"=")
        try:
            Ed25519PublicKey.from_public_bytes(_b64(jwk["x"])).verify(_b64(sig["signature"]), signing_input)
        except InvalidSignature:
            continue
        assert isinstance(header, dict)
        return header
    raise InvalidSignature("no signature verifies over the card as served")


async def test_card_is_v1_signed_and_verifies_with_the_sdk_and_by_hand(
    admin: httpx.AsyncClient, anon: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "card-a", loadout="echo")
    response = await anon.get(f"/agents/{agent.instance_id}/.well-known/agent-card.json")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/a2a+json"
    card = response.json()
    assert card["supportedInterfaces"][0]["url"] == agent.base  # no trailing slash
    assert {i["protocolBinding"] for i in card["supportedInterfaces"]} >= {"HTTP+JSON"}
    assert all(i["protocolVersion"] == "1.0" for i in card["supportedInterfaces"])
    # What a 0.3 client connects with, beside the 1.0 fields (a2a-sdk 1.x ignores them).
    assert (card["url"], card["preferredTransport"], card["protocolVersion"]) == (agent.base, "JSONRPC", "0.3.0")
    assert card["additionalInterfaces"] == [
        {"url": agent.base, "transport": "JSONRPC"},
        {"url": agent.base, "transport": "HTTP+JSON"},
    ]
    assert card["supportsAuthenticatedExtendedCard"] is True and card["security"] == [{"bearer": ["a2a"]}]
    assert card["securitySchemes"]["bearer"]["type"] == "http"
    assert card["capabilities"]["pushNotifications"] is True
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert "full host access" in card["description"]
    [ext] = [e for e in card["capabilities"]["extensions"] if e["uri"] == RUNTIME_EXTENSION]
    assert ext["required"] is True
    validate_runtime("params", ext["params"])
    assert ext["params"] == {
        "runtime": "host",
        "loadout": "echo",
        "instance_id": agent.instance_id,
        "provider": "hostd",
        # hostd's host provider's, for this instance (no image: a host instance has none); it can
        # sleep where hostd has cgroups to freeze it in.
        "capabilities": [
            "instance.start", "instance.stop", "instance.restart", "instance.destroy",
            "session.pty", "exec", "exec.control",
            *(["instance.sleep.freeze"] if os.geteuid() == 0 else []),
        ],
    }  # fmt: skip

    jwks = (await anon.get(f"/agents/{agent.instance_id}/.well-known/jwks.json")).json()
    header = verify_by_hand(card, jwks)
    assert header["alg"] == "EdDSA" and header["kid"] == agent.instance_id
    assert header["jku"] == f"{agent.base}/.well-known/jwks.json"

    # a2a-sdk: the card parsed into its proto model (0.3's fields dropped), verified with its own
    # canonical form. (parse_agent_card rewrites the dict it is given: it gets a copy.)
    keys = {k["kid"]: PyJWK(k) for k in jwks["keys"]}
    verifier = create_signature_verifier(lambda kid, _jku: keys[kid], ["EdDSA"])
    parsed = parse_agent_card(copy.deepcopy(card))
    verifier(parsed)
    assert [i.protocol_version for i in parsed.supported_interfaces] == ["1.0", "1.0"]
    # A 0.3 reader: the card fits a2a-sdk's 0.3 model (a2a-sdk 0.3 itself: test_v03_clients).
    legacy = t03.AgentCard.model_validate(card)
    assert (legacy.url, legacy.preferred_transport) == (agent.base, "JSONRPC")

    # A tampered card fails both checks.
    tampered = {**copy.deepcopy(card), "name": "someone-else"}
    try:
        verifier(parse_agent_card(copy.deepcopy(tampered)))
    except Exception as exc:
        assert "signature" in str(exc).lower()
    else:
        raise AssertionError("the SDK verifier accepted a tampered card")
    with pytest.raises(InvalidSignature):
        verify_by_hand(tampered, jwks)


async def test_card_caching_headers_and_conditional_get(
    admin: httpx.AsyncClient, anon: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "card-b")
    path = f"/agents/{agent.instance_id}/.well-known/agent-card.json"
    first = await anon.get(path)
    assert first.headers["cache-control"].startswith("max-age=")
    assert first.headers["last-modified"].endswith("GMT")
    etag = first.headers["etag"]
    again = await anon.get(path)
    assert again.headers["etag"] == etag and again.content == first.content  # stable bytes, stable signature
    cached = await anon.get(path, headers={"If-None-Match": etag})
    assert cached.status_code == 304 and cached.content == b""
    # Without a loadout the card names the one its tasks run with.
    [ext] = [e for e in first.json()["capabilities"]["extensions"] if e["uri"] == RUNTIME_EXTENSION]
    assert ext["params"]["loadout"] == "shell"


async def test_unknown_instance_card_is_an_a2a_404(anon: httpx.AsyncClient) -> None:
    response = await anon.get("/agents/01930000-0000-7000-8000-000000000000/.well-known/agent-card.json")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["status"] == "NOT_FOUND"
    assert error["details"][0]["reason"] == "INSTANCE_NOT_FOUND"


async def test_signing_key_persists_across_restarts_and_server_jwks_lists_it(hostd: LiveHostd, short_dir: Any) -> None:
    config = load_config(env=controller_env(short_dir / "ctl", hostd.socket_path))
    async with serve_controller(config) as live, live.client() as admin:
        agent = await new_agent(admin, live, "card-c")
        first = (await admin.get(f"/agents/{agent.instance_id}/.well-known/jwks.json")).json()
    async with serve_controller(config) as live, live.client(None) as anon:
        card = (await anon.get(f"/agents/{agent.instance_id}/.well-known/agent-card.json")).json()
        server = (await anon.get("/.well-known/jwks.json")).json()
        again = (await anon.get(f"/agents/{agent.instance_id}/.well-known/jwks.json")).json()
    assert again == first
    assert first["keys"][0] in server["keys"]
    assert first["keys"][0]["kty"] == "OKP" and first["keys"][0]["crv"] == "Ed25519"
    verify_by_hand(card, server)


def test_runtime_params_name_the_runtime_v1_kind() -> None:
    def record(runtime: str, provider: str | None) -> InstanceRecord:
        iid = "0190a000-0000-7000-8000-000000000001"
        return InstanceRecord(
            id=iid, name="x", runtime=runtime, state="running", provider=provider, created_at=0, updated_at=0
        )

    kinds = {
        runtime: runtime_params(record(runtime, provider))
        for runtime, provider in (("host", None), ("docker", "podman"), ("qemu", "libvirt"))
    }
    assert {r: (p["runtime"], p["provider"]) for r, p in kinds.items()} == {
        "host": ("host", "hostd"),
        "docker": ("container", "podman"),
        "qemu": ("vm", "libvirt"),
    }
    for params in kinds.values():
        validate_runtime("params", params)


async def test_a_card_is_signed_once_per_content_and_a_change_is_signed_anew(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "card-cache", loadout="echo")
    service = controller.state.a2a
    rec = await service.instance(agent.instance_id)
    first, _ = await service.signed_card(rec, controller.url)
    again, _ = await service.signed_card(rec, controller.url)
    assert again == first and again is not first  # the same signed card, a copy the caller may change
    again["name"] = "changed by a caller"
    assert (await service.signed_card(rec, controller.url))[0] == first
    renamed, _ = await service.signed_card(msgspec.structs.replace(rec, name="card-cache-2"), controller.url)
    elsewhere, _ = await service.signed_card(rec, "https://agents.example.com")
    jwks = await service.jwks(agent.instance_id)
    for card in (renamed, elsewhere):
        assert card["signatures"] != first["signatures"]
        verify_by_hand(card, jwks)
    assert renamed["name"] == "card-cache-2" and elsewhere["url"].startswith("https://agents.example.com/")
