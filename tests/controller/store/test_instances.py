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
