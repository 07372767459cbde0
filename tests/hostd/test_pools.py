"""Warm pools (``hostd.pools``) of VM slots on libvirt's test hypervisor: fill, claim, refill,
resize, delete, and a hostd restart with a pool half filled.

The test driver boots nothing and keeps its domains in this process, so a "restart" here is a new
registry and pool service over the same state dir while the domains stay. VM slots are saved
(booted, then checkpointed); a claim restores one under its own domain and UUID with the new
instance's mark. Container pools run against real podman in ``test_podman_pools.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from agentic_sandbox.hostd.config import HostdConfig
from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.hostd.instancecopies import InstanceCopies
from agentic_sandbox.hostd.instances import InstanceRegistry
from agentic_sandbox.hostd.pools import WarmPools
from agentic_sandbox.hostd.proctree import Cgroups
from agentic_sandbox.hostd.providers.libvirt import domain
from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m
from tests.hostd.registries import make_config, open_registry
from tests.libvirt_service import fake_guest_image

libvirt = pytest.importorskip("libvirt")

TEST_URI = "test:///default"
WAIT_S = 20.0
TEMPLATE = m.PoolTemplate(runtime="vm", loadout="tiny-vm", vm=m.VmSpec(memory_mib=64))


@pytest.fixture
def config(tmp_path: Path) -> HostdConfig:
    fake_guest_image(tmp_path / "image")
    return make_config(tmp_path, libvirt_uri=TEST_URI, vm_domain_type="qemu", vm_image_dir=str(tmp_path / "image"))


@pytest.fixture
def conn() -> Any:
    c = libvirt.open(TEST_URI)
    yield c
    c.close()


class Hostd:
    """A registry and its pools, as ``hostd.main`` wires them, in one nursery."""

    def __init__(self, registry: InstanceRegistry, pools: WarmPools, nursery: trio.Nursery) -> None:
        self.registry, self.pools, self.nursery = registry, pools, nursery

    def pool(self, name: str) -> m.PoolInfo:
        return next(p for p in self.pools.list() if p.pool == name)

    async def until(self, name: str, ready: int) -> m.PoolInfo:
        with trio.fail_after(WAIT_S):
            while (info := self.pool(name)).ready != ready or info.filling:
                await trio.sleep(0.02)
        return info

    async def stop(self) -> None:
        await self.registry.shutdown()
        self.pools.flush()
        self.nursery.cancel_scope.cancel()


async def start(config: HostdConfig, nursery: trio.Nursery) -> Hostd:
    registry = open_registry(config, Cgroups.detect("off"), nursery)
    await registry.load()
    with trio.fail_after(WAIT_S):
        while not next(p for p in registry.providers() if p.runtime == "vm").available:
            await trio.sleep(0.01)
    pools = WarmPools(config, registry)
    await pools.load()
    await nursery.start(pools.run)
    return Hostd(registry, pools, nursery)


@pytest.fixture
async def hostd(config: HostdConfig, leak_check: None) -> AsyncIterator[Hostd]:
    async with trio.open_nursery() as nursery:
        running = await start(config, nursery)
        yield running
        for name in [p.pool for p in running.pools.list()]:
            running.pools.delete(name)
        with trio.fail_after(WAIT_S):
            while running.registry.slots() or any(c.pool for c in running.registry.copies.checkpoints()):
                await trio.sleep(0.02)
        for info in running.registry.list():
            await running.registry.destroy(info.instance_id, 0.1)
        nursery.cancel_scope.cancel()


def domains(conn: Any, config: HostdConfig) -> dict[str, Any]:
    """This hostd's domains (by its mark), by UUID."""
    out = {}
    for dom in conn.listAllDomains():
        try:
            mark = domain.parse_mark(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, domain.METADATA_NS))
        except libvirt.libvirtError:
            continue
        if mark is not None and mark.namespace == config.namespace:
            out[dom.UUIDString()] = dom
    return out


# ---------------------------------------------------------------------------------------------


async def test_pool_fills_with_saved_slots_and_a_claim_restores_one_as_the_new_instance(
    hostd: Hostd, config: HostdConfig, conn: Any
) -> None:
    info = hostd.pools.set(m.PoolSetRequest(pool="vms", template=TEMPLATE, size=2))
    assert (info.runtime, info.provider, info.source, info.size) == ("vm", "libvirt", "template", 2)
    info = await hostd.until("vms", 2)
    assert (info.refills, info.failures, info.hits, info.misses) == (2, 0, 0, 0)
    # Slots wait saved: checkpoints of the pool, each its own shut-off domain; no instance anyone sees.
    slots = [c for c in hostd.registry.copies.checkpoints() if c.pool == "vms"]
    assert len(slots) == 2 and len({c.uuid for c in slots}) == 2
    assert hostd.registry.list() == [] and hostd.registry.slots() == []
    assert not any(d.isActive() for d in domains(conn, config).values())

    claimed = await hostd.pools.claim(
        m.PoolClaimRequest(pool="vms", instance_id="tenant-1", name="tenant", labels={"team": "a"})
    )
    assert (claimed.instance_id, claimed.name, claimed.state, claimed.labels) == (
        "tenant-1", "tenant", "running", {"team": "a"},
    )  # fmt: skip
    assert (claimed.launched_from, claimed.pool, claimed.loadout) == ("warm_pool:vms", None, "tiny-vm")
    oldest = min(slots, key=lambda c: c.created_at)
    assert claimed.vm is not None and claimed.vm.uuid == oldest.uuid  # the oldest slot, under its own UUID
    dom = conn.lookupByUUIDString(claimed.vm.uuid)
    assert dom.isActive()
    mark = domain.parse_mark(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, domain.METADATA_NS))
    assert mark == domain.DomainMark("tenant-1", config.namespace)  # relabelled for its new instance
    assert [i.instance_id for i in hostd.registry.list()] == ["tenant-1"]
    # The pool refills in the background.
    info = await hostd.until("vms", 2)
    assert (info.hits, info.misses, info.refills) == (1, 0, 3)


