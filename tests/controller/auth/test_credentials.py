"""Per-instance credentials over a real store file: a token is shown once and kept as a digest the
authenticator (and a restarted controller) recognises; a new one replaces it; the signing key is
made once, kept across restarts, and published as a JWK whose public half verifies its signatures."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agentic_sandbox.controller.auth.credentials import InstanceCredentials, b64url, public_jwk
from agentic_sandbox.controller.auth.tokens import Authenticator
from agentic_sandbox.controller.store import Store


def _credentials(path: Path) -> InstanceCredentials:
    store = Store.open(path)
    return InstanceCredentials(store, Authenticator([], store.credentials.token_digests()))


def _public_key(jwk: dict[str, str]) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(jwk["x"] + "=" * (-len(jwk["x"]) % 4)))


async def test_a_token_is_kept_as_its_digest_and_a_new_one_replaces_it(tmp_path: Path) -> None:
    creds = _credentials(tmp_path / "c.db")
    first = await creds.issue_token("i1")
    principal = creds.auth.authenticate(f"Bearer {first}")
    assert principal is not None and (principal.role, principal.instance_id) == ("instance", "i1")
    assert creds.store.credentials.token_digests() == {"i1": hashlib.sha256(first.encode()).hexdigest()}
    written = b"".join(p.read_bytes() for p in tmp_path.glob("c.db*"))  # the database and its WAL
    assert hashlib.sha256(first.encode()).hexdigest().encode() in written
    assert first.encode() not in written  # only the digest is written
    second = await creds.issue_token("i1")
    assert second != first
    assert creds.auth.authenticate(f"Bearer {first}") is None
    assert creds.auth.authenticate(f"Bearer {second}") is not None
    creds.store.close()

    again = _credentials(tmp_path / "c.db")  # a restarted controller
    try:
        assert again.auth.authenticate(f"Bearer {first}") is None
        assert again.auth.authenticate(f"Bearer {second}").instance_id == "i1"  # type: ignore[union-attr]
    finally:
        again.store.close()


async def test_an_identity_is_a_token_and_a_key_made_at_once_and_forgotten_at_once(tmp_path: Path) -> None:
    creds = _credentials(tmp_path / "c.db")
    try:
        token = await creds.issue_identity("i1")
        assert creds.auth.authenticate(f"Bearer {token}").instance_id == "i1"  # type: ignore[union-attr]
        [kept] = await creds.store.credentials.signing_keys()
        rec, _ = await creds.signing_key("i1")
        assert rec == kept and rec.kid == "i1" and len(rec.private_key) == 32
        await creds.forget("i1")
        assert creds.auth.authenticate(f"Bearer {token}") is None
        assert creds.store.credentials.token_digests() == {}
        assert (await creds.jwks())["keys"] == []
    finally:
        creds.store.close()


async def test_the_signing_key_is_made_once_on_first_use_and_survives_a_restart(tmp_path: Path) -> None:
    creds = _credentials(tmp_path / "c.db")
    results: list[bytes] = []

    async def use() -> None:
        rec, _ = await creds.signing_key("old-instance")  # from before identities: no key yet
        results.append(rec.private_key)

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(use)
    assert len(set(results)) == 1  # concurrent first uses share the one key the store kept
    creds.store.close()

    again = _credentials(tmp_path / "c.db")
    try:
        rec, key = await again.signing_key("old-instance")
        assert rec.private_key == results[0]
        jwks = await again.jwks("old-instance")
        [jwk] = jwks["keys"]
        assert jwk == public_jwk(rec)
        assert (jwk["kty"], jwk["crv"], jwk["alg"], jwk["use"], jwk["kid"]) == (
            "OKP", "Ed25519", "EdDSA", "sig", "old-instance",
        )  # fmt: skip
        assert "d" not in jwk  # the private half is never published
        _public_key(jwk).verify(key.sign(b"card"), b"card")  # raises if the halves do not match
    finally:
        again.store.close()


async def test_the_jwks_of_every_instance(tmp_path: Path) -> None:
    creds = _credentials(tmp_path / "c.db")
    try:
        for instance_id in ("b", "a"):
            await creds.issue_identity(instance_id)
        assert [k["kid"] for k in (await creds.jwks())["keys"]] == ["a", "b"]
        assert len((await creds.jwks("c"))["keys"]) == 1  # made on demand for one instance
        assert [k["kid"] for k in (await creds.jwks())["keys"]] == ["a", "b", "c"]
    finally:
        creds.store.close()


def test_b64url_has_no_padding() -> None:
    assert b64url(b"\xfb\xff") == "-_8"
    assert b64url(b"") == ""
