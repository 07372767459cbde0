"""The VM provider's lifecycle against libvirt's built-in test hypervisor (``test:///default``).

The test driver keeps its domains in this process (every connection to ``test:///default`` in one
process shares them), needs no daemon and boots nothing, so these tests cover what hostd does
with libvirt: define from the template with the metadata mark, start, stop with grace then destroy,
undefine, image pinning, re-adoption by UUID and mark, domains that stop behind hostd's back, and
an unreachable libvirt, and sleep (suspend, managed save) and wake. Real guests are in
``test_guest.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from agentic_sandbox.hostd.config import HostdConfig
from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.hostd.instances import InstanceRegistry
from agentic_sandbox.hostd.proctree import Cgroups
from agentic_sandbox.hostd.providers.libvirt import domain
from agentic_sandbox.proto import ErrorCode, new_id
from agentic_sandbox.proto import messages as m
from tests.hostd.registries import make_config, open_registry
from tests.libvirt_service import fake_guest_image

libvirt = pytest.importorskip("libvirt")

TEST_URI = "test:///default"
WAIT_S = 15.0


def _pinned_file(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return f"{path}@sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.fixture
def config(tmp_path: Path) -> HostdConfig:
    fake_guest_image(tmp_path / "image")
    return make_config(
        tmp_path, libvirt_uri=TEST_URI, vm_domain_type="qemu", vm_image_dir=str(tmp_path / "image"), stop_grace_s=0.3
    )


@pytest.fixture
def conn() -> Any:
    c = libvirt.open(TEST_URI)
    yield c
    c.close()


async def _open(config: HostdConfig, nursery: trio.Nursery) -> InstanceRegistry:
    reg = open_registry(config, Cgroups.detect("off"), nursery)
    await reg.load()
    with trio.fail_after(WAIT_S):  # the provider connects in the background
        while not next(p for p in reg.providers() if p.runtime == "vm").available:
            await trio.sleep(0.01)
    return reg


@pytest.fixture
async def registry(config: HostdConfig, leak_check: None) -> AsyncIterator[InstanceRegistry]:
    async with trio.open_nursery() as nursery:
        reg = await _open(config, nursery)
        yield reg
        for info in reg.list():
            await reg.destroy(info.instance_id, 0.1)
        nursery.cancel_scope.cancel()


def vm_req(**fields: Any) -> m.InstanceProvisionRequest:
    fields.setdefault("instance_id", f"v-{new_id()}")
    fields.setdefault("name", "vm")
    return m.InstanceProvisionRequest(runtime="vm", **fields)


def domain_of(conn: Any, info: m.InstanceInfo) -> Any:
    assert info.vm is not None and info.vm.uuid
    return conn.lookupByUUIDString(info.vm.uuid)


def gone(conn: Any, uuid: str) -> bool:
    try:
        conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError as exc:
        return exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN
    return False


# ---------------------------------------------------------------------------------------------


async def test_provider_publishes_only_what_the_test_driver_can_do(registry: InstanceRegistry) -> None:
    vm = next(p for p in registry.providers() if p.runtime == "vm")
    assert (vm.provider, vm.available, vm.default, vm.reason) == ("libvirt", True, True, None)
    # The test driver has no console, no guest agent and no QEMU save images (no fork): nothing is
    # published that would not work.
    assert vm.capabilities == [
        "instance.start", "instance.stop", "instance.restart", "instance.destroy",
        "instance.snapshot", "instance.restore", "warm_pool.manage",
        "instance.sleep.freeze", "instance.sleep.save",
    ]  # fmt: skip


async def test_provision_defines_and_starts_a_marked_domain(
    registry: InstanceRegistry, config: HostdConfig, conn: Any
) -> None:
    req = vm_req(vm=m.VmSpec(memory_mib=96, vcpus=2), labels={"team": "a"})
    info = await registry.provision(req)
    assert (info.state, info.runtime, info.provider, info.working_dir) == ("running", "vm", "libvirt", "/")
    assert info.vm is not None
    assert info.vm.domain == f"aiwg-{config.namespace}-{req.instance_id}"
    assert (info.vm.memory_mib, info.vm.vcpus, info.vm.domain_type) == (96, 2, "qemu")
    assert info.vm.image_ref is not None and info.vm.image_ref.startswith(f"direct://{config.guest_image_dir}/vmlinuz@")
    dom = domain_of(conn, info)
    assert dom.isActive() and dom.isPersistent() and dom.name() == info.vm.domain
    mark = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, domain.METADATA_NS)
    assert domain.parse_mark(mark) == domain.DomainMark(req.instance_id, config.namespace)
    xml = dom.XMLDesc()
    assert "<graphics" not in xml and "org.qemu.guest_agent.0" in xml and "<console type='pty'" in xml
    assert f"<kernel>{config.guest_image_dir}/vmlinuz</kernel>" in xml
    assert dom.maxMemory() == 96 * 1024


async def test_stop_start_destroy(registry: InstanceRegistry, conn: Any) -> None:
    info = await registry.provision(vm_req(start=False))
    assert info.state == "stopped"
    dom = domain_of(conn, info)
    assert not dom.isActive()
    assert (await registry.start(info.instance_id)).state == "running"
    assert dom.isActive()
    assert (await registry.start(info.instance_id)).state == "running"  # idempotent
    # The test driver's guests ignore nothing: stop asks for a shutdown, and destroys past the grace.
    stopped = await registry.stop(info.instance_id, 0.2)
    assert stopped.state == "stopped" and not dom.isActive()
    assert (await registry.stop(info.instance_id, 0.2)).state == "stopped"
    assert (await registry.start(info.instance_id)).state == "running"
    assert info.vm is not None and info.vm.uuid
    destroyed = await registry.destroy(info.instance_id, 0.1)
    assert destroyed.state == "destroyed"
    assert gone(conn, info.vm.uuid)
    with pytest.raises(RpcError) as excinfo:
        registry.get(info.instance_id)
    assert excinfo.value.code is ErrorCode.INSTANCE_NOT_FOUND


async def test_image_refs_are_pinned_by_digest(registry: InstanceRegistry, tmp_path: Path, conn: Any) -> None:
    disk = _pinned_file(tmp_path / "disk.qcow2", b"qcow2 bytes")
    info = await registry.provision(vm_req(image=f"qcow2://{disk}"))
    assert info.vm is not None and info.vm.image_ref == f"qcow2://{disk}"
    xml = domain_of(conn, info).XMLDesc()
    assert f"<source file='{tmp_path / 'disk.qcow2'}'" in xml and "<transient/>" in xml and "<kernel>" not in xml
    kernel = _pinned_file(tmp_path / "k", b"k")
    initrd = _pinned_file(tmp_path / "i", b"i")
    info = await registry.provision(vm_req(image=f"direct://{kernel},{initrd}"))
    assert "<cmdline>console=ttyS0" in domain_of(conn, info).XMLDesc()

    before = {d.UUIDString() for d in conn.listAllDomains()}
    wrong = f"{tmp_path / 'disk.qcow2'}@sha256:{'0' * 64}"
    cases = {
        f"qcow2://{wrong}": "has sha256:",
        f"qcow2://{tmp_path / 'missing'}@sha256:{'0' * 64}": "No such file",
        "qcow2://relative.qcow2@sha256:" + "0" * 64: "absolute path",
        f"qcow2://{tmp_path / 'disk.qcow2'}": "absolute path>@sha256",
        f"direct://{kernel}": "direct:// takes",
        "docker://busybox": "only qcow2://",
    }
    for ref, why in cases.items():
        with pytest.raises(RpcError) as excinfo:
            await registry.provision(vm_req(image=ref))
        assert excinfo.value.code is ErrorCode.REQUEST_INVALID, ref
        assert why in excinfo.value.message, (ref, excinfo.value.message)
    assert {d.UUIDString() for d in conn.listAllDomains()} == before  # nothing defined for a refusal
    assert len(registry.list()) == 2


async def test_missing_guest_image_is_provider_unavailable(tmp_path: Path, leak_check: None) -> None:
    config = make_config(tmp_path, libvirt_uri=TEST_URI, vm_image_dir=str(tmp_path / "nothing-built"))
    async with trio.open_nursery() as nursery:
        reg = await _open(config, nursery)
        with pytest.raises(RpcError) as excinfo:
            await reg.provision(vm_req())
        assert excinfo.value.code is ErrorCode.PROVIDER_UNAVAILABLE
        assert "build-guest-image.py" in excinfo.value.message
        assert reg.list() == []
        nursery.cancel_scope.cancel()


async def test_readopt_after_restart_by_uuid_and_mark(config: HostdConfig, conn: Any, leak_check: None) -> None:
    async with trio.open_nursery() as nursery:
        first = await _open(config, nursery)
        kept = await first.provision(vm_req(name="kept"))
        stopped = await first.provision(vm_req(name="stopped-while-down"))
        vanished = await first.provision(vm_req(name="vanished"))
        await first.shutdown()
        nursery.cancel_scope.cancel()
    # While hostd is down: one domain shuts off, one is removed behind its back.
    domain_of(conn, stopped).destroy()
    dom = domain_of(conn, vanished)
    dom.destroy()
    dom.undefine()
    async with trio.open_nursery() as nursery:
        second = await _open(config, nursery)
        info = second.get(kept.instance_id)
        assert (info.state, info.adopted) == ("running", True)
        assert info.vm is not None and info.vm.uuid == kept.vm.uuid  # type: ignore[union-attr]
        info = second.get(stopped.instance_id)
        assert (info.state, info.adopted) == ("stopped", False) and "shut off while hostd was down" in (info.note or "")
        info = second.get(vanished.instance_id)
        assert info.state == "failed" and "no longer exists" in (info.note or "")
        for iid in (kept.instance_id, stopped.instance_id, vanished.instance_id):
            await second.destroy(iid, 0.1)
        assert gone(conn, kept.vm.uuid)  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()


async def test_another_hostds_domain_is_not_adopted(tmp_path: Path, conn: Any, leak_check: None) -> None:
    """Same instance id, different state dir (another hostd on the same libvirt): the mark differs."""
    first_config = make_config(tmp_path / "a", libvirt_uri=TEST_URI, vm_image_dir=str(tmp_path / "image"))
    fake_guest_image(tmp_path / "image")
    async with trio.open_nursery() as nursery:
        first = await _open(first_config, nursery)
        info = await first.provision(vm_req(instance_id="same-id"))
        # The other hostd's state file claims the same id and UUID.
        second_config = make_config(tmp_path / "b", libvirt_uri=TEST_URI, vm_image_dir=str(tmp_path / "image"))
        from agentic_sandbox.hostd import statefile

        statefile.write(second_config.state_file, [statefile.PersistedInstance(info=info)])
        second = await _open(second_config, nursery)
        theirs = second.get("same-id")
        assert theirs.state == "failed" and "no longer exists" in (theirs.note or "")
        assert domain_of(conn, info).isActive()  # untouched
        await first.destroy("same-id", 0.1)
        nursery.cancel_scope.cancel()


async def test_domain_that_shuts_off_by_itself_is_noticed(registry: InstanceRegistry, conn: Any) -> None:
    info = await registry.provision(vm_req())
    domain_of(conn, info).destroy()  # as if the guest powered off
    with trio.fail_after(WAIT_S):
        while (now := registry.get(info.instance_id)).state == "running":
            await trio.sleep(0.05)
    assert now.state == "stopped" and "shut off by itself" in (now.note or "")
    assert (await registry.start(info.instance_id)).state == "running"


async def test_sessions_and_execs_are_refused_without_console_or_agent(registry: InstanceRegistry) -> None:
    info = await registry.provision(vm_req())
    placement = registry.placement(info.instance_id)
    for tty in (True, False):
        with pytest.raises(RpcError) as excinfo:
            placement.spawn_spec(["sh"], None, {}, tty=tty)
        assert excinfo.value.code is ErrorCode.UNSUPPORTED


async def test_unreachable_libvirt_is_reported_and_provision_fails_with_the_reason(
    tmp_path: Path, leak_check: None
) -> None:
    uri = f"qemu+unix:///system?socket={tmp_path / 'no-libvirtd.sock'}"
    config = make_config(tmp_path, libvirt_uri=uri)
    async with trio.open_nursery() as nursery:
        reg = open_registry(config, Cgroups.detect("off"), nursery)
        await reg.load()
        with trio.fail_after(WAIT_S):
            while "cannot connect" not in ((vm := next(p for p in reg.providers() if p.runtime == "vm")).reason or ""):
                await trio.sleep(0.01)
        assert not vm.available and "no-libvirtd.sock" in (vm.reason or "")
        with pytest.raises(RpcError) as excinfo:
            await reg.provision(vm_req())
        assert excinfo.value.code is ErrorCode.PROVIDER_UNAVAILABLE
        assert "cannot connect to libvirt" in excinfo.value.message
        assert reg.list() == []
        nursery.cancel_scope.cancel()


async def test_checkpoint_retires_the_instance_and_restore_brings_it_back_once(
    registry: InstanceRegistry, config: HostdConfig, conn: Any
) -> None:
    source = await registry.provision(vm_req(name="base"))
    assert {"instance.snapshot", "instance.restore"} <= set(source.capabilities)
    assert "instance.fork" not in source.capabilities  # the test driver's save images are not QEMU's
    saved = await registry.copies.checkpoint(source.instance_id, "cp-1")
    assert (saved.source_instance_id, saved.source_name, saved.runtime, saved.provider) == (
        source.instance_id, "base", "vm", "libvirt",
    )  # fmt: skip
    assert saved.uuid == source.vm.uuid and saved.size_bytes > 0  # type: ignore[union-attr]
    assert [c.checkpoint_id for c in registry.copies.checkpoints()] == ["cp-1"]
    with pytest.raises(RpcError) as excinfo:
        registry.get(source.instance_id)
    assert excinfo.value.code is ErrorCode.INSTANCE_NOT_FOUND  # retired into the checkpoint
    assert not domain_of(conn, source).isActive()  # shut off, still defined for the restore

    restored = await registry.copies.restore(
        m.CheckpointRestoreRequest(checkpoint_id="cp-1", instance_id="tenant-1", name="tenant", labels={"t": "1"})
    )
    assert (restored.instance_id, restored.name, restored.state, restored.labels) == (
        "tenant-1", "tenant", "running", {"t": "1"},
    )  # fmt: skip
    dom = domain_of(conn, restored)
    assert dom.isActive() and dom.UUIDString() == saved.uuid
    mark = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, domain.METADATA_NS)
    assert domain.parse_mark(mark) == domain.DomainMark("tenant-1", config.namespace)
    assert registry.copies.checkpoints() == []  # single use
    with pytest.raises(RpcError) as excinfo:
        await registry.copies.restore(
            m.CheckpointRestoreRequest(checkpoint_id="cp-1", instance_id="tenant-2", name="t2")
        )
    assert excinfo.value.code is ErrorCode.CHECKPOINT_NOT_FOUND


async def test_checkpoint_refusals(registry: InstanceRegistry) -> None:
    stopped = await registry.provision(vm_req(start=False))
    with pytest.raises(RpcError) as excinfo:
        await registry.copies.checkpoint(stopped.instance_id, "cp-stopped")
    assert excinfo.value.code is ErrorCode.INSTANCE_INVALID_STATE
    running = await registry.provision(vm_req())
    await registry.copies.checkpoint(running.instance_id, "cp-taken")
    other = await registry.provision(vm_req())
    with pytest.raises(RpcError) as excinfo:
        await registry.copies.checkpoint(other.instance_id, "cp-taken")
    assert excinfo.value.code is ErrorCode.REQUEST_INVALID and "already exists" in excinfo.value.message
    assert registry.get(other.instance_id).state == "running"  # untouched by the refusal
    with pytest.raises(RpcError) as excinfo:
        await registry.copies.restore(
            m.CheckpointRestoreRequest(checkpoint_id="cp-taken", instance_id=other.instance_id, name="x")
        )
    assert excinfo.value.code is ErrorCode.INSTANCE_EXISTS
    host = await registry.provision(m.InstanceProvisionRequest(instance_id=f"h-{new_id()}", name="host"))
    with pytest.raises(RpcError) as excinfo:
        await registry.copies.checkpoint(host.instance_id, "cp-host")
    assert excinfo.value.code is ErrorCode.UNSUPPORTED
    restored = await registry.copies.restore(
        m.CheckpointRestoreRequest(checkpoint_id="cp-taken", instance_id="r1", name="r")
    )
    assert restored.state == "running"


async def test_fork_is_refused_where_it_cannot_work(registry: InstanceRegistry, conn: Any) -> None:
    source = await registry.provision(vm_req(name="source"))
    before = {d.UUIDString() for d in conn.listAllDomains()}
    with pytest.raises(RpcError) as excinfo:
        await registry.copies.fork(
            m.InstanceForkRequest(source_instance_id=source.instance_id, instance_id="f1", name="f")
        )
    assert excinfo.value.code is ErrorCode.UNSUPPORTED and "cannot be forked" in excinfo.value.message
    assert {d.UUIDString() for d in conn.listAllDomains()} == before  # nothing made for the refusal
    assert [i.instance_id for i in registry.list()] == [source.instance_id]
    with pytest.raises(RpcError) as excinfo:
        await registry.copies.fork(m.InstanceForkRequest(source_instance_id="nope", instance_id="f2", name="f"))
    assert excinfo.value.code is ErrorCode.INSTANCE_NOT_FOUND


async def test_stray_domains_are_reported_never_touched(
    registry: InstanceRegistry, config: HostdConfig, conn: Any
) -> None:
    """A domain carrying this hostd's mark that no instance or checkpoint holds, and one named like
    this hostd's domains but without its mark, are strays; someone else's domain is not."""
    kept = await registry.provision(vm_req(name="kept"))
    await registry.copies.checkpoint((await registry.provision(vm_req(name="saved"))).instance_id, "cp-held")
    marked = domain.render(
        domain.DomainSpec(
            name="someone-copied-it", domain_type="qemu", memory_mib=64, vcpus=1,
            instance_id="gone-instance", namespace=config.namespace,
        )
    )  # fmt: skip
    copied = domain.render(
        domain.DomainSpec(
            name="a-copy-of-kept", domain_type="qemu", memory_mib=64, vcpus=1,
            instance_id=kept.instance_id, namespace=config.namespace,
        )
    )  # fmt: skip
    bare = "<domain type='test'><name>{}</name><memory>65536</memory><os><type>hvm</type></os></domain>"
    unmarked, foreign = bare.format(f"aiwg-{config.namespace}-orphan"), bare.format("not-ours")
    made = [conn.defineXML(xml) for xml in (marked, copied, unmarked, foreign)]
    try:
        with trio.fail_after(WAIT_S):
            while not (vm := next(p for p in registry.providers() if p.runtime == "vm")).strays:
                await trio.sleep(0.05)
        # A copy carrying the mark of a live instance (another UUID) is not that instance.
        assert vm.strays == ["a-copy-of-kept", f"aiwg-{config.namespace}-orphan (no hostd mark)", "someone-copied-it"]
        assert all(d.isPersistent() for d in made)  # reported, never touched
        assert kept.vm is not None and domain_of(conn, kept).isActive()
    finally:
        for dom in made:
            dom.undefine()


# -- sleep: suspended (freeze) or managed-saved (save), and woken -------------------------------


async def test_a_vm_freezes_and_saves_and_wakes_from_either(registry: InstanceRegistry, conn: Any) -> None:
    vm = next(p for p in registry.providers() if p.runtime == "vm")
    assert {"instance.sleep.freeze", "instance.sleep.save"} <= set(vm.capabilities)
    info = await registry.provision(vm_req())
    iid = info.instance_id
    dom = domain_of(conn, info)

    info = await registry.sleep.sleep(iid, "freeze", "operator")
    assert info.state == "sleeping" and info.sleep is not None and info.sleep.how == "freeze"
    assert dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED
    await trio.sleep(2.5)  # a watcher round: a paused domain is no stop of its own
    assert registry.get(iid).state == "sleeping"
    info, woke = await registry.sleep.wake(iid, "exec")
    assert woke and info.state == "running" and dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    assert info.last_wake is not None and (info.last_wake.cause, info.last_wake.how) == ("exec", "freeze")

    info = await registry.sleep.sleep(iid, "save", "idle")
    assert info.sleep is not None and info.sleep.how == "save"
    assert not dom.isActive() and dom.hasManagedSaveImage(0)
    await trio.sleep(2.5)  # shut off, but asleep: no stop of its own either
    assert registry.get(iid).state == "sleeping"
    info, woke = await registry.sleep.wake(iid, "attach")
    assert woke and info.state == "running" and dom.isActive() and not dom.hasManagedSaveImage(0)
    assert (info.sleeps, info.wakes) == (2, 2)


async def test_a_policy_of_save_is_followed_and_a_saved_vm_is_destroyed_whole(
    registry: InstanceRegistry, conn: Any
) -> None:
    info = await registry.provision(vm_req(idle=m.IdlePolicy(after_s=1, sleep="save")))
    with trio.fail_after(10):
        while (info := registry.get(info.instance_id)).state != "sleeping":
            await trio.sleep(0.05)
    assert info.sleep is not None and (info.sleep.how, info.sleep.cause) == ("save", "idle")
    assert domain_of(conn, info).hasManagedSaveImage(0)
    assert info.vm is not None and info.vm.uuid
    await registry.destroy(info.instance_id, 0.1)
    assert gone(conn, info.vm.uuid)


async def test_a_stop_wakes_it_first_and_a_wake_that_cannot_be_is_named(registry: InstanceRegistry, conn: Any) -> None:
    info = await registry.provision(vm_req())
    await registry.sleep.sleep(info.instance_id, "save", "operator")
    info = await registry.stop(info.instance_id, 0.1)
    assert info.state == "stopped" and info.last_wake is not None and info.last_wake.cause == "stop"

    other = await registry.provision(vm_req(name="lost"))
    await registry.sleep.sleep(other.instance_id, "save", "operator")
    dom = domain_of(conn, other)
    dom.managedSaveRemove(0)  # its memory file lost behind hostd's back
    with pytest.raises(RpcError) as failed:
        await registry.sleep.wake(other.instance_id, "exec")
    assert failed.value.code == ErrorCode.INSTANCE_WAKE_FAILED
    assert other.instance_id in failed.value.message and "managed save image" in failed.value.message
    assert registry.get(other.instance_id).state == "sleeping"  # as it was: nothing booted afresh


async def test_a_vm_asleep_across_a_hostd_restart(config: HostdConfig, conn: Any, leak_check: None) -> None:
    async with trio.open_nursery() as nursery:
        first = await _open(config, nursery)
        frozen = await first.provision(vm_req(name="frozen"))
        saved = await first.provision(vm_req(name="saved"))
        resumed = await first.provision(vm_req(name="resumed"))
        for info, how in ((frozen, "freeze"), (saved, "save"), (resumed, "freeze")):
            await first.sleep.sleep(info.instance_id, how, "operator")  # type: ignore[arg-type]
        await first.shutdown()
        nursery.cancel_scope.cancel()
    domain_of(conn, resumed).resume()  # woken by hand while hostd was down
    async with trio.open_nursery() as nursery:
        second = await _open(config, nursery)
        for info, how in ((frozen, "freeze"), (saved, "save")):
            again = second.get(info.instance_id)
            assert again.state == "sleeping" and again.sleep is not None and again.sleep.how == how
            woken, woke = await second.sleep.wake(info.instance_id, "exec")
            assert woke and woken.state == "running"
        again = second.get(resumed.instance_id)
        assert again.state == "running" and again.sleep is None
        for info in (frozen, saved, resumed):
            await second.destroy(info.instance_id, 0.1)
        nursery.cancel_scope.cancel()
