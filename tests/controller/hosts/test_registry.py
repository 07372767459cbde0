"""This host in the store: its heartbeat, the view routing reads, placement's fresh reads and a
clean stop; with a real hostd and the controller on the embedded store, plus rows of other hosts
and controllers written straight into that store."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from agentic_sandbox.controller.config import load_config
from agentic_sandbox.controller.errors import Unavailable
from agentic_sandbox.controller.hosts.registry import HostRegistry
from agentic_sandbox.controller.store import HostCapacity, HostFacts, InstanceRecord
from tests.controller.conftest import LiveController, LiveHostd, controller_env, serve_controller


async def reported(registry: HostRegistry) -> None:
    with trio.fail_after(15):
        while registry.own is None:
            await trio.sleep(0.05)


async def test_the_heartbeat_reports_this_host_and_controller(controller: LiveController) -> None:
    registry = controller.state.hosts
    await reported(registry)
    assert registry.own is not None and registry.own.id == registry.host_id == controller.state.link.host_id
    assert registry.own.boot_id == controller.state.link.boot_id and "host" in registry.own.runtimes
    [me] = await registry.controllers()
    assert me.url == controller.url and me.id == registry.controller_id
    assert registry.state_of(registry.host_id) == "available"
    assert registry.state_of(None) is None and registry.state_of("unknown") is None
    assert registry.peer_for(registry.host_id or "") is None  # never itself


async def test_other_hosts_and_their_controllers_as_routing_sees_them(controller: LiveController) -> None:
    registry = controller.state.hosts
    store = registry.store
    await reported(registry)
    now = time.time()
    facts = HostFacts(id="h-other", boot_id="b", name="other", runtimes=["host"], capacity=HostCapacity(cpus=1))
    await store.hosts.heartbeat(facts, "c-1", "http://10.0.0.1:1", now)
    await store.hosts.heartbeat(facts, "c-2", "http://10.0.0.1:2", now)
    gone = HostFacts(id="h-gone", boot_id="b", name="gone", runtimes=["host"])
    await store.hosts.heartbeat(gone, "c-3", "http://10.0.0.2:1", now - 3600)
    await registry.refresh()

    assert registry.state_of("h-other") == "available" and registry.state_of("h-gone") == "unavailable"
    seen = {registry.peer_for("h-other") for _ in range(4)}
    assert seen == {"http://10.0.0.1:1", "http://10.0.0.1:2"}  # round robin over the live ones
    assert registry.peer_for("h-other", avoid={"http://10.0.0.1:1"}) == "http://10.0.0.1:2"
    assert registry.peer_for("h-other", avoid=seen) is None
    assert registry.peer_for("h-gone") is None
    assert "none of its controllers was heard from" in registry.why_unreachable("h-gone")
    assert "not known" in registry.why_unreachable("h-never")

    # Placement reads the store afresh: the other host has more memory free than this one says.
    await store.hosts.heartbeat(
        HostFacts(
            id="h-other",
            boot_id="b",
            name="other",
            runtimes=["host"],
            capacity=HostCapacity(memory_available_bytes=1 << 60),
        ),
        "c-1",
        "http://10.0.0.1:1",
        time.time(),
    )
    assert (await registry.place("host")).id == "h-other"
    assert (await registry.place("host", host=registry.host_id)).id == registry.host_id
    with pytest.raises(Unavailable):  # "container" is docker, which the other host does not offer now
        await registry.place("container", host="other")


async def test_draining_refuses_new_work_and_a_clean_stop_leaves(controller: LiveController) -> None:
    registry = controller.state.hosts
    await reported(registry)
    registry.require_open()
    own = await registry.store.hosts.set_flags(registry.host_id or "", draining=True)
    registry.own = own
    with pytest.raises(Unavailable) as info:
        registry.require_open()
    assert info.value.code == "host.draining"
    await registry.store.hosts.set_flags(registry.host_id or "", draining=False)
    await registry.report()
    registry.require_open()  # the heartbeat read the flag back
    # A clean stop, of a second registry beside the running one (whose heartbeat would write its row back).
    other = HostRegistry(
        registry.store,
        registry.link,
        controller_id="c-leaving",
        url="http://127.0.0.1:1",
        labels={},
        heartbeat_s=60,
        timeout_s=120,
        max_instances=0,
    )
    await other.report()
    assert "c-leaving" in {c.id for c in await registry.store.hosts.controllers()}
    await other.leave()
    assert "c-leaving" not in {c.id for c in await registry.store.hosts.controllers()}


async def test_rows_from_before_hosts_were_recorded_become_this_hosts(controller: LiveController) -> None:
    registry = controller.state.hosts
    store = registry.store
    await reported(registry)  # its own first report is over: the one below is the test's
    now = time.time()
    rec = InstanceRecord(id="old-1", name="old-1", runtime="host", state="stopped", created_at=now, updated_at=now)
    await store.instances.insert(rec)
    assert await store.instances.host_of("old-1") == (True, None)
    registry._placed_unplaced = False  # as at a start on a store from before
    await registry.report()
    assert await store.instances.host_of("old-1") == (True, registry.host_id)


async def test_the_first_report_follows_the_bound_port_at_once(hostd: LiveHostd, tmp_path: Path) -> None:
    # A heartbeat far apart: what this host is (drained, cordoned) is still known as it starts serving.
    env = controller_env(tmp_path / "c", hostd.socket_path, AIWG_HOST_HEARTBEAT_S="60", AIWG_HOST_TIMEOUT_S="120")
    async with serve_controller(load_config(env=env)) as live:
        with trio.fail_after(5):
            while live.state.hosts.own is None:
                await trio.sleep(0.02)
        [me] = await live.state.hosts.controllers()
        assert me.url == live.url
