"""Per-instance credentials: the A2A bearer token and the AgentCard signing key.

* :meth:`InstanceCredentials.issue_token` makes a fresh random token for an instance, keeps its
  SHA-256 digest (store and :class:`~controller.auth.Authenticator`) and returns the token; it is
  never stored or shown again. Issuing again replaces the previous token.
* :meth:`InstanceCredentials.signing_key` is the instance's persistent Ed25519 key (one per
  instance, kept in the 0600 store; ``kid`` is the instance id, as upstream has it), made with its
  token when the instance is provisioned (:meth:`InstanceCredentials.issue_identity`), else on
  first use (instances from before that, or adopted from hostd).
* :meth:`InstanceCredentials.jwks` publishes the public halves as a JWK Set (RFC 7517, OKP keys per
  RFC 8037).

Several controllers (a shared store): a token issued or revoked at another controller is read
again when the store says it changed (:meth:`InstanceCredentials.refresh`, from
:mod:`controller.cluster`), and all of them after the controller may have missed such news
(:meth:`InstanceCredentials.refresh_all`).

Errors: none of its own; store failures propagate.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from ..store import SigningKeyRecord, Store
from .tokens import Authenticator

TOKEN_BYTES = 32


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def public_jwk(rec: SigningKeyRecord) -> dict[str, Any]:
    public = Ed25519PrivateKey.from_private_bytes(rec.private_key).public_key()
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {"kty": "OKP", "crv": "Ed25519", "x": b64url(raw), "kid": rec.kid, "alg": "EdDSA", "use": "sig"}


def _new_key(instance_id: str) -> SigningKeyRecord:
    fresh = Ed25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return SigningKeyRecord(instance_id=instance_id, kid=instance_id, private_key=fresh, created_at=time.time())


class InstanceCredentials:
    def __init__(self, store: Store, auth: Authenticator) -> None:
        self.store = store
        self.auth = auth

    async def issue_token(self, instance_id: str) -> str:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        digest = hashlib.sha256(token.encode()).hexdigest()
        await self.store.credentials.set_token(instance_id, digest, time.time())
        self.auth.set_instance_token(instance_id, digest)
        return token

    async def issue_identity(self, instance_id: str) -> str:
        """A new instance's whole identity at once: its token (returned, never kept) and its
        signing key (a warm pool's slot gets its own, like any new instance)."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        digest = hashlib.sha256(token.encode()).hexdigest()
        await self.store.credentials.set_identity(instance_id, digest, _new_key(instance_id))
        self.auth.set_instance_token(instance_id, digest)
        return token

    async def forget(self, instance_id: str) -> None:
        self.auth.forget_instance(instance_id)
        await self.store.credentials.forget(instance_id)

    async def refresh(self, instance_id: str) -> None:
        """Take the instance's token digest from the store again (another controller changed it)."""
        digest = await self.store.credentials.token_digest(instance_id)
        if digest is None:
            self.auth.forget_instance(instance_id)
        else:
            self.auth.set_instance_token(instance_id, digest)

    async def refresh_all(self) -> None:
        self.auth.replace_instance_tokens(await self.store.credentials.all_token_digests())

    async def signing_key(self, instance_id: str) -> tuple[SigningKeyRecord, Ed25519PrivateKey]:
        rec = await self.store.credentials.signing_key(instance_id)
        if rec is None:
            # Two first requests at once: the store keeps one key and both use it.
            rec = await self.store.credentials.add_signing_key(_new_key(instance_id))
        return rec, Ed25519PrivateKey.from_private_bytes(rec.private_key)

    async def jwks(self, instance_id: str | None = None) -> dict[str, Any]:
        """The JWK Set of one instance's key (made if missing), or of every key kept."""
        if instance_id is not None:
            rec, _ = await self.signing_key(instance_id)
            return {"keys": [public_jwk(rec)]}
        return {"keys": [public_jwk(rec) for rec in await self.store.credentials.signing_keys()]}
