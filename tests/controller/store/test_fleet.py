"""fleet-workload/v1 rows on each real store: admission outcomes by key and child, the
compare-and-set of a revision, and one inventory counter that every change moves once."""

from __future__ import annotations

import time

import msgspec
import trio

from agentic_sandbox.controller.store import Admission, FleetRow, Store
from tests.controller.store.conftest import OpenStore


def _row(child: str, key: str, digest: str = "h1") -> FleetRow:
    now = time.time()
    record = {"lineage": {"child_id": child}, "status": {"revision": 0, "observed_state": "pending"}}
    return FleetRow(
        child_id=child,
        orchestrator_id="orch",
        idempotency_key=key,
        payload_hash=digest,
        record=record,
        revision=0,
        admitted_at=now,
        updated_at=now,
    )


def _next(row: FleetRow, revision: int, state: str) -> dict[str, object]:
    return {**row.record, "status": {"revision": revision, "observed_state": state}}


async def test_admission_by_key_and_child(store: Store) -> None:
    first = _row("c1", "k1")
    assert (await store.fleet.admit(first))[0] is Admission.CREATED
    assert await store.fleet.revision() == 1
    outcome, stored = await store.fleet.admit(first)
    assert (outcome, stored.child_id) == (Admission.REPLAYED, "c1")
    assert (await store.fleet.admit(_row("c1", "k1", digest="h2")))[0] is Admission.KEY_CONFLICT
    assert (await store.fleet.admit(_row("c1", "k2")))[0] is Admission.CHILD_EXISTS
    other_orchestrator = msgspec.structs.replace(_row("c2", "k1"), orchestrator_id="other")
    assert (await store.fleet.admit(other_orchestrator))[0] is Admission.CREATED  # keys are per orchestrator
    assert await store.fleet.revision() == 2  # replays and refusals change nothing


async def test_a_revision_moves_once_and_the_inventory_with_it(open_store: OpenStore) -> None:
    store = open_store()
    row = _row("c1", "k1")
    await store.fleet.admit(row)
    assert await store.fleet.advance("c1", 0, _next(row, 1, "running"))
    assert not await store.fleet.advance("c1", 0, _next(row, 1, "failed"))  # stale
    assert not await store.fleet.advance("nope", 0, _next(row, 1, "running"))
    again = open_store()  # another controller's view, or after a restart
    revision, rows = await again.fleet.inventory()
    assert revision == 2 and [(r.child_id, r.revision, r.record["status"]["observed_state"]) for r in rows] == [
        ("c1", 1, "running")
    ]


async def test_concurrent_writers_of_one_revision_one_wins(open_store: OpenStore) -> None:
    stores = [open_store() for _ in range(4)]  # four controllers
    row = _row("c1", "k1")
    await stores[0].fleet.admit(row)
    won: list[bool] = []

    async def write(store: Store, n: int) -> None:
        won.append(await store.fleet.advance("c1", 0, _next(row, 1, f"state-{n}")))

    async with trio.open_nursery() as nursery:
        for n in range(12):
            nursery.start_soon(write, stores[n % 4], n)
    assert won.count(True) == 1
    assert await stores[1].fleet.revision() == 2