async def test_an_empty_pool_is_a_miss_and_refusals_name_what_is_wrong(hostd: Hostd) -> None:
    hostd.pools.set(m.PoolSetRequest(pool="none", template=TEMPLATE, size=0))
    with pytest.raises(RpcError) as excinfo:
        await hostd.pools.claim(m.PoolClaimRequest(pool="none", instance_id="x", name="x"))
    assert excinfo.value.code is ErrorCode.POOL_EMPTY
    assert hostd.pool("none").misses == 1
    with pytest.raises(RpcError) as excinfo:
        await hostd.pools.claim(m.PoolClaimRequest(pool="nope", instance_id="x", name="x"))
    assert excinfo.value.code is ErrorCode.POOL_NOT_FOUND
    with pytest.raises(RpcError) as excinfo:
        hostd.pools.set(m.PoolSetRequest(pool="hosts", template=m.PoolTemplate(runtime="host"), size=1))
    assert excinfo.value.code is ErrorCode.UNSUPPORTED and "no warm pools" in excinfo.value.message
    with pytest.raises(RpcError) as excinfo:
        hostd.pools.set(m.PoolSetRequest(pool="gpu", template=m.PoolTemplate(runtime="gpu"), size=1))
    assert excinfo.value.code is ErrorCode.PROVIDER_UNAVAILABLE


async def test_a_failing_template_backs_off_and_says_why(hostd: Hostd, tmp_path: Path) -> None:
    broken = m.PoolTemplate(runtime="vm", image=f"qcow2://{tmp_path}/missing.qcow2@sha256:{'0' * 64}")
    hostd.pools.set(m.PoolSetRequest(pool="broken", template=broken, size=1))
    with trio.fail_after(WAIT_S):
        while (info := hostd.pool("broken")).failures < 2:
            await trio.sleep(0.02)
    assert info.ready == 0 and "missing.qcow2" in (info.last_error or "")
    # It backs off (1 s, then 2 s, ...): not a retry storm.
    await trio.sleep(0.5)
    assert hostd.pool("broken").failures <= 3
    assert hostd.registry.slots() == [] and hostd.registry.list() == []  # nothing left of the attempts


async def test_resizing_a_pool_and_changing_its_template(hostd: Hostd) -> None:
    hostd.pools.set(m.PoolSetRequest(pool="vms", template=TEMPLATE, size=3))
    await hostd.until("vms", 3)
    hostd.pools.set(m.PoolSetRequest(pool="vms", template=TEMPLATE, size=1))
    assert hostd.pool("vms").ready == 1  # at once: the surplus is no longer handed out
    with trio.fail_after(WAIT_S):  # and is destroyed in the background
        while len([c for c in hostd.registry.copies.checkpoints() if c.pool == "vms"]) != 1:
            await trio.sleep(0.02)
    bigger = m.PoolTemplate(runtime="vm", loadout="tiny-vm", vm=m.VmSpec(memory_mib=96))
    hostd.pools.set(m.PoolSetRequest(pool="vms", template=bigger, size=1))
    info = await hostd.until("vms", 1)
    assert info.template is not None and info.template.vm == bigger.vm
    claimed = await hostd.pools.claim(m.PoolClaimRequest(pool="vms", instance_id="t", name="t"))
    assert claimed.vm is not None and claimed.vm.memory_mib == 96  # made from the new template


