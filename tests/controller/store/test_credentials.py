"""Instance credentials on a real file: token digests (one per instance, replaced), signing keys
(the first one stays), both set in one go and forgotten together."""

from __future__ import annotations

from agentic_sandbox.controller.store import SigningKeyRecord, Store
from tests.controller.store.conftest import OpenStore


def _key(instance_id: str, kid: str, key: bytes = b"\x01" * 32) -> SigningKeyRecord:
    return SigningKeyRecord(instance_id=instance_id, kid=kid, private_key=key, created_at=1.0)


async def test_a_token_digest_per_instance_replaced_by_a_new_one(store: Store) -> None:
    assert store.credentials.token_digests() == {}
    await store.credentials.set_token("i1", "d1", 1.0)
    await store.credentials.set_token("i2", "d2", 1.0)
    await store.credentials.set_token("i1", "d1-new", 2.0)
    assert store.credentials.token_digests() == {"i1": "d1-new", "i2": "d2"}


async def test_the_first_signing_key_stays(store: Store) -> None:
    first = _key("i1", "k-first", bytes(range(32)))
    assert await store.credentials.add_signing_key(first) == first
    assert await store.credentials.add_signing_key(_key("i1", "k-second")) == first
    assert await store.credentials.signing_key("i1") == first
    assert await store.credentials.signing_key("i2") is None
    assert isinstance(first.private_key, bytes)


async def test_an_identity_is_set_at_once_and_forgotten_at_once(open_store: OpenStore) -> None:
    store = open_store()
    await store.credentials.set_identity("i1", "d1", _key("i1", "kid-b"))
    await store.credentials.set_identity("i2", "d2", _key("i2", "kid-a", b"\x02" * 32))
    # A second identity for i1 replaces the token but keeps the key.
    await store.credentials.set_identity("i1", "d1-new", _key("i1", "kid-c"))
    store.close()

    store = open_store()
    try:
        assert store.credentials.token_digests() == {"i1": "d1-new", "i2": "d2"}
        assert [k.kid for k in await store.credentials.signing_keys()] == ["kid-a", "kid-b"]  # by kid
        assert (await store.credentials.signing_key("i2")) == _key("i2", "kid-a", b"\x02" * 32)
        await store.credentials.forget("i1")
        assert store.credentials.token_digests() == {"i2": "d2"}
        assert [k.instance_id for k in await store.credentials.signing_keys()] == ["i2"]
        await store.credentials.forget("nobody")  # nothing to forget: no error
    finally:
        store.close()
