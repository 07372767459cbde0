"""The instance catalog on a real file: insert, a name taken twice, get by id and name, update,
list, counts by state, delete; every field round-trips."""

from __future__ import annotations

import pytest
import trio

from agentic_sandbox.controller.store import NameTaken, Store
from tests.controller.store.records import instance


async def test_instance_catalog(store: Store) -> None:
    a = instance("id-a", "alpha", labels={"team": "x"}, working_dir="/w")
    await store.instances.insert(a)
    await store.instances.insert(instance("id-b", "beta", state="stopped"))
    with pytest.raises(NameTaken):
        await store.instances.insert(instance("id-c", "alpha"))
    assert await store.instances.get("id-a") == a
    assert (await store.instances.get_by_name("beta")).id == "id-b"  # type: ignore[union-attr]
    a.state, a.note = "failed", "why"
    await store.instances.update(a)
    assert (await store.instances.get("id-a")).state == "failed"  # type: ignore[union-attr]
    assert [r.name for r in await store.instances.list()] == ["alpha", "beta"]
    assert await store.instances.count_by_state() == {"failed": 1, "stopped": 1}
    assert await store.instances.delete("id-a")
    assert not await store.instances.delete("id-a")
    assert await store.instances.get("id-a") is None


async def test_every_field_round_trips_and_an_update_can_rename(store: Store) -> None:
    rec = instance(
        "id-a", "alpha", provider="podman", loadout="echo", working_dir="/w", labels={"a": "1", "b": "2"},
        source="admin-v2", note="n", capabilities=["checkpoint", "exec"], image_ref="docker.io/x:1",
    )  # fmt: skip
    await store.instances.insert(rec)
    assert await store.instances.get("id-a") == rec
    rec.name, rec.capabilities, rec.image_ref = "renamed", [], None
    await store.instances.update(rec)
    assert await store.instances.get_by_name("alpha") is None
    assert await store.instances.get_by_name("renamed") == rec


async def test_the_same_id_twice_is_refused_too(store: Store) -> None:
    await store.instances.insert(instance("id-a", "alpha"))
    with pytest.raises(NameTaken):
        await store.instances.insert(instance("id-a", "other"))
    assert [r.name for r in await store.instances.list()] == ["alpha"]


async def test_concurrent_calls_from_trio(store: Store) -> None:
    async def add(i: int) -> None:
        await store.instances.insert(instance(f"id-{i}", f"name-{i}"))

    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(add, i)
    assert len(await store.instances.list()) == 40


async def _walk(store: Store, limit: int, **filters: object) -> list[str]:
    """Every page of ``page`` in turn, each cursor the last row of the page before."""
    seen: list[str] = []
    after = None
    while True:
        rows, more = await store.instances.page(after=after, limit=limit, **filters)  # type: ignore[arg-type]
        assert len(rows) <= limit
        seen += [r.id for r in rows]
        if not more:
            return seen
        assert len(rows) == limit
        after = (rows[-1].created_at, rows[-1].id)


async def test_pages_walk_every_row_once_oldest_first_with_ties_by_id(store: Store) -> None:
    # Two rows share a creation time: the id decides between them, and no page loses one.
    rows = [
        instance("id-e", "e", created_at=5.0, state="stopped", labels={"team": "x", "tier": "1"}),
        instance("id-b", "b", created_at=2.0, runtime="docker", provider="podman", labels={"team": "y"}),
        instance("id-d", "d", created_at=2.0, labels={"team": "x"}),
        instance("id-a", "a", created_at=1.0, labels={"tier": "2"}),
        instance("id-c", "c", created_at=3.0, state="stopped"),
    ]
    for rec in rows:
        await store.instances.insert(rec)
    everything = ["id-a", "id-b", "id-d", "id-c", "id-e"]
    for limit in (1, 2, 4, 5, 50):
        assert await _walk(store, limit) == everything
    assert await _walk(store, 1, state="stopped") == ["id-c", "id-e"]
    assert await _walk(store, 1, runtime="docker") == ["id-b"]
    assert await _walk(store, 1, provider="podman") == ["id-b"]
    assert await _walk(store, 2, instance_id="id-d") == ["id-d"]
    assert await _walk(store, 1, labels=[("team", "x")]) == ["id-d", "id-e"]
    assert await _walk(store, 1, labels=[("team", "x"), ("tier", "1")]) == ["id-e"]
    assert await _walk(store, 1, labels=[("tier", None)]) == ["id-a", "id-e"]
    assert await _walk(store, 1, labels=[("team", "x"), ("team", "y")]) == []
    assert await _walk(store, 3, state="running", labels=[("team", None)]) == ["id-b", "id-d"]
    assert await store.instances.page(limit=5, after=(5.0, "id-e")) == ([], False)


async def test_a_label_page_reads_past_rows_without_the_label(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows read in batches of 3: the matches sit in the third and the fifth batch.
    monkeypatch.setattr("agentic_sandbox.controller.store.instances.LABEL_SCAN_BATCH", 3)
    for i in range(15):
        await store.instances.insert(instance(f"id-{i:02}", f"n{i:02}", created_at=float(i), labels={"k": str(i % 7)}))
    assert await _walk(store, 1, labels=[("k", "0")]) == ["id-00", "id-07", "id-14"]
    rows, more = await store.instances.page(limit=1, labels=[("k", "6")])
    assert [r.id for r in rows] == ["id-06"] and more


async def test_the_host_of_an_instance_is_kept_and_filters_its_rows(store: Store) -> None:
    await store.instances.insert(instance("id-a", "a", created_at=1.0, host_id="h1"))
    await store.instances.insert(instance("id-b", "b", created_at=2.0, host_id="h2"))
    await store.instances.insert(instance("id-c", "c", created_at=3.0))  # from before hosts: unplaced
    await store.instances.insert(instance("id-d", "d", created_at=4.0, host_id="h1", state="stopped"))
    a = await store.instances.get("id-a")
    assert a is not None and a.host_id == "h1"
    a.state = "stopped"
    await store.instances.update(a)  # writes the host it holds: still h1
    assert (await store.instances.get("id-a")).host_id == "h1"  # type: ignore[union-attr]
    # A host's list holds its rows and the unplaced ones (which may be its own); the page filter is exact.
    assert [r.id for r in await store.instances.list(host_id="h1")] == ["id-a", "id-c", "id-d"]
    assert [r.id for r in await store.instances.list(host_id="h3")] == ["id-c"]
    assert [r.id for r in await store.instances.list()] == ["id-a", "id-b", "id-c", "id-d"]
    assert await _walk(store, 1, host_id="h1") == ["id-a", "id-d"]
    assert await _walk(store, 1, host_id="h1", state="stopped") == ["id-a", "id-d"]
    assert await _walk(store, 1, host_id="h2", state="stopped") == []
    assert await store.instances.host_of("id-b") == (True, "h2")
    assert await store.instances.host_of("id-c") == (True, None)
    assert await store.instances.host_of("id-x") == (False, None)


async def test_unplaced_rows_become_one_hosts_and_placed_ones_stay(store: Store) -> None:
    await store.instances.insert(instance("id-a", "a"))
    await store.instances.insert(instance("id-b", "b", host_id="h2"))
    await store.instances.insert(instance("id-c", "c"))
    assert await store.instances.place_unplaced("h1") == 2
    assert await store.instances.place_unplaced("h3") == 0
    assert {r.id: r.host_id for r in await store.instances.list()} == {"id-a": "h1", "id-b": "h2", "id-c": "h1"}