async def test_a_pool_of_checkpoints_hands_each_out_once(hostd: Hostd) -> None:
    for i in range(2):
        base = await hostd.registry.provision(
            m.InstanceProvisionRequest(instance_id=f"base-{i}", name="b", runtime="vm")
        )
        await hostd.registry.copies.checkpoint(base.instance_id, f"cp-{i}")
    info = hostd.pools.from_checkpoints(m.PoolFromCheckpointsRequest(pool="given", checkpoint_ids=["cp-0", "cp-1"]))
    assert (info.source, info.size, info.ready, info.runtime) == ("checkpoints", 2, 2, "vm")
    # A pool's checkpoint is not restored around the pool.
    with pytest.raises(RpcError) as excinfo:
        await hostd.registry.copies.restore(m.CheckpointRestoreRequest(checkpoint_id="cp-0", instance_id="x", name="x"))
    assert excinfo.value.code is ErrorCode.REQUEST_INVALID and "claim it from the pool" in excinfo.value.message
    with pytest.raises(RpcError) as excinfo:
        hostd.pools.from_checkpoints(m.PoolFromCheckpointsRequest(pool="again", checkpoint_ids=["cp-1"]))
    assert excinfo.value.code is ErrorCode.REQUEST_INVALID and "already a slot" in excinfo.value.message
    first = await hostd.pools.claim(m.PoolClaimRequest(pool="given", instance_id="t-0", name="t0"))
    second = await hostd.pools.claim(m.PoolClaimRequest(pool="given", instance_id="t-1", name="t1"))
    assert {first.launched_from, second.launched_from} == {"warm_pool:given"}
    with pytest.raises(RpcError) as excinfo:
        await hostd.pools.claim(m.PoolClaimRequest(pool="given", instance_id="t-2", name="t2"))
    assert excinfo.value.code is ErrorCode.POOL_EMPTY  # never refilled
    info = hostd.pool("given")
    assert (info.hits, info.misses, info.ready) == (2, 1, 0)


async def test_deleting_a_checkpoint_pool_releases_its_checkpoints(hostd: Hostd) -> None:
    base = await hostd.registry.provision(m.InstanceProvisionRequest(instance_id="base", name="b", runtime="vm"))
    await hostd.registry.copies.checkpoint(base.instance_id, "cp-kept")
    hostd.pools.from_checkpoints(m.PoolFromCheckpointsRequest(pool="given", checkpoint_ids=["cp-kept"]))
    hostd.pools.delete("given")
    assert [(c.checkpoint_id, c.pool) for c in hostd.registry.copies.checkpoints()] == [("cp-kept", None)]
    restored = await hostd.registry.copies.restore(
        m.CheckpointRestoreRequest(checkpoint_id="cp-kept", instance_id="back", name="back")
    )
    assert restored.state == "running"


async def test_restart_with_a_pool_half_filled_loses_and_leaks_nothing(
    config: HostdConfig, conn: Any, leak_check: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hostd stops while a slot is being made (booted, not yet saved): the next hostd removes that
    half-made slot, keeps the ready ones, and fills the pool up again. No domain is left over."""
    gate = trio.Event()
    real_wait = InstanceCopies.wait_usable

    async def held(self: InstanceCopies, instance_id: str) -> None:
        if not gate.is_set():
            await trio.sleep_forever()  # the second slot's guest never "boots" in the first hostd
        await real_wait(self, instance_id)

    async with trio.open_nursery() as nursery:
        first = await start(config, nursery)
        first.pools.set(m.PoolSetRequest(pool="vms", template=TEMPLATE, size=2))
        gate.set()
        await first.until("vms", 2)
        claimed = await first.pools.claim(m.PoolClaimRequest(pool="vms", instance_id="kept", name="kept"))
        gate = trio.Event()
        monkeypatch.setattr(InstanceCopies, "wait_usable", held)
        with trio.fail_after(WAIT_S):  # the refill's VM is defined and running, waiting to "boot"
            while not (booting := [s for s in first.registry.slots("vms") if s.state == "running"]):
                await trio.sleep(0.02)
        half = booting[0]
        counters = first.pool("vms")
        await first.stop()
    assert half.vm is not None and conn.lookupByUUIDString(half.vm.uuid).isActive()  # left by the "crash"

    monkeypatch.setattr(InstanceCopies, "wait_usable", real_wait)
    async with trio.open_nursery() as nursery:
        second = await start(config, nursery)
        info = await second.until("vms", 2)
        assert (info.hits, info.refills) == (counters.hits, counters.refills + 1)  # counters survived
        with pytest.raises(RpcError):
            second.registry.get(half.instance_id)
        assert second.registry.get("kept").state == "running"  # the claimed instance is just an instance
        held_uuids = {c.uuid for c in second.registry.copies.checkpoints()}
        live = {i.vm.uuid for i in second.registry.list() if i.vm}
        assert set(domains(conn, config)) == held_uuids | live  # no domain of this hostd unaccounted for
        assert half.vm.uuid not in held_uuids | live
        second.pools.delete("vms")
        with trio.fail_after(WAIT_S):
            while any(c.pool for c in second.registry.copies.checkpoints()):
                await trio.sleep(0.02)
        await second.registry.destroy(claimed.instance_id, 0.1)
        assert domains(conn, config) == {}
        await second.stop()


async def test_a_slot_of_a_pool_that_is_gone_is_removed_at_start(
    config: HostdConfig, conn: Any, leak_check: None
) -> None:
    async with trio.open_nursery() as nursery:
        first = await start(config, nursery)
        first.pools.set(m.PoolSetRequest(pool="vms", template=TEMPLATE, size=1))
        await first.until("vms", 1)
        await first.stop()
    config.pools_file.unlink()  # the definitions are lost; the slot's checkpoint is still there
    async with trio.open_nursery() as nursery:
        second = await start(config, nursery)
        with trio.fail_after(WAIT_S):
            while second.registry.copies.checkpoints():
                await trio.sleep(0.02)
        assert domains(conn, config) == {}
        await second.stop()
