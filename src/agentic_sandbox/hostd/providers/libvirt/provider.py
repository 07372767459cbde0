"""The VM runtime: an instance is a libvirt domain (provider ``libvirt``).

Lifecycle: ``provision`` checks the boot image (:mod:`.bootimage`) and defines a persistent domain
from the template (:mod:`.domain`) with hostd's metadata mark; ``start`` creates (boots) it;
``stop`` ends the instance's sessions and execs, asks the guest to shut down (ACPI), waits the grace
period and destroys (powers off) what is still running; ``discard`` destroys and undefines the
domain and removes the instance's directory. Every libvirt call runs in a worker thread
(:mod:`.connection`).

A domain that stops by itself (the guest powered off or crashed) is noticed by the watcher, which
polls the domains of running instances every :data:`POLL_S` seconds: the instance becomes
``stopped`` (or ``failed`` when libvirt says it crashed). The watcher also reconnects a broken
connection; until it is back the provider reports itself unavailable, and a provision fails with
``provider.unavailable`` and the reason.

Restart of hostd: domains keep running. :meth:`VmProvider.readopt` finds each by its UUID and
checks that its metadata mark names this instance and this hostd (else it is not ours); it scans
every domain by mark when the UUID is gone. What it cannot find is reported ``failed``.

Forks and warm pool slots: :mod:`.copies`. Warm pools keep VM slots saved
(:attr:`VmProvider.pool_form`): booted, given until the guest agent answers, then saved.

Strays: every round the watcher also lists libvirt's domains; one marked with this hostd's
namespace that no instance or checkpoint holds, or named like this hostd's domains but without its
mark, is reported in ``ProviderInfo.strays`` (logged, never touched). Domains of anyone else are
none of hostd's business.

Processes inside (:meth:`VmProvider.spawn_spec`): a PTY session is the serial console, relayed by
:mod:`.console` on the PTY hostd owns (so ring, replay and reattach work as for host sessions); an
exec runs through qemu-guest-agent's ``guest-exec`` by :mod:`.guestexec` (both run as
``python -m`` children).
The test driver (``test://``) has neither a console nor an agent: its instances publish lifecycle
capabilities only, and a session or exec is refused with ``capability.unsupported``.

Sleep (:meth:`VmProvider.sleep`): ``freeze`` is ``virDomainSuspend`` (the vCPUs stop, QEMU keeps
the memory; ``virDomainResume`` wakes it), ``save`` is ``virDomainManagedSave`` (the memory goes to
libvirt's managed save file and QEMU exits; ``virDomainCreate`` restores it). The watcher looks at
running instances only, so a sleeping one's paused or shut-off domain is never taken for a stop. A
console session lives through a ``freeze``; after a ``save`` its console is gone and it ends, as after
a reboot. The agent channel's relay waits for the port to come back.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from ...config import HostdConfig
from ...errors import RpcError
from ..base import ControlSocket, EndChildren, Instance, Provider, Saved, SpawnSpec
from ..host import directory
from . import bootimage, connection, domain
from .agentmux import AgentMux
from .connection import LONG_CALL_TIMEOUT_S, LibvirtLink
from .copies import FORK, VmCopies, make_dir, vm_detail

log = logging.getLogger(__name__)

POLL_S = 2.0
#: How often stop checks whether the guest has shut down within its grace period.
_SHUTDOWN_POLL_S = 0.2
_LIFECYCLE = ["instance.start", "instance.stop", "instance.restart", "instance.destroy"]
#: libvirt save/restore, and warm pools of saved slots (each its own domain, booted and saved).
_CHECKPOINTS = ["instance.snapshot", "instance.restore", "warm_pool.manage"]
#: Suspended (memory kept) or managed-saved (memory on disk, QEMU gone).
_SLEEP = ["instance.sleep.freeze", "instance.sleep.save"]
MAX_STRAYS = 64
#: The environment variable carrying the guest env of an exec to ``hostd.providers.libvirt.guestexec``.
GUEST_ENV = "AIWG_GUEST_ENV"
#: The agent channel's launcher in the built guest image (scripts/guest/aiwg-guest.c).
GUEST_HELPER = "/bin/aiwg-guest"


class VmProvider(Provider):
    """libvirt domains, through one :class:`LibvirtLink` to ``config.libvirt_uri``."""

    runtime = "vm"
    name = "libvirt"

    def __init__(self, config: HostdConfig, nursery: trio.Nursery, commit: Callable[[Instance], None]) -> None:
        super().__init__(commit)
        self._config = config
        self._link = LibvirtLink(config.libvirt_uri)
        self._instances: dict[str, Instance] = {}
        self._emulated = config.libvirt_uri.startswith("test")
        self._copies = VmCopies(
            config, self._link, self._instances, emulated=self._emulated, capabilities=self.instance_capabilities
        )
        self._strays: list[str] = []
        self._nursery = nursery
        #: The agent channel of each VM whose execs asked for a control channel (:mod:`.agentmux`).
        self._muxes: dict[str, AgentMux] = {}
        nursery.start_soon(self._watch)

    pool_form = "saved"

    def capabilities(self) -> list[str]:
        if self._emulated:
            return [*_LIFECYCLE, *_CHECKPOINTS, *_SLEEP]
        return [*_LIFECYCLE, *_CHECKPOINTS, *_SLEEP, FORK, "session.pty", "exec"]

    def instance_capabilities(self, info: m.InstanceInfo) -> list[str]:
        # A disk's state is not in a memory image: such a VM cannot be forked (saveimage refuses it).
        disk = info.vm is not None and (info.vm.image_ref or "").startswith("qcow2://")
        found = [c for c in self.capabilities() if not (disk and c == FORK)]
        if "exec" in found and info.vm is not None and info.vm.agent_channel:
            found.append("exec.control")  # its guest runs the agent channel's helper
        return found

    def describe(self, *, default: bool) -> m.ProviderInfo:
        info = super().describe(default=default)
        info.strays = list(self._strays)
        return info

    def availability(self) -> str | None:
        return self._link.reason

    # -- instances made from others (see .copies) ---------------------------------------------------

    async def fork(self, source: Instance, instance: Instance) -> None:
        await self._copies.fork(source, instance)

    async def wait_usable(self, instance: Instance) -> None:
        await self._copies.wait_usable(instance)

    async def drop_checkpoint(self, saved: Saved) -> None:
        await self._copies.drop_checkpoint(saved)

    def _domain_name(self, instance_id: str) -> str:
        return domain.domain_name(self._config.namespace, instance_id)

    # -- lifecycle ------------------------------------------------------------------------------

    async def provision(self, instance: Instance, req: m.InstanceProvisionRequest) -> None:
        info = instance.info
        spec = req.vm or m.VmSpec()
        info.vm = m.VmDetail(
            uri=self._config.libvirt_uri,
            domain=self._domain_name(info.instance_id),
            domain_type=self._config.vm_domain_type,
            memory_mib=spec.memory_mib,
            vcpus=spec.vcpus,
        )
        info.working_dir = "/"  # the guest's
        info.instance_dir = str(self._config.instances_dir / info.instance_id)
        self._instances[info.instance_id] = instance
        image = await bootimage.resolve(req.image, self._config.guest_image_dir)
        info.vm.image_ref, info.vm.agent_channel = image.image_ref, image.agent_channel
        await trio.to_thread.run_sync(make_dir, Path(info.instance_dir))
        xml = domain.render(
            domain.DomainSpec(
                name=info.vm.domain,
                domain_type=info.vm.domain_type,
                memory_mib=spec.memory_mib,
                vcpus=spec.vcpus,
                instance_id=info.instance_id,
                namespace=self._config.namespace,
                pool=info.pool,
                kernel=image.kernel,
                initrd=image.initrd,
                cmdline=image.cmdline,
                disk=image.disk,
            )
        )
        info.vm.uuid = await self._link.call(lambda conn: conn.defineXML(xml).UUIDString())

    async def start(self, instance: Instance) -> None:
        info, vm = instance.info, vm_detail(instance)

        def boot(conn: Any) -> None:
            dom = connection.existing(conn, vm)
            if not connection.is_active(dom):
                dom.create()

        info.state = "starting"
        try:
            await self._link.call(boot)
        except RpcError as exc:
            info.state, info.note, info.stopped_at = "failed", exc.message, time.time()
            raise
        info.state, info.started_at, info.stopped_at = "running", time.time(), None
        info.exit_code = info.adopted = info.note = None

    async def stop(self, instance: Instance, grace_s: float, end_children: EndChildren) -> None:
        vm = vm_detail(instance)
        await end_children()
        if vm.uuid is None:
            return

        def shutdown(conn: Any) -> bool:
            dom = connection.lookup(conn, vm.uuid or "")
            if dom is None or not connection.is_active(dom):
                return False
            try:
                dom.shutdown()  # ACPI: a guest without an ACPI daemon ignores it; destroy follows
            except Exception as exc:
                log.info("domain %s: shutdown request failed (%s); destroying it", vm.domain, exc)
            return True

        if not await self._link.call(shutdown):
            return
        with trio.move_on_after(grace_s):
            while await self._link.call(lambda conn: self._active(conn, vm)):
                await trio.sleep(_SHUTDOWN_POLL_S)
        await self._link.call(lambda conn: self._power_off(conn, vm))

    async def discard(self, instance: Instance) -> None:
        info = instance.info
        vm = info.vm
        self._instances.pop(info.instance_id, None)
        if vm is not None and vm.uuid is not None:

            def remove(conn: Any) -> None:
                self._power_off(conn, vm)
                dom = connection.lookup(conn, vm.uuid or "")
                if dom is not None:
                    try:
                        if dom.hasManagedSaveImage(0):  # a VM destroyed asleep: its memory file too
                            dom.managedSaveRemove(0)
                        dom.undefine()
                    except Exception as exc:
                        if not connection.is_no_domain(exc):
                            raise

            await self._link.call(remove)
        if info.instance_dir:
            await trio.to_thread.run_sync(directory.remove, Path(info.instance_dir))

    async def readopt(self, instance: Instance, saved: Saved) -> None:
        try:
            await self._readopt(instance)
        finally:
            # Only now: the watcher, already running, must not judge the saved state ("running")
            # against a shut-off domain before re-adoption has (it would call that a stop of its own).
            self._instances[instance.info.instance_id] = instance

    async def _readopt(self, instance: Instance) -> None:
        info = instance.info
        vm = info.vm
        if vm is None:
            info.state, info.adopted, info.note = "failed", False, "no VM detail was saved for this instance"
            return
        try:
            found = await self._link.call(lambda conn: self._find(conn, info.instance_id, vm.uuid))
        except RpcError as exc:
            info.state, info.adopted = "failed", False
            info.note = f"could not look for domain {vm.domain}: {exc.message}"
            return
        if found is None:
            info.state, info.adopted, info.stopped_at = "failed", False, time.time()
            info.note = f"domain {vm.domain} no longer exists"
            return
        vm.uuid, active = found
        sleep = info.sleep
        if info.state == "sleeping" and sleep is not None:
            asleep = await self._link.call(lambda conn: self._asleep(conn, vm, sleep))
            if asleep:
                info.adopted, info.note = True, None
                return  # sleeps on, as hostd left it
            info.sleep = None
            info.state = "running" if active else "stopped"
        if active:
            info.state, info.adopted = "running", True
            info.note = "console sessions and execs from the previous hostd ended with it"
        elif info.state in ("running", "starting", "stopping"):
            info.state, info.adopted, info.stopped_at = "stopped", False, time.time()
            info.note = f"domain {vm.domain} shut off while hostd was down"

    async def shutdown(self) -> None:
        await trio.to_thread.run_sync(self._link.close)

    # -- sleep ----------------------------------------------------------------------------------

    async def sleep(self, instance: Instance, how: m.SleepForm) -> None:
        vm = vm_detail(instance)

        def fall_asleep(conn: Any) -> tuple[int, bool]:
            dom = connection.existing(conn, vm)
            if how == "freeze":
                dom.suspend()
            else:
                dom.managedSave(0)
            return dom.state()[0], bool(dom.hasManagedSaveImage(0))

        verb = "suspended" if how == "freeze" else "saved"
        try:
            state, saved = await self._link.call(fall_asleep, timeout_s=LONG_CALL_TIMEOUT_S)
        except RpcError as exc:
            raise RpcError(exc.code, f"domain {vm.domain} could not be {verb}: {exc.message}", **exc.details) from exc
        libvirt = connection.libvirt_module()
        if how == "freeze":
            asleep = state == libvirt.VIR_DOMAIN_PAUSED
        else:
            asleep = state == libvirt.VIR_DOMAIN_SHUTOFF and saved
        if not asleep:
            raise RpcError(
                ErrorCode.PROVIDER_FAILED, f"domain {vm.domain} could not be {verb}: libvirt says it is {_state(state)}"
            )

    async def wake(self, instance: Instance, how: m.SleepForm) -> None:
        vm = vm_detail(instance)

        def wake_up(conn: Any) -> int:
            libvirt = connection.libvirt_module()
            dom = connection.existing(conn, vm)
            state = dom.state()[0]
            if state == libvirt.VIR_DOMAIN_PAUSED:
                dom.resume()
            elif not connection.is_active(dom):
                if how == "save" and not dom.hasManagedSaveImage(0):
                    # Booting it afresh would lose what ran in it: say so instead.
                    raise RpcError(ErrorCode.PROVIDER_FAILED, f"the managed save image of domain {vm.domain} is gone")
                dom.create()  # from the managed save image
            return int(dom.state()[0])

        try:
            state = await self._link.call(wake_up, timeout_s=LONG_CALL_TIMEOUT_S)
        except RpcError as exc:
            gone = "no longer exists" in exc.message
            if gone:
                instance.info.state, instance.info.note = "failed", exc.message
            raise RpcError(exc.code, f"domain {vm.domain} could not be woken: {exc.message}", **exc.details) from exc
        if state != connection.libvirt_module().VIR_DOMAIN_RUNNING:
            raise RpcError(ErrorCode.PROVIDER_FAILED, f"domain {vm.domain} is {_state(state)} after its wake")

    # -- checkpoints ----------------------------------------------------------------------------

    async def checkpoint(self, instance: Instance, path: Path) -> Saved:
        """``virDomainSave``: the domain's memory and device state go to ``path`` and it shuts off
        (still defined, its definition kept for the restore)."""
        info, vm = instance.info, vm_detail(instance)

        def save(conn: Any) -> None:
            connection.existing(conn, vm).save(str(path))

        await self._link.call(save, timeout_s=LONG_CALL_TIMEOUT_S)
        if info.instance_dir:
            await trio.to_thread.run_sync(directory.remove, Path(info.instance_dir))
        # Forgotten only now, with no await before the registry records the checkpoint: until then
        # the domain is this instance's, not a stray (a pool slot's would be removed as one).
        self._instances.pop(info.instance_id, None)
        return {"vm": msgspec.to_builtins(vm)}

    async def restore(self, instance: Instance, saved: Saved, path: Path) -> None:
        """``virDomainRestore`` under the saved name and UUID, then the mark names the new instance."""
        info = instance.info
        try:
            vm = msgspec.convert(saved.get("vm"), m.VmDetail)
        except (msgspec.ValidationError, TypeError) as exc:
            raise RpcError(ErrorCode.PROVIDER_FAILED, f"the checkpoint's VM detail is unreadable: {exc}") from None
        info.vm, info.working_dir = vm, "/"
        info.instance_dir = str(self._config.instances_dir / info.instance_id)
        mark = domain.mark_element(info.instance_id, self._config.namespace)

        def restore(conn: Any) -> None:
            libvirt = connection.libvirt_module()
            conn.restore(str(path))
            dom = connection.existing(conn, vm)
            flags = libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG
            dom.setMetadata(
                libvirt.VIR_DOMAIN_METADATA_ELEMENT, mark, domain.METADATA_PREFIX, domain.METADATA_NS, flags
            )

        await trio.to_thread.run_sync(make_dir, Path(info.instance_dir))
        await self._link.call(restore, timeout_s=LONG_CALL_TIMEOUT_S)
        self._instances[info.instance_id] = instance
        info.state, info.started_at, info.stopped_at = "running", time.time(), None

    # -- processes inside -----------------------------------------------------------------------

    def spawn_spec(
        self, instance: Instance, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], *, tty: bool
    ) -> SpawnSpec:
        vm = vm_detail(instance)
        needed = "session.pty" if tty else "exec"
        if needed not in self.capabilities() or vm.uuid is None:
            raise RpcError(
                ErrorCode.UNSUPPORTED,
                f"instance {instance.id!r}: {needed} is not available with libvirt at {vm.uri}",
                capability=needed,
            )
        helper_env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG")}
        helper_env["AIWG_INSTANCE_DIR"] = instance.info.instance_dir
        helper = [sys.executable, "-m"]
        if tty:
            # The serial console; argv has no meaning there (the guest runs its own shell on it).
            return SpawnSpec(
                argv=[*helper, "agentic_sandbox.hostd.providers.libvirt.console", vm.uri, vm.uuid],
                cwd=instance.info.instance_dir,
                env={**helper_env, "TERM": env.get("TERM", "xterm")},
                shown_cwd="/",
            )
        guest_argv = list(argv)
        if cwd:
            guest_argv = ["/bin/sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", cwd, *guest_argv]
        return SpawnSpec(
            argv=[*helper, "agentic_sandbox.hostd.providers.libvirt.guestexec", vm.uri, vm.uuid, "--", *guest_argv],
            cwd=instance.info.instance_dir,
            env={**helper_env, GUEST_ENV: json.dumps({**instance.env, **env})},
            shown_cwd=cwd or "/",
        )

    def control_socket(self, instance: Instance, exec_id: str) -> ControlSocket | None:
        """Through the guest's agent channel (:mod:`.agentmux`), where its image has one."""
        vm = vm_detail(instance)
        if not vm.agent_channel or self._emulated:
            return None
        control_dir = Path(instance.info.instance_dir) / "control"
        control_dir.mkdir(mode=0o700, exist_ok=True)
        self._ensure_mux(instance)
        return ControlSocket(
            host_path=str(control_dir / f"{exec_id}.sock"), argv_prefix=[GUEST_HELPER, "exec", exec_id, "--"]
        )

    def _ensure_mux(self, instance: Instance) -> None:
        instance_id = instance.id
        if instance_id in self._muxes:
            return

        async def port_path() -> str | None:
            vm = vm_detail(instance)
            return await self._link.call(lambda conn: connection.channel_path(conn, vm, domain.AGENT_CHANNEL))

        def alive() -> bool:
            # Asleep too: an exec parked on its channel gets its answer through the port once awake.
            live = ("starting", "running", "sleeping")
            return self._instances.get(instance_id) is instance and instance.info.state in live

        mux = AgentMux(instance_id, port_path, lambda: Path(instance.info.instance_dir) / "control", alive)
        self._muxes[instance_id] = mux

        async def run() -> None:
            try:
                await mux.run()
            finally:
                self._muxes.pop(instance_id, None)

        self._nursery.start_soon(run)

    # -- helpers (in worker threads) ------------------------------------------------------------

    @staticmethod
    def _asleep(conn: Any, vm: m.VmDetail, sleep: m.SleepDetail) -> bool:
        """Whether the domain still sleeps as ``sleep`` says (paused; shut off with its image)."""
        libvirt = connection.libvirt_module()
        dom = connection.lookup(conn, vm.uuid or "")
        if dom is None:
            return False
        if sleep.how == "freeze":
            return bool(dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED)
        return not connection.is_active(dom) and bool(dom.hasManagedSaveImage(0))

    @staticmethod
    def _active(conn: Any, vm: m.VmDetail) -> bool:
        dom = connection.lookup(conn, vm.uuid or "")
        return dom is not None and connection.is_active(dom)

    @staticmethod
    def _power_off(conn: Any, vm: m.VmDetail) -> None:
        dom = connection.lookup(conn, vm.uuid or "")
        if dom is None:
            return
        try:
            if connection.is_active(dom):
                dom.destroy()
        except Exception as exc:
            if not connection.is_no_domain(exc) and connection.is_active(dom):
                raise

    def _find(self, conn: Any, instance_id: str, uuid: str | None) -> tuple[str, bool] | None:
        """(uuid, active) of this instance's domain, by UUID then by metadata mark; None if gone."""
        dom = connection.lookup(conn, uuid) if uuid else None
        candidates = [dom] if dom is not None else list(conn.listAllDomains())
        for cand in candidates:
            mark = self._mark(cand)
            if mark is not None and (mark.instance_id, mark.namespace) == (instance_id, self._config.namespace):
                return cand.UUIDString(), connection.is_active(cand)
        return None

    @staticmethod
    def _mark(dom: Any) -> domain.DomainMark | None:
        libvirt = connection.libvirt_module()
        try:
            xml = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, domain.METADATA_NS)
        except libvirt.libvirtError:
            return None  # no mark of ours
        return domain.parse_mark(xml)

    # -- the watcher ----------------------------------------------------------------------------

    async def startup(self) -> None:
        # A fork cut off by a hostd crash leaves its snapshot file; nothing else reads it.
        await trio.to_thread.run_sync(shutil.rmtree, self._config.forks_dir, True)

    async def _watch(self) -> None:
        """Keep the connection up and notice domains that stopped by themselves (module docstring)."""
        while True:
            if await self._link.probe() is None:
                running = [i for i in self._instances.values() if i.info.state == "running" and i.info.vm]
                for instance in running:
                    await self._check(instance)
                await self._find_strays()
            await trio.sleep(POLL_S)

    async def _find_strays(self) -> None:
        """Report strays; remove those marked as a pool slot (made ahead, never handed to anyone:
        a fill cut off by a crash before hostd recorded it)."""
        known = {i.info.vm.uuid for i in self._instances.values() if i.info.vm and i.info.vm.uuid}
        known |= self.held_elsewhere()
        # By mark too, but only for an instance whose domain is being defined (its UUID not yet
        # recorded): a copy of one of ours (virsh dumpxml, define) carries its mark as well.
        defining = {iid for iid, i in self._instances.items() if i.info.vm is None or i.info.vm.uuid is None}
        prefix = f"aiwg-{self._config.namespace}-"

        def listing(conn: Any) -> list[str]:
            out = []
            for dom in conn.listAllDomains():
                mark = self._mark(dom)
                ours = mark is not None and mark.namespace == self._config.namespace
                if not (ours or dom.name().startswith(prefix)) or dom.UUIDString() in known:
                    continue
                if mark is not None and ours and mark.instance_id in defining:
                    continue
                slot_name = mark is not None and dom.name() == self._domain_name(mark.instance_id)
                if mark is not None and ours and mark.pool is not None and slot_name:
                    log.info("removing domain %s: a warm pool slot nothing holds", dom.name())
                    if connection.is_active(dom):
                        dom.destroy()
                    dom.undefine()
                    continue
                out.append(str(dom.name()) if ours else f"{dom.name()} (no hostd mark)")
            return sorted(out)

        try:
            strays = await self._link.call(listing)
        except RpcError:
            return
        if strays != self._strays:
            if strays:
                log.warning("libvirt domains of this hostd that no instance claims: %s", ", ".join(strays))
            self._strays = strays[:MAX_STRAYS]

    async def _check(self, instance: Instance) -> None:
        vm = vm_detail(instance)
        if instance.lock.locked():
            return  # a lifecycle call is working on it and records the outcome itself

        def state(conn: Any) -> tuple[int, int] | None:
            dom = connection.lookup(conn, vm.uuid or "")
            return None if dom is None else tuple(dom.state())

        try:
            found = await self._link.call(state)
        except RpcError:
            return
        libvirt = connection.libvirt_module()
        if found is not None and found[0] not in (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_CRASHED):
            return
        if instance.lock.locked() or instance.info.state != "running":
            return
        info = instance.info
        info.stopped_at = time.time()
        if found is None:
            info.state, info.note = "failed", f"domain {vm.domain} disappeared"
        elif found[0] == libvirt.VIR_DOMAIN_CRASHED or found[1] == libvirt.VIR_DOMAIN_SHUTOFF_CRASHED:
            info.state, info.note = "failed", f"domain {vm.domain} crashed"
        else:
            info.state, info.note = "stopped", f"domain {vm.domain} shut off by itself"
        self._commit(instance)


def _state(state: int) -> str:
    """libvirt's word for a domain state number."""
    names = {0: "nostate", 1: "running", 2: "blocked", 3: "paused", 4: "shutting down", 5: "shut off", 6: "crashed"}
    return names.get(state, f"in state {state}")
