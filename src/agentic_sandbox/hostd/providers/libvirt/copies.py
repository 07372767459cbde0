"""VM instances made from other VM instances (the fork), and what warm pools of VMs need.

Fork (``instance.fork``, QEMU only, VMs without a disk): a live external memory snapshot of the
running source (it keeps running; QEMU pauses it only for the last pages) into
``<state>/forks/<id>.mem``, whose image then gets the fork's own domain name, UUID and mark
(:mod:`.saveimage`: libvirt's API refuses to restore under another identity), restored as a new
domain and made persistent; the snapshot file goes right after (and at the next start, if hostd
died meanwhile). A warm pool's VM slot is saved once its guest agent answers
(:meth:`VmCopies.wait_usable`); a slot thrown away unclaimed takes its shut-off domain along
(:meth:`VmCopies.drop_checkpoint`).

:class:`VmCopies` is held by the VM provider, which hands it what it uses when it builds it.
"""

from __future__ import annotations

import time
import uuid as uuid_mod
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from ...config import HostdConfig
from ...errors import RpcError
from ...statefile import mkdir_private
from ..base import Instance, Saved
from . import connection, saveimage
from .connection import LONG_CALL_TIMEOUT_S, LibvirtLink
from .domain import domain_name

#: Only the QEMU driver: the fork restamps a QEMU save image (the test driver writes its own format).
FORK = "instance.fork"
#: How long a pool slot's guest gets to boot (its agent to answer) before it is saved.
SLOT_BOOT_WAIT_S = 180.0


def make_dir(inst_dir: Path) -> None:
    mkdir_private(inst_dir.parent)
    mkdir_private(inst_dir)


def vm_detail(instance: Instance) -> m.VmDetail:
    assert instance.info.vm is not None
    return instance.info.vm


class VmCopies:
    """See the module docstring. ``instances`` is the provider's table of its instances (a fork is
    entered there before its domain is restored, so the watcher knows it); ``capabilities`` says
    what one instance can do (a VM with a disk cannot be forked)."""

    def __init__(
        self,
        config: HostdConfig,
        link: LibvirtLink,
        instances: dict[str, Instance],
        *,
        emulated: bool,
        capabilities: Callable[[m.InstanceInfo], list[str]],
    ) -> None:
        self._config = config
        self._link = link
        self._instances = instances
        self._emulated = emulated
        self._capabilities = capabilities

    async def drop_checkpoint(self, saved: Saved) -> None:
        """Undefine the saved domain (shut off since its save), unless something runs it again."""
        try:
            vm = msgspec.convert(saved.get("vm"), m.VmDetail)
        except (msgspec.ValidationError, TypeError):
            return

        def undefine(conn: Any) -> None:
            dom = connection.lookup(conn, vm.uuid or "") if vm.uuid else None
            if dom is not None and not connection.is_active(dom):
                dom.undefine()

        await self._link.call(undefine)

    # -- fork and warm pools --------------------------------------------------------------------

    async def fork(self, source: Instance, instance: Instance) -> None:
        """A copy of the running ``source`` as ``instance`` (module docstring): live memory snapshot,
        restamped with the fork's identity, restored as a new persistent domain."""
        src = vm_detail(source)
        if FORK not in self._capabilities(source.info) or src.uuid is None:
            raise RpcError(
                ErrorCode.UNSUPPORTED,
                f"instance {source.id!r} cannot be forked: libvirt at {src.uri} "
                + ("has no QEMU save images" if self._emulated else "cannot copy a VM with a disk"),
                capability=FORK,
            )
        info = instance.info
        info.vm = msgspec.structs.replace(
            src, domain=domain_name(self._config.namespace, info.instance_id), uuid=str(uuid_mod.uuid4())
        )
        info.working_dir, info.instance_dir = "/", str(self._config.instances_dir / info.instance_id)
        path = self._config.forks_dir / f"{info.instance_id}.mem"
        await trio.to_thread.run_sync(make_dir, self._config.forks_dir)
        await trio.to_thread.run_sync(make_dir, Path(info.instance_dir))
        snapshot = (
            "<domainsnapshot><name>aiwg-fork</name>"
            f"<memory snapshot='external' file={quoteattr(str(path))}/><disks/></domainsnapshot>"
        )

        def snap(conn: Any) -> None:
            libvirt = connection.libvirt_module()
            flags = libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_LIVE | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_NO_METADATA
            connection.existing(conn, src).snapshotCreateXML(snapshot, flags)

        vm = info.vm

        def restore(conn: Any) -> None:
            libvirt = connection.libvirt_module()
            conn.restore(str(path))
            dom = connection.existing(conn, vm)
            # Restored transient; defined so it stops, starts and outlives a shutdown as any VM does.
            conn.defineXML(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE))

        try:
            await self._link.call(snap, timeout_s=LONG_CALL_TIMEOUT_S)
            try:
                await trio.to_thread.run_sync(
                    lambda: saveimage.restamp(
                        path,
                        name=vm.domain,
                        uuid=vm.uuid or "",
                        instance_id=info.instance_id,
                        namespace=self._config.namespace,
                    )
                )
            except saveimage.SaveImageError as exc:
                raise RpcError(ErrorCode.UNSUPPORTED, f"instance {source.id!r} cannot be forked: {exc}") from None
            self._instances[info.instance_id] = instance
            await self._link.call(restore, timeout_s=LONG_CALL_TIMEOUT_S)
        finally:
            await trio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))
        info.state, info.started_at, info.stopped_at = "running", time.time(), None

    async def wait_usable(self, instance: Instance) -> None:
        """Until the guest agent answers (the guest has booted); at once where there is no agent."""
        vm = vm_detail(instance)
        if self._emulated:
            return

        def ping(conn: Any) -> bool:
            import libvirt_qemu

            libvirt = connection.libvirt_module()
            try:
                libvirt_qemu.qemuAgentCommand(connection.existing(conn, vm), '{"execute": "guest-ping"}', 5, 0)
            except libvirt.libvirtError:
                return False
            return True

        with trio.fail_after(SLOT_BOOT_WAIT_S):
            while not await self._link.call(ping):
                await trio.sleep(0.5)
