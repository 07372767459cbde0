"""Claims in the store, on both stores: named claims taken, run out and released; and every claim a
controller holds (tasks, named ones) renewed and given up together."""

from __future__ import annotations

import time

from agentic_sandbox.controller.store import Append, Store
from tests.controller.store.records import task


async def test_a_named_claim_is_one_controllers_until_it_runs_out_or_is_released(store: Store) -> None:
    now = time.time()
    assert await store.leases.acquire("hostd-watch", "ctl-a", now + 10, now)
    assert await store.leases.acquire("hostd-watch", "ctl-a", now + 20, now)  # ours: renewed
    assert not await store.leases.acquire("hostd-watch", "ctl-b", now + 10, now)
    assert await store.leases.held(["hostd-watch", "operation:x"], now) == {"hostd-watch"}
    later = now + 30  # ctl-a stopped renewing
    assert await store.leases.held(["hostd-watch"], later) == set()
    assert await store.leases.acquire("hostd-watch", "ctl-b", later + 10, later)
    await store.leases.release("hostd-watch", "ctl-a")  # not ctl-a's any more: nothing happens
    assert await store.leases.held(["hostd-watch"], later) == {"hostd-watch"}
    await store.leases.release("hostd-watch", "ctl-b")
    assert await store.leases.held(["hostd-watch"], later) == set()


async def test_a_controllers_claims_are_renewed_and_released_together(store: Store) -> None:
    now = time.time()
    rec = task("t-1", now)
    await store.tasks.create(rec, Append(kind="message", body={"messageId": "m"}), owner="ctl-a", until=now + 1)
    assert await store.leases.acquire("operation:op_1", "ctl-a", now + 1, now)
    await store.renew("ctl-a", now + 100)
    assert [t.id for t in await store.tasks.orphans(now + 50)] == []
    assert await store.leases.held(["operation:op_1"], now + 50) == {"operation:op_1"}
    assert not await store.tasks.claim("t-1", "ctl-b", now + 60, now + 50)
    await store.release("ctl-a")
    assert [t.id for t in await store.tasks.orphans(now)] == ["t-1"]
    assert await store.leases.held(["operation:op_1"], now) == set()
    assert await store.tasks.claim("t-1", "ctl-b", now + 60, now)
