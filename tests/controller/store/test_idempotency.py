"""The idempotency cache on each store: the first response per key stays until it expires; the
table is held to its size, oldest first, in the same transaction as the insert; a key is claimed
by one controller at a time, its claim taken over once it runs out, and replaced by the answer."""

from __future__ import annotations

from agentic_sandbox.controller.store import CachedResponse, Store
from agentic_sandbox.controller.store.idempotency import Claim


def _entry(request_hash: str, created_at: float, ttl: float = 100.0, body: bytes = b"{}") -> CachedResponse:
    return CachedResponse(
        request_hash=request_hash, status=200, body=body, created_at=created_at, expires_at=created_at + ttl
    )


async def test_the_first_response_stays_and_keys_are_apart(store: Store) -> None:
    first = _entry("h1", 10.0, body=b'{"n": 1}')
    await store.idempotency.put("i1", "jsonrpc", "m1", first, max_entries=10)
    await store.idempotency.put("i1", "jsonrpc", "m1", _entry("h2", 11.0, body=b"later"), max_entries=10)
    assert await store.idempotency.get("i1", "jsonrpc", "m1", now=12.0) == first
    # Another scope, instance or message id is another key.
    assert await store.idempotency.get("i1", "rest", "m1", now=12.0) is None
    assert await store.idempotency.get("i2", "jsonrpc", "m1", now=12.0) is None
    assert await store.idempotency.get("i1", "jsonrpc", "m2", now=12.0) is None
    await store.idempotency.put("i1", "rest", "m1", _entry("h3", 12.0), max_entries=10)
    assert await store.idempotency.count() == 2


async def test_an_expired_entry_is_a_miss_and_is_replaced(store: Store) -> None:
    await store.idempotency.put("i1", "rest", "m1", _entry("old", 10.0, ttl=5.0), max_entries=10)
    assert await store.idempotency.get("i1", "rest", "m1", now=14.9) is not None
    assert await store.idempotency.get("i1", "rest", "m1", now=15.0) is None  # expires_at is exclusive
    fresh = _entry("new", 20.0)
    await store.idempotency.put("i1", "rest", "m1", fresh, max_entries=10)
    assert await store.idempotency.get("i1", "rest", "m1", now=21.0) == fresh


async def test_a_put_drops_expired_rows_then_the_oldest_beyond_the_bound(store: Store) -> None:
    await store.idempotency.put("i1", "rest", "short", _entry("h", 1.0, ttl=15.0), max_entries=10)
    for i in range(4):
        await store.idempotency.put("i1", "rest", f"m{i}", _entry("h", 10.0 + i), max_entries=10)
    assert await store.idempotency.count() == 5
    # At t=20 "short" (until 16) has expired (and goes first); then the oldest beyond 3: m0, m1.
    await store.idempotency.put("i1", "rest", "m4", _entry("h", 20.0), max_entries=3)
    assert await store.idempotency.count() == 3
    live = [m for m in ("short", "m0", "m1", "m2", "m3", "m4") if await store.idempotency.get("i1", "rest", m, 20.5)]
    assert live == ["m2", "m3", "m4"]


async def test_a_key_is_claimed_by_one_controller_then_answered(store: Store) -> None:
    key = ("i1", "rest", "m1")
    assert await store.idempotency.claim(*key, owner="a", until=20.0, now=10.0, ttl_s=100) is Claim.MINE
    assert await store.idempotency.claim(*key, owner="b", until=21.0, now=11.0, ttl_s=100) is Claim.BUSY
    assert await store.idempotency.get(*key, now=11.0) is None  # a claim is not an answer
    assert await store.idempotency.count() == 0
    answer = _entry("h1", 12.0, body=b'{"task": 1}')
    await store.idempotency.put(*key, answer, max_entries=10)
    assert await store.idempotency.claim(*key, owner="b", until=23.0, now=13.0, ttl_s=100) is Claim.ANSWERED
    assert await store.idempotency.get(*key, now=13.0) == answer
    await store.idempotency.unclaim(*key, "a")  # the answer stays
    assert await store.idempotency.get(*key, now=13.0) == answer


async def test_a_claim_that_ran_out_is_taken_over_and_a_dropped_one_frees_the_key(store: Store) -> None:
    key = ("i1", "jsonrpc", "m2")
    assert await store.idempotency.claim(*key, owner="a", until=20.0, now=10.0, ttl_s=100) is Claim.MINE
    taken = await store.idempotency.claim(*key, owner="b", until=31.0, now=21.0, ttl_s=100)
    assert taken is Claim.TAKEN_OVER and taken.taken_over
    assert await store.idempotency.claim(*key, owner="a", until=32.0, now=22.0, ttl_s=100) is Claim.BUSY
    await store.idempotency.unclaim(*key, "a")  # not a's any more
    assert await store.idempotency.claim(*key, owner="c", until=33.0, now=23.0, ttl_s=100) is Claim.BUSY
    await store.idempotency.unclaim(*key, "b")
    assert await store.idempotency.claim(*key, owner="c", until=34.0, now=24.0, ttl_s=100) is Claim.MINE


async def test_a_large_bound_is_counted_every_hundredth_of_it(store: Store) -> None:
    """Counting at every put would scan the whole cache per send: a bound of 1,000 is checked
    every 10 puts (and at the first), so it is passed by 1 % at most."""
    for i in range(1_011):
        await store.idempotency.put("i1", "rest", f"m{i}", _entry("h", 10.0 + i, ttl=1e6), max_entries=1_000)
    assert 1_000 <= await store.idempotency.count() <= 1_010
    assert await store.idempotency.get("i1", "rest", "m0", now=2_000.0) is None  # the oldest went
