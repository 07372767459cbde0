"""The hosts table on both stores: heartbeats register a host and refresh its facts while keeping
what an operator set, controllers by host and liveness, forgetting, the instance counts per host,
and the cluster secret made once for every controller."""

from __future__ import annotations

import trio

from agentic_sandbox.controller.store import ControllerRecord, HostCapacity, HostFacts, HostRecord, Store
from tests.controller.store.conftest import OpenStore
from tests.controller.store.records import instance


def _facts(host_id: str = "h1", **kw: object) -> HostFacts:
    fields: dict[str, object] = {"boot_id": "b1", "name": f"{host_id}.example"}
    fields.update(kw)
    return HostFacts(id=host_id, **fields)  # type: ignore[arg-type]


async def test_the_first_heartbeat_registers_the_host_and_later_ones_refresh_its_facts(store: Store) -> None:
    facts = _facts(
        labels={"zone": "a"},
        runtimes=["host", "docker"],
        capacity=HostCapacity(cpus=8, memory_bytes=16 << 30, memory_available_bytes=9 << 30, max_instances=20),
    )
    first = await store.hosts.heartbeat(facts, "ctl-1", "http://10.0.0.1:8080", 100.0)
    assert first == HostRecord(
        id="h1",
        boot_id="b1",
        name="h1.example",
        labels={"zone": "a"},
        runtimes=["host", "docker"],
        capacity=facts.capacity,
        registered_at=100.0,
        heartbeat_at=100.0,
    )
    assert await store.hosts.get("h1") == first
    assert await store.hosts.set_flags("h1", cordoned=True) is not None
    # A reboot: new boot id, facts, one runtime fewer; the cordon and the registration stay.
    later = await store.hosts.heartbeat(_facts(boot_id="b2", runtimes=["host"]), "ctl-1", "http://10.0.0.1:8080", 130.0)
    assert (later.boot_id, later.runtimes, later.labels, later.capacity) == ("b2", ["host"], {}, HostCapacity())
    assert (later.cordoned, later.draining, later.registered_at, later.heartbeat_at) == (True, False, 100.0, 130.0)
    assert await store.hosts.get("h1") == later
    assert await store.hosts.get("h2") is None


async def test_hosts_list_oldest_first_and_flags_set_and_clear_one_by_one(store: Store) -> None:
    await store.hosts.heartbeat(_facts("h2"), "ctl-2", "http://b:1", 200.0)
    await store.hosts.heartbeat(_facts("h1"), "ctl-1", "http://a:1", 100.0)
    await store.hosts.heartbeat(_facts("h0"), "ctl-0", "http://c:1", 200.0)  # same time: the id decides
    assert [h.id for h in await store.hosts.list()] == ["h1", "h0", "h2"]
    drained = await store.hosts.set_flags("h1", draining=True)
    assert drained is not None and (drained.cordoned, drained.draining) == (False, True)
    both = await store.hosts.set_flags("h1", cordoned=True)
    assert both is not None and (both.cordoned, both.draining) == (True, True)
    undrained = await store.hosts.set_flags("h1", draining=False)
    assert undrained is not None and (undrained.cordoned, undrained.draining) == (True, False)
    assert await store.hosts.set_flags("nope", cordoned=True) is None
    assert [(h.id, h.cordoned) for h in await store.hosts.list()] == [("h1", True), ("h0", False), ("h2", False)]


async def test_controllers_by_host_and_liveness_newest_first(store: Store) -> None:
    await store.hosts.heartbeat(_facts("h1"), "ctl-a", "http://a:1", 100.0)
    await store.hosts.heartbeat(_facts("h1"), "ctl-b", "http://b:1", 110.0)
    await store.hosts.heartbeat(_facts("h2"), "ctl-c", "http://c:1", 105.0)
    # ctl-a beats again from a new address: its start stays, it is the newest now.
    await store.hosts.heartbeat(_facts("h1"), "ctl-a", "http://a:2", 120.0)
    a = ControllerRecord(id="ctl-a", host_id="h1", url="http://a:2", started_at=100.0, heartbeat_at=120.0)
    b = ControllerRecord(id="ctl-b", host_id="h1", url="http://b:1", started_at=110.0, heartbeat_at=110.0)
    c = ControllerRecord(id="ctl-c", host_id="h2", url="http://c:1", started_at=105.0, heartbeat_at=105.0)
    assert await store.hosts.controllers() == [a, b, c]
    assert await store.hosts.controllers("h1") == [a, b]
    assert await store.hosts.controllers("h1", alive_since=115.0) == [a]
    assert await store.hosts.controllers(alive_since=106.0) == [a, b]
    assert await store.hosts.controllers("h3") == []
    assert (await store.hosts.get("h1")).heartbeat_at == 120.0  # type: ignore[union-attr]
    await store.hosts.forget_controller("ctl-a")
    await store.hosts.forget_controller("ctl-a")  # twice: nothing left to do
    assert await store.hosts.controllers("h1") == [b]


async def test_forgetting_a_host_takes_its_controllers_and_nothing_else(store: Store) -> None:
    await store.hosts.heartbeat(_facts("h1"), "ctl-a", "http://a:1", 100.0)
    await store.hosts.heartbeat(_facts("h2"), "ctl-b", "http://b:1", 100.0)
    assert await store.hosts.forget("h1")
    assert not await store.hosts.forget("h1")
    assert [h.id for h in await store.hosts.list()] == ["h2"]
    assert [c.id for c in await store.hosts.controllers()] == ["ctl-b"]


async def test_instance_counts_per_host_and_state_with_unplaced_rows_apart(store: Store) -> None:
    assert await store.hosts.instance_counts() == {}
    await store.instances.insert(instance("i1", "one", host_id="h1"))
    await store.instances.insert(instance("i2", "two", host_id="h1", state="stopped"))
    await store.instances.insert(instance("i3", "three", host_id="h1"))
    await store.instances.insert(instance("i4", "four", host_id="h2"))
    await store.instances.insert(instance("i5", "five"))
    assert await store.hosts.instance_counts() == {
        "h1": {"running": 2, "stopped": 1},
        "h2": {"running": 1},
        "": {"running": 1},
    }


async def test_the_cluster_secret_is_made_once_for_every_controller(open_store: OpenStore) -> None:
    first, second = open_store(), open_store()
    secrets: list[bytes] = []

    async def ask(store: Store) -> None:
        secrets.append(await store.hosts.secret())

    async with trio.open_nursery() as nursery:  # two controllers asking first at once
        nursery.start_soon(ask, first)
        nursery.start_soon(ask, second)
    assert len(secrets[0]) == 32 and secrets[0] == secrets[1]
    assert await first.hosts.secret() == secrets[0]
    first.close()
    assert await open_store().hosts.secret() == secrets[0]  # kept across restarts


async def test_controllers_long_silent_are_forgotten(store: Store) -> None:
    facts = HostFacts(id="h1", boot_id="b", name="one")
    await store.hosts.heartbeat(facts, "old", "http://a:1", 100.0)
    await store.hosts.heartbeat(facts, "new", "http://a:2", 5000.0)
    assert await store.hosts.forget_silent(1000.0) == 1
    assert [c.id for c in await store.hosts.controllers()] == ["new"]
